"""Element types and torch's type-promotion rules.

numpy has no bfloat16, so bfloat16 tensors keep their raw bits in uint16 arrays on the host; the
helpers at the bottom convert them to and from float32 (round to nearest even, as torch does).
"""
import numpy as np

BOOL, INT, FLOAT = 0, 1, 2  # promotion categories, in order


class dtype:
    """One element type: its size, its category, and how numpy and Triton spell it."""

    __slots__ = ("name", "itemsize", "category", "is_signed", "np", "triton", "_order")

    def __init__(self, name, itemsize, category, is_signed, np_dtype, triton_name, order):
        self.name = name
        self.itemsize = itemsize
        self.category = category
        self.is_signed = is_signed
        self.np = np.dtype(np_dtype)  # storage dtype on the host (uint16 for bfloat16)
        self.triton = triton_name
        self._order = order

    @property
    def is_floating_point(self):
        return self.category == FLOAT

    def __repr__(self):
        return f"minitensor.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


bool_ = dtype("bool", 1, BOOL, False, np.bool_, "i1", 0)
uint8 = dtype("uint8", 1, INT, False, np.uint8, "u8", 1)
int8 = dtype("int8", 1, INT, True, np.int8, "i8", 2)
int16 = dtype("int16", 2, INT, True, np.int16, "i16", 3)
int32 = dtype("int32", 4, INT, True, np.int32, "i32", 4)
int64 = dtype("int64", 8, INT, True, np.int64, "i64", 5)
float16 = dtype("float16", 2, FLOAT, True, np.float16, "fp16", 6)
bfloat16 = dtype("bfloat16", 2, FLOAT, True, np.uint16, "bf16", 7)
float32 = dtype("float32", 4, FLOAT, True, np.float32, "fp32", 8)
float64 = dtype("float64", 8, FLOAT, True, np.float64, "fp64", 9)

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64)
_BY_NAME = {d.name: d for d in ALL}
_FROM_NP = {d.np: d for d in ALL if d is not bfloat16}

default_float = float32
default_int = int64

# torch's (c10's) names of the scalar types, as its error messages spell them
TORCH_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long",
               "float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "float64": "Double"}


def tensor_type_name(dt, cuda):
    """torch's legacy tensor type name in minitensor's package: "minitensor.cuda.FloatTensor"."""
    return f"minitensor.{'cuda.' if cuda else ''}{TORCH_NAMES[dt.name]}Tensor"


def from_tensor_type_name(name):
    """(dtype, on cuda?) of a tensor type name, minitensor's or torch's ("torch.cuda.FloatTensor")."""
    package, _, rest = name.partition(".")
    cuda = rest.startswith("cuda.")
    kind = rest[5:] if cuda else rest
    by_torch_name = {f"{torch_name}Tensor": _BY_NAME[own] for own, torch_name in TORCH_NAMES.items()}
    if package not in ("minitensor", "torch") or kind not in by_torch_name:
        raise ValueError(f"invalid type: {name!r}; expected a name such as 'minitensor.cuda.FloatTensor' or "
                         f"'torch.LongTensor'")
    return by_torch_name[kind], cuda


def _by_name(name):
    return _BY_NAME[name]


_PYTHON_TYPES = ((bool, bool_), (int, int64), (float, float64))  # what torch takes Python's types for


def dtype_arg(value, function):
    """`value` as a dtype argument of `function`: a minitensor dtype, or Python's bool, int or float (torch takes
    them for bool, int64 and float64); anything else (a string, a numpy type) raises TypeError, as in torch."""
    if type(value) is dtype:
        return value
    for python_type, dt in _PYTHON_TYPES:
        if value is python_type:
            return dt
    raise TypeError(f"{function}(): argument 'dtype' must be minitensor.dtype, not {type(value).__name__}: one of "
                    f"{', '.join('mt.' + d.name for d in ALL)}, or Python's bool, int or float")


def from_numpy(np_dtype):
    try:
        return _FROM_NP[np.dtype(np_dtype)]
    except KeyError:
        raise TypeError(f"can't convert numpy array of type {np.dtype(np_dtype)}: the supported types are "
                        "bool, uint8, int8, int16, int32, int64, float16, float32 and float64") from None


def promote_types(a, b):
    """torch.promote_types for the dtypes minitensor has."""
    if a is b:
        return a
    if a._order > b._order:
        a, b = b, a
    if b.category == FLOAT:
        if a.category == FLOAT:  # float16 with bfloat16 meets at float32
            return float32 if {a, b} == {float16, bfloat16} else b
        return b
    if a is bool_:
        return b
    if a is uint8:  # uint8 with a signed int needs a wider signed type
        return int16 if b is int8 else b
    return b


def scalar_category(value):
    """The promotion category (BOOL < INT < FLOAT) of a Python number."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (int, np.integer)):
        return INT
    return FLOAT


def can_cast(src, dst):
    """torch.can_cast: no cast to a lower category (float -> int, int -> bool)."""
    return src.category <= dst.category


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """Round float32 to bfloat16 bits, to nearest even; NaN stays a quiet NaN."""
    u = np.asarray(values, np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(np.isnan(values), 0x7FC0, rounded).astype(np.uint16)
