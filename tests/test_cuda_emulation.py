"""CUDA C++ kernels on the CPU (kernels/cuda_emulation.py): real host compiles, results compared with numpy.

The builds go to a cache folder of this module's own, so every run compiles once per source; the big source is
built once for the whole module.
"""
import ctypes
import os
import threading

import numpy as np
import pytest

from helpers import SEED_SAXPY_SOURCE
from minitensor.base.errors import CompileError
from minitensor.kernels import cuda_emulation as ce

KERNELS = r'''
#include <cuda_runtime.h>
#include "emulation_test_scale.h"

__device__ __forceinline__ float square(float v) { return v * v; }
__device__ __noinline__ double twice(double v) { return 2.0 * v; }
__device__ __attribute__((__noinline__)) double half_of(double v) { return 0.5 * v; }

extern "C" __global__ void __launch_bounds__(128) axpby(int n, float a, const float *__restrict__ x, double b, const double *y,
                                 double *out) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a * x[i] + b * y[i];
}

extern "C" __global__ void grid_stride(unsigned long long n, const float *x, float *y) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)blockDim.x * gridDim.x)
    y[i] = square(x[i]) * SCALE;  // SCALE: from -D, HELPER_OFFSET: from the -I folder's header
}

extern "C" __global__ void matrix(const float *a, float *out, int rows, int cols, unsigned int pitch) {
  int r = blockIdx.y * blockDim.y + threadIdx.y;
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (r < rows && c < cols) out[r * pitch + c] = a[r * pitch + c] * 2.0f + HELPER_OFFSET;
}

extern "C" __global__ void histogram(const int *values, long long n, unsigned int *bins, int nbins,
                                     unsigned long long *count, float *sum, const float *w, int *low, int *high) {
  for (long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
    atomicAdd(&bins[values[i] % nbins], 1u);
    atomicAdd(count, 1ull);
    atomicAdd(sum, w[i]);
    atomicMin(low, values[i]);
    atomicMax(high, values[i]);
  }
}

extern "C" __global__ void order(int *counter, int *seen, unsigned *where) {
  int t = atomicAdd(counter, 1);
  int threads = blockDim.x * blockDim.y * blockDim.z;
  int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  seen[t] = block * threads + (threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x;
  unsigned *w = where + 6 * t;
  w[0] = threadIdx.x; w[1] = threadIdx.y; w[2] = threadIdx.z; w[3] = blockIdx.x; w[4] = blockIdx.y; w[5] = blockIdx.z;
}

__global__ void cpp_doubles(int64_t n, double *x) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) x[i] = twice(twice(half_of(x[i])));
}

namespace ops {
__global__ void offset(float *x, uint32_t n, float by) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += by;
}
}

__global__ void takes_bool(float *x, bool flag) {}
template <typename T> __global__ void templated(T *x) {}
__global__ void twin(int *x) {}
__global__ void twin(float *x) {}
'''

SEED = SEED_SAXPY_SOURCE  # torch's seed source

HOST = r'''
#include <cuda.h>
template <typename T> __global__ void fill(T *out, T value, int n) {
  int i = (blockIdx.y * gridDim.x + blockIdx.x) * blockDim.x * blockDim.y + threadIdx.y * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value + (T)i;
}
namespace ns {
__global__ void negate(double *x, int n) { for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = -x[i]; }
}

extern "C" int fill_floats(float *out, float value, int n, void *stream) {
  dim3 block(16, 4);
  dim3 grid((n + 63) / 64 / 2 + 1, 2);
  fill<<<grid, block, 0, (cudaStream_t)stream>>>(out, value, n);
  return (int)cudaGetLastError();
}
extern "C" int negate(double *x, int n) {
  ns::negate<<<1, dim3(32)>>>(x, n);
  return (int)cudaDeviceSynchronize();
}
extern "C" int copy_and_clear(float *dst, float *src, int n) {
  if (cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice) != cudaSuccess) return -1;
  return (int)cudaMemset(src, 0, n * sizeof(float));
}
extern "C" int too_big(float *out) {
  fill<float><<<1, 2048>>>(out, 1.0f, 4);
  cudaError_t peek = cudaPeekAtLastError();
  cudaError_t err = cudaGetLastError();
  return peek == err && cudaGetLastError() == cudaSuccess ? (int)err : -1;
}
'''


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A cache folder of this module's own: the first build of each source here is a real compile."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("cuda-emulation-cache")
        patch.setenv("MINITENSOR_CACHE_DIR", str(folder))
        yield folder


@pytest.fixture(scope="module")
def headers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cuda-emulation-headers")
    (folder / "emulation_test_scale.h").write_text("#pragma once\n#define HELPER_OFFSET 0.5f\n")
    return folder


@pytest.fixture(scope="module")
def module(cache, headers):
    return ce.emulated_module(KERNELS, ("-DSCALE=3", "-I", str(headers), "--std=c++17", "-arch=sm_90",
                                        "-arch", "sm_80", "--use_fast_math", "-lineinfo"))


@pytest.fixture(scope="module")
def host_library(cache):
    library = ctypes.CDLL(ce.emulated_library(HOST))
    library.fill_floats.argtypes = (ctypes.c_void_p, ctypes.c_float, ctypes.c_int, ctypes.c_void_p)
    library.negate.argtypes = (ctypes.c_void_p, ctypes.c_int)
    library.too_big.argtypes = (ctypes.c_void_p,)
    library.copy_and_clear.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
    return library


def launch(module, name):
    """Kernel `name` launched as the simulator does: prepared (checked, arguments packed), then run."""
    prepare = module.launcher(name)

    def prepare_and_run(*args):
        run = prepare(*args)
        if run is not None:
            run()
    return prepare_and_run


def address(array):
    return array.ctypes.data


def test_seed_library_saxpy(cache):
    library = ctypes.CDLL(ce.emulated_library(SEED))
    library.saxpy.argtypes = (ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_void_p)
    rng = np.random.default_rng(0)
    for n in (10, 1000):
        x, y = rng.standard_normal(n + 3, dtype=np.float32), rng.standard_normal(n + 3, dtype=np.float32)
        expected = y.copy()
        expected[:n] = np.float32(5.0) * x[:n] + y[:n]
        assert library.saxpy(n, 5.0, address(x), address(y)) == 0
        np.testing.assert_array_equal(y, expected)  # the guard stops at n: the tail is untouched


def test_int_float_double_pointer_params(module):
    rng = np.random.default_rng(1)
    n = 1001
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n)
    out = np.full(n + 5, 7.0)
    launch(module, "axpby")((n + 127) // 128, 1, 1, 128, 1, 1, n, 1.5, address(x), -0.25, address(y), address(out))
    expected = (np.float32(1.5) * x).astype(np.float64) + -0.25 * y
    np.testing.assert_allclose(out[:n], expected, rtol=1e-12)
    assert (out[n:] == 7.0).all()


def test_grid_stride_uint64_and_define(module):
    rng = np.random.default_rng(2)
    n = 4099
    x, y = rng.standard_normal(n, dtype=np.float32), np.zeros(n, np.float32)
    launch(module, "grid_stride")(3, 1, 1, 64, 1, 1, n, address(x), address(y))
    np.testing.assert_allclose(y, x * x * 3, rtol=1e-6)


def test_two_dimensional_grid_and_block(module):
    rng = np.random.default_rng(3)
    rows, cols, pitch = 37, 53, 64
    a = rng.standard_normal((rows, pitch), dtype=np.float32)
    out = np.full((rows, pitch), -1.0, np.float32)
    launch(module, "matrix")((cols + 15) // 16, (rows + 7) // 8, 1, 16, 8, 1, address(a), address(out), rows, cols,
                              pitch)
    np.testing.assert_allclose(out[:, :cols], a[:, :cols] * 2 + 0.5, rtol=1e-6)
    assert (out[:, cols:] == -1).all()


def test_global_atomics_histogram(module):
    rng = np.random.default_rng(4)
    n, nbins = 5003, 17
    values = rng.integers(0, 1000, n, dtype=np.int32)
    weights = rng.random(n, dtype=np.float32)
    bins, count, total = np.zeros(nbins, np.uint32), np.zeros(1, np.uint64), np.zeros(1, np.float32)
    low, high = np.array([2**31 - 1], np.int32), np.array([-1], np.int32)
    launch(module, "histogram")(4, 1, 1, 96, 1, 1, address(values), n, address(bins), nbins, address(count),
                                 address(total), address(weights), address(low), address(high))
    np.testing.assert_array_equal(bins, np.bincount(values % nbins, minlength=nbins))
    assert count[0] == n and low[0] == values.min() and high[0] == values.max()
    assert total[0] == pytest.approx(weights.sum(dtype=np.float64), rel=1e-4)


def run_order(module, grid, block):
    threads = int(np.prod(grid) * np.prod(block))
    counter, seen = np.zeros(1, np.int32), np.full(threads, -1, np.int32)
    where = np.zeros((threads, 6), np.uint32)
    launch(module, "order")(*grid, *block, address(counter), address(seen), address(where))
    return seen, where


def test_blocks_and_threads_run_in_order_x_fastest(module):
    seen, where = run_order(module, (3, 2, 2), (4, 3, 2))
    np.testing.assert_array_equal(seen, np.arange(seen.size))
    expected = [(tx, ty, tz, bx, by, bz) for bz in range(2) for by in range(2) for bx in range(3)
                for tz in range(2) for ty in range(3) for tx in range(4)]
    np.testing.assert_array_equal(where, np.array(expected, np.uint32))


def test_launches_on_two_threads_at_once_keep_their_own_indices(module):
    results, shapes = {}, {0: ((5, 3, 1), (7, 2, 3)), 1: ((2, 2, 2), (32, 4, 1))}

    def work(k):
        for _ in range(20):
            results.setdefault(k, []).append(run_order(module, *shapes[k])[0])
    threads = [threading.Thread(target=work, args=(k,)) for k in shapes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, runs in results.items():
        assert len(runs) == 20 and all((seen == np.arange(seen.size)).all() for seen in runs)


def test_cpp_names_device_helper_and_namespaces(module):
    assert not module.signatures["cpp_doubles"].extern_c and module.signatures["axpby"].extern_c
    rng = np.random.default_rng(5)
    x = rng.standard_normal(300)
    expected = 2 * x
    launch(module, "cpp_doubles")(2, 1, 1, 160, 1, 1, 300, address(x))
    np.testing.assert_array_equal(x, expected)
    f = rng.standard_normal(77, dtype=np.float32)
    expected = f + np.float32(0.75)
    launch(module, "ops::offset")(1, 1, 1, 128, 1, 1, address(f), 77, 0.75)
    np.testing.assert_array_equal(f, expected)


def test_empty_launch_is_a_no_op(module):
    x = np.arange(4, dtype=np.float32)
    launch(module, "ops::offset")(0, 1, 1, 128, 1, 1, address(x), 4, 1.0)
    launch(module, "ops::offset")(1, 1, 1, 128, 0, 1, address(x), 4, 1.0)
    np.testing.assert_array_equal(x, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("grid, block, words", [
    ((1, 1, 1), (1025, 1, 1), "1024 threads per block"), ((1, 1, 1), (32, 32, 2), "1024 threads per block"),
    ((1, 1, 1), (1, 1, 65), "(1024, 1024, 64)"), ((1, 65536, 1), (1, 1, 1), "(2147483647, 65535, 65535)"),
    ((2**31, 1, 1), (1, 1, 1), "(2147483647, 65535, 65535)"), ((-1, 1, 1), (1, 1, 1), "negative")])
def test_launch_limits(module, grid, block, words):
    with pytest.raises(ValueError, match="'ops::offset'") as info:
        launch(module, "ops::offset")(*grid, *block, 0, 0, 1.0)
    assert words in str(info.value)


def test_launcher_refusals(module):
    with pytest.raises(AttributeError, match="no __global__ kernel named 'nope'.*axpby, cpp_doubles"):
        launch(module, "nope")
    with pytest.raises(TypeError, match=r"'takes_bool' parameter 'flag' has type 'bool'"):
        launch(module, "takes_bool")
    with pytest.raises(TypeError, match="'templated' is a template"):
        launch(module, "templated")
    with pytest.raises(TypeError, match="'twin' is overloaded"):
        launch(module, "twin")


def test_argument_errors(module):
    axpby = launch(module, "axpby")
    with pytest.raises(TypeError, match=r"takes 6 arguments \(n, a, x, b, y, out\), got 2"):
        axpby(1, 1, 1, 1, 1, 1, 1, 2.0)
    with pytest.raises(TypeError, match=r"argument 0 \(n: int\) must be an int, got float"):
        axpby(1, 1, 1, 1, 1, 1, 1.5, 2.0, 0, 0.0, 0, 0)
    with pytest.raises(OverflowError, match=r"argument 0 \(n: int\) is out of range: 2147483648"):
        axpby(1, 1, 1, 1, 1, 1, 2**31, 2.0, 0, 0.0, 0, 0)
    with pytest.raises(OverflowError, match=r"argument 2 \(x: const float \*\) is out of range: -8"):
        axpby(1, 1, 1, 1, 1, 1, 0, 2.0, -8, 0.0, 0, 0)
    with pytest.raises(OverflowError, match=r"argument 1 \(a: float\) is out of range"):
        axpby(1, 1, 1, 1, 1, 1, 0, 1e300, 0, 0.0, 0, 0)


def test_host_code_launches_dim3_streams_templates(host_library):
    n = 999
    out = np.full(n + 1, -5.0, np.float32)
    assert host_library.fill_floats(address(out), 0.25, n, None) == 0
    np.testing.assert_array_equal(out[:n], np.float32(0.25) + np.arange(n, dtype=np.float32))
    assert out[n] == -5.0
    x = np.random.default_rng(6).standard_normal(100)
    expected = -x
    assert host_library.negate(address(x), 100) == 0
    np.testing.assert_array_equal(x, expected)


def test_host_runtime_copies(host_library):
    src = np.random.default_rng(7).standard_normal(33, dtype=np.float32)
    dst, expected = np.zeros(33, np.float32), src.copy()
    assert host_library.copy_and_clear(address(dst), address(src), 33) == 0
    np.testing.assert_array_equal(dst, expected)
    assert (src == 0).all()


def test_host_launch_past_limits_reports_invalid_configuration(host_library):
    out = np.zeros(4, np.float32)
    assert host_library.too_big(address(out)) == 9  # cudaErrorInvalidConfiguration, nothing run
    assert (out == 0).all()


REFUSED = [
    ("__shared__ float tile[32];\n  tile[threadIdx.x] = *x;", "shared memory", "__shared__"),
    ("extern __shared__ float dynamic[];\n  *x = dynamic[0];", "shared memory", "__shared__"),
    ("*x = 1;\n  __syncthreads();", "a block barrier", "__syncthreads"),
    ("*x = 1;\n  if (__syncthreads_or(1)) *x = 2;", "a block barrier", "__syncthreads_or"),
    ("*x = 1;\n  __syncwarp();", "a warp barrier", "__syncwarp"),
    ("*x = 1;\n  *x = __shfl_down_sync(0xffffffff, *x, 1);", "a warp-level operation", "__shfl_down_sync"),
    ("*x = 1;\n  *x = __ballot_sync(0xffffffff, 1);", "a warp-level operation", "__ballot_sync"),
    ("*x = 1;\n  *x = __any_sync(0xffffffff, 1);", "a warp-level operation", "__any_sync"),
    ("*x = 1;\n  *x = __activemask();", "a warp-level operation", "__activemask"),
    ("*x = 1;\n  auto b = cooperative_groups::this_thread_block();", "cooperative groups", "cooperative_groups"),
    ("*x = 1;\n  asm volatile(\"membar.gl;\");", "inline assembly", "asm volatile"),
    ("*x = 1;\n  cudaTextureObject_t t = 0;", "a texture or surface", "cudaTextureObject_t"),
    ("*x = 1;\n  child<<<1, 1>>>(x);", "a kernel launch from device code (dynamic parallelism)", "<<<"),
]


@pytest.mark.parametrize("body, what, construct", REFUSED)
def test_refusals_name_kernel_construct_and_line(body, what, construct):
    source = f'__global__ void child(float *x) {{}}\n\nextern "C" __global__ void uses_it(float *x) {{\n  {body}\n}}\n'
    line = 4 + body[:body.index(construct)].count("\n")
    for build in (ce.emulated_module, ce.emulated_library):
        with pytest.raises(NotImplementedError) as info:
            build(source)
        message = str(info.value)
        assert f"CUDA kernel 'uses_it' uses {what} ('{construct}', line {line})" in message
        assert "one thread after another on the CPU" in message and "run it on a GPU" in message


def test_refusal_in_a_device_function_and_outside_functions():
    source = "__device__ int lane(int v) {\n  return __shfl_sync(0xffffffff, v, 0);\n}\n"
    with pytest.raises(NotImplementedError, match=r"CUDA device function 'lane' uses a warp-level operation "
                                                  r"\('__shfl_sync', line 2\)"):
        ce.translate(source)
    with pytest.raises(NotImplementedError, match=r"the CUDA source uses cooperative groups"):
        ce.translate("#include <cooperative_groups.h>\n__global__ void k(float *x) {}\n")


def test_constructs_in_comments_and_strings_are_not_refused():
    source = ('__global__ void k(float *x) {\n  // __syncthreads(); __shared__\n'
              '  /* __shfl_sync */ printf("__syncthreads asm(");\n}\n')
    assert ce.translate(source) == source


def test_options():
    assert ce._flags(("-DA=1", "-D", "B", "--define-macro=C=3", "-UD", "-arch=sm_80", "-gencode",
                      "arch=compute_80,code=sm_80", "-O3", "--std=c++17", "-std", "c++14", "-Xptxas", "-v")) == \
        ("-DA=1", "-DB", "-DC=3", "-UD")
    assert ce._flags(("-I", "inc", "--include-path=/x")) == (f"-I{os.path.abspath('inc')}", "-I/x")
    with pytest.raises(ValueError, match=r"CUDA option '--bogus' is not supported.*-D/-U/-I"):
        ce.emulated_module("__global__ void k(int *x) {}", ("--bogus",))
    with pytest.raises(ValueError, match=r"CUDA option '-D' needs a value"):
        ce.emulated_module("__global__ void k(int *x) {}", ("-D",))


def test_no_compiler(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RuntimeError, match=r"install c\+\+, g\+\+ or clang\+\+ on PATH, or set \$CXX"):
        ce._compiler.__wrapped__(None)  # not the cached answer for this process's PATH
    monkeypatch.setenv("CXX", "/no/such/compiler")
    with pytest.raises(RuntimeError, match=r"'/no/such/compiler' \(\$CXX\) cannot be run"):
        ce.emulated_library(SEED)


def test_compile_error(cache):
    with pytest.raises(CompileError) as info:
        ce.emulated_module('extern "C" __global__ void broken(float *x) {\n  *x = undeclared_name;\n}\n')
    error = info.value
    assert "undeclared_name" in error.log and os.path.exists(error.source_path)
    assert "undeclared_name" in str(error) and error.command[0]
    assert [(line, kind) for line, kind, _ in error.lines] == [(2, "error")]


def test_builds_are_cached(module, cache, headers):
    options = ("-DSCALE=3", f"-I{headers}")
    assert ce.emulated_module(KERNELS, options) is module  # the same flags: the same module
    again = ce.emulated_module(KERNELS, ("-DSCALE=2", f"-I{headers}"))
    assert again is not module and again.path != module.path  # other flags, another build
    stamp = os.stat(module.path).st_mtime_ns
    ce._built.clear()  # as a new process would: from the disk cache, not compiled
    assert ce.emulated_module(KERNELS, options) is module
    assert os.stat(module.path).st_mtime_ns == stamp and os.path.dirname(module.path) == str(cache)


def test_an_edited_header_rebuilds(module, headers):
    header = headers / "emulation_test_scale.h"
    header.write_text("#pragma once\n#define HELPER_OFFSET 1.25f\n")
    try:
        edited = ce.emulated_module(KERNELS, ("-DSCALE=3", f"-I{headers}"))
    finally:
        header.write_text("#pragma once\n#define HELPER_OFFSET 0.5f\n")
    assert edited.path != module.path
    a, out = np.ones((1, 4), np.float32), np.zeros((1, 4), np.float32)
    launch(edited, "matrix")(1, 1, 1, 4, 1, 1, address(a), address(out), 1, 4, 4)
    np.testing.assert_array_equal(out, np.full((1, 4), 3.25, np.float32))
