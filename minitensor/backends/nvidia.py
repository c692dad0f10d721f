"""The real GPU, through NVIDIA's driver API (`cuda-bindings`).

One primary context per device, made current per thread on demand. User streams are created
non-blocking, so they never synchronise implicitly with the legacy default stream (handle 0).
Triton is given a driver object of ours before anything compiles: Triton 3.6's own CudaDriver imports
torch to find devices and streams.
"""
import ctypes
import threading
import uuid

from cuda.bindings import driver as cu

from ..errors import CudaError, OutOfMemoryError
from .base import DeviceProperties, Driver

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_OOM = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY


def _check(result):
    """cuda-bindings returns (CUresult, *values): raise on error, return the values."""
    err = result[0]
    if err != _SUCCESS:
        raise CudaError(int(err), _error_string(err))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _error_string(err):
    e, s = cu.cuGetErrorString(err)
    return s.decode() if e == _SUCCESS and s else f"CUresult {int(err)}"


class NvidiaDriver(Driver):
    name = "nvidia"

    def __init__(self):
        _check(cu.cuInit(0))
        self._count = _check(cu.cuDeviceGetCount())
        if self._count == 0:
            raise CudaError(100, "no CUDA-capable device is detected")
        self._devices = [_check(cu.cuDeviceGet(i)) for i in range(self._count)]
        self._contexts = [None] * self._count
        self._properties = [None] * self._count
        self._lock = threading.Lock()
        self._tls = threading.local()
        self._kernels = None  # minitensor.kernels.timing, loaded with the first sleep or gate
        self._activate_triton()

    # ------------------------------------------------------------------ devices
    def device_count(self):
        return self._count

    def properties(self, device):
        props = self._properties[device]
        if props is None:
            dev = self._devices[device]
            attr = cu.CUdevice_attribute
            name = _check(cu.cuDeviceGetName(256, dev)).split(b"\0", 1)[0].decode()
            props = DeviceProperties(
                name=name,
                total_memory=int(_check(cu.cuDeviceTotalMem(dev))),
                multi_processor_count=_check(cu.cuDeviceGetAttribute(
                    attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)),
                major=_check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)),
                minor=_check(cu.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)),
                uuid=uuid.UUID(bytes=bytes(_check(cu.cuDeviceGetUuid(dev)).bytes)))
            self._properties[device] = props
        return props

    def mem_get_info(self, device):
        self.set_device(device)
        free, total = _check(cu.cuMemGetInfo())
        return int(free), int(total)

    def set_device(self, device):
        """Make the device's primary context current in this thread (cheap when it already is)."""
        if getattr(self._tls, "device", None) == device:
            return
        ctx = self._contexts[device]
        if ctx is None:
            with self._lock:
                if self._contexts[device] is None:
                    self._contexts[device] = _check(cu.cuDevicePrimaryCtxRetain(self._devices[device]))
                ctx = self._contexts[device]
        _check(cu.cuCtxSetCurrent(ctx))
        self._tls.device = device

    def current_device(self):
        device = getattr(self._tls, "device", None)
        if device is None:
            self.set_device(0)
            device = 0
        return device

    def synchronize(self, device):
        self.set_device(device)
        _check(cu.cuCtxSynchronize())

    def error_string(self, code):
        try:
            return _error_string(cu.CUresult(code))
        except ValueError:
            return f"CUresult {code}"

    # ------------------------------------------------------------------ memory
    def malloc(self, device, nbytes):
        self.set_device(device)
        err, ptr = cu.cuMemAlloc(nbytes)
        if err == _OOM:
            raise OutOfMemoryError(f"CUDA error {int(err)}: {_error_string(err)}")
        if err != _SUCCESS:
            raise CudaError(int(err), _error_string(err))
        return int(ptr)

    def free(self, device, ptr):
        self.set_device(device)
        _check(cu.cuMemFree(ptr))

    def host_alloc(self, nbytes):
        self.current_device()  # a context must be current
        flags = cu.CU_MEMHOSTALLOC_PORTABLE | cu.CU_MEMHOSTALLOC_DEVICEMAP
        return int(_check(cu.cuMemHostAlloc(nbytes, flags)))

    def host_free(self, ptr):
        _check(cu.cuMemFreeHost(ptr))

    def host_register(self, ptr, nbytes):
        self.current_device()
        _check(cu.cuMemHostRegister(ptr, nbytes, cu.CU_MEMHOSTREGISTER_PORTABLE))

    def host_unregister(self, ptr):
        _check(cu.cuMemHostUnregister(ptr))

    def memcpy_async(self, dst, src, nbytes, stream):
        self.current_device()
        _check(cu.cuMemcpyAsync(dst, src, nbytes, stream))

    # ------------------------------------------------------------------ streams
    def stream_create(self, device, priority):
        self.set_device(device)
        low, high = _check(cu.cuCtxGetStreamPriorityRange())  # numerically: low is the least urgent
        priority = max(min(priority, low), high)
        return int(_check(cu.cuStreamCreateWithPriority(cu.CUstream_flags.CU_STREAM_NON_BLOCKING, priority)))

    def stream_query(self, stream):
        self.current_device()
        err = cu.cuStreamQuery(stream)[0]
        if err == _NOT_READY:
            return False
        if err != _SUCCESS:
            raise CudaError(int(err), _error_string(err))
        return True

    def stream_synchronize(self, stream):
        self.current_device()
        _check(cu.cuStreamSynchronize(stream))

    def stream_wait_event(self, stream, event):
        self.current_device()
        _check(cu.cuStreamWaitEvent(stream, event, 0))

    # ------------------------------------------------------------------ events
    def event_create(self, device, enable_timing, blocking):
        self.set_device(device)
        flags = 0 if enable_timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        if blocking:
            flags |= cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC
        return int(_check(cu.cuEventCreate(int(flags))))

    def event_destroy(self, event):
        _check(cu.cuEventDestroy(event))

    def event_record(self, event, stream):
        self.current_device()
        _check(cu.cuEventRecord(event, stream))

    def event_query(self, event):
        err = cu.cuEventQuery(event)[0]
        if err == _NOT_READY:
            return False
        if err != _SUCCESS:
            raise CudaError(int(err), _error_string(err))
        return True

    def event_synchronize(self, event):
        _check(cu.cuEventSynchronize(event))

    def event_elapsed_ms(self, start, end):
        return float(_check(cu.cuEventElapsedTime(start, end)))

    # ------------------------------------------------------------------ kernels
    def compile(self, device, kernel, signature, constexprs, aligned, num_warps):
        from ..kernels import compat
        self.set_device(device)
        props = self.properties(device)
        launch = compat.compile_cuda(kernel, signature, constexprs, aligned, props.major * 10 + props.minor,
                                     num_warps)
        set_device = self.set_device

        def launch_on_device(gx, gy, gz, stream, *args):
            set_device(device)  # the module lives in this device's context; cheap when already current
            launch(gx, gy, gz, stream, *args)
        return launch_on_device

    def _activate_triton(self):
        """Install a Triton driver that asks us, not torch, for devices, streams and capabilities."""
        from triton.backends.nvidia.driver import CudaDriver, CudaLauncher, CudaUtils
        from triton.runtime import driver as triton_driver
        outer = self

        class MinitensorTritonDriver(CudaDriver):
            def __init__(self):  # CudaDriver.__init__ would import torch
                self.utils = CudaUtils()
                self.launcher_cls = CudaLauncher

            def get_current_device(self):
                return outer.current_device()

            def set_current_device(self, device):
                outer.set_device(device)

            def get_current_stream(self, device):
                from .. import cuda
                return cuda.current_stream(device).cuda_stream

            def get_device_capability(self, device):
                props = outer.properties(device)
                return props.major, props.minor

            @staticmethod
            def is_active():
                return True

        self.current_device()
        triton_driver.set_active(MinitensorTritonDriver())

    # ------------------------------------------------------------------ test helpers
    def _timing_kernels(self):
        if self._kernels is None:
            from ..kernels import timing
            self._kernels = timing
        return self._kernels

    def sleep(self, stream, ms):
        self._timing_kernels().spin_sleep(stream, int(ms * 1e6))

    def gate_create(self):
        host = self.host_alloc(8)
        ctypes.c_int32.from_address(host).value = 0
        device_ptr = int(_check(cu.cuMemHostGetDevicePointer(host, 0)))
        return host, device_ptr

    def gate_wait(self, gate, stream):
        self._timing_kernels().spin_on_flag(stream, gate[1])

    def gate_open(self, gate):
        ctypes.c_int32.from_address(gate[0]).value = 1
