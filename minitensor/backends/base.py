"""The driver interface: everything minitensor asks of a device, in one small class.

Handles are plain ints, as in CUDA's driver API: device pointers, stream handles (0 is the legacy default
stream of the calling thread's current device) and event handles. Calls that take no device act on the
calling thread's current device, which `set_device` chooses, again as in CUDA.
"""
import threading
import uuid
from dataclasses import dataclass


class ThreadDevice(threading.local):
    """Per thread: the device set current by `set_device`, None until then (a class default, so reading it
    is a plain attribute lookup on every call that needs it)."""
    device = None


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    total_memory: int
    multi_processor_count: int
    major: int
    minor: int
    uuid: uuid.UUID
    shared_memory_per_block_optin: int  # the most shared memory one block may ask for, in bytes

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count}, uuid={self.uuid})")


class Driver:
    """Abstract driver. `nvidia.NvidiaDriver` and `sim.SimDriver` implement every method but those a flag below
    rules out for them; the allocator is tested against a fake one. Every method minitensor calls on a driver
    is declared here (tests/test_architecture.py checks it)."""

    name = "abstract"

    # devices; `current_device` is the calling thread's, device 0 until `set_device`
    def device_count(self): raise NotImplementedError
    def properties(self, device): raise NotImplementedError
    def mem_get_info(self, device): raise NotImplementedError
    def current_device(self): raise NotImplementedError
    def set_device(self, device): raise NotImplementedError
    def synchronize(self, device): raise NotImplementedError
    def error_string(self, code): raise NotImplementedError

    # memory: malloc raises OutOfMemoryError when the device is full; it may run while a stream captures (the
    # new memory is not part of the graph)
    def malloc(self, device, nbytes): raise NotImplementedError
    def free(self, device, ptr): raise NotImplementedError
    def host_alloc(self, nbytes): raise NotImplementedError
    def host_free(self, ptr): raise NotImplementedError
    def host_register(self, ptr, nbytes): raise NotImplementedError
    def host_unregister(self, ptr): raise NotImplementedError
    def memcpy_async(self, dst, src, nbytes, stream): raise NotImplementedError
    # what holds an address another library gave: (device, start, nbytes) of the allocation or registration
    # `ptr` lies in (device None for pinned host memory, which every device reaches), or None when none does; in
    # an expandable segment of ours, the run of mapped pages holding ptr
    def memory_range(self, ptr): raise NotImplementedError
    # between devices: can `device` reach `peer`'s memory directly; let it (once per pair); copy on `stream`
    # (a stream of the current device)
    def can_access_peer(self, device, peer): raise NotImplementedError
    def enable_peer_access(self, device, peer): raise NotImplementedError
    def memcpy_peer_async(self, dst, dst_device, src, src_device, nbytes, stream): raise NotImplementedError

    # expandable segments (CUDA's virtual memory management): an address range reserved once, into which physical
    # pages are mapped and unmapped again. Addresses and sizes are multiples of `vmm_granularity(device)`.
    # vmm_map maps [ptr, ptr + nbytes) as pages of `page` bytes, each its own physical allocation so that any page
    # can be unmapped later, and raises OutOfMemoryError, having mapped none of them, when the device is full;
    # vmm_unmap first waits for the device's work (as free does; cuMemUnmap does not), then unmaps and releases
    # whole pages; vmm_release gives back a reserved range with no page mapped. vmm_reserve returns the address.
    def vmm_granularity(self, device): raise NotImplementedError
    def vmm_reserve(self, device, nbytes): raise NotImplementedError
    def vmm_map(self, device, ptr, nbytes, page): raise NotImplementedError
    def vmm_unmap(self, device, ptr, nbytes): raise NotImplementedError
    def vmm_release(self, device, ptr, nbytes): raise NotImplementedError

    # streams and events
    def stream_create(self, device, priority): raise NotImplementedError
    def stream_query(self, stream): raise NotImplementedError
    def stream_synchronize(self, stream): raise NotImplementedError
    def stream_wait_event(self, stream, event): raise NotImplementedError
    def event_create(self, device, enable_timing, blocking): raise NotImplementedError
    def event_destroy(self, event): raise NotImplementedError
    def event_record(self, event, stream): raise NotImplementedError
    def event_query(self, event): raise NotImplementedError
    def event_synchronize(self, event): raise NotImplementedError
    def event_elapsed_ms(self, start, end): raise NotImplementedError

    # kernels: a GPU loads compiled binaries (`load_function` gives the raw function and context handles for
    # minitensor's C launcher, kernels/_launch.c); the simulator interprets the @triton.jit function itself,
    # `wrappers` turning each raw launch argument into what the interpreter takes. Either way a launch is
    # launch(grid_x, grid_y, grid_z, stream, *args), which enqueues one kernel.
    interprets_kernels = False
    def load_function(self, device, cubin, name, shared): raise NotImplementedError
    # a user's compiled CUDA C++ (cubin or PTX): the module loaded once, (module, context) handles, then each of
    # its kernels by (lowered) name
    def load_module(self, device, image): raise NotImplementedError
    def module_function(self, module, name): raise NotImplementedError
    def interpret(self, device, kernel, wrappers, constexprs): raise NotImplementedError
    # the simulator runs host work in a stream's order: `work()` after everything enqueued before it (emulated
    # CUDA C++ kernels), or, with `interpreted`, holding the interpreter (a user's @triton.jit kernel)
    def enqueue(self, stream, work, interpreted=False): raise NotImplementedError

    # CUDA graphs. Between begin and end a stream captures: the work enqueued on it, and on every stream that
    # waits for an event recorded in the capture (a stream joins so, and must rejoin the origin stream before
    # the end), is recorded into a graph instead of running. `mode` is "global", "thread_local" or
    # "relaxed" (CUDA's capture modes). `stream_end_capture` returns the graph handle, or raises CudaError
    # (the capture was invalidated, a joined stream did not rejoin); either way the streams capture no longer.
    # A graph is instantiated into an executable graph that `graph_launch` enqueues as a whole on a stream.
    def stream_begin_capture(self, stream, mode): raise NotImplementedError
    def stream_end_capture(self, stream): raise NotImplementedError
    def graph_node_count(self, graph): raise NotImplementedError
    def graph_instantiate(self, graph): raise NotImplementedError
    def graph_destroy(self, graph): raise NotImplementedError
    def graph_exec_destroy(self, graph_exec): raise NotImplementedError
    def graph_launch(self, graph_exec, stream): raise NotImplementedError

    # the stream waits behind mt.cuda.sleep and mt.cuda.Gate. A gate is a flag the host sets; with
    # `host_waits` the driver's streams wait on the host (`sleep`, `gate_wait`), else minitensor launches spin
    # kernels (kernels/timing.py) that read the gate's device address (`gate_device_pointer`)
    host_waits = False
    def sleep(self, stream, ms): raise NotImplementedError
    def gate_create(self): raise NotImplementedError
    def gate_wait(self, gate, stream): raise NotImplementedError
    def gate_device_pointer(self, gate): raise NotImplementedError
    def gate_open(self, gate): raise NotImplementedError
