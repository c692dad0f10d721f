"""What a Python value means as the argument of a user's CUDA C++ kernel, typed by the kernel's own signature
(kernels/cuda_signatures.py gives each parameter a kind code, as the C launcher's).

The launch passes plain ints and floats itself (a Python float for a `float` parameter is converted to 32 bits,
never passed as a double, as CuPy would); `plain_argument` handles the rest: a tensor is its device address, a numpy
scalar must be of the parameter's own type. On the simulator, which has no C launcher, `plain_arguments` does
the whole conversion with the C launcher's range checks.
"""
import numpy as np

PARAMETER_TYPES = {"p": "a pointer", "i": "int (int32)", "u": "unsigned int (uint32)", "l": "long long (int64)",
                   "q": "unsigned long long (uint64)", "f": "float (float32)", "d": "double (float64)"}
_NUMPY_TYPES = {"i": np.int32, "u": np.uint32, "l": np.int64, "q": np.uint64, "f": np.float32, "d": np.float64}
_RANGES = {"p": (0, 2**64 - 1), "i": (-2**31, 2**31 - 1), "u": (0, 2**32 - 1), "l": (-2**63, 2**63 - 1),
           "q": (0, 2**64 - 1)}


class ArgumentError(TypeError):
    """An argument that does not fit its parameter; `index` says which."""

    def __init__(self, index, message):
        super().__init__(message)
        self.index = index


def plain_argument(kind, index, value):
    """The int or float that `value` means for a parameter of kind `kind` (called by the C launcher for anything
    but a plain int, or float for a float parameter)."""
    if kind == "p":
        return _address(index, value)
    if isinstance(value, np.generic):
        if type(value) is not _NUMPY_TYPES[kind]:
            raise ArgumentError(index, f"argument {index} is {PARAMETER_TYPES[kind]}, got numpy.{type(value).__name__}:"
                                       f" pass a Python number or numpy.{_NUMPY_TYPES[kind].__name__}")
        return value.item()
    if isinstance(value, (bool, int)) or (kind in "fd" and isinstance(value, float)):
        return float(value) if kind in "fd" else int(value)
    raise ArgumentError(index, f"argument {index} is {PARAMETER_TYPES[kind]}, got {type(value).__name__}")


def dims(value, what):
    """(x, y, z) from an int or a tuple of one to three ints, as the C launcher reads a grid or a block."""
    if isinstance(value, int):
        return value, 1, 1
    if isinstance(value, tuple) and 1 <= len(value) <= 3 and all(isinstance(v, int) for v in value):
        return value + (1,) * (3 - len(value))
    raise TypeError(f"{what} must be an int or a tuple of one to three ints, got {value!r}")


def plain_arguments(kinds, values):
    """Every argument converted and range-checked, as the C launcher does (the simulator's launch)."""
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"kernel arguments are given as a tuple, got {type(values).__name__}")
    if len(values) != len(kinds):
        raise TypeError(f"the kernel takes {len(kinds)} arguments, got {len(values)}")
    plain = []
    for index, (kind, value) in enumerate(zip(kinds, values)):
        exact = type(value) is int or (kind in "fd" and type(value) is float)
        value = value if exact else plain_argument(kind, index, value)
        if kind in _RANGES and not _RANGES[kind][0] <= value <= _RANGES[kind][1]:
            raise OverflowError(f"kernel argument {value} does not fit in {PARAMETER_TYPES[kind]}")
        plain.append(float(value) if kind in "fd" else value)
    return plain


def _address(index, value):
    if isinstance(value, (bool, float)) or not hasattr(value, "data_ptr") and not isinstance(value, int):
        raise ArgumentError(index, f"argument {index} is a pointer: pass a cuda tensor or an int address, "
                                   f"got {type(value).__name__}")
    if isinstance(value, int):
        return value
    device = getattr(value, "device", None)
    if getattr(device, "type", None) != "cuda":
        raise ArgumentError(index, f"argument {index} is a pointer to device memory, got a tensor on {device}")
    return value.data_ptr()
