"""`UntypedStorage`: the bytes behind tensors; views share one storage.

A CPU storage is a numpy uint8 array (shared with numpy when it came from `from_numpy`). A cuda storage
owns one allocator block and gives it back when the last reference goes.
"""
import numpy as np

from .cuda import memory
from .cuda.streams import current_stream_handle
from .device import CPU


class UntypedStorage:
    __slots__ = ("device", "_nbytes", "_array", "_block", "_allocator", "_owner", "__weakref__")

    def __init__(self, nbytes=0, device=None):
        from .device import as_device
        device = CPU if device is None else as_device(device)
        self.device = device
        self._nbytes = nbytes
        self._array = None
        self._block = None
        self._allocator = None
        self._owner = None
        if device.type == "cpu":
            self._array = np.empty(nbytes, np.uint8)
        else:
            self._allocator = memory.allocator(device.index)
            self._block = self._allocator.alloc(nbytes, current_stream_handle(device.index))

    @classmethod
    def _allocate(cls, nbytes, device, allocator, stream):
        """A cuda storage from `allocator` (the device's) on `stream`: the per-op fast path."""
        storage = cls.__new__(cls)
        storage.device = device
        storage._nbytes = nbytes
        storage._array = None
        storage._block = allocator.alloc(nbytes, stream)
        storage._allocator = allocator
        storage._owner = None
        return storage

    @classmethod
    def _from_array(cls, array, owner=None):
        """A CPU storage over an existing uint8 array (no copy); `owner` is kept alive with it."""
        storage = cls.__new__(cls)
        storage.device = CPU
        storage._nbytes = array.nbytes
        storage._array = array
        storage._block = None
        storage._allocator = None
        storage._owner = owner
        return storage

    def data_ptr(self):
        if self._array is not None:
            return self._array.ctypes.data if self._nbytes else 0
        return self._block.ptr

    def nbytes(self):
        return self._nbytes

    def size(self):
        return self._nbytes

    def __len__(self):
        return self._nbytes

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    def __del__(self):
        if self._block is not None:
            try:
                self._allocator.free(self._block)
            except Exception:  # interpreter shutdown: the driver may already be gone
                pass

    def __repr__(self):
        return f"minitensor.UntypedStorage(nbytes={self._nbytes}, device={self.device})"
