"""Device memory: one caching allocator per device, and the torch.cuda.memory functions over it."""
import threading

from ..backends import active_driver

_allocators = {}
_lock = threading.Lock()


def allocator(index):
    """The caching allocator of device `index`, created on first use."""
    a = _allocators.get(index)
    if a is None:
        from minitensor.allocator import DeviceCachingAllocator
        with _lock:
            a = _allocators.get(index)
            if a is None:
                a = _allocators[index] = DeviceCachingAllocator(active_driver(), index)
    return a


def _allocator_of(device):
    from . import _index
    return allocator(_index(device))


def empty_cache():
    for a in list(_allocators.values()):
        a.empty_cache()


def memory_allocated(device=None):
    return _allocator_of(device).stats()["allocated_bytes"]


def max_memory_allocated(device=None):
    return _allocator_of(device).stats()["peak_allocated_bytes"]


def memory_reserved(device=None):
    return _allocator_of(device).stats()["reserved_bytes"]


def max_memory_reserved(device=None):
    return _allocator_of(device).stats()["peak_reserved_bytes"]


__all__ = ["empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"]
