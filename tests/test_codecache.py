"""mt.cuda.codecache: torch inductor's test_cudacodecache.py in minitensor's terms (saxpy through .o/.so and
through a cubin, a compile error, an async compile), on both backends: nvcc and NVRTC run without a GPU, and on
the simulator the library's launches run in the CPU emulation."""
import ctypes
import os

import numpy as np
import pytest

import minitensor as mt
from helpers import SEED_SAXPY_SOURCE, run_python

pytestmark = pytest.mark.usefixtures("clean_cuda_state")

KERNEL_ONLY = r"""
extern "C" __global__ void saxpy(int n, float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """One fresh cache folder for this file's compiles (module-scoped: nvcc takes seconds a source)."""
    folder = str(tmp_path_factory.mktemp("codecache"))
    old = os.environ.get("MINITENSOR_CACHE_DIR")
    os.environ["MINITENSOR_CACHE_DIR"] = folder
    yield folder
    if old is None:
        del os.environ["MINITENSOR_CACHE_DIR"]
    else:
        os.environ["MINITENSOR_CACHE_DIR"] = old


def _xy(n, seed):
    rng = np.random.default_rng(seed)
    x_np, y_np = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    return x_np, y_np, mt.tensor(x_np, device="cuda"), mt.tensor(y_np, device="cuda")


def test_cuda_load_o_and_so_share_key_and_source_and_saxpy_runs(cache_dir):
    object_path, object_key, source_path0 = mt.cuda.codecache.compile(SEED_SAXPY_SOURCE, "o")
    library, so_key, source_path1 = mt.cuda.codecache.load(SEED_SAXPY_SOURCE, "so")
    assert source_path0 == source_path1 and object_key == so_key
    assert object_path.endswith(".o") and os.path.getsize(object_path) > 0
    assert source_path0.startswith(cache_dir) and open(source_path0).read() == SEED_SAXPY_SOURCE
    x_np, y_np, x, y = _xy(10, 0)
    library.saxpy(ctypes.c_int(10), ctypes.c_float(5.0), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()))
    np.testing.assert_allclose(y.cpu().numpy(), 5.0 * x_np + y_np, rtol=1e-6)


def test_library_call_is_ordered_with_a_side_stream(cache_dir):
    library = mt.cuda.codecache.load(SEED_SAXPY_SOURCE, "so")[0]
    s = mt.cuda.Stream()
    with mt.cuda.stream(s):
        mt.cuda.sleep(50)  # the inputs are written behind a busy stream
        x = mt.full((4096,), 2.0, device="cuda")
        y = mt.full((4096,), 1.0, device="cuda")
        library.saxpy(ctypes.c_int(4096), ctypes.c_float(3.0), ctypes.c_void_p(x.data_ptr()),
                      ctypes.c_void_p(y.data_ptr()))
        result = y * 1  # the side stream's next op reads what the call wrote
    s.synchronize()
    assert np.all(result.cpu().numpy() == 7.0)


def test_saxpy_through_a_cubin_module(cache_dir):
    module, key, source_path = mt.cuda.codecache.load(KERNEL_ONLY, "cubin")
    path, key2, source_path2 = mt.cuda.codecache.compile(KERNEL_ONLY, "cubin")
    assert (key, source_path) == (key2, source_path2) and open(path, "rb").read(4) == b"\x7fELF"
    x_np, y_np, x, y = _xy(1000, 1)
    module.get_function("saxpy")(4, 256, (1000, 2.0, x, y))
    np.testing.assert_allclose(y.cpu().numpy(), 2.0 * x_np + y_np, rtol=1e-6)
    assert mt.cuda.codecache.load(KERNEL_ONLY, "cubin")[0] is module


def test_ptx_module(cache_dir):
    module = mt.cuda.codecache.load(KERNEL_ONLY, "ptx")[0]
    x_np, y_np, x, y = _xy(300, 2)
    module.get_function("saxpy")(2, 256, (300, -1.0, x, y))
    np.testing.assert_allclose(y.cpu().numpy(), y_np - x_np, rtol=1e-6)


def test_compilation_error(cache_dir):
    broken = SEED_SAXPY_SOURCE.replace("saxpy_device", "saxpy_wrong", 1)
    with pytest.raises(mt.cuda.CompileError) as info:
        mt.cuda.codecache.compile(broken, "o")
    assert "saxpy_device" in info.value.log and info.value.lines
    assert info.value.source_path and info.value.command[0].endswith("nvcc")


def test_async_compile(cache_dir):
    compiled = mt.cuda.codecache.load_async(SEED_SAXPY_SOURCE, "so")
    scope = {"compiled_res": compiled, "other": 1}
    mt.cuda.codecache.wait(scope)
    assert scope["other"] == 1 and isinstance(scope["compiled_res"], mt.cuda.codecache.SharedLibrary)
    x_np, y_np, x, y = _xy(5, 3)
    compiled.result().saxpy(ctypes.c_int(5), ctypes.c_float(2.0), ctypes.c_void_p(x.data_ptr()),
                            ctypes.c_void_p(y.data_ptr()))
    np.testing.assert_allclose(y.cpu().numpy(), 2.0 * x_np + y_np, rtol=1e-6)


def test_async_compile_error_surfaces_from_result(cache_dir):
    future = mt.cuda.codecache.compile_async(KERNEL_ONLY.replace("a * x[i]", "a * missing[i]"), "cubin")
    with pytest.raises(mt.cuda.CompileError, match="missing"):
        future.result(timeout=120)


def test_a_library_function_returning_non_zero_raises(cache_dir):
    source = 'extern "C" __attribute__((visibility("default"))) int fails(int code) { return code; }\n'
    library = mt.cuda.codecache.load(source, "so")[0]
    library.fails(0)
    with pytest.raises(RuntimeError, match="Error in function: fails"):
        library.fails(3)


def test_bad_kind_and_options_are_refused(cache_dir):
    with pytest.raises(ValueError, match="'o', 'so', 'cubin' or 'ptx'|kind"):
        mt.cuda.codecache.compile(KERNEL_ONLY, "exe")
    with pytest.raises(ValueError, match="load takes kind"):
        mt.cuda.codecache.load(KERNEL_ONLY, "o")
    with pytest.raises(TypeError):
        mt.cuda.codecache.compile(KERNEL_ONLY, "cubin", options=(3,))
    with pytest.raises(mt.cuda.CompileError):
        mt.cuda.codecache.compile(KERNEL_ONLY, "cubin", options=("--no-such-option",))


def test_fresh_process_hits_the_disk_cache(cache_dir):
    path, key, _ = mt.cuda.codecache.compile(KERNEL_ONLY, "cubin")
    before = os.stat(path)
    out = run_python(f"""
        import time, minitensor as mt
        mt.ones(1, device="cuda")
        t = time.perf_counter()
        path, key, _ = mt.cuda.codecache.compile({KERNEL_ONLY!r}, "cubin")
        print(path, key, time.perf_counter() - t)
        """, env={"MINITENSOR_CACHE_DIR": cache_dir})
    other_path, other_key, seconds = out.split()
    after = os.stat(path)
    assert (other_path, other_key) == (path, key)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "the hit rebuilt the entry"
