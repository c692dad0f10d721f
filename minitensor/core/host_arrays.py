"""numpy over CPU tensors, and values converted to what an element of a dtype holds.

On the host, bfloat16 values are stored as raw bits (numpy has no bfloat16) and computed in float32, as the
kernels do for both half types.
"""
import math
import numbers

import numpy as np

from ..base import dtypes


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
        if values.dtype.kind == "f" and dtype.category == dtypes.INT:  # float -> int truncates toward zero
            values = np.trunc(values)
            if not dtype.is_signed:  # negative floats to unsigned wrap through int64, as torch's CPU does
                values = values.astype(np.int64)
        return values.astype(dtype.np)


def scalar_for(dtype, value):
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
