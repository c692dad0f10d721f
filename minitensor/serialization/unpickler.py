"""The restricted unpickler that reads a checkpoint's pickle: it builds tensors, storages, containers and
plain values, and nothing else.

It is an interpreter of pickle opcodes written here rather than `pickle.Unpickler` with a restricted
`find_class`, because pickle's BUILD opcode sets attributes on any object on its stack (a dtype, a
tensor's storage): here BUILD works on OrderedDicts only, REDUCE calls only the functions allowlist.py names,
and every other global is refused with a `pickle.UnpicklingError` naming it. Nothing from the file is ever
imported or executed. Tensors are checked against their storage: sizes, strides and offset must stay
inside it.

Storages arrive as persistent ids `("storage", storage_type, key, location, numel)`; the caller's
`load_storage(key, location, dtype, numel)` turns one into an `UntypedStorage` (reading its record and
placing it per map_location), once per key.
"""
import math
import struct
from collections import OrderedDict
from pickle import UnpicklingError

from ..base import dtypes
from ..base.device import device as _device
from ..tensor import Size, Tensor
from .allowlist import INT64_MAX, MARKERS, TENSOR_REBUILDS, Global, StorageType, find

_ERRORS = (IndexError, KeyError, TypeError, ValueError, struct.error, OverflowError, RecursionError)


def loads(data, load_storage):
    """The object pickled in `data`; storages come from `load_storage(key, location, dtype, numel)`."""
    return Unpickler(data, load_storage).load()


class _Stop(Exception):
    pass


class Unpickler:
    def __init__(self, data, load_storage):
        self._data = bytes(data)
        self._pos = 0
        self._load_storage = load_storage
        self._stack = []
        self._marks = []
        self._memo = {}
        self._by_key = {}  # storage key -> UntypedStorage
        self._dtypes = {}  # id(storage) -> (storage, dtype of its storage class)
        self._caller_error = None  # an error raised by load_storage: the caller's, passed through as it is
        self._ops = {
            0x80: self._proto, 0x95: self._frame, 0x2E: self._stop, 0x63: self._global, 0x93: self._stack_global,
            0x52: self._reduce, 0x62: self._build, 0x28: self._mark, 0x74: self._tuple, 0x85: self._tuple1,
            0x86: self._tuple2, 0x87: self._tuple3, 0x29: self._empty_tuple, 0x5D: self._empty_list,
            0x61: self._append, 0x65: self._appends, 0x7D: self._empty_dict, 0x73: self._setitem,
            0x75: self._setitems, 0x8F: self._empty_set, 0x90: self._additems, 0x91: self._frozenset_op,
            0x4E: self._none, 0x88: self._true, 0x89: self._false, 0x4A: self._binint, 0x4B: self._binint1,
            0x4D: self._binint2, 0x8A: self._long1, 0x8B: self._long4, 0x47: self._binfloat,
            0x58: self._binunicode, 0x8C: self._short_binunicode, 0x8D: self._binunicode8,
            0x55: self._short_binstring, 0x42: self._binbytes, 0x43: self._short_binbytes,
            0x8E: self._binbytes8, 0x96: self._bytearray8, 0x51: self._binpersid, 0x71: self._binput,
            0x72: self._long_binput, 0x94: self._memoize, 0x68: self._binget, 0x6A: self._long_binget,
            0x30: self._pop, 0x31: self._pop_mark,
        }

    def load(self):
        data, ops = self._data, self._ops
        start = 0
        try:
            while True:
                start = self._pos
                if start >= len(data):
                    raise UnpicklingError("pickle data was truncated: it ends before its STOP opcode")
                op = ops.get(data[start])
                self._pos = start + 1
                if op is None:
                    raise UnpicklingError(f"unsupported pickle opcode {data[start:start + 1]!r} at byte {start}: "
                                          "checkpoints use only the opcodes of protocols 2 to 5 that build "
                                          "containers and plain values")
                op()
        except _Stop as stop:
            return stop.args[0]
        except _ERRORS as exc:
            if exc is self._caller_error:
                raise
            raise UnpicklingError(f"corrupt pickle at byte {start}: {type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------------------------------ reading
    def _read(self, n):
        end = self._pos + n
        if n < 0 or end > len(self._data):
            raise UnpicklingError(f"pickle data was truncated: {n} bytes wanted at byte {self._pos}, "
                                  f"{len(self._data) - self._pos} left")
        chunk = self._data[self._pos:end]
        self._pos = end
        return chunk

    def _unpack(self, fmt):
        return struct.unpack(fmt, self._read(struct.calcsize(fmt)))[0]

    def _readline(self):
        end = self._data.find(b"\n", self._pos, self._pos + 256)
        if end < 0:
            raise UnpicklingError(f"GLOBAL at byte {self._pos - 1} has no name (no newline within 256 bytes)")
        line = self._data[self._pos:end]
        self._pos = end + 1
        return line.decode("utf-8")

    def _push(self, value):
        self._stack.append(value)

    def _pop_mark(self):
        items = self._stack
        self._stack = self._marks.pop()
        return items

    # ------------------------------------------------------------------------------------------ opcodes
    def _proto(self):
        self._read(1)

    def _frame(self):
        self._read(8)

    def _stop(self):
        raise _Stop(self._stack.pop())

    def _global(self):
        module = self._readline()
        self._push(find(module, self._readline(), self))

    def _stack_global(self):
        name, module = self._stack.pop(), self._stack.pop()
        if type(name) is not str or type(module) is not str:
            raise UnpicklingError("STACK_GLOBAL needs two strings")
        self._push(find(module, name, self))

    def _reduce(self):
        args = self._stack.pop()
        func = self._stack[-1]
        if type(func) is not Global or func.fn is None:
            raise UnpicklingError(f"REDUCE can only call the allowed functions, not {func!r}")
        if type(args) is not tuple:
            raise UnpicklingError(f"REDUCE needs an argument tuple for {func.name}, got {type(args).__name__}")
        self._stack[-1] = func.fn(*args)

    def _build(self):
        state = self._stack.pop()
        inst = self._stack[-1]
        if type(inst) is not OrderedDict or type(state) is not dict or not all(type(k) is str for k in state):
            raise UnpicklingError(f"BUILD can only set attributes of an OrderedDict from a dict, not of "
                                  f"{type(inst).__name__} from {type(state).__name__}")
        inst.__dict__.update(state)

    def _mark(self):
        self._marks.append(self._stack)
        self._stack = []

    def _tuple(self):
        self._push(tuple(self._pop_mark()))

    def _tuple1(self):
        self._stack[-1] = (self._stack[-1],)

    def _tuple2(self):
        self._tuple_n(2)

    def _tuple3(self):
        self._tuple_n(3)

    def _tuple_n(self, n):
        if len(self._stack) < n:
            raise IndexError("stack underflow")
        items = tuple(self._stack[-n:])
        del self._stack[-n:]
        self._push(items)

    def _empty_tuple(self):
        self._push(())

    def _empty_list(self):
        self._push([])

    def _append(self):
        value = self._stack.pop()
        self._target(list, "APPEND").append(value)

    def _appends(self):
        items = self._pop_mark()
        self._target(list, "APPENDS").extend(items)

    def _empty_dict(self):
        self._push({})

    def _setitem(self):
        value, key = self._stack.pop(), self._stack.pop()
        self._target((dict, OrderedDict), "SETITEM")[key] = value

    def _setitems(self):
        items = self._pop_mark()
        if len(items) % 2:
            raise UnpicklingError("SETITEMS needs key, value pairs")
        target = self._target((dict, OrderedDict), "SETITEMS")
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def _empty_set(self):
        self._push(set())

    def _additems(self):
        items = self._pop_mark()
        self._target(set, "ADDITEMS").update(items)

    def _frozenset_op(self):
        self._push(frozenset(self._pop_mark()))

    def _target(self, types, op):
        target = self._stack[-1]
        if type(target) not in (types if isinstance(types, tuple) else (types,)):
            raise UnpicklingError(f"{op} on a {type(target).__name__}")
        return target

    def _none(self):
        self._push(None)

    def _true(self):
        self._push(True)

    def _false(self):
        self._push(False)

    def _binint(self):
        self._push(self._unpack("<i"))

    def _binint1(self):
        self._push(self._read(1)[0])

    def _binint2(self):
        self._push(self._unpack("<H"))

    def _long1(self):
        self._push(int.from_bytes(self._read(self._read(1)[0]), "little", signed=True))

    def _long4(self):
        self._push(int.from_bytes(self._read(self._unpack("<i")), "little", signed=True))

    def _binfloat(self):
        self._push(self._unpack(">d"))

    def _binunicode(self):
        self._push(self._read(self._unpack("<I")).decode("utf-8", "surrogatepass"))

    def _short_binunicode(self):
        self._push(self._read(self._read(1)[0]).decode("utf-8", "surrogatepass"))

    def _binunicode8(self):
        self._push(self._read(self._unpack("<Q")).decode("utf-8", "surrogatepass"))

    def _short_binstring(self):  # Python 2 str: torch.load decodes it as UTF-8
        self._push(self._read(self._read(1)[0]).decode("utf-8"))

    def _binbytes(self):
        self._push(self._read(self._unpack("<I")))

    def _short_binbytes(self):
        self._push(self._read(self._read(1)[0]))

    def _binbytes8(self):
        self._push(self._read(self._unpack("<Q")))

    def _bytearray8(self):
        self._push(bytearray(self._read(self._unpack("<Q"))))

    def _binput(self):
        self._memo[self._read(1)[0]] = self._stack[-1]

    def _long_binput(self):
        self._memo[self._unpack("<I")] = self._stack[-1]

    def _memoize(self):
        self._memo[len(self._memo)] = self._stack[-1]

    def _binget(self):
        self._push(self._memo[self._read(1)[0]])

    def _long_binget(self):
        self._push(self._memo[self._unpack("<I")])

    def _pop(self):
        if self._stack:
            self._stack.pop()
        else:
            self._pop_mark()

    def _binpersid(self):
        self._push(self._storage(self._stack.pop()))

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
                storage = self._load_storage(key, location, storage_type.dtype, numel)
            except BaseException as exc:
                self._caller_error = exc
                raise
            self._by_key[key] = storage
            self._dtypes.setdefault(id(storage), (storage, storage_type.dtype))
        return storage

    # ------------------------------------------------------------------------------------------ callables
    def _tensor(self, storage, offset, size, stride, dtype=None):
        entry = self._dtypes.get(id(storage))
        if entry is None or entry[0] is not storage:
            raise UnpicklingError(f"a tensor must be rebuilt from a storage of this file, not {_describe(storage)}")
        dtype = entry[1] if dtype is None else dtype
        size, stride = _ints(size, "size"), _ints(stride, "stride")
        if len(size) != len(stride):
            raise UnpicklingError(f"a tensor's size {list(size)} and stride {list(stride)} differ in length")
        if type(offset) is not int or not 0 <= offset <= INT64_MAX:
            raise UnpicklingError(f"a tensor's storage offset must be a non-negative int, got {_describe(offset)}")
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
        return OrderedDict()

    def _size(self, values):
        return Size(_ints(values, "torch.Size"))

    def _torch_device(self, kind, index=None):
        if type(kind) is not str or not (index is None or type(index) is int):
            raise UnpicklingError(f"torch.device needs a string and an optional int, got {_describe(kind)}, "
                                  f"{_describe(index)}")
        return _device(kind, index)

    def _encode(self, text, encoding):
        if type(text) is not str or type(encoding) is not str or encoding not in ("latin1", "latin-1"):
            raise UnpicklingError(f"_codecs.encode is allowed only as encode(str, 'latin1') for bytes, got "
                                  f"{_describe(text)}, {encoding!r}")
        return text.encode("latin1")

    def _bytes(self):
        return b""

    def _bytearray(self, data=b"", encoding=None):
        if encoding is not None:
            data = self._encode(data, encoding)
        if type(data) is not bytes:
            raise UnpicklingError(f"bytearray needs bytes, got {_describe(data)}")
        return bytearray(data)

    def _set(self, items=()):
        return set(_sequence(items, "set"))

    def _frozenset(self, items=()):
        return frozenset(_sequence(items, "frozenset"))

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


def _sequence(items, what):
    if type(items) not in (list, tuple, set, frozenset):
        raise UnpicklingError(f"{what} needs a list, got {_describe(items)}")
    return items


def _describe(value):
    text = repr(value) if type(value) in (str, bytes, int, float, bool, type(None)) else type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."
