"""The real GPU, through NVIDIA's driver API (`cuda-bindings`).

One primary context per device, made current per thread on demand. User streams are created
non-blocking, so they never synchronise implicitly with the legacy default stream (handle 0).
Compiled kernels are loaded with cuModuleLoadData and launched by minitensor's C launcher (kernels/_launch.c),
so Triton's runtime driver, whose 3.6 version imports torch, is never used.
"""
import ctypes
import threading
import uuid

from cuda.bindings import driver as cu

from ..base.errors import CudaError, OutOfMemoryError
from .base import DeviceProperties, Driver, ThreadDevice
from .mapped_pages import MappedPages

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_OOM = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
_NOT_READY = cu.CUresult.CUDA_ERROR_NOT_READY
# cuEventCreate's flags by (enable_timing, blocking), made once: an enum's construction costs more than the call
_EVENT_FLAGS = {(timing, blocking): (0 if timing else int(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING))
                | (int(cu.CUevent_flags.CU_EVENT_BLOCKING_SYNC) if blocking else 0)
                for timing in (False, True) for blocking in (False, True)}
_MODES = {"global": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
          "thread_local": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
          "relaxed": cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED}
_RELAXED = _MODES["relaxed"]
_INVALID_VALUE = cu.CUresult.CUDA_ERROR_INVALID_VALUE


def _check(result):
    """cuda-bindings returns (CUresult, *values): raise on error, return the values."""
    err = result[0]
    if err != _SUCCESS:
        raise CudaError(int(err), _error_string(err))
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def _code_string(code):
    try:
        return _error_string(cu.CUresult(code))
    except ValueError:  # not a CUresult this cuda-bindings knows
        return f"CUresult {code}"


def _error_string(err):
    e, s = cu.cuGetErrorString(err)
    return s.decode() if e == _SUCCESS and s else f"CUresult {int(err)}"


def _invalid():
    return CudaError(int(_INVALID_VALUE), _error_string(_INVALID_VALUE))


def _check_memory(result):
    """`_check` for a call that allocates device memory: CUDA's out of memory is OutOfMemoryError."""
    if result[0] == _OOM:
        raise OutOfMemoryError(f"CUDA error {int(_OOM)}: {_error_string(_OOM)}")
    return _check(result)


def _on_device(device):
    """A CUmemLocation's (type, id) for `device`: where an expandable segment's pages live, and who reaches them."""
    return cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE, device


def _allocation_prop(device):
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type, prop.location.id = _on_device(device)
    return prop


def _read_write(device):
    desc = cu.CUmemAccessDesc()
    desc.location.type, desc.location.id = _on_device(device)
    desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


def _pointer_attribute(name, ptr):
    return _check(cu.cuPointerGetAttribute(getattr(cu.CUpointer_attribute, "CU_POINTER_ATTRIBUTE_" + name), ptr))


def _device_range(ptr):
    """(device or None for host memory, start, size) of the allocation, mapping or registration holding ptr, as
    cuPointerGetAttribute reports it, or None."""
    err, start = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr)
    if err == cu.CUresult.CUDA_ERROR_INVALID_VALUE:
        return None
    _check((err,))
    nbytes = int(_pointer_attribute("RANGE_SIZE", ptr))
    if int(_pointer_attribute("MEMORY_TYPE", ptr)) == int(cu.CUmemorytype.CU_MEMORYTYPE_HOST):
        return None, int(start), nbytes
    return int(_pointer_attribute("DEVICE_ORDINAL", ptr)), int(start), nbytes


def _query(function, handle):
    """cuStreamQuery / cuEventQuery: True when done, False while work is pending."""
    err = function(handle)[0]
    if err == _NOT_READY:
        return False
    if err != _SUCCESS:
        raise CudaError(int(err), _error_string(err))
    return True


def _relaxed(function, *args):
    """`function(*args)` in the relaxed capture mode. While a stream captures in the global mode (or in this
    thread's thread-local mode), a potentially unsafe call (an allocation, a graph's instantiation) is refused
    and invalidates the capture; minitensor's own calls of these kinds never touch a capturing stream."""
    mode = _check(cu.cuThreadExchangeStreamCaptureMode(_RELAXED))
    try:
        return function(*args)
    finally:
        _check(cu.cuThreadExchangeStreamCaptureMode(mode))


class NvidiaDriver(Driver):
    name = "nvidia"

    def __init__(self, prepare_first_op=None):
        """`prepare_first_op`, when given, runs on a thread while the first context is created (~100 ms with
        the GIL released), to load what the first op needs next."""
        _check(cu.cuInit(0))
        self._count = _check(cu.cuDeviceGetCount())
        if self._count == 0:
            raise CudaError(100, "no CUDA-capable device is detected")
        self._devices = [_check(cu.cuDeviceGet(i)) for i in range(self._count)]
        self._contexts = [None] * self._count
        self._properties = [None] * self._count
        self._granularity = [None] * self._count
        self._vmm_reserved = [{} for _ in range(self._count)]  # per device: reserved range's address -> size
        self._vmm_pages = [MappedPages() for _ in range(self._count)]  # per device: mapped page -> size
        self._vmm_handles = [{} for _ in range(self._count)]  # per device: mapped page -> its cuMemCreate
        self._lock = threading.Lock()
        self._tls = ThreadDevice()
        self._prepare_first_op = prepare_first_op

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
                uuid=uuid.UUID(bytes=bytes(_check(cu.cuDeviceGetUuid(dev)).bytes)),
                shared_memory_per_block_optin=_check(cu.cuDeviceGetAttribute(
                    attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev)))
            self._properties[device] = props
        return props

    def mem_get_info(self, device):
        self.set_device(device)
        free, total = _check(cu.cuMemGetInfo())
        return int(free), int(total)

    def set_device(self, device):
        """Make the device's primary context current in this thread (cheap when it already is)."""
        if self._tls.device == device:
            return
        ctx = self._contexts[device]
        if ctx is None:
            with self._lock:
                if self._contexts[device] is None:
                    if not any(self._contexts) and self._prepare_first_op is not None:
                        threading.Thread(target=self._prepare_first_op, daemon=True,
                                         name="minitensor-first-op").start()
                    self._contexts[device] = _check(cu.cuDevicePrimaryCtxRetain(self._devices[device]))
                ctx = self._contexts[device]
        _check(cu.cuCtxSetCurrent(ctx))
        self._tls.device = device

    def current_device(self):
        device = self._tls.device
        if device is None:
            self.set_device(0)
            device = 0
        return device

    def synchronize(self, device):
        self.set_device(device)
        _check(cu.cuCtxSynchronize())

    def error_string(self, code):
        return _code_string(code)

    # ------------------------------------------------------------------ memory
    def malloc(self, device, nbytes):
        """cuMemAlloc in the relaxed capture mode, as torch's cudaMallocMaybeCapturing (see `_relaxed`)."""
        self.set_device(device)
        err, ptr = _relaxed(cu.cuMemAlloc, nbytes)
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
        return int(_check(_relaxed(cu.cuMemHostAlloc, nbytes, flags)))

    def host_free(self, ptr):
        _check(cu.cuMemFreeHost(ptr))

    def host_register(self, ptr, nbytes):
        self.current_device()
        _check(_relaxed(cu.cuMemHostRegister, ptr, nbytes, cu.CU_MEMHOSTREGISTER_PORTABLE))

    def host_unregister(self, ptr):
        _check(cu.cuMemHostUnregister(ptr))

    def memory_range(self, ptr):
        """In one of our expandable segments, the run of mapped pages holding ptr (CUDA would report the whole
        reserved range, mapped or not); elsewhere cuPointerGetAttribute's range, None where it finds nothing (so
        another library's expandable segment is its reserved range)."""
        with self._lock:
            for device, reserved in enumerate(self._vmm_reserved):
                if any(base <= ptr < base + size for base, size in reserved.items()):
                    run = self._vmm_pages[device].run(ptr)
                    return None if run is None else (device, *run)
        self.current_device()  # the query needs a current context
        return _device_range(ptr)

    def memcpy_async(self, dst, src, nbytes, stream):
        self.current_device()
        _check(cu.cuMemcpyAsync(dst, src, nbytes, stream))

    def can_access_peer(self, device, peer):
        if device == peer:
            return False
        return bool(_check(cu.cuDeviceCanAccessPeer(self._devices[device], self._devices[peer])))

    def enable_peer_access(self, device, peer):
        """Map `peer`'s memory into `device`'s context (cuCtxEnablePeerAccess); enabled already is fine."""
        self.set_device(peer)  # retains the peer's primary context
        self.set_device(device)
        err = cu.cuCtxEnablePeerAccess(self._contexts[peer], 0)[0]
        if err not in (_SUCCESS, cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED):
            raise CudaError(int(err), _error_string(err))

    def memcpy_peer_async(self, dst, dst_device, src, src_device, nbytes, stream):
        self.current_device()
        _check(cu.cuMemcpyPeerAsync(dst, self._contexts[dst_device], src, self._contexts[src_device], nbytes,
                                    stream))

    # ------------------------------------------------------------------ expandable segments
    def vmm_granularity(self, device):
        granularity = self._granularity[device]
        if granularity is None:
            minimum = cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
            granularity = int(_check(cu.cuMemGetAllocationGranularity(_allocation_prop(device), minimum)))
            self._granularity[device] = granularity
        return granularity

    def vmm_reserve(self, device, nbytes):
        """Relaxed, as malloc: a graph's private pool may grow while a stream captures."""
        self.set_device(device)
        ptr = int(_check(_relaxed(cu.cuMemAddressReserve, nbytes, 0, 0, 0)))
        with self._lock:
            self._vmm_reserved[device][ptr] = nbytes
        return ptr

    def vmm_map(self, device, ptr, nbytes, page):
        """Each page is its own cuMemCreate, mapped alone, so any one can be unmapped later; one cuMemSetAccess
        then opens the range to the device. Relaxed, as malloc."""
        self.set_device(device)
        granularity = self.vmm_granularity(device)
        if page <= 0 or page % granularity or ptr % granularity or nbytes <= 0 or nbytes % page:
            raise _invalid()
        starts = range(ptr, ptr + nbytes, page)
        with self._lock:
            reserved = self._vmm_reserved[device].items()
            inside = any(base <= ptr and ptr + nbytes <= base + size for base, size in reserved)
            if not inside or self._vmm_pages[device].overlaps(ptr, ptr + nbytes):
                raise _invalid()
        handles = _relaxed(self._map_pages, device, starts)
        with self._lock:
            self._vmm_handles[device].update(zip(starts, handles))
            self._vmm_pages[device].update((start, page) for start in starts)

    def _map_pages(self, device, starts):
        """The handles of the pages created and mapped at `starts`. On a failure part-way (out of memory, most
        likely) what this call mapped and created is undone first, so nothing is left half-mapped."""
        page, prop, created, mapped = starts.step, _allocation_prop(device), [], []
        try:
            for start in starts:
                created.append(_check_memory(cu.cuMemCreate(page, prop, 0)))
                _check_memory(cu.cuMemMap(start, page, 0, created[-1], 0))
                mapped.append(start)
            _check_memory(cu.cuMemSetAccess(starts.start, len(starts) * page, [_read_write(device)], 1))
        except BaseException:
            for start in mapped:
                cu.cuMemUnmap(start, page)
            for handle in created:
                cu.cuMemRelease(handle)
            raise
        return created

    def vmm_unmap(self, device, ptr, nbytes):
        """cuMemFree waits for the device's work but cuMemUnmap does not: synchronize first, so no queued kernel
        touches a page after it is released."""
        self.synchronize(device)
        with self._lock:
            pages = self._vmm_pages[device]
            starts = pages.tiling(ptr, nbytes)  # whole pages this driver mapped, and only those
            if starts is None:
                raise _invalid()
            unmapping = [(start, pages.pop(start), self._vmm_handles[device].pop(start)) for start in starts]
        for start, page, handle in unmapping:
            _check(cu.cuMemUnmap(start, page))
            _check(cu.cuMemRelease(handle))

    def vmm_release(self, device, ptr, nbytes):
        with self._lock:
            if self._vmm_reserved[device].get(ptr) != nbytes or self._vmm_pages[device].overlaps(ptr, ptr + nbytes):
                raise _invalid()
            del self._vmm_reserved[device][ptr]
        self.set_device(device)
        _check(cu.cuMemAddressFree(ptr, nbytes))

    # ------------------------------------------------------------------ streams
    def stream_create(self, device, priority):
        self.set_device(device)
        low, high = _check(cu.cuCtxGetStreamPriorityRange())  # numerically: low is the least urgent
        priority = max(min(priority, low), high)
        return int(_check(cu.cuStreamCreateWithPriority(cu.CUstream_flags.CU_STREAM_NON_BLOCKING, priority)))

    def stream_query(self, stream):
        self.current_device()
        return _query(cu.cuStreamQuery, stream)

    def stream_synchronize(self, stream):
        self.current_device()
        _check(cu.cuStreamSynchronize(stream))

    def stream_wait_event(self, stream, event):
        self.current_device()
        _check(cu.cuStreamWaitEvent(stream, event, 0))

    # ------------------------------------------------------------------ events
    def event_create(self, device, enable_timing, blocking):
        self.set_device(device)
        return int(_check(cu.cuEventCreate(_EVENT_FLAGS[bool(enable_timing), bool(blocking)])))

    def event_destroy(self, event):
        _check(cu.cuEventDestroy(event))

    def event_record(self, event, stream):
        self.current_device()
        _check(cu.cuEventRecord(event, stream))

    def event_query(self, event):
        return _query(cu.cuEventQuery, event)

    def event_synchronize(self, event):
        _check(cu.cuEventSynchronize(event))

    def event_elapsed_ms(self, start, end):
        return float(_check(cu.cuEventElapsedTime(start, end)))

    # ------------------------------------------------------------------ kernels
    def load_function(self, device, cubin, name, shared):
        """Load a compiled kernel into the device's context: (function handle, context handle) as ints."""
        self.set_device(device)
        module = _check(cu.cuModuleLoadData(cubin))
        function = _check(cu.cuModuleGetFunction(module, name.encode()))
        if shared > 49152:  # beyond 48 KiB, dynamic shared memory must be asked for, as Triton's loader does
            attr = cu.CUfunction_attribute
            static = _check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function))
            optin = _check(cu.cuDeviceGetAttribute(
                cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, self._devices[device]))
            _check(cu.cuFuncSetCacheConfig(function, cu.CUfunc_cache.CU_FUNC_CACHE_PREFER_SHARED))
            _check(cu.cuFuncSetAttribute(function, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                         optin - static))
        return int(function), int(self._contexts[device])

    def load_module(self, device, image):
        """Load a cubin, or PTX (a bytes string ending in NUL) that the driver compiles, into the device's context."""
        self.set_device(device)
        return int(_check(cu.cuModuleLoadData(image))), int(self._contexts[device])

    def module_function(self, module, name):
        try:
            return int(_check(cu.cuModuleGetFunction(cu.CUmodule(module), name.encode())))
        except CudaError as e:
            raise AttributeError(f"the module has no kernel named {name!r} ({e})") from None

    # ------------------------------------------------------------------ graphs
    def stream_begin_capture(self, stream, mode):
        self.current_device()
        _check(cu.cuStreamBeginCapture(stream, _MODES[mode]))

    def stream_end_capture(self, stream):
        self.current_device()
        return int(_check(cu.cuStreamEndCapture(stream)))

    def graph_node_count(self, graph):
        return int(_check(cu.cuGraphGetNodes(graph, 0))[1])

    # instantiating and destroying are unsafe calls: relaxed, so another capture underway goes on
    def graph_instantiate(self, graph):
        self.current_device()
        return int(_check(_relaxed(cu.cuGraphInstantiate, graph, 0)))

    def graph_destroy(self, graph):
        _check(_relaxed(cu.cuGraphDestroy, graph))

    def graph_exec_destroy(self, graph_exec):
        _check(_relaxed(cu.cuGraphExecDestroy, graph_exec))

    def graph_launch(self, graph_exec, stream):
        self.current_device()
        _check(cu.cuGraphLaunch(graph_exec, stream))

    # ------------------------------------------------------------------ gates (spin kernels wait on them)
    def gate_create(self):
        """An int32 flag in mapped pinned memory: (host address, device address). It is never freed: a spin
        kernel may read it after the host opens the gate, and it is 8 bytes per gate of a test helper."""
        host = self.host_alloc(8)
        ctypes.c_int32.from_address(host).value = 0
        return host, int(_check(cu.cuMemHostGetDevicePointer(host, 0)))

    def gate_device_pointer(self, gate):
        return gate[1]

    def gate_open(self, gate):
        ctypes.c_int32.from_address(gate[0]).value = 1
