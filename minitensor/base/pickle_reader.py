"""A pickle reader that runs nothing from the file: an interpreter of the opcodes of protocols 2 to 5 that build
containers and plain values, each bounded by the pickle's size (pickle_guard.py `Guard`: nesting depth, elements
copied or hashed, keys of one hash).

It is written here rather than `pickle.Unpickler` with a restricted `find_class` because the C unpickler has no
such bounds (a 200 KB pickle nesting tuples 200,000 deep crashes whoever hashes it; memo GET repeats one object
for two bytes) and its BUILD sets attributes on any object on its stack. What a global, REDUCE, BUILD or a
persistent id stands for is the subclass's (`_find`, `_call`, `_set_state`, `_persistent`); here each is
refused. `mt.load`'s restricted reader (serialization/unpickler.py) and the memory viewer are its subclasses.
"""
import struct
from pickle import UnpicklingError

from .pickle_guard import Guard

_ERRORS = (IndexError, KeyError, TypeError, ValueError, struct.error, OverflowError, RecursionError)


class _Stop(Exception):
    pass


class PickleReader:
    """Reads one pickle: `load()` runs its opcodes and returns the object STOP leaves; `guard` holds the accounts,
    for a caller that walks the result on the same budget."""

    _MAPPINGS = (dict,)  # what SETITEM fills: a subclass that builds OrderedDicts adds them

    def __init__(self, data: bytes) -> None:
        self._data = bytes(data)
        self._pos = 0
        self._guard = Guard(len(self._data))
        self._hold = self._guard.hold  # hold(container, items) -> container: every container built goes through it
        self._stack = []
        self._marks = []
        self._memo = {}
        self._caller_error = None  # an error a subclass's callback raised: passed through as it is
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

    @property
    def guard(self) -> Guard:
        """This reading's accounts, whose budget a caller walking the result spends too."""
        return self._guard

    def load(self) -> object:
        """The pickled object; `pickle.UnpicklingError` naming what was wrong, or the subclass's own error."""
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
                                          "only the opcodes of protocols 2 to 5 that build containers and plain "
                                          "values are read")
                op()
        except _Stop as stop:
            return stop.args[0]
        except _ERRORS as exc:
            if exc is self._caller_error:
                raise
            raise UnpicklingError(f"corrupt pickle at byte {start}: {type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------------------------------ the subclass's
    def _find(self, module, name):
        """What GLOBAL module.name stands for."""
        raise UnpicklingError(f"GLOBAL {module}.{name} is not allowed: only plain values are read")

    def _call(self, func, args):
        """What REDUCE makes of `func` (a global `_find` gave) and its argument tuple."""
        raise UnpicklingError(f"REDUCE cannot call {func!r}: only plain values are read")

    def _set_state(self, inst, state):
        """BUILD: `inst` takes `state`."""
        raise UnpicklingError(f"BUILD cannot set the state of a {type(inst).__name__}: only plain values are read")

    def _persistent(self, pid):
        """What a persistent id loads as."""
        raise UnpicklingError("a persistent id is not allowed: only plain values are read")

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

    def _new(self, container):
        self._guard.new(container)
        return container

    # ------------------------------------------------------------------------------------------ opcodes
    def _proto(self):
        self._read(1)

    def _frame(self):
        self._read(8)

    def _stop(self):
        raise _Stop(self._stack.pop())

    def _global(self):
        module = self._readline()
        self._push(self._find(module, self._readline()))

    def _stack_global(self):
        name, module = self._stack.pop(), self._stack.pop()
        if type(name) is not str or type(module) is not str:
            raise UnpicklingError("STACK_GLOBAL needs two strings")
        self._push(self._find(module, name))

    def _reduce(self):
        args = self._stack.pop()
        self._stack[-1] = self._call(self._stack[-1], args)

    def _build(self):
        state = self._stack.pop()
        self._set_state(self._stack[-1], state)

    def _binpersid(self):
        self._push(self._persistent(self._stack.pop()))

    def _mark(self):
        self._marks.append(self._stack)
        self._stack = []

    def _tuple(self):
        items = tuple(self._pop_mark())
        self._push(self._hold(items, items))

    def _tuple1(self):
        items = (self._stack[-1],)
        self._stack[-1] = self._hold(items, items)

    def _tuple2(self):
        self._tuple_n(2)

    def _tuple3(self):
        self._tuple_n(3)

    def _tuple_n(self, n):
        if len(self._stack) < n:
            raise IndexError("stack underflow")
        items = tuple(self._stack[-n:])
        del self._stack[-n:]
        self._push(self._hold(items, items))

    def _empty_tuple(self):
        self._push(self._new(()))

    def _empty_list(self):
        self._push(self._new([]))

    def _append(self):
        value = self._stack.pop()
        self._hold(self._target(list, "APPEND"), (value,)).append(value)

    def _appends(self):
        items = self._pop_mark()
        self._hold(self._target(list, "APPENDS"), items).extend(items)

    def _empty_dict(self):
        self._push(self._new({}))

    def _setitem(self):
        value, key = self._stack.pop(), self._stack.pop()
        self._filled(self._target(self._MAPPINGS, "SETITEM"), [key, value])[key] = value

    def _setitems(self):
        items = self._pop_mark()
        if len(items) % 2:
            raise UnpicklingError("SETITEMS needs key, value pairs")
        target = self._filled(self._target(self._MAPPINGS, "SETITEMS"), items)
        for i in range(0, len(items), 2):
            target[items[i]] = items[i + 1]

    def _filled(self, mapping, items):
        """`mapping`, about to hold `items` (key, value, key, value, ...): keys hashed and counted, height raised."""
        self._guard.keys(mapping, items[::2])
        return self._hold(mapping, items)

    def _empty_set(self):
        self._push(self._new(set()))

    def _additems(self):
        items = self._pop_mark()
        target = self._target(set, "ADDITEMS")
        self._guard.keys(target, items)
        self._hold(target, items).update(items)

    def _frozenset_op(self):
        items = self._pop_mark()
        self._guard.keys(None, items)
        self._push(self._hold(frozenset(items), items))

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
        self._long(self._read(self._read(1)[0]))

    def _long4(self):
        self._long(self._read(self._unpack("<i")))

    def _long(self, data):
        value = int.from_bytes(data, "little", signed=True)
        self._guard.big_int(value)
        self._push(value)

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
