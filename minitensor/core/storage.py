"""`UntypedStorage`: the bytes behind tensors; views share one storage.

A CPU storage is a numpy uint8 array (shared with numpy when it came from `from_numpy`). A pinned CPU
storage is a numpy array over a block of the host caching allocator, which it gives back when the last
reference goes. A cuda storage owns one allocator block and gives it back when the last reference goes, or
wraps memory another library allocated (CUDA array interface, DLPack), which that library frees through the
storage's `_owner`. A storage on a device type a third party registered holds a block of that type's allocator
(cuda/device_modules.py).
"""
import pickle

import numpy as np

from ..base.arguments import int_arg
from ..base.device import CPU, of_registered_type
from ..cuda import host_memory, memory, transfer
from ..cuda.device_modules import module_for
from ..cuda.devices import as_device, cuda_device
from ..cuda.streams import current_stream_handle
from .fields import StorageFields, allocate, storage as new_storage


class UntypedStorage(StorageFields):
    """UntypedStorage(nbytes=0, device=None). The fields (device, _nbytes, _array, _block, _allocator, _owner)
    and giving the block back to its allocator are StorageFields' (fields.py), which also builds every storage."""

    __slots__ = ()

    def __new__(cls, nbytes=0, device=None):
        nbytes = int_arg(nbytes, "UntypedStorage(): argument 'nbytes'")
        if nbytes < 0:
            raise ValueError(f"UntypedStorage(): nbytes must be >= 0, got {nbytes}")
        device = CPU if device is None else as_device(device)
        if device.type == "cpu":
            return new_storage(CPU, nbytes, np.empty(nbytes, np.uint8), None, None, None)
        index = device.index
        if device.type != "cuda":
            module = module_for(device.type)
            return allocate(nbytes, device, module.allocator(index), module.current_stream_handle(index))
        return allocate(nbytes, device, memory.allocator(index), current_stream_handle(index))

    @staticmethod
    def _pinned(nbytes):
        """A CPU storage in pinned memory from the host caching allocator."""
        allocator = host_memory._allocator or host_memory.allocator()
        block = allocator.alloc(nbytes)
        array = block.array  # kept on the block: a block handed out again for the same size needs no new one
        if array is None or array.size != nbytes:
            array = host_memory.host_array(block, nbytes)
        return new_storage(CPU, nbytes, array, block, allocator, None)

    @staticmethod
    def _from_array(array, owner=None):
        """A CPU storage over an existing uint8 array (no copy); `owner` is kept alive with it."""
        return new_storage(CPU, array.nbytes, array, None, None, owner)

    @staticmethod
    def _from_external(ptr, nbytes, device, owner):
        """A cuda storage over memory minitensor did not allocate (no copy): no allocator is involved, and
        `owner`, kept alive with the storage, keeps the memory valid."""
        return new_storage(device, nbytes, None, _ExternalBlock(ptr), None, owner)

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

    def is_pinned(self):
        """True for CPU memory the device can reach directly: from the host caching allocator, or registered
        with mt.cuda.host_register."""
        if self.device.type != "cpu" or not self._nbytes:
            return False
        return self._block is not None or host_memory.is_registered(self.data_ptr(), self._nbytes)

    def pin_memory(self):
        """This storage if it is pinned, else a pinned copy of it (CPU storages only)."""
        if self.device.type != "cpu":
            raise RuntimeError(f"cannot pin a storage on {self.device}: only CPU memory can be pinned")
        if self.is_pinned():
            return self
        out = UntypedStorage._pinned(self._nbytes)
        out._array[...] = self._array
        return out

    # ------------------------------------------------------------------ copies and pickling
    def cpu(self):
        """This storage if it is on the CPU, else a copy of its bytes there."""
        return self if self.device.type == "cpu" else self._copy_to(CPU)

    def cuda(self, device=None, non_blocking=False):
        """This storage if it is on that cuda device (default: the current one), else a copy there;
        asynchronous with non_blocking from pinned memory (see cuda/transfer.py)."""
        target = cuda_device(device)
        return self if self.device == target else self._copy_to(target, non_blocking)

    def to(self, *, device, non_blocking=False):
        """This storage if it is on `device` (any type), else a copy there (torch's keyword-only signature)."""
        target = as_device(device)
        return self if self.device == target else self._copy_to(target, non_blocking)

    def _copy_to(self, device, non_blocking=False):
        """A copy of the bytes on `device`, with torch's rules for copies between devices (cuda/transfer.py)."""
        out = UntypedStorage(self._nbytes, device)
        if self._nbytes:
            copy_storage_bytes(out, 0, self, 0, self._nbytes, non_blocking)
        return out

    def __reduce_ex__(self, protocol):
        """pickle and copy.deepcopy: the bytes (through the host) and the device they go back to.
        Protocol 5 passes the host bytes as a buffer, without a copy."""
        host = self.cpu()._array
        return _rebuild_storage, (pickle.PickleBuffer(host) if protocol >= 5 else host.tobytes(), str(self.device))

    def __repr__(self):
        return f"minitensor.UntypedStorage(nbytes={self._nbytes}, device={self.device})"


def copy_storage_bytes(dst, dst_offset, src, src_offset, nbytes, non_blocking=False):
    """`nbytes` from `src` (at byte `src_offset`) into `dst` (at `dst_offset`): storages on any two devices. A
    registered device type's copies go through the host, one side at a time (cuda/device_modules.py)."""
    dst_ptr, src_ptr = dst.data_ptr() + dst_offset, src.data_ptr() + src_offset
    registered = next((d for d in (dst.device, src.device) if of_registered_type(d)), None)
    if registered is None:
        host = src if src.device.type == "cpu" else dst
        transfer.copy_bytes(dst_ptr, dst.device.index, src_ptr, src.device.index, nbytes, non_blocking,
                            host.is_pinned(), host._block)
    elif src.device.type != "cpu" and dst.device.type != "cpu":
        staged = UntypedStorage(nbytes)
        copy_storage_bytes(staged, 0, src, src_offset, nbytes)
        copy_storage_bytes(dst, dst_offset, staged, 0, nbytes)
    else:
        module_for(registered.type).copy_bytes(dst_ptr, None if dst.device.type == "cpu" else dst.device.index,
                                               src_ptr, None if src.device.type == "cpu" else src.device.index,
                                               nbytes)


def _rebuild_storage(data, device):
    """Unpickle a storage (see UntypedStorage.__reduce_ex__): over the unpickled buffer when it is
    writable, else over a copy."""
    array = np.frombuffer(data, np.uint8)
    storage = UntypedStorage._from_array(array if array.flags.writeable else array.copy())
    return storage.to(device=device)


class _ExternalBlock:
    """Stands in for an allocator block over external memory: its address, nothing to give back."""

    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr
