"""`copy_` (dst[...] = src, broadcast and cast, between any two devices) and `fill_`, with torch's rules
(aten/src/ATen/native/cuda/Copy.cu).

- On one device: a kernel (cuda) or numpy (CPU). torch refuses a copy between dense views that partly share
  memory, and into a view whose elements share memory (a stride 0): the result would depend on the order
  elements run in.
- A CPU destination over read-only memory (a read-only numpy array or memmap) is refused before any transfer,
  as numpy refuses the write on the CPU: a transfer would write it anyway, or fault on a read-only mapping.
- Between devices the bytes move through cuda/transfer.py: blocking by default (on return, a copy to the host
  is complete and a copy from the host has consumed its source); with non_blocking=True and pinned host memory
  (pin_memory, host_register) the transfer is queued on the cuda device's current stream and the call returns
  at once.
- Casts and broadcasts run on a cuda device when non_blocking (so nothing waits on the host), else on the side
  where the data is smaller; non-contiguous tensors go through a contiguous temporary on their own device.
- A device type a third party registered runs none of minitensor's kernels: copies to and from it work on the
  host, moving the bytes its tensor spans, and the host waits for them.
"""
import warnings

import numpy as np

from ..base.device import CPU, of_registered_type as registered
from ..core import fields
from ..core.alloc import empty
from ..core.host_arrays import checked_scalar, numpy_values, numpy_view, to_storage_values
from ..core.shapes import OVERLAP, broadcast_shapes, expanded, overlaps_itself
from ..core.storage import UntypedStorage, copy_storage_bytes
from ..cuda import transfer
from ..cuda.streams import current_stream_handle
from .runs import kernels


def fill_value(dtype, value):
    """What fill_ stores in a `dtype` tensor for `value`: a 0-d tensor cast as copy_ casts it (wrapping, as
    torch), a number checked against the dtype (host_arrays.checked_scalar: 300 for int8 raises)."""
    if isinstance(value, fields.TensorFields):
        if value.dim() != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{value.dim()} dimensions.")
        value = value.to(dtype).item()
    return checked_scalar(dtype, value)


def fill_(t, value):
    value = fill_value(t.dtype, value)
    if t.device.type == "cpu":
        numpy_view(t)[...] = to_storage_values(np.array(value), t.dtype)
    elif 0 in t._shape:
        return
    elif t.device.type == "cuda":
        plan = kernels().plans.fill_plan(t.dtype, t._shape, t._stride, t.device.index)
        plan.run(current_stream_handle(t.device.index), (t.data_ptr(),), (value,))
    else:  # a registered device type's: the value filled on the host, then copied
        _copy_registered(t, fields.tensor(UntypedStorage(t.dtype.itemsize), (), (), 0, t.dtype).fill_(value))


def copy_(dst, src, non_blocking=False):
    """dst[...] = src, broadcasting src and casting to dst's dtype, between any two devices."""
    if not isinstance(src, fields.TensorFields):
        raise TypeError(f"copy_(): argument 'src' must be a Tensor, not {type(src).__name__}")
    if broadcast_shapes(dst._shape, src._shape) != dst._shape:
        raise RuntimeError(f"output with shape {list(dst._shape)} doesn't match the broadcast shape "
                           f"{list(broadcast_shapes(dst._shape, src._shape))}")
    if dst.numel() == 0 or dst is src:
        return
    if 0 in dst._stride and overlaps_itself(dst._shape, dst._stride):
        raise RuntimeError(OVERLAP)  # as torch: which of the elements sharing a location wins is not defined
    _check_no_partial_overlap(dst, src)
    if src.dtype.is_complex and not dst.dtype.is_complex:
        warnings.warn("Casting complex values to real discards the imaginary part", UserWarning, stacklevel=3)
    if src.device != dst.device:
        if registered(src.device) or registered(dst.device):
            _copy_registered(dst, src)
        else:
            _copy_across(dst, src, non_blocking)
    elif dst.device.type == "cuda":
        src_stride = expanded(src._shape, src._stride, dst._shape)[1]
        plan = kernels().plans.copy_plan(src.dtype, dst.dtype, dst._shape, src_stride, dst._stride, dst.device.index)
        plan.run(current_stream_handle(dst.device.index), (src.data_ptr(), dst.data_ptr()), ())
    elif dst.device.type == "cpu":
        numpy_view(dst)[...] = to_storage_values(numpy_values(src.expand(dst._shape)), dst.dtype)
    else:  # a registered device type's: through the host
        _copy_registered(dst, src)


def _check_no_partial_overlap(dst, src):
    """The same memory read and written in place is fine; dense views that partly overlap are not."""
    if dst._storage is not src._storage or not (dst.is_contiguous() and src.is_contiguous()):
        return
    d0, s0 = dst._offset * dst.dtype.itemsize, src._offset * src.dtype.itemsize
    d1, s1 = d0 + dst.numel() * dst.dtype.itemsize, s0 + src.numel() * src.dtype.itemsize
    if d0 < s1 and s0 < d1 and (d0, d1, dst.dtype.itemsize) != (s0, s1, src.dtype.itemsize):
        raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                           "refer to a single memory location. Please clone() the tensor before performing the "
                           "operation.")


# ---------------------------------------------------------------------------------------------- across devices
def _copy_across(dst, src, non_blocking):
    """dst[...] = src for tensors on different devices (dst not empty, src broadcastable to it)."""
    if dst.device.type == "cpu" and not dst._storage._array.flags.writeable:  # a transfer would write it anyway
        raise ValueError("assignment destination is read-only: this CPU tensor shares the memory of a read-only "
                         "array (numpy, a memmap or a read-only DLPack tensor). clone() it, or make the array "
                         "writable, before writing to it")
    if src.device.type == "cpu":
        if not non_blocking and dst.dtype.itemsize < src.dtype.itemsize:
            src = src.to(dst.dtype)  # fewer bytes to move, and the host waits anyway
        asynchronous = non_blocking
    elif dst.device.type == "cpu":
        if non_blocking and dst.is_contiguous() and dst._storage.is_pinned():
            src = _on_device_as(src, dst._shape, dst.dtype)  # then one asynchronous transfer into dst
        elif src.dtype is not dst.dtype and (non_blocking or dst.dtype.itemsize < src.dtype.itemsize):
            src = src.to(dst.dtype)
        asynchronous = None  # decided below: only a transfer straight into dst may be left running
    else:
        if dst.dtype.itemsize < src.dtype.itemsize:
            src = src.to(dst.dtype)  # on the source device: fewer bytes to move
        asynchronous = False  # ordered on both devices' streams, never waited for on the host
    src = src.contiguous()  # a pinned source stays itself when it is contiguous
    receives = dst.dtype is src.dtype and dst._shape == src._shape and dst.is_contiguous()
    target = dst if receives else empty(src._shape, src.dtype, dst.device)
    if asynchronous is None:
        asynchronous = non_blocking and receives
    host = src if src.device.type == "cpu" else target
    transfer.copy_bytes(target.data_ptr(), target.device.index, src.data_ptr(), src.device.index,
                        src.numel() * src.dtype.itemsize, asynchronous, host._storage.is_pinned(),
                        host._storage._block)
    if target is not dst:
        copy_(dst, target)  # on dst's device: broadcast, cast, strides


def _copy_registered(dst, src):
    """dst[...] = src where a side is on a registered device type: the cast, broadcast and strides are worked
    on the host, and the registered side's bytes move through it."""
    if registered(src.device):
        copy_(dst, _span_on_host(src))
    elif src.device.type != "cpu":
        copy_(dst, src.cpu())
    elif dst.is_contiguous():
        staged = empty(dst._shape, dst.dtype, CPU)
        copy_(staged, src)
        copy_storage_bytes(dst._storage, dst._offset * dst.dtype.itemsize, staged._storage, 0, staged.nbytes)
    else:
        host = _span_on_host(dst)
        copy_(host, src)
        copy_storage_bytes(dst._storage, dst._offset * dst.dtype.itemsize, host._storage, 0, host._storage._nbytes)


def _span_on_host(t):
    """A CPU tensor with t's shape and strides over a copy of the bytes t spans (t has elements)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t._shape, t._stride))
    staged = UntypedStorage(span * t.dtype.itemsize)
    copy_storage_bytes(staged, 0, t._storage, t._offset * t.dtype.itemsize, staged._nbytes)
    return fields.tensor(staged, t._shape, t._stride, 0, t.dtype)


def _on_device_as(src, shape, dtype):
    """src broadcast to `shape` and cast to `dtype`, contiguous, on its device (one kernel at most)."""
    if src._shape == shape and src.dtype is dtype and src.is_contiguous():
        return src
    out = empty(shape, dtype, src.device)
    copy_(out, src)
    return out
