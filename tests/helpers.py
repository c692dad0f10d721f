"""Helpers that several test files share (tests/ is on sys.path under pytest: `from helpers import ...`)."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import minitensor as mt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code, env=None):
    """Run `code` in a fresh interpreter with this checkout importable and this process's backend unless `env`
    names one; assert it succeeded and return its stdout."""
    full_env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.setdefault("MINITENSOR_BACKEND", mt.cuda.backend())
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=full_env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"subprocess failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


class Failures:
    """Runs many cases in one test and reports every failing one (each message cut to `limit` characters)."""

    limit = 500

    def __init__(self):
        self.items = []

    def run(self, label, fn, *args):
        try:
            fn(*args)
        except (Exception, pytest.fail.Exception) as exc:  # noqa: B902
            self.items.append(f"{label}: {type(exc).__name__}: {str(exc).strip()[:self.limit]}")

    def check(self):
        assert not self.items, f"{len(self.items)} failing case(s):\n" + "\n".join(self.items)


# torch's test_cudacodecache.py source: a kernel and an extern "C" host function launching it with <<<>>>
SEED_SAXPY_SOURCE = r"""

#include <stdio.h>

__global__
void saxpy_device(int n, float a, float *x, float *y)
{
  int i = blockIdx.x*blockDim.x + threadIdx.x;
  if (i < n) y[i] = a*x[i] + y[i];
}

extern "C" {

__attribute__((__visibility__("default")))
int saxpy(int n, float a, float *x, float *y) {
  // Perform SAXPY
  saxpy_device<<<(n+255)/256, 256>>>(n, a, x, y);
  return 0;
}

}
"""


def fresh_stream():
    """A side stream none of whose segments exist: what other tests keep alive on a stream may leave room in
    its segments, and a request then takes it instead of a new segment (stream handles are pooled)."""
    taken = {s["stream"] for s in mt.cuda.memory_snapshot()} | {0}
    tried = []
    for _ in range(100):
        stream = mt.cuda.Stream()
        if stream.cuda_stream not in taken:
            return stream
        tried.append(stream)  # kept until the search ends, so its handle is not handed out again
    raise AssertionError("no stream without segments")


def launched_behind_a_closed_gate(launch):
    """Call `launch()` with a new side stream current that waits on a closed Gate, check that its work did not run
    ahead of the gate (nor keep the default stream busy), open the gate, and make the current stream wait for it.
    The kernel must have been loaded before: no kernel may be loaded behind a closed gate."""
    mt.cuda.synchronize()
    s = mt.cuda.Stream()
    gate = mt.cuda.Gate()
    try:
        with mt.cuda.stream(s):
            gate.wait()
            launch()
            done = mt.cuda.Event()
            done.record()
        assert not done.query(), "the kernel ran ahead of the closed gate on its stream"
        assert mt.cuda.default_stream().query()
    finally:
        gate.open()
    mt.cuda.current_stream().wait_event(done)


INT_RANGE = {"uint8": (0, 256), "int8": (-128, 128), "int16": (-2**15, 2**15), "int32": (-2**31, 2**31),
             "int64": (-2**63, 2**63)}


def random_values(rng, shape, name, quarters=127):
    """Random values of dtype `name` as numpy: integers over the dtype's whole range, half types multiples of 1/4
    up to `quarters` quarters either way (exact in float16 and bfloat16, and so are small sums of them)."""
    shape = tuple(shape)
    if name == "bool":
        return rng.random(shape) < 0.5
    if name in INT_RANGE:
        lo, hi = INT_RANGE[name]
        return rng.integers(lo, hi, size=shape, dtype=np.int64 if name != "uint8" else np.uint8).astype(name)
    if name in ("float16", "bfloat16"):
        return (rng.integers(-quarters, quarters + 1, size=shape) / 4.0).astype(np.float32)
    return rng.standard_normal(shape).astype(name)


def host(t):
    """A tensor's values as numpy (bfloat16 as float32)."""
    t = t.cpu()
    return (t.float() if t.dtype == mt.bfloat16 else t).numpy()
