"""Pinned host memory: the process's caching host allocator (minitensor.allocator.host) behind
`pin_memory`, torch.cuda's host memory functions over it, and `host_register`/`host_unregister`, which pin
the memory of an existing CPU tensor in place.
"""
import ctypes
import threading

import numpy as np

from ..allocator import HostCachingAllocator, settings as allocator_settings
from ..backends import active_driver
from . import capturing

__all__ = ["host_empty_cache", "host_memory_stats", "host_register", "host_unregister",
           "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats"]

_allocator = None
_lock = threading.Lock()
_registered = {}  # address -> (nbytes, storage): host_register'd memory, its storage kept alive until unregistered


def allocator():
    """The host caching allocator, created on first use with the current allocator settings."""
    global _allocator
    if _allocator is None:
        with _lock:
            if _allocator is None:
                _allocator = HostCachingAllocator(active_driver(), allocator_settings.current(), capturing.underway)
    return _allocator


def configure(settings):
    """New allocator settings (mt.cuda.memory.set_allocator_settings): the pinned_* keys apply from the next
    allocation."""
    if _allocator is not None:
        _allocator.configure(settings)


def host_array(block, nbytes):
    """The numpy uint8 array over a block's first `nbytes` bytes, kept on the block: a block handed out
    again for the same size needs no new one."""
    array = block.array
    if array is None or array.size != nbytes:
        if not nbytes:
            return np.empty(0, np.uint8)
        array = block.array = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(block.ptr), np.uint8)
    return array


# ---------------------------------------------------------------------------- statistics and cache
def host_memory_stats():
    """torch's dict: allocations/allocated_bytes/active_requests/active_bytes .current/.peak/.allocated/.freed,
    num_host_alloc, num_host_free, host_alloc_time/host_free_time .total/.max/.min/.count/.avg (us)."""
    return allocator().memory_stats()


def reset_peak_host_memory_stats():
    allocator().reset_peak_stats()


def reset_accumulated_host_memory_stats():
    allocator().reset_accumulated_stats()


def host_empty_cache():
    """Give every cached pinned block back to the driver (blocks still used by copies stay)."""
    allocator().empty_cache()


# ---------------------------------------------------------------------------- registering existing memory
def _cpu_storage(obj, what):
    """The storage of a tensor, or a storage itself (read through their methods: this layer is below both)."""
    storage = obj.untyped_storage() if hasattr(obj, "untyped_storage") else obj
    if not all(hasattr(storage, name) for name in ("data_ptr", "nbytes", "is_pinned", "device")):
        raise TypeError(f"{what}() expects a CPU Tensor or UntypedStorage, got {type(obj).__name__}")
    if storage.device.type != "cpu":
        raise ValueError(f"{what}() expects CPU memory, got a tensor on {storage.device}")
    return storage


def host_register(tensor):
    """Page-lock the memory of an existing CPU tensor's storage (cuMemHostRegister): it `is_pinned()`, and
    non_blocking copies from and to it are asynchronous. Its storage stays alive until host_unregister."""
    storage = _cpu_storage(tensor, "host_register")
    nbytes = storage.nbytes()
    if not nbytes:
        raise ValueError("host_register() expects a tensor with memory, got one of 0 bytes")
    if storage.is_pinned():
        raise RuntimeError("host_register(): the tensor's memory is already pinned")
    ptr = storage.data_ptr()
    with _lock:
        active_driver().host_register(ptr, nbytes)
        _registered[ptr] = (nbytes, storage)


def host_unregister(tensor):
    """Undo host_register of the same tensor's memory."""
    storage = _cpu_storage(tensor, "host_unregister")
    ptr = storage.data_ptr()
    with _lock:
        if ptr not in _registered:
            raise RuntimeError(f"host_unregister(): the memory at {ptr:#x} was not registered with host_register")
        active_driver().host_unregister(ptr)
        del _registered[ptr]


def is_registered(ptr, nbytes):
    """Whether [ptr, ptr + nbytes) lies in memory registered with host_register."""
    if not _registered:
        return False
    return any(base <= ptr and ptr + nbytes <= base + size for base, (size, _) in list(_registered.items()))
