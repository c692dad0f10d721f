"""A user's own @triton.jit kernels called with minitensor tensors, as with torch's: pointers, dtypes and
specialisation understood, launched on minitensor's current stream (ordered with its events), captured in a
graph, timed by triton.testing.do_bench and tuned by triton.autotune. On the simulator they run in Triton's
interpreter; on a GPU Triton compiles and launches them, asking minitensor (not torch) for device and stream."""
import os
import tempfile

import numpy as np
import pytest
import triton
import triton.language as tl

import minitensor as mt
from graph_helpers import capturing
from helpers import launched_behind_a_closed_gate, run_python

pytestmark = pytest.mark.usefixtures("clean_cuda_state")
SIM = mt.cuda.backend() == "sim"


@triton.jit
def _twice(v):
    return v * 2


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, _twice(x) + y, mask=mask)


@triton.jit
def scale_2d_kernel(src, dst, rows, cols, src_row_stride, src_col_stride, factor,
                    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)[:, None]
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)[None, :]
    mask = (r < rows) & (c < cols)
    v = tl.load(src + r * src_row_stride + c * src_col_stride, mask=mask)
    tl.store(dst + r * cols + c, v * factor, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 256})], key=["n"])
@triton.jit
def tuned_square_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * x, mask=mask)


def _random(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "f":
        data = rng.standard_normal(shape).astype(dtype)
    else:
        data = rng.integers(-50, 50, size=shape).astype(dtype)
    return data, mt.tensor(data, device="cuda")


def _add(x, y, out, block=128):
    n = x.numel()
    add_kernel[(triton.cdiv(n, block),)](x, y, out, n, BLOCK=block)


DTYPES = [np.float32, np.float16, np.float64, np.int32, np.int64, np.int16, np.int8]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", [1, 1000, 4099])
def test_vector_add_matches_numpy(dtype, n):
    x_np, x = _random(n, dtype, 1)
    y_np, y = _random(n, dtype, 2)
    out = mt.empty(n, dtype=x.dtype, device="cuda")
    _add(x, y, out)
    np.testing.assert_allclose(out.cpu().numpy(), (x_np * 2 + y_np).astype(dtype), rtol=1e-3 if dtype == np.float16 else 1e-6)


def test_grid_as_a_function_of_the_meta_parameters():
    x_np, x = _random(777, np.float32)
    out = mt.empty(777, device="cuda")
    add_kernel[lambda meta: (triton.cdiv(777, meta["BLOCK"]),)](x, x, out, 777, BLOCK=64)
    np.testing.assert_allclose(out.cpu().numpy(), 3 * x_np, rtol=1e-6)


def test_offset_view_passes_its_first_element():
    x_np, x = _random(300, np.float32)
    view = x[100:]
    out = mt.empty(200, device="cuda")
    _add(view, view, out, block=64)
    np.testing.assert_allclose(out.cpu().numpy(), 3 * x_np[100:], rtol=1e-6)


def test_strided_2d_kernel_reads_a_transposed_view():
    src_np, src = _random((37, 53), np.float32)
    view = src.t()  # (53, 37), strides (1, 53): not contiguous
    dst = mt.empty(53, 37, device="cuda")
    grid = (triton.cdiv(53, 16), triton.cdiv(37, 16))
    scale_2d_kernel[grid](view, dst, 53, 37, view.stride(0), view.stride(1), 1.5, BLOCK_R=16, BLOCK_C=16)
    np.testing.assert_allclose(dst.cpu().numpy(), src_np.T * 1.5, rtol=1e-6)


def test_autotuned_kernel_picks_a_config_and_matches_numpy():
    x_np, x = _random(3001, np.float32)
    out = mt.empty(3001, device="cuda")
    tuned_square_kernel[lambda meta: (triton.cdiv(3001, meta["BLOCK"]),)](x, out, 3001)
    np.testing.assert_allclose(out.cpu().numpy(), x_np * x_np, rtol=1e-6)
    assert tuned_square_kernel.best_config.kwargs["BLOCK"] in (64, 256)


def test_do_bench_times_a_launch_with_minitensor_events():
    _, x = _random(4096, np.float32)
    out = mt.empty(4096, device="cuda")
    ms = triton.testing.do_bench(lambda: _add(x, x, out), warmup=1, rep=5)
    assert ms > 0


def test_launch_runs_on_the_current_side_stream_in_its_order():
    x_np, x = _random(2048, np.float32)
    out = mt.zeros(2048, device="cuda")
    _add(x, x, out)  # compiled and loaded here: no kernel may be loaded behind a closed gate
    out.zero_()
    launched_behind_a_closed_gate(lambda: _add(x, x, out))
    np.testing.assert_allclose(out.cpu().numpy(), 3 * x_np, rtol=1e-6)


def test_kernel_after_an_op_on_the_same_stream_sees_its_result():
    s = mt.cuda.Stream()
    with mt.cuda.stream(s):
        x = mt.full((1500,), 2.0, device="cuda")
        y = x * 3  # a minitensor op, then the user's kernel reading it, in order on s
        out = mt.empty(1500, device="cuda")
        _add(y, x, out)
    s.synchronize()
    assert np.all(out.cpu().numpy() == 14.0)


def test_kernel_captured_in_a_graph_replays_on_new_inputs():
    x_np, x = _random(1024, np.float32)
    out = mt.empty(1024, device="cuda")
    _add(x, x, out)  # compile outside the capture
    g = mt.cuda.CUDAGraph()
    s = mt.cuda.Stream()
    s.wait_stream(mt.cuda.current_stream())
    with capturing(g, s), mt.cuda.stream(s):
        _add(x, x, out)
    mt.cuda.current_stream().wait_stream(s)
    out.zero_()
    x.copy_(mt.tensor(x_np + 1, device="cuda"))
    g.replay()
    np.testing.assert_allclose(out.cpu().numpy(), 3 * (x_np + 1), rtol=1e-6)


def test_cpu_tensor_is_refused_on_the_simulator():
    if not SIM:
        pytest.skip("on a GPU Triton itself reads the pointer; the simulator checks the device")
    x = mt.ones(8)
    with pytest.raises(ValueError, match="cuda tensors"):
        _add(x, x, x)


_TRITON_FIRST = """
import sys
import numpy as np
import triton, triton.language as tl
import minitensor as mt

@triton.jit
def k(x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) + 1, mask=offsets < n)

x = mt.arange(10, dtype=mt.float32, device="cuda")
k[(1,)](x, 10, BLOCK=16)
assert x.tolist() == [float(i + 1) for i in range(10)], x.tolist()
assert "torch" not in sys.modules, "a user kernel's launch imported torch"
print("OK")
"""


@pytest.mark.parametrize("order", ["triton first", "minitensor first"])
def test_launch_from_a_fresh_process_leaves_torch_unimported(order):
    script = _TRITON_FIRST
    if order == "minitensor first":
        script = script.replace("import triton, triton.language as tl\nimport minitensor as mt",
                                "import minitensor as mt\nmt.ones(1, device='cuda')\nimport triton, triton.language as tl")
    _run_script(script)


def test_looking_triton_up_does_not_end_the_watch_for_its_import():
    script = _TRITON_FIRST.replace("import triton, triton.language as tl\nimport minitensor as mt",
                                   "import importlib.util\nimport minitensor as mt\nmt.ones(1, device='cuda')\n"
                                   "assert importlib.util.find_spec('triton') is not None\n"
                                   "import triton, triton.language as tl")
    _run_script(script)


def _run_script(script):
    """Run `script` from a file (Triton reads a kernel's source) in a fresh process with an empty kernel cache."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "user_script.py")
        with open(path, "w") as f:
            f.write(script)
        out = run_python(f"import runpy; runpy.run_path({path!r})", env={"MINITENSOR_CACHE_DIR": folder})
    assert out.strip().splitlines()[-1] == "OK", out
