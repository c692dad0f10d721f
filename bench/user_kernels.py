"""Users' own kernels (mt.cuda.codecache, RawKernel, @triton.jit on minitensor tensors): compile, cache and launch
costs, beside raw NVRTC and CuPy measured in the same run.

- Cold compile of a saxpy kernel to a cubin, each run a new source (a counter in a comment) so no cache answers:
  minitensor's `codecache.compile` (NVRTC, key, disk write), raw NVRTC through cuda-bindings (program, compile,
  cubin out), CuPy's `RawKernel.compile()`; the median ms.
- Cache hit in a fresh process: a new Python with minitensor imported and its device started times
  `codecache.compile` of a source compiled before (key, entry checked) and `codecache.load` (the module load
  too); CuPy the same with its disk cache warm; the median ms over a few processes.
- Cache hit in this process: `codecache.compile` of the same source again; CuPy's `RawKernel(...).compile()`.
- Launch: host us per launch of saxpy on 4096 floats: RawKernel; minitensor's own Triton launch (`y.add_(x)`, a
  kernel of the same reads and writes through minitensor's C launcher); a user's @triton.jit kernel on minitensor
  tensors (Triton's own launch path, asking minitensor for device and stream); CuPy's RawKernel.
"""
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import triton
import triton.language as tl

from bench import startup
from bench.report import add_times
from bench.table import table
from bench.timing import best_s_in_turns, host_us_per_call

KIND = "user_kernels"
COLD, FRESH, MEMORY, LAUNCH = "user.cold_compile", "user.fresh_hit", "user.memory_hit", "user.launch"
SAXPY = r"""// %d
extern "C" __global__ void saxpy(int n, float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""
_fresh_sources = itertools.count(int(time.time()))


@triton.jit
def saxpy_triton(x_ptr, y_ptr, n, a, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(y_ptr + offsets, a * tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask),
             mask=mask)


def _fresh():
    return SAXPY % next(_fresh_sources)


def _raw_nvrtc(arch):
    from cuda.bindings import nvrtc

    def compile_once():
        _, program = nvrtc.nvrtcCreateProgram(_fresh().encode(), b"saxpy.cu", 0, [], [])
        options = [f"-arch=sm_{arch}".encode()]
        result, = nvrtc.nvrtcCompileProgram(program, len(options), options)
        assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, result
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = b" " * size
        nvrtc.nvrtcGetCUBIN(program, cubin)
        nvrtc.nvrtcDestroyProgram(program)
    return compile_once


def _cold_row(fws, mt, new_row, repeats):
    row = new_row(COLD, KIND, "cold compile of saxpy to a cubin", ())
    row.update(unit="ms", statistic="median", repeats=repeats)
    major, minor = mt.cuda.get_device_capability()
    setups = {"minitensor": lambda: (lambda: mt.cuda.codecache.compile(_fresh(), "cubin"), None, None),
              "nvrtc": lambda: (_raw_nvrtc(major * 10 + minor), None, None)}
    cupy = next((fw.module for fw in fws if fw.name == "cupy"), None)
    if cupy is not None:
        setups["cupy"] = lambda: (lambda: cupy.RawKernel(_fresh(), "saxpy").compile(), None, None)
    seconds, errors = best_s_in_turns(setups, repeats, pick=statistics.median)
    add_times(row, {label: t * 1e3 for label, t in seconds.items()}, errors)
    return row


_CHILD = {
    "minitensor": """
import json, time, minitensor as mt
mt.ones(1, device="cuda")
t0 = time.perf_counter(); mt.cuda.codecache.compile(SOURCE, "cubin"); t1 = time.perf_counter()
mt.cuda.codecache.load(SOURCE, "cubin"); t2 = time.perf_counter()
print(json.dumps({"minitensor": t1 - t0, "minitensor_load": t2 - t1}))
""",
    "cupy": """
import json, time, cupy
cupy.ones(1)
t0 = time.perf_counter(); cupy.RawKernel(SOURCE, "saxpy").compile(); t1 = time.perf_counter()
print(json.dumps({"cupy": t1 - t0}))
""",
}


def _fresh_row(fws, new_row, runs):
    row = new_row(FRESH, KIND, "cache hit in a fresh process", ())
    row.update(unit="ms", statistic="median", runs=runs)
    source = _fresh()
    times, errors = {}, {}
    startup.compile_bytecode("minitensor")  # as installed: the GPU machines' Python writes no bytecode itself
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, MINITENSOR_CACHE_DIR=cache, CUPY_CACHE_DIR=cache)
        for name in (fw.name for fw in fws if fw.name in _CHILD):
            script = f"SOURCE = {source!r}\n" + _CHILD[name]
            try:
                samples = [_child(script, env) for _ in range(runs + 1)][1:]  # the first compiles
            except Exception as exc:  # a child that fails is a result too
                errors[name] = exc
                continue
            for label in samples[0]:
                times[label] = statistics.median(s[label] for s in samples) * 1e3
    add_times(row, times, errors)
    return row


def _child(script, env):
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "child failed")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _memory_row(fws, mt, new_row, calls, repeats):
    row = new_row(MEMORY, KIND, "cache hit in this process", ())
    row.update(unit="us per call", calls=calls, repeats=repeats)
    source = _fresh()
    setups = {"minitensor": lambda: (lambda: mt.cuda.codecache.compile(source, "cubin"), None)}
    cupy = next((fw.module for fw in fws if fw.name == "cupy"), None)
    if cupy is not None:
        setups["cupy"] = lambda: (lambda: cupy.RawKernel(source, "saxpy").compile(), None)
    add_times(row, *host_us_per_call(setups, calls, repeats))
    return row


def _launch_setups(fws, n):
    mt = next(fw for fw in fws if fw.name == "minitensor")
    x, y = mt.rand((n,)), mt.rand((n,))
    kernel = mt.module.cuda.RawKernel(SAXPY % 0, "saxpy")
    blocks = (n + 255) // 256
    setups = {"minitensor": lambda: (lambda: kernel(blocks, 256, (n, 1.0, x, y)), mt.synchronize),
              "minitensor_op": lambda: (lambda: y.add_(x), mt.synchronize),
              "minitensor_user_triton": lambda: (lambda: saxpy_triton[(blocks,)](x, y, n, 1.0, BLOCK=256),
                                                 mt.synchronize)}
    cupy_fw = next((fw for fw in fws if fw.name == "cupy"), None)
    if cupy_fw is not None:
        cx, cy = cupy_fw.rand((n,)), cupy_fw.rand((n,))
        ckernel = cupy_fw.module.RawKernel(SAXPY % 0, "saxpy")
        f32 = cupy_fw.module.float32
        setups["cupy"] = lambda: (lambda: ckernel((blocks,), (256,), (n, f32(1.0), cx, cy)), cupy_fw.synchronize)
    return setups


def _launch_row(fws, new_row, calls, repeats):
    row = new_row(LAUNCH, KIND, "launch saxpy on 4096 floats", (4096,))
    row.update(unit="us per call", calls=calls, repeats=repeats)
    add_times(row, *host_us_per_call(_launch_setups(fws, 4096), calls, repeats))
    return row


def run(fws, sim, selected, new_row):
    mt = next(fw.module for fw in fws if fw.name == "minitensor")
    rows = []
    if selected(COLD, "cold compile"):
        rows.append(_cold_row(fws, mt, new_row, 3 if sim else 7))
    if selected(FRESH, "cache hit in a fresh process"):
        rows.append(_fresh_row(fws, new_row, 2 if sim else 5))
    if selected(MEMORY, "cache hit in this process"):
        rows.append(_memory_row(fws, mt, new_row, 200, 3 if sim else 20))
    if selected(LAUNCH, "launch saxpy"):
        rows.append(_launch_row(fws, new_row, 20 if sim else 500, 3 if sim else 40))
    return rows


LABELS = ("minitensor", "nvrtc", "cupy", "minitensor_load", "minitensor_op", "minitensor_user_triton")


def section(rows, verdicts):
    """Each row's times by contender, and the targets' verdicts."""
    def status(key):
        return "/".join(v["status"] for v in verdicts if v["case"] == key)

    body = [[r["name"], r["unit"], *(_cell(r, label) for label in LABELS), status(r["key"])] for r in rows]
    return table(["users' kernels", "unit", *LABELS, "target"], body)


def _cell(row, label):
    if label in row["errors"]:
        return "error"
    value = row["time"].get(label)
    return "n/a" if value is None else f"{value:.3g}"
