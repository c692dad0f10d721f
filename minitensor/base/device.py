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
