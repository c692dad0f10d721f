"""What a checkpoint's pickle may name: every global the restricted unpickler (unpickler.py) accepts, and
what each stands for. A name not listed here is refused; nothing from a file is ever imported.
"""
import re
from pickle import UnpicklingError

from ..base import dtypes
from .torch_pickle import STORAGE_CLASSES

INT64_MAX = 2**63 - 1
_PY2_NAMES = {"__builtin__": "builtins", "copy_reg": "copyreg", "torch.tensor": "torch._tensor"}
_NOT_IN_MINITENSOR = re.compile(r"^torch\.(cuda\.)?(u?int\d+|float\d+\w*|complex\d+|c?half|cfloat|cdouble|bits\w+|"
                                r"q?u?int\d+x?\d*|\w+Storage)$")


class Named:
    """A global on the unpickler's stack, shown by its name."""
    __slots__ = ("name",)

    def __repr__(self):
        return self.name


class Global(Named):
    """A name loaded by GLOBAL: `fn` is the Unpickler method REDUCE calls, None for a type used as a marker."""
    __slots__ = ("fn",)

    def __init__(self, name, fn):
        self.name, self.fn = name, fn


class StorageType(Named):
    """torch.FloatStorage and friends: only meaningful inside a persistent id."""
    __slots__ = ("dtype",)

    def __init__(self, name, dtype):
        self.name, self.dtype = name, dtype

    @property
    def untyped(self):
        """torch.UntypedStorage (numel in bytes), as against a dtype's legacy class (torch.FloatStorage)."""
        return self.name.endswith(".UntypedStorage")


_VALUES = {f"torch.{d.name}": d for d in dtypes.ALL}
_VALUES.update({f"{module}.{name}": StorageType(f"{module}.{name}", dtype)
                for module in ("torch", "torch.cuda") for dtype, name in STORAGE_CLASSES.items()})
_VALUES.update({name: StorageType(name, dtypes.uint8) for name in ("torch.storage.UntypedStorage",
                                                                   "torch.UntypedStorage")})
MARKERS = {name: Global(name, None) for name in ("torch.Tensor", "torch.nn.parameter.Parameter")}
CALLABLES = {  # global name -> Unpickler method
    "collections.OrderedDict": "_ordered_dict",
    "torch._utils._rebuild_tensor": "_rebuild_tensor",
    "torch._utils._rebuild_tensor_v2": "_rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3": "_rebuild_tensor_v3",
    "torch._utils._rebuild_parameter": "_rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state": "_rebuild_parameter_with_state",
    "torch._tensor._rebuild_from_type_v2": "_rebuild_from_type_v2",
    "torch.Size": "_size",
    "torch.device": "_torch_device",
    "_codecs.encode": "_encode",
    "builtins.bytes": "_bytes",
    "builtins.bytearray": "_bytearray",
    "builtins.set": "_set",
    "builtins.frozenset": "_frozenset",
    "builtins.complex": "_complex",
}
TENSOR_REBUILDS = {"torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2",
                   "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
                   "torch._utils._rebuild_parameter_with_state"}


def find(module, name, unpickler):
    """What GLOBAL module.name stands for: a value, a marker type, or a Global whose fn is the `unpickler`
    method that REDUCE calls; anything else raises UnpicklingError naming it."""
    module = _PY2_NAMES.get(module, module)
    full = f"{module}.{name}"
    if full in _VALUES:
        return _VALUES[full]
    if full in MARKERS:
        return MARKERS[full]
    if full in CALLABLES:
        return Global(full, getattr(unpickler, CALLABLES[full]))
    if _NOT_IN_MINITENSOR.match(full):
        raise UnpicklingError(f"the checkpoint uses {full}, a dtype or storage type that minitensor does not "
                              f"have (it has {', '.join(d.name for d in dtypes.ALL)})")
    raise UnpicklingError(f"Unsupported global: GLOBAL {full} is not allowed: minitensor loads only tensors, "
                          "storages, containers and plain values, and never imports or runs code from a file")
