"""Element types and torch's type-promotion rules.

numpy has no bfloat16, so bfloat16 tensors keep their raw bits in uint16 arrays on the host; the
helpers at the bottom convert them to and from float32 (round to nearest even, as torch does).
Triton has no complex type: a complex element is two floats of its `component` dtype, (real, imag), and
complex dtypes have no `triton` name, so a kernel that does not know about them cannot take them.
uint16, uint32 and uint64 are torch's "shell" types: they promote only with floating types.
"""
import numpy as np

BOOL, INT, FLOAT, COMPLEX = 0, 1, 2, 3  # promotion categories, in order


class dtype:
    """One element type: its size, its category, and how numpy and Triton spell it."""

    __slots__ = ("name", "itemsize", "category", "is_signed", "np", "triton", "_order", "component")

    def __init__(self, name, itemsize, category, is_signed, np_dtype, triton_name, order, component=None):
        self.name = name
        self.itemsize = itemsize
        self.category = category
        self.is_signed = is_signed
        self.np = np.dtype(np_dtype)  # storage dtype on the host (uint16 for bfloat16)
        self.triton = triton_name  # None for complex types: kernels see their `component` pairs
        self._order = order
        self.component = component  # the float type of a complex type's real and imaginary parts

    @property
    def is_floating_point(self):
        return self.category == FLOAT

    @property
    def is_complex(self):
        return self.category == COMPLEX

    def to_real(self):
        """torch.dtype.to_real: a complex type's component type; any other type itself."""
        return self.component or self

    def to_complex(self):
        """torch.dtype.to_complex: the complex type of float32/float64 (complex types: themselves)."""
        if self.is_complex:
            return self
        if self is float32 or self is float64:
            return complex64 if self is float32 else complex128
        raise RuntimeError(f"Unknown Complex ScalarType for {TORCH_NAMES[self.name]}: minitensor's complex types "
                           "are complex64 and complex128")

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
uint16 = dtype("uint16", 2, INT, False, np.uint16, "u16", 10)
uint32 = dtype("uint32", 4, INT, False, np.uint32, "u32", 11)
uint64 = dtype("uint64", 8, INT, False, np.uint64, "u64", 12)
complex64 = dtype("complex64", 8, COMPLEX, True, np.complex64, None, 13, float32)
complex128 = dtype("complex128", 16, COMPLEX, True, np.complex128, None, 14, float64)

ALL = (bool_, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64, uint16, uint32, uint64,
       complex64, complex128)
SHELL_UINTS = (uint16, uint32, uint64)  # torch's types with few ops and no promotion but with floating types
_BY_NAME = {d.name: d for d in ALL}
_FROM_NP = {d.np: d for d in ALL if d is not bfloat16}

default_float = float32
default_int = int64

# torch's (c10's) names of the scalar types, as its error messages spell them
TORCH_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long",
               "float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "float64": "Double", "uint16": "UInt16",
               "uint32": "UInt32", "uint64": "UInt64", "complex64": "ComplexFloat", "complex128": "ComplexDouble"}


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


_PYTHON_TYPES = ((bool, bool_), (int, int64), (float, float64), (complex, complex128))  # as torch takes them


def dtype_arg(value, function):
    """`value` as a dtype argument of `function`: a minitensor dtype, or Python's bool, int, float or complex
    (torch takes them for bool, int64, float64 and complex128); anything else (a string, a numpy type) raises
    TypeError, as in torch."""
    if type(value) is dtype:
        return value
    for python_type, dt in _PYTHON_TYPES:
        if value is python_type:
            return dt
    raise TypeError(f"{function}(): argument 'dtype' must be minitensor.dtype, not {type(value).__name__}: one of "
                    f"{', '.join('mt.' + d.name for d in ALL)}, or Python's bool, int, float or complex")


def from_numpy(np_dtype):
    try:
        return _FROM_NP[np.dtype(np_dtype)]
    except KeyError:
        raise TypeError(f"can't convert numpy array of type {np.dtype(np_dtype)}: the supported types are "
                        f"{', '.join(str(d) for d in _FROM_NP)}") from None


def promote_types(a, b):
    """torch.promote_types for the dtypes minitensor has."""
    if a is b:
        return a
    if a in SHELL_UINTS or b in SHELL_UINTS:
        other = b if a in SHELL_UINTS else a
        if other.category != FLOAT:
            raise RuntimeError(f"Promotion for uint16, uint32, uint64 types is not supported, attempted to promote "
                               f"{TORCH_NAMES[a.name]} and {TORCH_NAMES[b.name]}")
        return other
    if a.category == COMPLEX or b.category == COMPLEX:  # complex128 if either side has float64's precision
        return complex128 if {a, b} & {float64, complex128} else complex64
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
    """The promotion category (BOOL < INT < FLOAT < COMPLEX) of a Python number."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (int, np.integer)):
        return INT
    if isinstance(value, (complex, np.complexfloating)):
        return COMPLEX
    return FLOAT


def complex_for(real):
    """The complex type a complex Python number or 0-d tensor makes of a `real` result, as torch picks it: the
    float type's own complex type, else the default complex64; float16 would need complex32, which minitensor
    does not have."""
    if real is float16:
        raise TypeError("minitensor has no complex32 (torch's ComplexHalf): cast the float16 operand to float32 or "
                        "float64 first")
    return complex128 if real is float64 else complex64


def can_cast(src, dst):
    """torch.can_cast: no cast to a lower category (complex -> float, float -> int, int -> bool)."""
    return src.category <= dst.category


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values):
    """Round float32 to bfloat16 bits, to nearest even; NaN stays a quiet NaN."""
    u = np.asarray(values, np.float32).view(np.uint32)
    rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
    return np.where(np.isnan(values), 0x7FC0, rounded).astype(np.uint16)
