"""The restricted unpickler that reads a checkpoint's pickle: it builds tensors, storages, containers and
plain values, and nothing else.

The opcodes are base/pickle_reader.py's (`PickleReader`, an interpreter written there rather than
`pickle.Unpickler` with a restricted `find_class`, because pickle's BUILD sets attributes on any object on its
stack: a dtype, a tensor's storage), bounded by the pickle's size (base/pickle_guard.py `Guard`: nesting depth,
elements copied or hashed, keys of one hash). This reader says what the rest means: BUILD works on OrderedDicts
only, REDUCE calls only the functions allowlist.py names, and every other global is refused with a
`pickle.UnpicklingError` naming it. Nothing from the file is ever imported or executed. What those functions
build, and how they check it, is rebuilds.py's.

Storages arrive as persistent ids `("storage", storage_type, key, location, numel)`; the caller's
`load_storage(key, location, dtype, numel)` turns one into an `UntypedStorage` (reading its record and
placing it per map_location), once per key; a dtype's storage class (torch.FloatStorage) makes a `TypedStorage`
over it (rebuilds.py).
"""
from collections import OrderedDict
from pickle import UnpicklingError

from ..base.pickle_reader import PickleReader
from .allowlist import Global, find
from .rebuilds import Rebuilds


def loads(data, load_storage):
    """The object pickled in `data`; storages come from `load_storage(key, location, dtype, numel)`."""
    return Unpickler(data, load_storage).load()


class Unpickler(PickleReader, Rebuilds):
    """Reads one checkpoint pickle: `load()` runs its opcodes and returns the object STOP leaves."""

    _MAPPINGS = (dict, OrderedDict)

    def __init__(self, data, load_storage):
        super().__init__(data)
        self._load_storage = load_storage
        self._by_key = {}  # storage key -> UntypedStorage, or TypedStorage for a dtype's storage class
        self._dtypes = {}  # id(storage) -> (storage, dtype of its storage class)

    def _find(self, module, name):
        return find(module, name, self)

    def _call(self, func, args):
        if type(func) is not Global or func.fn is None:
            raise UnpicklingError(f"REDUCE can only call the allowed functions, not {func!r}")
        if type(args) is not tuple:
            raise UnpicklingError(f"REDUCE needs an argument tuple for {func.name}, got {type(args).__name__}")
        return func.fn(*args)

    def _set_state(self, inst, state):
        if type(inst) is not OrderedDict or type(state) is not dict or not all(type(k) is str for k in state):
            raise UnpicklingError(f"BUILD can only set attributes of an OrderedDict from a dict, not of "
                                  f"{type(inst).__name__} from {type(state).__name__}")
        self._guard.copied(inst, state, "BUILD")
        inst.__dict__.update(state)

    def _persistent(self, pid):
        return self._storage(pid)
