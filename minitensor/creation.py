"""Tensor factories: torch's names, dtype inference and argument forms."""
import ctypes
import math

import numpy as np

from .base import dtypes
from .base.device import CPU
from .core import fields
from .core.host_arrays import checked_scalar, data_values, plain_number, python_number, to_storage_values
from .core.layout import device_key, layout_number
from .core.shapes import contiguous_strides, extent, new_shape, shape_arg, storage_nbytes
from .core.storage import UntypedStorage
from .cuda import memory
from .cuda.devices import as_device
from .cuda.streams import _tls as _streams_tls
from .interop import foreign_tensor
from .ops import random
from .ops.copy import fill_value as fill_value_for
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


def _pinned(t, pin_memory):
    """`t` itself, or with pin_memory=True a pinned copy of it (CPU only, as in torch)."""
    return t.pin_memory() if pin_memory else t


def _flag(value, name):
    """A bool argument, as torch wants it (a string would otherwise read as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"argument '{name}' must be bool, not {type(value).__name__}")
    return value


def _dtype(dtype, default, function):
    """The dtype argument of factory `function`: `default` for None, else checked (base/dtypes.dtype_arg)."""
    return default if dtype is None else dtypes.dtype_arg(dtype, function)


def tensor(data, dtype=None, device=None, pin_memory=False, requires_grad=False):
    pin_memory = _flag(pin_memory, "pin_memory")
    return _pinned(_tensor(data, _dtype(dtype, None, "tensor"), device), pin_memory)


def _tensor(data, dtype, device):
    foreign = foreign_tensor(data)  # another library's array (CUDA array interface, DLPack): copied, like torch
    if foreign is not None:
        return foreign.to(device=foreign.device if device is None else device, dtype=dtype or foreign.dtype,
                          copy=True)
    device = _device(device)
    if isinstance(data, Tensor):
        return data.to(device=device, dtype=dtype or data.dtype, copy=True)
    if isinstance(data, np.ndarray):  # cast as numpy casts (wrapping), as torch does
        return _from_host(data, dtype or dtypes.from_numpy(data.dtype), device)
    if isinstance(data, np.generic):  # a number, checked like one, that keeps its dtype as in torch
        dtype = dtype or dtypes.from_numpy(data.dtype)
    items, types = _python_data(data)
    if dtype is None:  # torch's inference: complex64 if any element is complex, the default float if any is a
        dtype = (dtypes.complex64 if complex in types else  # float, else int64, else bool
                 dtypes.default_float if float in types or not types else dtypes.int64 if int in types
                 else dtypes.bool_)
    return _from_host(data_values(items, types, dtype), dtype, device)


def _python_data(data):
    """`data` (a number, or nested lists, tuples and ranges of numbers, numpy scalars and one-element tensors) as
    nested lists of Python bools, ints and floats, and the set of those types."""
    types = set()

    def walk(x, dim):
        if isinstance(x, (list, tuple, range)):
            if len({len(y) if isinstance(y, (list, tuple, range)) else -1 for y in x}) > 1:
                raise ValueError(f"expected sequence of equal lengths at dim {dim + 1}")
            return [walk(y, dim + 1) for y in x]
        if isinstance(x, Tensor):
            if x.numel() != 1:
                raise ValueError("only one element tensors can be converted to Python scalars")
            x = x.item()
        number = plain_number(x)
        if number is None:
            raise TypeError(f"new(): invalid data type '{type(x).__name__}'")
        types.add(type(number))
        return number
    return walk(data, 0), types


_empty_makers = {}  # (size, dtype, device key, pin_memory) -> make() -> a new tensor of that kind


def empty(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """Uninitialised memory; a microbenchmark's favourite, so what a call needs besides the allocation is
    worked out once per (size, dtype, device, pin_memory) and kept in a `make` function."""
    if dtype is None:
        dtype = dtypes.default_float
    device = CPU if device is None else as_device(device)
    # size_key(size) and device_key(device) written out (two calls fewer on the hot path): cuda's index says
    # which one it is (None: the CPU); the types keep invalid arguments equal to valid ones apart
    inner = size[0] if len(size) == 1 and isinstance(size[0], tuple) else size
    key = (size, tuple(map(type, inner)), dtype,
           device.index if device.type == "cuda" or device.type == "cpu" else device, pin_memory, type(pin_memory))
    try:
        make = _empty_makers.get(key)
    except TypeError:  # a list size: unhashable, no memo
        return _empty_maker(size, dtype, device, pin_memory)()
    if make is None:
        make = _empty_makers[key] = _empty_maker(size, dtype, device, pin_memory)
    return make()


def _empty_maker(size, dtype, device, pin_memory):
    shape, dtype, pin_memory = new_shape(size), dtypes.dtype_arg(dtype, "empty"), _flag(pin_memory, "pin_memory")
    nbytes, strides = math.prod(shape) * dtype.itemsize, contiguous_strides(shape)
    layout = layout_number(dtype, shape, strides, device_key(device))
    if pin_memory:
        if device.type != "cpu":
            raise RuntimeError(f"Only dense CPU tensors can be pinned (pin_memory=True with device {device})")
        pinned, new_tensor = UntypedStorage._pinned, fields.tensor
        return lambda: new_tensor(pinned(nbytes), shape, strides, 0, dtype, layout)
    if device.type != "cuda":  # the CPU, or a registered device type (its allocator is UntypedStorage's choice)
        return lambda: Tensor(UntypedStorage(nbytes, device), shape, strides, 0, dtype, layout)
    index, allocator = device.index, memory.allocator(device.index)
    allocate, new_tensor = fields.allocate, fields.tensor

    def make():
        handles = _streams_tls.handles  # current_stream_handle(index), inline
        storage = allocate(nbytes, device, allocator, 0 if handles is None else handles[index])
        return new_tensor(storage, shape, strides, 0, dtype, layout)
    return make


def empty_strided(size, stride, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """Uninitialised memory viewed with these strides, its storage exactly what they reach (torch's)."""
    shape, strides = shape_arg((size,)), shape_arg((stride,))
    if len(shape) != len(strides):
        raise RuntimeError(f"mismatch in length of strides and shape: {len(strides)} strides for shape {shape}")
    dtype = dtypes.default_float if dtype is None else dtypes.dtype_arg(dtype, "empty_strided")
    nbytes = storage_nbytes(shape, strides, 0, dtype.itemsize, "empty_strided")
    base = empty(nbytes // dtype.itemsize, dtype=dtype, device=device, pin_memory=pin_memory)
    return base.as_strided(shape, strides, 0)


def full(size, fill_value, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """A new tensor of `fill_value`, which is checked against the dtype before any memory is taken."""
    dtype = _dtype(dtype, None, "full") or result_type(fill_value)
    value = fill_value_for(dtype, fill_value)
    return empty(new_shape((size,)), dtype=dtype, device=device, pin_memory=pin_memory).fill_(value)


def zeros(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    return full(shape_arg(size), 0, dtype=_dtype(dtype, dtypes.default_float, "zeros"), device=device,
                pin_memory=pin_memory)


def ones(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    return full(shape_arg(size), 1, dtype=_dtype(dtype, dtypes.default_float, "ones"), device=device,
                pin_memory=pin_memory)


def arange(start, end=None, step=1, dtype=None, device=None, requires_grad=False):
    """[start, end) by step, with torch's checks: a finite range, a nonzero step of its sign, and for an
    integer dtype bounds that int64 holds (the values are computed in int64, then cast, wrapping as torch)."""
    if end is None:
        start, end = 0, start
    start, end, step = (python_number(x.item() if isinstance(x, Tensor) else x, f"arange(): argument '{name}'")
                        for x, name in ((start, "start"), (end, "end"), (step, "step")))
    if not (math.isfinite(start) and math.isfinite(end)):
        raise RuntimeError(f"unsupported range: {start} -> {end}")
    if not (step > 0 or step < 0):  # NaN too, as torch
        raise RuntimeError("step must be nonzero")
    if (end - start) * step < 0:
        raise RuntimeError("upper bound and lower bound inconsistent with step sign")
    dtype = _dtype(dtype, None, "arange") or result_type(start, end, step)
    device = _device(device)
    if dtype is dtypes.bool_ or dtype.is_complex or dtype in dtypes.SHELL_UINTS:
        raise NotImplementedError(f"\"arange_{device.type}\" not implemented for '{dtypes.TORCH_NAMES[dtype.name]}'")
    if not dtype.is_floating_point:
        for x in (start, end, step):
            checked_scalar(dtypes.int64, x)
    exact = all(type(x) is not float for x in (start, end, step))  # ints: the size without rounding
    size = -((start - end) // step) if exact else (end - start) / step
    if not size < 2**63:  # an infinite quotient too
        raise RuntimeError("invalid size, possible overflow?")
    n = size if exact else math.ceil(size)
    return _from_host(start + step * np.arange(n, dtype=np.float64 if dtype.is_floating_point else np.int64),
                      dtype, device)


def rand(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """Uniform in [0, 1), drawn on the tensor's device (random.py)."""
    pin_memory = _flag(pin_memory, "pin_memory")
    return _pinned(random.new("uniform", size, _dtype(dtype, None, "rand"), device, 0.0, 1.0), pin_memory)


def randn(*size, dtype=None, device=None, pin_memory=False, requires_grad=False):
    pin_memory = _flag(pin_memory, "pin_memory")
    return _pinned(random.new("normal", size, _dtype(dtype, None, "randn"), device, 0.0, 1.0), pin_memory)


def randint(low, high=None, size=None, dtype=None, device=None, pin_memory=False, requires_grad=False):
    """randint(high, size) or randint(low, high, size): integers uniform in [low, high)."""
    if size is None and isinstance(high, (tuple, list)):
        low, high, size = 0, low, high
    elif high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("randint() missing required argument 'size'")
    pin_memory = _flag(pin_memory, "pin_memory")
    return _pinned(random.new("random", (size,), _dtype(dtype, None, "randint"), device, low, high), pin_memory)


def empty_like(t, dtype=None, device=None):
    return empty(t._shape, dtype=_dtype(dtype, t.dtype, "empty_like"), device=device or t.device)


def zeros_like(t, dtype=None, device=None):
    return zeros(t._shape, dtype=_dtype(dtype, t.dtype, "zeros_like"), device=device or t.device)


def ones_like(t, dtype=None, device=None):
    return ones(t._shape, dtype=_dtype(dtype, t.dtype, "ones_like"), device=device or t.device)


def full_like(t, fill_value, dtype=None, device=None):
    return full(t._shape, fill_value, dtype=_dtype(dtype, t.dtype, "full_like"), device=device or t.device)


def rand_like(t, dtype=None, device=None):
    return rand(t._shape, dtype=_dtype(dtype, t.dtype, "rand_like"), device=device or t.device)


def randn_like(t, dtype=None, device=None):
    return randn(t._shape, dtype=_dtype(dtype, t.dtype, "randn_like"), device=device or t.device)


def randint_like(t, low, high=None, dtype=None, device=None):
    return randint(low, high, t._shape, dtype=_dtype(dtype, t.dtype, "randint_like"),
                   device=device or t.device)


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
    dtype = _dtype(dtype, None, "as_tensor")
    if isinstance(data, np.ndarray) and all(s >= 0 for s in data.strides):
        data = from_numpy(data)
    foreign = foreign_tensor(data)
    if foreign is not None:
        data = foreign
    if isinstance(data, Tensor):
        return data.to(device=device or data.device, dtype=dtype or data.dtype)
    return tensor(data, dtype=dtype, device=device)
