"""New contiguous tensors, each over a new storage: what ops' outputs and the factories start from. They are
built as `fields.Tensor`, the Tensor class minitensor/tensor.py registers."""
import math

from ..cuda import memory
from ..cuda.streams import _tls as _streams_tls
from . import fields
from .shapes import contiguous_strides
from .storage import UntypedStorage


def empty(shape, dtype, device):
    """A new contiguous tensor; `device` must already be normalised (see cuda/devices.as_device)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type == "cuda":  # straight to the allocator: factories and ops call this per op
        index = device.index
        handles = _streams_tls.handles  # current_stream_handle(index), inline
        storage = fields.allocate(nbytes, device, memory._only or memory.allocator(index),
                                  0 if handles is None else handles[index])
    else:
        storage = UntypedStorage(nbytes, device)
    return fields.tensor(storage, shape, contiguous_strides(shape), 0, dtype)


def empty_pinned(shape, dtype):
    """A new contiguous CPU tensor in pinned memory."""
    return fields.tensor(UntypedStorage._pinned(math.prod(shape) * dtype.itemsize), shape,
                         contiguous_strides(shape), 0, dtype)
