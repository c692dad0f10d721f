"""minitensor as Triton's active driver, so that a user's own @triton.jit kernel runs on minitensor tensors as it
runs on torch's.

Triton's launch asks its active driver for the current device and stream; its CUDA driver asks torch. With
minitensor in use the answers are minitensor's: a kernel launches on minitensor's current stream of its current
device, so it orders with minitensor's ops, events and record_stream, and a graph capture records it;
`triton.testing.do_bench` and `triton.autotune` time with `mt.cuda` events and flush the L2 cache with a
minitensor buffer. Triton's own launch path is unchanged: it reads a tensor's `data_ptr()` and `dtype`.

The simulator runs no binary: there a launch runs the kernel in Triton's interpreter, queued on the current
stream as minitensor's own kernels are, each tensor handed over as its device address (simulated device memory
is host memory). `install` is called by triton_hook.py once both minitensor's backend and Triton are started.
"""
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver as triton_driver
from triton.testing import do_bench

from .. import cuda
from ..backends import active_driver
from ..base.device import device
from ..base.dtypes import int32
from ..core import alloc, fields
from ..cuda.streams import current_stream_handle
from ..kernels import user_kernels


class _MinitensorAnswers:
    """What Triton asks its driver, answered by minitensor on both backends."""

    flush_bytes = 256 * 2**20  # Triton's own L2 flush buffer

    def get_current_device(self):
        return cuda.current_device()

    def set_current_device(self, index):
        cuda.set_device(index)

    def get_current_stream(self, index=None):
        return current_stream_handle(cuda.current_device() if index is None else index)

    def get_device_capability(self, index=None):
        return cuda.get_device_capability(index)

    def get_device_interface(self):
        return cuda

    def get_active_torch_device(self):  # Triton's name for it: the device its buffers are made on
        return device("cuda", cuda.current_device())

    def get_benchmarker(self):
        return do_bench

    def get_empty_cache_for_benchmark(self):
        return alloc.empty((self.flush_bytes // 4,), int32, self.get_active_torch_device())

    def clear_cache(self, cache):
        cache.zero_()

    @staticmethod
    def is_active():
        return True


class GpuTritonDriver(_MinitensorAnswers, user_kernels.TorchFreeCudaDriver):
    """Triton's CUDA driver (compile, load, launch) with minitensor's device and stream."""


class SimTritonDriver(_MinitensorAnswers, DriverBase):
    """The simulator's: no compiler, loader nor launcher (launches are diverted to the interpreter)."""

    flush_bytes = 4096  # no cache to flush; every flush is an interpreted fill

    def get_current_target(self):
        major, minor = self.get_device_capability()
        return GPUTarget("cuda", major * 10 + minor, 32)

    def map_python_to_cpp_type(self, ty):
        raise NotImplementedError("the simulated device compiles no launcher")


def install(driver):
    """Make minitensor Triton's active driver (`driver` is minitensor's backend)."""
    user_kernels.specialize_without_torch()
    if driver.interprets_kernels:
        triton_driver.set_active(SimTritonDriver())
        user_kernels.divert_launches(_run_interpreted, _takes_tensors)
    else:
        triton_driver.set_active(GpuTritonDriver())


def _takes_tensors(args, kwargs):
    return any(isinstance(a, fields.Tensor) for a in (*args, *kwargs.values()))


def _run_interpreted(kernel, args, kwargs, grid, warmup):
    """A launch on the simulator: the kernel interpreted on the current stream, in its order."""
    if warmup:
        return None
    form = user_kernels.interpreted(kernel)
    args = [_argument(a) for a in args]
    kwargs = {name: _argument(value) for name, value in kwargs.items()}

    def work():
        with user_kernels.interpret_nested_jit():
            form.run(*args, grid=grid, warmup=False, **kwargs)
    index = cuda.current_device()
    active_driver().enqueue(current_stream_handle(index), work, interpreted=True)
    return None


def _argument(value):
    """A tensor as the interpreter's pointer to its first element; other values as they are."""
    if not isinstance(value, fields.Tensor):
        return value
    if value.device.type != "cuda":
        raise ValueError(f"a Triton kernel takes cuda tensors, got a tensor on {value.device}")
    if value.dtype.is_complex:  # as on a GPU, where Triton finds no type for it either
        raise TypeError(f"a Triton kernel cannot take a {value.dtype} tensor: Triton has no complex type; pass "
                        "mt.view_as_real(t), its (real, imag) float pairs")
    return user_kernels.pointer_argument(value.data_ptr(), value.dtype.triton)
