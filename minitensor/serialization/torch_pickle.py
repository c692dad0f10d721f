"""The pickle of a checkpoint, written in torch's vocabulary so that `torch.load(f, weights_only=True)`
reads it.

A tensor becomes `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())`
and a storage a persistent id `("storage", torch.<Type>Storage, key, location, numel)`. The pickle is
written opcode by opcode at protocol 2 rather than with `pickle.Pickler`, which would have to import torch
to name its functions, and using only the opcodes torch's weights-only unpickler accepts.

A storage that tensors of one dtype view is written as that dtype's legacy storage class (numel in
elements), the form every torch version reads. One that is viewed as several dtypes, or saved on its own,
is written as `torch.storage.UntypedStorage` (numel in bytes) and its tensors with `_rebuild_tensor_v3`,
which names their dtype. A TypedStorage (`t.storage()`) is the persistent id of its UntypedStorage, written
as its dtype's legacy class, as torch.save writes it; with tensors or storages that view its memory as another
dtype it is refused with torch.save's error.
"""
import struct
from collections import OrderedDict

from ..base import dtypes
from ..base.device import device as _device
from ..core.storage import UntypedStorage
from ..core.typed_storage import TypedStorage
from ..tensor import Size, Tensor

STORAGE_CLASSES = {
    dtypes.float64: "DoubleStorage", dtypes.float32: "FloatStorage", dtypes.float16: "HalfStorage",
    dtypes.bfloat16: "BFloat16Storage", dtypes.int64: "LongStorage", dtypes.int32: "IntStorage",
    dtypes.int16: "ShortStorage", dtypes.int8: "CharStorage", dtypes.uint8: "ByteStorage",
    dtypes.bool_: "BoolStorage", dtypes.complex64: "ComplexFloatStorage", dtypes.complex128: "ComplexDoubleStorage",
}

_APPENDS_BATCH = 1000  # items per MARK ... APPENDS / SETITEMS, as pickle does


def dumps(obj):
    """(pickle bytes, [(key, storage)] in key order) for `obj`."""
    plan = _StoragePlan(obj)
    pickler = _Pickler(plan)
    pickler.dump(obj)
    return pickler.getvalue(), plan.storages


def location_tag(device):
    """How torch names a storage's device in a checkpoint: 'cpu', 'cuda:N', or a registered type's 'fake:N'."""
    return "cpu" if device.type == "cpu" else f"{device.type}:{device.index}"


class _StoragePlan:
    """Walks `obj` once before pickling to learn, for each storage, the dtypes of the tensors that view
    it and whether it is saved on its own: that decides the class written for it."""

    def __init__(self, obj):
        self._dtypes = {}  # id(storage) -> set of dtypes, None when saved on its own
        self._keys = {}  # id(storage) -> key, in first-seen order while pickling
        self._typed = {}  # id(storage) -> a TypedStorage over it that is saved
        self.storages = []
        self._walk(obj)
        self._check_typed()

    def _walk(self, obj):
        seen, stack = set(), [obj]
        while stack:
            x = stack.pop()
            if isinstance(x, Tensor):
                self._note(x._storage, x.dtype)
            elif isinstance(x, UntypedStorage):
                self._note(x, None)
            elif isinstance(x, TypedStorage):
                self._note(x._untyped_storage, x.dtype)
                self._typed[id(x._untyped_storage)] = x
            elif isinstance(x, (list, tuple, dict, set)) and id(x) not in seen:
                seen.add(id(x))
                if isinstance(x, dict):
                    stack.extend(x.keys())
                    stack.extend(x.values())
                    if isinstance(x, OrderedDict):
                        stack.extend(vars(x).values())
                else:
                    stack.extend(x)

    def _note(self, storage, dtype):
        kinds = self._dtypes.setdefault(id(storage), set())
        if kinds is not None:
            if dtype is None:
                self._dtypes[id(storage)] = None
            else:
                kinds.add(dtype)

    def _check_typed(self):
        """A TypedStorage is written as its dtype's class, so its memory must not be saved as another dtype."""
        for key, typed in self._typed.items():
            if self._dtypes[key] != {typed.dtype}:
                raise RuntimeError("Cannot save multiple tensors or storages that view the same data as different "
                                   "types")
            if typed.nbytes() % typed.dtype.itemsize:
                raise RuntimeError(f"Cannot save a {typed.dtype.name} TypedStorage over {typed.nbytes()} bytes: "
                                   f"not a whole number of {typed.dtype.itemsize}-byte elements")

    def typed_dtype(self, storage):
        """The dtype whose legacy storage class this storage is written as, or None for UntypedStorage (also
        for uint16/32/64, which have no legacy class: torch writes them so too)."""
        kinds = self._dtypes[id(storage)]
        if kinds is None or len(kinds) != 1:
            return None
        (dtype,) = kinds
        return dtype if dtype in STORAGE_CLASSES and storage.nbytes() % dtype.itemsize == 0 else None

    def persistent_id(self, storage):
        key = self._keys.get(id(storage))
        if key is None:
            key = self._keys[id(storage)] = str(len(self._keys))
            self.storages.append((key, storage))
        dtype = self.typed_dtype(storage)
        if dtype is None:
            return ("torch.storage", "UntypedStorage"), key, storage.nbytes()
        return ("torch", STORAGE_CLASSES[dtype]), key, storage.nbytes() // dtype.itemsize


class _Pickler:
    def __init__(self, plan):
        self._plan = plan
        self._out = [b"\x80\x02"]  # PROTO 2
        self._memo = {}  # id(obj) -> (memo index, obj): obj is kept so its id stays unique
        self._in_progress = set()  # ids of tuples being written, to refuse a tuple that holds itself

    def getvalue(self):
        return b"".join(self._out)

    def dump(self, obj):
        self._save(obj)
        self._out.append(b".")  # STOP

    # ------------------------------------------------------------------------------------ helpers
    def _put(self, obj):
        index = len(self._memo)
        self._memo[id(obj)] = (index, obj)
        self._out.append(b"q" + bytes([index]) if index < 256 else b"r" + struct.pack("<I", index))

    def _get(self, obj):
        entry = self._memo.get(id(obj))
        if entry is None:
            return False
        index = entry[0]
        self._out.append(b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index))
        return True

    def _global(self, module, name):
        self._out.append(f"c{module}\n{name}\n".encode("ascii"))

    def _call(self, module, name, args):
        """module.name(*args) at load time: GLOBAL, the argument tuple, REDUCE."""
        self._global(module, name)
        self._save(tuple(args))
        self._out.append(b"R")

    def _batched(self, items, single, many):
        """APPEND/SETITEM for one item, MARK ... APPENDS/SETITEMS in batches for more."""
        for start in range(0, len(items), _APPENDS_BATCH):
            batch = items[start:start + _APPENDS_BATCH]
            if len(batch) == 1:
                for x in batch[0]:
                    self._save(x)
                self._out.append(single)
            else:
                self._out.append(b"(")
                for item in batch:
                    for x in item:
                        self._save(x)
                self._out.append(many)

    # ------------------------------------------------------------------------------------ objects
    def _save(self, obj):
        t = type(obj)
        if obj is None:
            self._out.append(b"N")
        elif t is bool:
            self._out.append(b"\x88" if obj else b"\x89")
        elif t is int:
            self._int(obj)
        elif t is float:
            self._out.append(b"G" + struct.pack(">d", obj))
        elif t is str:
            data = obj.encode("utf-8", "surrogatepass")
            self._out.append(b"X" + struct.pack("<I", len(data)) + data)
        elif self._get(obj):
            return
        elif t is Tensor:
            self._tensor(obj)
        elif t is UntypedStorage:
            self._persistent_id(obj)
        elif t is TypedStorage:
            self._persistent_id(obj._untyped_storage)
        elif t is tuple:
            self._tuple(obj)
        elif t is list:
            self._out.append(b"]")
            self._put(obj)
            self._batched([(x,) for x in obj], b"a", b"e")
        elif t is dict:
            self._out.append(b"}")
            self._put(obj)
            self._batched(list(obj.items()), b"s", b"u")
        elif t is OrderedDict:
            self._call("collections", "OrderedDict", ())
            self._put(obj)
            self._batched(list(obj.items()), b"s", b"u")
            if vars(obj):  # e.g. the _metadata of a module's state_dict
                self._save(dict(vars(obj)))
                self._out.append(b"b")  # BUILD
        elif t is bytes:
            self._call("_codecs", "encode", (obj.decode("latin1"), "latin1"))
            self._put(obj)
        elif t is bytearray:
            self._call("builtins", "bytearray", (bytes(obj),))
            self._put(obj)
        elif t is set:
            self._call("builtins", "set", (list(obj),))
            self._put(obj)
        elif t is complex:
            self._call("builtins", "complex", (obj.real, obj.imag))
        elif t is Size:
            self._call("torch", "Size", (tuple(obj),))
        elif t is _device:
            self._call("torch", "device", (obj.type,) if obj.index is None else (obj.type, obj.index))
        elif t is dtypes.dtype:
            self._global("torch", obj.name)
        else:
            raise TypeError(f"mt.save can save tensors, storages, dicts, OrderedDicts, lists, tuples, sets and "
                            f"plain values (None, bool, int, float, complex, str, bytes, devices, dtypes, Size); "
                            f"got an object of type {t.__module__}.{t.__qualname__}")

    def _int(self, value):
        if 0 <= value < 256:
            self._out.append(b"K" + bytes([value]))
        elif 0 <= value < 65536:
            self._out.append(b"M" + struct.pack("<H", value))
        elif -2**31 <= value < 2**31:
            self._out.append(b"J" + struct.pack("<i", value))
        else:
            data = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
            if len(data) > 255:
                raise ValueError(f"mt.save cannot save an int of {value.bit_length()} bits: torch reads ints of "
                                 "at most 2040 bits")
            self._out.append(b"\x8a" + bytes([len(data)]) + data)

    def _tuple(self, obj):
        if not obj:
            self._out.append(b")")
            return
        if id(obj) in self._in_progress:
            raise ValueError("mt.save cannot save a tuple that contains itself")
        self._in_progress.add(id(obj))
        if len(obj) <= 3:
            for x in obj:
                self._save(x)
            self._out.append(b"\x85\x86\x87"[len(obj) - 1:len(obj)])
        else:
            self._out.append(b"(")
            for x in obj:
                self._save(x)
            self._out.append(b"t")
        self._in_progress.discard(id(obj))
        self._put(obj)

    def _persistent_id(self, storage):
        (module, name), key, numel = self._plan.persistent_id(storage)
        self._out.append(b"(X\x07\x00\x00\x00storage")
        self._global(module, name)
        self._save(key)
        self._save(location_tag(storage.device))
        self._int(numel)
        self._out.append(b"tQ")  # TUPLE, BINPERSID

    def _tensor(self, t):
        typed = self._plan.typed_dtype(t._storage) is not None
        self._global("torch._utils", "_rebuild_tensor_v2" if typed else "_rebuild_tensor_v3")
        self._out.append(b"(")
        self._persistent_id(t._storage)
        self._int(t._offset)
        self._save(tuple(t._shape))
        self._save(tuple(t._stride))
        self._out.append(b"\x89")  # requires_grad=False
        self._call("collections", "OrderedDict", ())
        if not typed:
            self._global("torch", t.dtype.name)
        self._out.append(b"tR")  # TUPLE, REDUCE
        self._put(t)

