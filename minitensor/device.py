"""`mt.device`: a device type ("cpu" or "cuda") and an optional index."""
import re

_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


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
        m = _DEVICE_RE.match(type)
        if m is None or (m.group(2) is not None and index is not None):
            raise RuntimeError(f"Invalid device string: '{type}'")
        self.type = m.group(1)
        self.index = int(m.group(2)) if m.group(2) is not None else index
        if self.index is not None:
            if not isinstance(self.index, int) or self.index < 0:
                raise RuntimeError(f"Device index must not be negative, got {self.index!r}")
            if self.type == "cpu" and self.index != 0:
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


CPU = device("cpu")
_named = {}  # device string -> the device it always names: factories take strings on every call
_cuda = None  # minitensor.cuda, once imported (it imports this module)


def as_device(d):
    """Normalise a device argument: a cuda device always gets an index (the current device)."""
    if type(d) is str:
        named = _named.get(d)
        if named is not None:
            return named
        parsed = device(d)
        named = _resolve(parsed)
        if parsed.index is not None or named is CPU or len(_cuda._DEVICES) == 1:
            _named[d] = named  # "cuda" names the current device, which is always cuda:0 on a one-GPU machine
        return named
    if isinstance(d, int):
        d = device("cuda", d)
    elif not isinstance(d, device):
        d = device(d)
    return _resolve(d)


def _resolve(d):
    global _cuda
    if d.type != "cuda":
        return CPU
    if _cuda is None:
        from . import cuda as _cuda
    return _cuda._DEVICES[_cuda._check_index(_cuda.current_device() if d.index is None else d.index)]
