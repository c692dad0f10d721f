"""minitensor never imports torch, as users meet it.

Where torch is not installed (the CI environments), the whole suite is the check: every op runs.
Where torch is installed (the GPU machines, CI's oldest-Triton environment), a process that imports
minitensor and runs its ops, kernels compiled cold, must still not have imported torch: Triton 3.6's own
GPU driver imports it, which is why minitensor launches through its own driver layer.
"""
import importlib.util
import tempfile

import pytest

import minitensor as mt
from helpers import run_python

_OPS = """
import sys
import numpy as np
import minitensor as mt
assert mt.cuda.backend() == "{backend}", mt.cuda.backend()
rng = np.random.default_rng(0)
a_np = rng.standard_normal((33, 31)).astype(np.float32)
a = mt.tensor(a_np, device="cuda")
b = mt.rand(33, 31, device="cuda")
c = a * 2 - b.exp()
expected = a_np * 2 - np.exp(b.cpu().numpy())
assert np.allclose(c.cpu().numpy(), expected, rtol=1e-5, atol=1e-5)
assert np.allclose(a.sum(1).cpu().numpy(), a_np.sum(1), rtol=1e-4, atol=1e-4)
index = mt.tensor([3, 0, 7], device="cuda")
assert np.array_equal(a.index_select(0, index).cpu().numpy(), a_np[[3, 0, 7]])
pinned = mt.ones(1 << 16, pin_memory=True)
assert pinned.to("cuda", non_blocking=True).sum().item() == 1 << 16
s = mt.cuda.Stream()
with s:
    d = a.t().contiguous()
s.synchronize()
assert np.array_equal(d.cpu().numpy(), a_np.T)
mt.save({{"a": a}}, "{folder}/ckpt.pt")
assert np.array_equal(mt.load("{folder}/ckpt.pt")["a"].cpu().numpy(), a_np)
assert np.array_equal(np.from_dlpack(a.cpu()), a_np)
assert "torch" not in sys.modules, "minitensor imported torch"
print("OK")
"""


def _backends():
    """The simulator always; the GPU as well when this process runs on one."""
    return ["sim"] + (["nvidia"] if mt.cuda.backend() == "nvidia" else [])


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="torch is not installed here: the suite itself runs without it")
@pytest.mark.parametrize("backend", _backends())
def test_ops_leave_torch_unimported_where_it_is_installed(backend):
    with tempfile.TemporaryDirectory() as folder:  # an empty kernel cache: Triton compiles in this process
        out = run_python(_OPS.format(backend=backend, folder=folder),
                         env={"MINITENSOR_BACKEND": backend, "MINITENSOR_CACHE_DIR": folder})
    assert out.strip().splitlines()[-1] == "OK", out
