"""Users' CUDA C++ kernels on minitensor tensors: mt.cuda.RawKernel and RawModule (CuPy's names), compiled by
NVRTC through the cache on both backends; on the GPU loaded and launched by the driver, on the simulator run by
the CPU emulation on the simulated stream. Compared with numpy on random data."""
import numpy as np
import pytest

import minitensor as mt
from helpers import launched_behind_a_closed_gate

pytestmark = pytest.mark.usefixtures("clean_cuda_state")
SIM = mt.cuda.backend() == "sim"

KERNELS = r"""
extern "C" __global__ void saxpy(int n, float a, const float *x, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}

extern "C" __global__ void axpy_double(long long n, double a, const double *x, double *y) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)  // a grid-stride loop
        y[i] = a * x[i] + y[i];
}

extern "C" __global__ void scale_2d(const float *src, float *dst, unsigned rows, unsigned cols, float factor) {
    unsigned r = blockIdx.y * blockDim.y + threadIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < rows && c < cols) dst[r * cols + c] = src[r * cols + c] * factor;
}

extern "C" __global__ void fill_index(unsigned long long n, long long offset, int *out) {
    unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (int)(i + offset);
}

extern "C" __global__ void histogram(const int *values, int n, unsigned *counts) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) atomicAdd(&counts[values[i]], 1u);
}

__device__ float squared(float v) { return v * v; }

__global__ void square(int n, float *x) {  // a C++ (mangled) kernel, found by name
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = squared(x[i]);
}
"""

REVERSE_IN_SHARED_MEMORY = r"""extern "C" __global__ void reverse(float *x) {
    __shared__ float tile[256];
    tile[threadIdx.x] = x[threadIdx.x];
    __syncthreads();
    x[threadIdx.x] = tile[255 - threadIdx.x];
}"""


@pytest.fixture(scope="module")
def module():
    m = mt.cuda.RawModule(code=KERNELS)
    m.compile()
    return m


def _random(n, dtype=np.float32, seed=0):
    data = np.random.default_rng(seed).standard_normal(n).astype(dtype)
    return data, mt.tensor(data, device="cuda")


@pytest.mark.parametrize("n", [1, 255, 1000, 4097])
def test_saxpy_float_scalar_is_passed_as_float(module, n):
    x_np, x = _random(n, seed=1)
    y_np, y = _random(n, seed=2)
    module.get_function("saxpy")(((n + 255) // 256,), (256,), (n, 2.5, x, y))
    # a GPU contracts a*x + y into one fused multiply-add: one rounding fewer than numpy's
    np.testing.assert_allclose(y.cpu().numpy(), 2.5 * x_np + y_np, rtol=1e-6, atol=1e-6)


def test_double_and_long_long_parameters_with_a_grid_stride_loop(module):
    x_np, x = _random(3001, np.float64, 3)
    y_np, y = _random(3001, np.float64, 4)
    module.get_function("axpy_double")(4, 128, (3001, -0.75, x, y))  # 512 threads for 3001 elements
    np.testing.assert_allclose(y.cpu().numpy(), -0.75 * x_np + y_np, rtol=1e-12)


def test_two_dimensional_grid_and_block(module):
    src_np = np.random.default_rng(5).standard_normal((37, 53)).astype(np.float32)
    src, dst = mt.tensor(src_np, device="cuda"), mt.empty(37, 53, device="cuda")
    module.get_function("scale_2d")(((53 + 15) // 16, (37 + 7) // 8), (16, 8), (src, dst, 37, 53, np.float32(3)))
    np.testing.assert_allclose(dst.cpu().numpy(), src_np * 3, rtol=1e-6)


def test_unsigned_64_bit_and_negative_64_bit_scalars(module):
    out = mt.empty(777, dtype=mt.int32, device="cuda")
    module.get_function("fill_index")(7, 128, (777, -100, out))
    np.testing.assert_array_equal(out.cpu().numpy(), np.arange(777) - 100)


def test_global_atomics_histogram(module):
    values_np = np.random.default_rng(6).integers(0, 16, 5000).astype(np.int32)
    counts = mt.zeros(16, dtype=mt.int32, device="cuda")
    module.get_function("histogram")(20, 256, (mt.tensor(values_np, device="cuda"), 5000, counts))
    np.testing.assert_array_equal(counts.cpu().numpy(), np.bincount(values_np, minlength=16))


def test_cxx_kernel_calling_a_device_function(module):
    x_np, x = _random(300, seed=7)
    module.get_function("square")(2, 256, (300, x))
    np.testing.assert_allclose(x.cpu().numpy(), x_np * x_np, rtol=1e-6)


def test_raw_kernel_front_door_and_offset_view():
    kernel = mt.cuda.RawKernel(KERNELS, "saxpy")
    x_np, x = _random(500, seed=8)
    y_np, y = _random(500, seed=9)
    kernel(2, 256, (400, 1.0, x[100:], y[100:]))
    expected = y_np.copy()
    expected[100:] += x_np[100:]
    np.testing.assert_allclose(y.cpu().numpy(), expected, rtol=1e-6)


def test_wrong_numpy_scalar_type_is_refused_naming_the_parameter(module):
    _, x = _random(8)
    with pytest.raises(TypeError, match=r"saxpy: argument 1 is float \(float32\), got numpy.float64.*'a'"):
        module.get_function("saxpy")(1, 8, (8, np.float64(2.0), x, x))


@pytest.mark.parametrize("args, error, match", [
    ((8, 2.0, "x", None), TypeError, "argument 2 is a pointer"),
    ((8.5, 2.0, None, None), TypeError, r"argument 0 is int \(int32\), got float"),
    ((2**31, 2.0, None, None), OverflowError, "does not fit in"),
    ((8, 2.0), TypeError, "takes 4 arguments"),
])
def test_bad_arguments_are_refused(module, args, error, match):
    _, x = _random(8)
    args = tuple(x if a is None else a for a in args)
    with pytest.raises(error, match=match):
        module.get_function("saxpy")(1, 8, args)
    mt.cuda.synchronize()


def test_cpu_tensor_is_refused():
    kernel = mt.cuda.RawKernel(KERNELS, "saxpy")
    with pytest.raises(TypeError, match="device memory, got a tensor on cpu"):
        kernel(1, 8, (8, 1.0, mt.ones(8), mt.ones(8)))


def test_unknown_kernel_and_unlaunchable_signatures_are_named():
    source = KERNELS + r"""
    template <typename T> __global__ void fill(T *x, T v) { x[threadIdx.x] = v; }
    extern "C" __global__ void by_char(char c, int *x) { x[0] = c; }
    """
    module = mt.cuda.RawModule(code=source, name_expressions=("fill<float>",))
    with pytest.raises(AttributeError, match="no __global__ function 'nope'"):
        module.get_function("nope")(1, 1, ())
    with pytest.raises(TypeError, match="template"):
        module.get_function("fill")(1, 1, ())
    with pytest.raises(TypeError, match="parameter 'c' is of type 'char'"):
        module.get_function("by_char")(1, 1, (1, None))


def test_launch_on_a_side_stream_runs_in_its_order(module):
    x_np, x = _random(2048, seed=10)
    y = mt.zeros(2048, device="cuda")
    saxpy = module.get_function("saxpy")
    saxpy.compile()
    launched_behind_a_closed_gate(lambda: saxpy(8, 256, (2048, 1.0, x, y)))
    np.testing.assert_allclose(y.cpu().numpy(), x_np, rtol=1e-6)


def test_explicit_stream_argument(module):
    x_np, x = _random(1000, seed=11)
    y = mt.zeros(1000, device="cuda")
    s = mt.cuda.Stream()
    s.wait_stream(mt.cuda.current_stream())
    module.get_function("saxpy")(4, 256, (1000, 2.0, x, y), stream=s)
    mt.cuda.current_stream().wait_stream(s)
    np.testing.assert_allclose(y.cpu().numpy(), 2 * x_np, rtol=1e-6)


def test_kernel_captured_in_a_graph_replays(module):
    x_np, x = _random(1024, seed=12)
    y = mt.zeros(1024, device="cuda")
    saxpy = module.get_function("saxpy")
    g = mt.cuda.CUDAGraph()
    s = mt.cuda.Stream()
    s.wait_stream(mt.cuda.current_stream())
    with mt.cuda.stream(s):
        g.capture_begin()
        saxpy(4, 256, (1024, 1.0, x, y))
        g.capture_end()
    mt.cuda.current_stream().wait_stream(s)
    assert np.all(y.cpu().numpy() == 0), "a captured kernel must not run before replay"
    g.replay()
    g.replay()
    np.testing.assert_allclose(y.cpu().numpy(), 2 * x_np, rtol=1e-6)


def test_compile_error_is_a_compile_error_with_the_line():
    kernel = mt.cuda.RawKernel('extern "C" __global__ void k(float *x) {\n  x[0] = undefined_name;\n}\n', "k")
    with pytest.raises(mt.cuda.CompileError) as info:
        kernel(1, 1, (mt.zeros(1, device="cuda"),))
    assert isinstance(info.value, RuntimeError)
    assert any(line == 2 and kind == "error" for line, kind, _ in info.value.lines), info.value.lines
    assert "undefined_name" in info.value.log


@pytest.mark.skipif(not SIM, reason="the simulator's limit: a GPU runs shared memory and barriers")
def test_simulator_names_what_it_cannot_run():
    with pytest.raises(NotImplementedError, match="__shared__"):
        mt.cuda.RawKernel(REVERSE_IN_SHARED_MEMORY, "reverse")(1, 256, (mt.zeros(256, device="cuda"),))


@pytest.mark.skipif(SIM, reason="the simulator runs no shared memory nor barriers (see the test above)")
def test_shared_memory_and_barriers_on_a_gpu():
    x_np, x = _random(256, seed=13)
    mt.cuda.RawKernel(REVERSE_IN_SHARED_MEMORY, "reverse")(1, 256, (x,))
    np.testing.assert_array_equal(x.cpu().numpy(), x_np[::-1])
