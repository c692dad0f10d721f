"""Operations on tensors: argument checks and torch's typing rules here, the work in Triton kernels
(cuda tensors, `minitensor.kernels`) or numpy (CPU tensors).

Kernels launch on the current stream of the tensor's device. On the host, bfloat16 values are stored as
raw bits and computed in float32, as the kernels do for both half types.
"""
import math
import numbers

import numpy as np

from . import dtypes
from . import tensor as _tensor
from .cuda.streams import current_stream_handle

_plans = None


def plans():
    """minitensor.kernels.plans, imported on first use: it starts the backend, which `import minitensor`
    should not pay for."""
    global _plans
    if _plans is None:
        from .kernels import plans as module
        _plans = module
    return _plans


def _stream(t):
    return current_stream_handle(t.device.index)


# ---------------------------------------------------------------------------------------------- host arrays
def numpy_view(t):
    """The numpy array over a CPU tensor's memory (bfloat16 as uint16 bits)."""
    if t.numel() == 0:
        return np.empty(t._shape, t.dtype.np)
    itemsize = t.dtype.itemsize
    return np.ndarray(t._shape, t.dtype.np, buffer=t._storage._array, offset=t._offset * itemsize,
                      strides=tuple(s * itemsize for s in t._stride))


def numpy_values(t):
    """A CPU tensor's values as numpy; bfloat16 converted to float32."""
    view = numpy_view(t)
    return dtypes.bf16_bits_to_f32(view) if t.dtype is dtypes.bfloat16 else view


def to_storage_values(values, dtype):
    """Values (any numpy dtype) converted to `dtype`'s host representation."""
    values = np.asarray(values)
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype is dtypes.bfloat16:
            return dtypes.f32_to_bf16_bits(values.astype(np.float32))
        if dtype is dtypes.bool_:
            return values != 0
        if values.dtype.kind == "f" and dtype.category == 1:  # float -> int truncates toward zero
            values = np.trunc(values)
            if not dtype.is_signed:  # negative floats to unsigned wrap through int64, as torch's CPU does
                values = values.astype(np.int64)
        return values.astype(dtype.np)


# ---------------------------------------------------------------------------------------------- fill / copy
def _scalar_for(dtype, value):
    """A Python number converted to what a `dtype` element holds (wrapping like a C cast for ints)."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, numbers.Number) or isinstance(value, complex):
        raise TypeError(f"expected a real Python number for a {dtype} tensor, got {type(value).__name__}")
    if dtype is dtypes.bool_:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RuntimeError(f"value cannot be converted to type {dtype.name} without overflow")
        value = int(value)
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    if dtype.is_signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def fill_(t, value):
    Tensor = _tensor.Tensor
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{value.dim()} dimensions.")
        value = value.item()
    value = _scalar_for(t.dtype, value)
    if t.device.type == "cpu":
        numpy_view(t)[...] = to_storage_values(np.array(value), t.dtype)
    elif 0 in t._shape:
        return
    else:
        plan = plans().fill_plan(t.dtype, t._shape, t._stride, t.device.index)
        plan.run(_stream(t), (t.data_ptr(),), (value,))


def broadcast_shapes(*shapes):
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            if size != 1:
                if result[i] not in (1, size):
                    raise RuntimeError(f"The size of tensor a ({result[i]}) must match the size of tensor b "
                                       f"({size}) at non-singleton dimension {i}")
                result[i] = size
            elif result[i] == 1:
                result[i] = size
    return tuple(result)


def copy_(dst, src, non_blocking=False):
    """dst[...] = src, broadcasting src and casting to dst's dtype, between any two devices."""
    Tensor = _tensor.Tensor
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' must be a Tensor, not {type(src).__name__}")
    if broadcast_shapes(dst._shape, src._shape) != dst._shape:
        raise RuntimeError(f"output with shape {list(dst._shape)} doesn't match the broadcast shape "
                           f"{list(broadcast_shapes(dst._shape, src._shape))}")
    if dst.numel() == 0:
        return
    _check_no_partial_overlap(dst, src)
    if src.device != dst.device:
        from .copies import copy_across
        return copy_across(dst, src, non_blocking)
    src = src.expand(dst._shape)
    if dst.device.type == "cpu":
        numpy_view(dst)[...] = to_storage_values(numpy_values(src), dst.dtype)
    else:
        plan = plans().copy_plan(src.dtype, dst.dtype, dst._shape, src._stride, dst._stride, dst.device.index)
        plan.run(_stream(dst), (src.data_ptr(), dst.data_ptr()), ())


def _check_no_partial_overlap(dst, src):
    """torch refuses a copy between dense views that partly share memory: a kernel's result would depend on
    the order its elements run in. The same memory read and written in place is fine."""
    if dst._storage is not src._storage or not (dst.is_contiguous() and src.is_contiguous()):
        return
    d0, s0 = dst._offset * dst.dtype.itemsize, src._offset * src.dtype.itemsize
    d1, s1 = d0 + dst.numel() * dst.dtype.itemsize, s0 + src.numel() * src.dtype.itemsize
    if d0 < s1 and s0 < d1 and (d0, d1, dst.dtype.itemsize) != (s0, s1, src.dtype.itemsize):
        raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                           "refer to a single memory location. Please clone() the tensor before performing the "
                           "operation.")


# ---------------------------------------------------------------------------------------------- repr
def format_tensor(t):
    values = t._host_values()
    if t.numel() == 0:
        body = "[]" if t.dim() == 1 else f"[], size={tuple(t._shape)}"
    elif t.dtype.is_floating_point:
        values = values.astype(np.float64)
        finite = values[np.isfinite(values)]
        integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
        big = finite.size and (np.abs(finite).max() >= 1e8 or 0 < np.abs(finite[finite != 0]).min(initial=1) < 1e-4)
        if big:
            fmt = "{:.4e}".format
        elif integral:
            fmt = lambda v: f"{v:.0f}." if np.isfinite(v) else str(v)
        else:
            fmt = "{:.4f}".format
        body = np.array2string(values, separator=", ", formatter={"float_kind": fmt}, prefix="tensor(",
                               threshold=1000)
    else:
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=1000)
    extras = []
    if t.device.type == "cuda":
        extras.append(f"device='{t.device}'")
    if t.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_) or (t.numel() == 0 and t.dtype is not dtypes.float32):
        extras.append(f"dtype={t.dtype}")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"
