"""`TypedStorage`: the bytes of an `UntypedStorage` read as elements of one dtype, torch's legacy storage
class, which `Tensor.storage()` returns and old checkpoints hold.

It owns no memory: it is a dtype and an UntypedStorage, so a TypedStorage from `t.storage()` shares memory
with `t` and every other view of that storage. Element reads and writes, fills and casts run through a 1-D
tensor over the whole storage, as torch's own TypedStorage does (`torch.tensor([]).set_(storage)`); that tensor
is built with `fields.tensor` (the Tensor class minitensor/tensor.py registers), so nothing here imports
above the core layer.

torch deprecates TypedStorage: its first public use in a process warns (UserWarning, once). minitensor warns
the same once, at `Tensor.storage()` or `TypedStorage(...)`; storages made inside minitensor (mt.load, the
conversions below) do not warn.
"""
import numbers
import warnings
from collections.abc import Sequence

import numpy as np

from ..base import dtypes
from ..base.device import CPU
from ..cuda.devices import as_device
from . import fields
from .host_arrays import data_values, plain_number, to_storage_values
from .storage import UntypedStorage

DEPRECATION = ("TypedStorage is deprecated. It will be removed in the future and UntypedStorage will be the only "
               "storage class. This should only matter to you if you are using storages directly.  To access "
               "UntypedStorage directly, use tensor.untyped_storage() instead of tensor.storage()")
_warned = False  # the deprecation is shown once per process, as torch shows it

_USAGE = ("TypedStorage.__init__ received an invalid combination of arguments. Expected one of:\n"
          " * (*, minitensor.device device, minitensor.dtype dtype)\n"
          " * (int size, *, minitensor.device device, minitensor.dtype dtype)\n"
          " * (Sequence data, *, minitensor.device device, minitensor.dtype dtype)\n"
          " * (*, UntypedStorage wrap_storage, minitensor.dtype dtype)")

# the dtypes torch has a legacy storage class for (torch.FloatStorage, torch.cuda.BoolStorage, ...)
_LEGACY = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
           "complex64", "complex128")


def _warn_deprecated():
    """The deprecation warning, pointing at the caller's caller (the user's line)."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(DEPRECATION, UserWarning, stacklevel=3)


def tensor_storage(tensor):
    """Tensor.storage(): a TypedStorage of the tensor's dtype over its whole storage (not only the elements this
    view reaches), sharing its memory."""
    _warn_deprecated()
    return wrap_untyped(tensor._storage, tensor.dtype)


def wrap_untyped(untyped, dtype):
    """A TypedStorage of `dtype` over `untyped`, without the deprecation warning: for mt.load, pickle and the
    storages this module makes."""
    storage = object.__new__(TypedStorage)
    storage._untyped_storage = untyped
    storage.dtype = dtype
    return storage


class TypedStorage:
    """TypedStorage(size=0 or a sequence of numbers, *, device=None, dtype=None), or
    TypedStorage(*, wrap_storage=UntypedStorage, dtype): elements of `dtype` (default float32) on `device`."""

    __slots__ = ("_untyped_storage", "dtype", "__weakref__")

    def __init__(self, *args, device=None, dtype=None, wrap_storage=None):
        _warn_deprecated()
        if dtype is not None and type(dtype) is not dtypes.dtype:
            raise TypeError(f"{_USAGE}\nArgument 'dtype' must be minitensor.dtype, not {type(dtype)}")
        if len(args) > 1:
            raise RuntimeError(f"{_USAGE}\nToo many positional arguments")
        if wrap_storage is not None:
            _check_wrapped(args, device, dtype, wrap_storage)
            self._untyped_storage, self.dtype = wrap_storage, dtype
            return
        self.dtype = dtypes.default_float if dtype is None else dtype
        device = CPU if device is None else as_device(device)
        if not args:
            self._untyped_storage = UntypedStorage(0, device)
        elif isinstance(args[0], numbers.Integral):
            self._untyped_storage = _new_untyped(int(args[0]), self.dtype, device)
        elif isinstance(args[0], Sequence) and not isinstance(args[0], str):
            self._untyped_storage = _from_sequence(args[0], self.dtype, device)
        else:
            raise TypeError(f"{_USAGE}\nArgument type not recognized: {type(args[0])}")

    # ------------------------------------------------------------------ metadata
    @property
    def device(self):
        return self._untyped_storage.device

    @property
    def is_cuda(self):
        return self._untyped_storage.device.type == "cuda"

    def untyped(self):
        """The UntypedStorage this storage reads (the same object, not a copy)."""
        return self._untyped_storage

    def size(self):
        """The number of whole elements in the storage's bytes."""
        return self._untyped_storage.nbytes() // self.dtype.itemsize

    def __len__(self):
        return self.size()

    def nbytes(self):
        return self._untyped_storage.nbytes()

    def element_size(self):
        return self.dtype.itemsize

    def data_ptr(self):
        return self._untyped_storage.data_ptr()

    def is_pinned(self):
        return self._untyped_storage.is_pinned()

    def pin_memory(self):
        return wrap_untyped(self._untyped_storage.pin_memory(), self.dtype)

    def type(self):
        """torch's legacy storage type name in minitensor's package ("minitensor.cuda.FloatStorage");
        "minitensor.TypedStorage" for a dtype torch has no legacy class for (uint16, ...)."""
        name = dtypes.TORCH_NAMES.get(self.dtype.name)
        if name is None or self.dtype.name not in _LEGACY:
            return "minitensor.TypedStorage"
        return f"minitensor.{'cuda.' if self.is_cuda else ''}{name}Storage"

    # ------------------------------------------------------------------ elements
    def _elements(self):
        """A 1-D tensor over every element of the storage, sharing its memory."""
        return fields.tensor(self._untyped_storage, (self.size(),), (1,), 0, self.dtype)

    def __getitem__(self, idx):
        """The element at int `idx` as a Python number."""
        if isinstance(idx, slice):
            raise RuntimeError("a TypedStorage is indexed by an int: slices of a storage are not supported")
        if not isinstance(idx, int):
            raise RuntimeError(f"can't index a {type(self)} with {type(idx)}")
        if type(idx) is not int:  # a bool
            raise TypeError(f"can't index a {type(self)} with {type(idx)}")
        n = self.size()
        if not -n <= idx < n:
            raise IndexError(f"index {idx} out of range for storage of size {n}")
        return self._elements()[idx % n].item()

    def __setitem__(self, idx, value):
        """storage[int or slice] = a number or a tensor, stored as the tensor's item assignment stores it."""
        if not isinstance(idx, (int, slice)):
            raise RuntimeError(f"can't index a {type(self)} with {type(idx)}")
        if isinstance(value, (TypedStorage, UntypedStorage)):
            raise RuntimeError(f"cannot set item with value type {type(value)}")
        self._elements()[idx] = value

    def fill_(self, value):
        self._elements().fill_(value)
        return self

    def tolist(self):
        return self._elements().tolist()

    def __iter__(self):
        return iter(self.tolist())

    # ------------------------------------------------------------------ copies
    def copy_(self, source, non_blocking=False):
        """Copy `source`'s bytes (a TypedStorage or UntypedStorage of as many bytes, on any device) into this
        storage. As in torch the bytes are copied, not the values cast: see float(), int(), ... for casts."""
        if isinstance(source, TypedStorage):
            source = source._untyped_storage
        if not isinstance(source, UntypedStorage):
            raise TypeError(f"copy_(): argument 'source' must be a TypedStorage or UntypedStorage, not "
                            f"{type(source).__name__}")
        if source.nbytes() != self.nbytes():
            raise RuntimeError(f"size does not match, self was {self.nbytes()} bytes but src was "
                               f"{source.nbytes()} bytes")
        _byte_tensor(self._untyped_storage).copy_(_byte_tensor(source), non_blocking)
        return self

    def clone(self):
        """A copy on the same device."""
        return wrap_untyped(_byte_tensor(self._untyped_storage).clone()._storage, self.dtype)

    def cpu(self):
        """This storage's memory if it is on the CPU, else a copy there."""
        return wrap_untyped(self._untyped_storage.cpu(), self.dtype)

    def cuda(self, device=None, non_blocking=False):
        """This storage's memory if it is on that cuda device (default: the current one), else a copy there."""
        return wrap_untyped(self._untyped_storage.cuda(device, non_blocking), self.dtype)

    def to(self, *, device, non_blocking=False):
        """This storage's memory if it is on `device` (any type), else a copy there."""
        return wrap_untyped(self._untyped_storage.to(device=device, non_blocking=non_blocking), self.dtype)

    def _cast(self, dtype):
        """A new storage of `dtype` holding this one's values cast as Tensor.to casts them; a copy even for the
        same dtype, as in torch."""
        if dtype is self.dtype:
            return self.clone()
        return wrap_untyped(self._elements().to(dtype)._storage, dtype)

    def __reduce_ex__(self, protocol):
        """pickle and copy.deepcopy: its UntypedStorage (pickled by itself, through pickle's memo, so a tensor
        pickled with it still shares its memory after loading) and its dtype."""
        return wrap_untyped, (self._untyped_storage, self.dtype)

    def __repr__(self):
        """torch's form: one element per line, then the type, dtype, device and size."""
        info = f"[minitensor.TypedStorage(dtype={self.dtype}, device={self.device}) of size {self.size()}]"
        return " " + "\n ".join(str(x) for x in self.tolist()) + "\n" + info

    # ------------------------------------------------------------------ casts (last: they shadow the builtins)
    def double(self): return self._cast(dtypes.float64)
    def float(self): return self._cast(dtypes.float32)
    def half(self): return self._cast(dtypes.float16)
    def bfloat16(self): return self._cast(dtypes.bfloat16)
    def long(self): return self._cast(dtypes.int64)
    def int(self): return self._cast(dtypes.int32)
    def short(self): return self._cast(dtypes.int16)
    def char(self): return self._cast(dtypes.int8)
    def byte(self): return self._cast(dtypes.uint8)
    def bool(self): return self._cast(dtypes.bool_)


def _check_wrapped(args, device, dtype, wrap_storage):
    """TypedStorage(wrap_storage=..., dtype=...) takes nothing else, as in torch."""
    if args:
        raise RuntimeError(f"{_USAGE}\nNo positional arguments should be given when using 'wrap_storage'")
    if dtype is None:
        raise RuntimeError(f"{_USAGE}\nArgument 'dtype' must be specified")
    if device is not None:
        raise RuntimeError(f"{_USAGE}\nArgument 'device' should not be specified when 'wrap_storage' is given")
    if not isinstance(wrap_storage, UntypedStorage):
        raise TypeError(f"{_USAGE}\nArgument 'wrap_storage' must be UntypedStorage, but got {type(wrap_storage)}")


def _new_untyped(size, dtype, device):
    if size < 0:
        raise RuntimeError(f"TypedStorage(): size must be a non-negative int, got {size}")
    return UntypedStorage(size * dtype.itemsize, device)


def _from_sequence(items, dtype, device):
    """An UntypedStorage holding `items` (numbers: Python's or numpy's) as `dtype` values, checked and converted
    as mt.tensor(items, dtype=dtype) converts them."""
    plain = [plain_number(x) for x in items]
    if None in plain:
        bad = next(x for x, number in zip(items, plain) if number is None)
        raise TypeError(f"TypedStorage(): a sequence's items must be numbers (bool, int or float), got "
                        f"{type(bad).__name__}")
    kinds = {type(x) for x in plain}
    values = to_storage_values(data_values(plain, kinds, dtype), dtype)
    host = UntypedStorage._from_array(np.ascontiguousarray(values).reshape(-1).view(np.uint8))
    return host if device.type == "cpu" else host.cuda(device)


def _byte_tensor(untyped):
    """A 1-D uint8 tensor over every byte of `untyped`."""
    return fields.tensor(untyped, (untyped.nbytes(),), (1,), 0, dtypes.uint8)
