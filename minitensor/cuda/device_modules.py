"""The module of a device type a third party registered (backends/registry.py): what
`mt.get_device_module("fake")` gives, as torch.get_device_module gives `torch.mtia`.

Its devices, streams, events and memory are minitensor's own over the registered driver: the StreamTable of
streams.py (stream pools, ids, each thread's current stream), one DeviceCachingAllocator per device, and byte
copies to and from the host. minitensor's kernels run only on cuda, so a registered type's tensors hold and move
bytes (factories, `to`, `cpu`, `copy_`), while ops on them raise NotImplementedError (ops/typing.py).
"""
import threading
import types

from ..allocator import DeviceCachingAllocator, settings as allocator_settings
from ..backends import registered_device_types, registered_driver
from .streams import GenericEvent, GenericStream, current_stream_of, set_stream, stream, table_for

_modules = {}
_lock = threading.Lock()


def module_for(type_name):
    """The DeviceModule of a registered device type, made on first use."""
    module = _modules.get(type_name)
    if module is None:
        if type_name not in registered_device_types():
            raise RuntimeError(f"Device '{type_name}' does not have a corresponding module registered as "
                               f"'minitensor.{type_name}'")
        with _lock:
            module = _modules.get(type_name) or _modules.setdefault(type_name, DeviceModule(type_name))
    return module


class _DeviceContext:
    """Context manager: the device current inside, the previous one restored after; None changes nothing."""

    _module = None  # set in each device module's subclass

    def __init__(self, device):
        self.index = None if device is None else self._module._index(device)
        self.previous = None

    def __enter__(self):
        if self.index is not None:
            self.previous = self._module.current_device()
            self._module.set_device(self.index)
        return self

    def __exit__(self, *exc):
        if self.index is not None:
            self._module.set_device(self.previous)
        return False


class DeviceModule(types.ModuleType):
    """torch.<backend>'s functions for one registered device type: `Stream`, `Event`, `current_stream`,
    `stream`, `device`, `current_device`, `set_device`, `device_count`, `synchronize` and the memory API."""

    stream = staticmethod(stream)
    set_stream = staticmethod(set_stream)

    def __init__(self, type_name):
        super().__init__(f"minitensor.{type_name}")
        self._table = table = table_for(type_name)
        self.device_type = type_name
        self.Stream = type("Stream", (GenericStream,), {"__slots__": (), "_device_type": type_name,
                                                        "__module__": self.__name__})
        self.Event = type("Event", (GenericEvent,), {"__slots__": (), "_device_type": type_name,
                                                     "__module__": self.__name__})
        self.device = type("device", (_DeviceContext,), {"_module": self, "__module__": self.__name__})
        table.stream_class, table.event_class = self.Stream, self.Event
        self._allocators = {}
        self._allocators_lock = threading.Lock()

    @property
    def _driver(self):
        return registered_driver(self.device_type)

    def _index(self, device):
        return self._table.device_of(device).index

    def device_count(self):
        return self._driver.device_count()

    def is_available(self):
        return self.device_count() > 0

    def current_device(self):
        return self._driver.current_device()

    def set_device(self, device):
        self._driver.set_device(self._index(device))

    def current_stream(self, device=None):
        return current_stream_of(self._table, device)

    def default_stream(self, device=None):
        return self.Stream(self._index(device), _handle=0)

    def synchronize(self, device=None):
        self._driver.synchronize(self._index(device))

    def get_device_properties(self, device=None):
        return self._driver.properties(self._index(device))

    # ------------------------------------------------------------------ memory
    def allocator(self, index):
        """The caching allocator of device `index`, created on first use."""
        a = self._allocators.get(index)
        if a is None:
            with self._allocators_lock:
                a = self._allocators.get(index)
                if a is None:
                    a = self._allocators[index] = DeviceCachingAllocator(self._driver, index,
                                                                         allocator_settings.current())
        return a

    def current_stream_handle(self, index):
        return self._table.current_handles()[index]

    def memory_stats(self, device=None):
        return self.allocator(self._index(device)).memory_stats()

    def memory_allocated(self, device=None):
        return self.allocator(self._index(device)).allocated_bytes()

    def max_memory_allocated(self, device=None):
        return self.allocator(self._index(device)).peak("allocated_bytes")

    def memory_reserved(self, device=None):
        return self.allocator(self._index(device)).reserved_bytes()

    def max_memory_reserved(self, device=None):
        return self.allocator(self._index(device)).peak("reserved_bytes")

    def reset_peak_memory_stats(self, device=None):
        self.allocator(self._index(device)).reset_peak_stats()

    def reset_accumulated_memory_stats(self, device=None):
        self.allocator(self._index(device)).reset_accumulated_stats()

    def empty_cache(self):
        for a in list(self._allocators.values()):
            a.empty_cache()

    def mem_get_info(self, device=None):
        return self._driver.mem_get_info(self._index(device))

    def copy_bytes(self, dst, dst_device, src, src_device, nbytes):
        """`nbytes` between the host (device None) and a device of this type, on that device's current stream;
        the host waits for it (host memory here is pageable)."""
        index = src_device if dst_device is None else dst_device
        handle = self.current_stream_handle(index)
        driver = self._driver
        self._table.on_device(index, driver.memcpy_async, dst, src, nbytes, handle)
        self._table.on_device(index, driver.stream_synchronize, handle)

    def __repr__(self):
        return f"<minitensor device module '{self.device_type}'>"
