"""What the restricted unpickler (unpickler.py) builds from a checkpoint's calls: storages from persistent ids
(an UntypedStorage for torch.UntypedStorage, a TypedStorage over one for a dtype's class such as
torch.FloatStorage, as torch.load gives), and the results of the functions REDUCE may call (allowlist.py's
CALLABLES name these methods). Each checks its arguments and raises `pickle.UnpicklingError` naming what was
wrong; tensors are checked against their storage and against the shapes minitensor can hold (limits.py).

`Rebuilds` is the unpickler's base class: its methods use the unpickler's state (`_guard`, `_load_storage`, the
storages by key and their dtypes, `_hold`, `_new`).
"""
import math
from collections import OrderedDict
from pickle import UnpicklingError

from ..base import dtypes
from ..base.device import device as _device
from ..core.typed_storage import TypedStorage, wrap_untyped
from ..tensor import Size, Tensor
from .allowlist import INT64_MAX, MARKERS, TENSOR_REBUILDS, Global, StorageType
from .limits import MAX_DEVICE_INDEX, MAX_DIMS, shape_problem


class Rebuilds:
    """The persistent-id loader and the REDUCE targets of `Unpickler` (its base class)."""

    # ------------------------------------------------------------------------------------------ storages
    def _storage(self, pid):
        if type(pid) is not tuple or len(pid) != 5:
            raise UnpicklingError(f"a persistent id must be ('storage', storage type, key, location, numel), "
                                  f"got {_describe(pid)}")
        typename, storage_type, key, location, numel = pid
        if _ascii(typename) != "storage":
            raise UnpicklingError(f"only storages are loaded from persistent ids, not {_describe(typename)}")
        if type(storage_type) is not StorageType:
            raise UnpicklingError(f"a storage's type must be a torch storage class, got {_describe(storage_type)}")
        key, location = _ascii(key), _ascii(location)
        if type(key) is not str or type(location) is not str:
            raise UnpicklingError(f"a storage's key and location must be strings, got {_describe(key)} and "
                                  f"{_describe(location)}")
        if type(numel) is not int or not 0 <= numel <= INT64_MAX:
            raise UnpicklingError(f"a storage's size must be a non-negative int, got {_describe(numel)}")
        storage = self._by_key.get(key)
        if storage is None:
            try:
                untyped = self._load_storage(key, location, storage_type.dtype, numel)
            except BaseException as exc:
                self._caller_error = exc
                raise
            storage = untyped if storage_type.untyped else wrap_untyped(untyped, storage_type.dtype)
            self._by_key[key] = storage
            self._dtypes.setdefault(id(storage), (storage, storage_type.dtype))
        return storage

    # ------------------------------------------------------------------------------------------ callables
    def _tensor(self, storage, offset, size, stride, dtype=None):
        entry = self._dtypes.get(id(storage))
        if entry is None or entry[0] is not storage:
            raise UnpicklingError(f"a tensor must be rebuilt from a storage of this file, not {_describe(storage)}")
        dtype = entry[1] if dtype is None else dtype
        if type(storage) is TypedStorage:
            storage = storage.untyped()
        size, stride = _dims(size, "size"), _dims(stride, "stride")
        if len(size) != len(stride):
            raise UnpicklingError(f"a tensor's size {list(size)} and stride {list(stride)} differ in length")
        if type(offset) is not int or not 0 <= offset <= INT64_MAX:
            raise UnpicklingError(f"a tensor's storage offset must be a non-negative int, got {_describe(offset)}")
        problem = shape_problem(size, dtype.itemsize)
        if problem:
            raise UnpicklingError(problem)
        if math.prod(size):
            end = (offset + sum((n - 1) * s for n, s in zip(size, stride)) + 1) * dtype.itemsize
            if end > storage.nbytes():
                raise UnpicklingError(f"a {dtype.name} tensor of size {list(size)}, stride {list(stride)} and "
                                      f"offset {offset} reaches byte {end} of its storage, which has "
                                      f"{storage.nbytes()} bytes")
        return Tensor(storage, size, stride, offset, dtype)

    def _rebuild_tensor(self, storage, storage_offset, size, stride):
        return self._tensor(storage, storage_offset, size, stride)

    def _rebuild_tensor_v2(self, storage, storage_offset, size, stride, requires_grad, backward_hooks,
                           metadata=None):
        return self._tensor(storage, storage_offset, size, stride)

    def _rebuild_tensor_v3(self, storage, storage_offset, size, stride, requires_grad, backward_hooks, dtype,
                           metadata=None):
        if type(dtype) is not dtypes.dtype:
            raise UnpicklingError(f"_rebuild_tensor_v3 needs a dtype, got {_describe(dtype)}")
        return self._tensor(storage, storage_offset, size, stride, dtype)

    def _rebuild_parameter(self, data, requires_grad, backward_hooks):
        """A Parameter loads as its tensor: minitensor has no autograd."""
        if type(data) is not Tensor:
            raise UnpicklingError(f"a Parameter's data must be a tensor, got {_describe(data)}")
        return data

    def _rebuild_parameter_with_state(self, data, requires_grad, backward_hooks, state):
        return self._rebuild_parameter(data, requires_grad, backward_hooks)

    def _rebuild_from_type_v2(self, func, new_type, args, state):
        """A tensor with Python attributes (or a Parameter): rebuilt by `func`; the attributes are dropped,
        minitensor tensors have none."""
        if type(func) is not Global or func.fn is None or func.name not in TENSOR_REBUILDS:
            raise UnpicklingError(f"_rebuild_from_type_v2 can only call a tensor rebuild function, not {func!r}")
        if not any(new_type is marker for marker in MARKERS.values()):  # identity: tensors compare elementwise
            raise UnpicklingError(f"_rebuild_from_type_v2 can only make a Tensor or Parameter, not {new_type!r}")
        if type(args) is not tuple:
            raise UnpicklingError(f"_rebuild_from_type_v2 needs an argument tuple, got {_describe(args)}")
        return func.fn(*args)

    def _ordered_dict(self):
        return self._new(OrderedDict())

    def _size(self, values):
        result = Size(_ints(values, "torch.Size"))
        self._guard.copied(result, values, "torch.Size")
        return result

    def _torch_device(self, kind, index=None):
        if type(kind) is not str or not (index is None or type(index) is int):
            raise UnpicklingError(f"torch.device needs a string and an optional int, got {_describe(kind)}, "
                                  f"{_describe(index)}")
        try:
            device = _device(kind, index)
        except (RuntimeError, ValueError) as exc:
            raise UnpicklingError(f"torch.device needs a device string minitensor has ('cpu', 'cuda', 'cuda:N') "
                                  f"and an optional non-negative index, got {_describe(kind)}, {_describe(index)}: "
                                  f"{exc}") from None
        if device.index is not None and device.index > MAX_DEVICE_INDEX:
            raise UnpicklingError(f"a torch.device index must be in [0, {MAX_DEVICE_INDEX}], got "
                                  f"{_describe(device.index)} (device indices past {MAX_DEVICE_INDEX} do not survive "
                                  "torch's own parser)")
        return device

    def _encode(self, text, encoding):
        if type(text) is not str or type(encoding) is not str or encoding not in ("latin1", "latin-1"):
            raise UnpicklingError(f"_codecs.encode is allowed only as encode(str, 'latin1') for bytes, got "
                                  f"{_describe(text)}, {encoding!r}")
        self._guard.spend(len(text), f"_codecs.encode copying {len(text)} characters")
        return text.encode("latin1")

    def _bytes(self):
        return b""

    def _bytearray(self, data=b"", encoding=None):
        if encoding is not None:
            data = self._encode(data, encoding)
        if type(data) is not bytes:
            raise UnpicklingError(f"bytearray needs bytes, got {_describe(data)}")
        self._guard.spend(len(data), f"bytearray copying {len(data)} bytes")
        return bytearray(data)

    def _set(self, items=()):
        return self._new_set(set, items)

    def _frozenset(self, items=()):
        return self._new_set(frozenset, items)

    def _new_set(self, kind, items):
        """builtins.set(items) or frozenset(items): the copy charged, the keys hashed and counted."""
        _sequence(items, kind.__name__)
        self._guard.keys(None, items)
        result = kind(items)
        self._guard.copied(result, items, f"{kind.__name__}()")
        return result

    def _complex(self, real=0.0, imag=0.0):
        if type(real) not in (int, float) or type(imag) not in (int, float):
            raise UnpicklingError(f"complex needs two numbers, got {_describe(real)}, {_describe(imag)}")
        return complex(real, imag)


def _ascii(value):
    return value.decode("ascii") if type(value) is bytes else value


def _ints(values, what):
    if not isinstance(values, (tuple, list)) or not all(type(v) is int and 0 <= v <= INT64_MAX for v in values):
        raise UnpicklingError(f"a tensor's {what} must be a tuple of non-negative ints, got {_describe(values)}")
    return tuple(values)


def _dims(values, what):
    """A tensor's size or stride: at most MAX_DIMS ints, checked before anything walks them."""
    if isinstance(values, (tuple, list)) and len(values) > MAX_DIMS:
        raise UnpicklingError(shape_problem(values, 1) + f" (in its {what})")
    return _ints(values, what)


def _sequence(items, what):
    if type(items) not in (list, tuple, set, frozenset):
        raise UnpicklingError(f"{what} needs a list, got {_describe(items)}")
    return items


def _describe(value):
    if type(value) is int and value.bit_length() > 256:  # its decimal digits would be slow, or refused, to make
        return f"an int of {value.bit_length()} bits"
    text = repr(value) if type(value) in (str, bytes, int, float, bool, type(None)) else type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."

