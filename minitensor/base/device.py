"""`mt.device`: a device type ("cpu", "cuda", or one a third party registered) and an optional index."""
import re

from .arguments import int_arg

_DEVICE_RE = re.compile(r"([a-z][a-z0-9_]*)(?::(0|[1-9][0-9]*))?")  # whole strings (fullmatch), ASCII digits, as torch
_TYPE_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")
_TYPES = {"cpu", "cuda"}  # and those added by register_type


def of_registered_type(d):
    """Whether device `d` is of a type a third party registered (neither cpu nor cuda)."""
    return d.type != "cpu" and d.type != "cuda"


def register_type(name):
    """Let device strings name a new device type (minitensor.backends.register_device_type calls this)."""
    if not isinstance(name, str) or not _TYPE_NAME_RE.fullmatch(name):
        raise ValueError(f"a device type name must be lowercase letters, digits and '_', starting with a letter; "
                         f"got {name!r}")
    if name in _TYPES:
        raise RuntimeError(f"device type '{name}' is already registered")
    _TYPES.add(name)


class device:
    __slots__ = ("type", "index")

    def __init__(self, type, index=None):
        if isinstance(type, device):
            self.type, self.index = type.type, type.index
            return
        if isinstance(type, tuple) and len(type) == 2:
            type, index = type
        if not isinstance(type, str):
            raise TypeError(f"device() expects a string or a device, got {type!r}")
        m = _DEVICE_RE.fullmatch(type)
        if m is None or m.group(1) not in _TYPES:
            raise RuntimeError(f"Invalid device string: '{type}'")
        if m.group(2) is not None and index is not None:
            raise RuntimeError(f"type (string) must not include an index because index was passed explicitly: "
                               f"{type}")
        self.type = m.group(1)
        self.index = int(m.group(2)) if m.group(2) is not None else _index_arg(index)
        if self.type == "cpu" and self.index not in (None, 0):
            raise RuntimeError(f"CPU device index must be 0, got {self.index}")

    def __str__(self):
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def __repr__(self):
        index = "" if self.index is None else f", index={self.index}"
        return f"device(type='{self.type}'{index})"

    def __eq__(self, other):
        if isinstance(other, str):
            try:
                other = device(other)
            except RuntimeError:
                return False
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self):
        return hash((self.type, self.index))

    def __reduce__(self):
        return (device, (self.type, self.index))


def _index_arg(index):
    """A device index: None, or an int >= 0 (numpy's ints too; not a bool, as in torch)."""
    if index is None:
        return None
    index = int_arg(index, "device(): argument 'index'")
    if index < 0:
        raise RuntimeError(f"Device index must not be negative, got {index}")
    return index


CPU = device("cpu")
