"""Tensor factories: torch's names, dtype inference and argument forms."""
import ctypes
import math
import numbers

import numpy as np

from .base import dtypes
from .base.device import CPU
from .core import fields
from .core.host_arrays import to_storage_values
from .core.layout import layout_number
from .core.shapes import contiguous_strides, extent, shape_arg
from .core.storage import UntypedStorage
from .cuda import memory
from .cuda.devices import as_device
from .cuda.streams import _tls as _streams_tls
from .interop import foreign_tensor
from .ops import random
from .ops.typing import result_type
from .tensor import Tensor


def _device(device):
    return CPU if device is None else as_device(device)


def _host_tensor(values, dtype):
    """A contiguous CPU tensor holding `values` (numpy) converted to `dtype`."""
    host = np.array(to_storage_values(values, dtype), order="C", copy=None)
    storage = UntypedStorage._from_array(host.reshape(-1).view(np.uint8))
    return Tensor(storage, tuple(host.shape), tuple(s // dtype.itemsize for s in host.strides) if host.size
                  else contiguous_strides(host.shape), 0, dtype)


def _from_host(values, dtype, device):
    t = _host_tensor(values, dtype)
    return t if device.type == "cpu" else t.to(device)


def _infer_dtype(array):
    kind = array.dtype.kind
    if kind == "b":
        return dtypes.bool_
    if kind in "iu":
        return dtypes.int64
    if kind == "f":
        return dtypes.default_float
    raise TypeError(f"Could not infer dtype of {array.dtype}")


def _pinned(t, pin_memory):
    """`t` itself, or with pin_memory=True a pinned copy of it (CPU only, as in torch)."""
    return t.pin_memory() if pin_memory else t


def tensor(data, dtype=None, device=None, pin_memory=False, requires_grad=False):
    return _pinned(_tensor(data, dtype, device), pin_memory)


def _tensor(data, dtype, device):
    foreign = foreign_tensor(data)  # another library's array (CUDA array interface, DLPack): copied, like torch
    if foreign is not None:
        return foreign.to(device=foreign.device if device is None else device, dtype=dtype or foreign.dtype,
                          copy=True)
    device = _device(device)
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype or data.dtype, copy=True)
    if isinstance(data, (np.ndarray, np.generic)):  # numpy scalars keep their dtype, as in torch
        array = np.asarray(data)
        inferred = dtypes.from_numpy(array.dtype)
    else:
        array = _nested_to_numpy(data)
        inferred = _infer_dtype(array)
    return _from_host(array, dtype or inferred, device)


def _nested_to_numpy(data):
    def check(x, dim):
        if isinstance(x, (list, tuple)):
            lengths = {len(y) if isinstance(y, (list, tuple)) else -1 for y in x}
            if len(lengths) > 1:
                raise ValueError(f"expected sequence of equal lengths at dim {dim + 1}")
            for y in x:
                check(y, dim + 1)
        elif isinstance(x, Tensor):
            if x.numel() != 1:
                raise ValueError("only one element tensors can be converted to Python scalars")
        elif not isinstance(x, (numbers.Number, np.generic)) or isinstance(x, complex):
            raise TypeError(f"new(): invalid data type '{type(x).__name__}'")
    check(data, 0)
    return np.array(_items(data))


def _items(x):
    if isinstance(x, (list, tuple)):
        return [_items(y) for y in x]
    return x.item() if isinstance(x, (Tensor, np.generic)) else x


_empty_makers = {}  # (size, dtype, device index, pin_memory) -> make() -> a new tensor of that kind


def empty(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """Uninitialised memory; a microbenchmark's favourite, so what a call needs besides the allocation is
    worked out once per (size, dtype, device, pin_memory) and kept in a `make` function."""
    dtype = dtype or dtypes.default_float
    device = CPU if device is None else as_device(device)
    key = (size, dtype, device.index, pin_memory)  # a device's index says which one it is (None: the CPU)
    try:
        make = _empty_makers.get(key)
    except TypeError:  # a list size: unhashable, no memo
        return _empty_maker(size, dtype, device, pin_memory)()
    if make is None:
        make = _empty_makers[key] = _empty_maker(size, dtype, device, pin_memory)
    return make()


def _empty_maker(size, dtype, device, pin_memory):
    shape = shape_arg(size)
    nbytes, strides = math.prod(shape) * dtype.itemsize, contiguous_strides(shape)
    layout = layout_number(dtype, shape, strides, device.index)
    if pin_memory:
        if device.type != "cpu":
            raise RuntimeError(f"Only dense CPU tensors can be pinned (pin_memory=True with device {device})")
        pinned, new_tensor = UntypedStorage._pinned, fields.tensor
        return lambda: new_tensor(pinned(nbytes), shape, strides, 0, dtype, layout)
    if device.type == "cpu":
        return lambda: Tensor(UntypedStorage(nbytes), shape, strides, 0, dtype, layout)
    index, allocator = device.index, memory.allocator(device.index)
    allocate, new_tensor = fields.allocate, fields.tensor

    def make():
        handles = _streams_tls.handles  # current_stream_handle(index), inline
        storage = allocate(nbytes, device, allocator, 0 if handles is None else handles[index])
        return new_tensor(storage, shape, strides, 0, dtype, layout)
    return make


def full(size, fill_value, dtype=None, device=None, pin_memory=False, requires_grad=False):
    if dtype is None:
        dtype = result_type(fill_value)
    t = empty(shape_arg((size,)), dtype=dtype, device=device, pin_memory=pin_memory)
    return t.fill_(fill_value)


def zeros(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    return full(shape_arg(size), 0, dtype=dtype or dtypes.default_float, device=device, pin_memory=pin_memory)


def ones(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    return full(shape_arg(size), 1, dtype=dtype or dtypes.default_float, device=device, pin_memory=pin_memory)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and larger bound inconsistent with step sign")
    if dtype is None:
        dtype = result_type(start, end, step)
    n = max(0, math.ceil((end - start) / step))
    return _from_host(start + step * np.arange(n, dtype=np.float64 if dtype.is_floating_point else np.int64),
                      dtype, _device(device))


def rand(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """Uniform in [0, 1), drawn on the tensor's device (random.py)."""
    return _pinned(random.new("uniform", size, dtype, device, 0.0, 1.0), pin_memory)


def randn(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    return _pinned(random.new("normal", size, dtype, device, 0.0, 1.0), pin_memory)


def randint(low, high=None, size=None, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """randint(high, size) or randint(low, high, size): integers uniform in [low, high)."""
    if size is None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    return _pinned(random.new("random", (size,), dtype, device, low, high), pin_memory)


def empty_like(t, dtype=None, device=None):
    return empty(t._shape, dtype=dtype or t.dtype, device=device or t.device)


def zeros_like(t, dtype=None, device=None):
    return zeros(t._shape, dtype=dtype or t.dtype, device=device or t.device)


def ones_like(t, dtype=None, device=None):
    return ones(t._shape, dtype=dtype or t.dtype, device=device or t.device)


def full_like(t, fill_value, dtype=None, device=None):
    return full(t._shape, fill_value, dtype=dtype or t.dtype, device=device or t.device)


def rand_like(t, dtype=None, device=None):
    return rand(t._shape, dtype=dtype or t.dtype, device=device or t.device)


def randn_like(t, dtype=None, device=None):
    return randn(t._shape, dtype=dtype or t.dtype, device=device or t.device)


def randint_like(t, low, high=None, dtype=None, device=None):
    return randint(low, high, t._shape, dtype=dtype or t.dtype, device=device or t.device)


def from_numpy(array):
    """A CPU tensor sharing the array's memory."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"expected np.ndarray (got {type(array).__name__})")
    if not array.dtype.isnative:
        raise ValueError("given numpy array has byte order different from the native byte order. Conversion "
                         "between byte orders is currently not supported.")
    dtype = dtypes.from_numpy(array.dtype)
    itemsize = array.itemsize
    if any(s < 0 for s in array.strides):
        raise ValueError("At least one stride in the given numpy array is negative, and tensors with negative "
                         "strides are not currently supported. (You can probably work around this by making a "
                         "copy of your array  with array.copy().) ")
    if any(s % itemsize for s in array.strides):
        raise ValueError("given numpy array strides not a multiple of the element byte size. Copy the numpy "
                         "array to reallocate the memory.")
    nbytes = extent(array.shape, [s // itemsize for s in array.strides]) * itemsize
    buffer = (ctypes.c_uint8 * nbytes).from_address(array.ctypes.data) if nbytes else None
    raw = np.frombuffer(buffer, np.uint8) if nbytes else np.empty(0, np.uint8)
    raw.flags.writeable = array.flags.writeable  # a read-only array stays read-only: writes raise, not corrupt
    storage = UntypedStorage._from_array(raw, owner=array)
    return Tensor(storage, tuple(array.shape), tuple(s // itemsize for s in array.strides), 0, dtype)


def as_tensor(data, dtype=None, device=None):
    """No copy when `data` already is a tensor (or numpy array, or another library's array through the CUDA
    array interface or DLPack) of that dtype and device."""
    if isinstance(data, np.ndarray) and all(s >= 0 for s in data.strides):
        data = from_numpy(data)
    foreign = foreign_tensor(data)
    if foreign is not None:
        data = foreign
    if isinstance(data, Tensor):
        return data.to(device=device or data.device, dtype=dtype or data.dtype)
    return tensor(data, dtype=dtype, device=device)
