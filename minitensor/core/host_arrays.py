"""numpy over CPU tensors, and values (numpy arrays, Python numbers, Python data) converted to what an element
of a dtype holds, with torch's checks.

On the host, bfloat16 values are stored as raw bits (numpy has no bfloat16) and computed in float32, as the
kernels do for both half types.
"""
import math
import numbers

import numpy as np

from ..base import dtypes


def numpy_view(t):
    """The numpy array over a CPU tensor's memory (bfloat16 as uint16 bits)."""
    if t.numel() == 0:
        return np.empty(t._shape, t.dtype.np)
    itemsize = t.dtype.itemsize
    return np.ndarray(t._shape, t.dtype.np, buffer=t._storage._array, offset=t._offset * itemsize,
                      strides=tuple(s * itemsize for s in t._stride))


def numpy_values(t):
    """A CPU tensor's values as numpy; bfloat16 converted to float32."""
    view = numpy_view(t)
    return dtypes.bf16_bits_to_f32(view) if t.dtype is dtypes.bfloat16 else view


def to_storage_values(values, dtype):
    """Values (any numpy dtype) converted to `dtype`'s host representation."""
    values = np.asarray(values)
    if values.dtype.kind == "c" and not dtype.is_complex:  # as torch: a complex value cast to a real type is
        values = values.real if dtype is not dtypes.bool_ else values != 0  # its real part (bool: either part)
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype is dtypes.bfloat16:
            return dtypes.f32_to_bf16_bits(values.astype(np.float32))
        if dtype is dtypes.bool_:
            return values != 0
        if values.dtype.kind == "f" and dtype.category == dtypes.INT:  # float -> int truncates toward zero
            values = np.trunc(values)
            if not dtype.is_signed:  # negative floats to unsigned wrap through int64, as torch's CPU does
                values = values.astype(np.int64)
        return values.astype(dtype.np)


# The conversions of Python numbers, as torch has them. A number becomes a c10 Scalar first: an int past int64
# and uint64 cannot (OverflowError). Then an operand of arithmetic (`t + 300`, torch's "wrapped number") is cast
# like C casts, wrapping an int to the dtype's width; a value to store (fill_, full, t[i] = v, clamp's bounds,
# where's numbers, alpha, pow's exponent) is checked by c10's checked_convert, whose error names the C++ type.
_INT_LOW, _INT_END = -2**63, 2**64
_CPP_NAMES = {"bool": "bool", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int",
              "int64": "int64_t", "float16": "c10::Half", "bfloat16": "c10::BFloat16", "float32": "float",
              "float64": "double", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
              "complex64": "c10::complex<float>", "complex128": "c10::complex<double>"}
_FLOAT_MAX = {dtypes.float16: 65504.0, dtypes.bfloat16: 3.3895313892515355e38, dtypes.float32: 3.4028234663852886e38,
              dtypes.complex64: 3.4028234663852886e38}


def _int_ranges(dtype):
    """An int dtype's (low, high) for int values (unsigned types take -max..max: torch lets -1 stand for 255)
    and for float values."""
    info = np.iinfo(dtype.np)
    low, high = int(info.min), int(info.max)
    return (low if dtype.is_signed else -high, high), (low, high)


_INT_RANGES = {d: _int_ranges(d) for d in dtypes.ALL if d.category == dtypes.INT}


def plain_number(value):
    """A number (numpy's scalars, int subclasses, fractions too) as a Python bool, int, float or complex; None
    for anything else."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, (float, numbers.Real)):
        return float(value)
    if isinstance(value, numbers.Complex):
        return complex(value)
    return None


def python_number(value, what):
    """`value` as a Python bool, int or float, as torch makes a c10 Scalar of it: TypeError naming `what` for
    what is no real number, OverflowError for an int no 64-bit integer holds."""
    number = plain_number(value)
    if number is None or type(number) is complex:
        raise TypeError(f"{what} must be a real number, not {type(value).__name__}")
    if type(number) is int and not _INT_LOW <= number < _INT_END:
        raise OverflowError("int too big to convert")
    return number


def scalar_for(dtype, value, checked_as=None):
    """A number as a `dtype` kernel argument or element. An operand of arithmetic (checked_as None) wraps to the
    dtype's width like a C cast, as torch's wrapped numbers do; a value torch stores must first fit `checked_as`
    (_check_fits). A float never wraps into an integer type, and an int past 64 bits raises OverflowError.
    Runs on every op with a number operand: keep it cheap."""
    kind = type(value)
    if kind is int:
        if not _INT_LOW <= value < _INT_END:
            raise OverflowError("int too big to convert")
    elif kind is complex:
        value, kind = _complex_scalar(dtype, value, checked_as)
        if kind is complex:
            return value
    elif kind is not float and kind is not bool:
        value = plain_number(value)
        value = python_number(value, "a number operand") if type(value) is not complex else value
        return scalar_for(dtype, value, checked_as)
    if checked_as is not None:
        _check_fits(checked_as, value, kind)
    category = dtype.category
    if category == dtypes.FLOAT:
        return float(value)
    if category == dtypes.COMPLEX:
        return complex(value)
    if category == dtypes.BOOL:
        return bool(value)
    if kind is float:
        _check_fits(dtype, value, kind)
        value = int(value)
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    if dtype.is_signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _complex_scalar(dtype, value, checked_as):
    """A complex number as (value, its kind) for a `dtype` kernel argument or element: itself for a complex type
    (each part checked against complex64's range where stored); for bool whether it is nonzero; for another real
    type its real part, which torch stores only when the imaginary part is 0 (else its overflow error naming
    the C++ type)."""
    if dtype.is_complex:
        if checked_as is not None:
            _check_fits(checked_as, value.real, float)
            _check_fits(checked_as, value.imag, float)
        return value, complex
    if dtype is dtypes.bool_:
        return value != 0, bool
    if checked_as is not None and value.imag != 0:
        raise RuntimeError(f"value cannot be converted to type {_CPP_NAMES[checked_as.name]} without overflow")
    return value.real, float


def checked_scalar(dtype, value):
    """A number to store in a `dtype` element (see _check_fits), as what the element holds."""
    return scalar_for(dtype, value, dtype)


def _check_fits(dtype, value, kind):
    """torch's checked_convert: RuntimeError("value cannot be converted to type int8_t without overflow") for a
    value outside the dtype's range: NaN, inf or a fraction past the ends for integer types (unsigned ones take
    ints down to -max, which wrap: -1 is 255), a finite value past the largest finite one for float16, bfloat16
    and float32. bool and float64 take any number. Stricter than torch in one case: a float of 2**63 is refused
    for int64 (torch gives -2**63)."""
    limit = _FLOAT_MAX.get(dtype)
    if limit is not None:
        fits = not limit < abs(value) < math.inf
    else:
        ranges = _INT_RANGES.get(dtype)
        if ranges is None:
            return
        low, high = ranges[kind is float]
        fits = low <= value <= high  # False for NaN
    if not fits:
        raise RuntimeError(f"value cannot be converted to type {_CPP_NAMES[dtype.name]} without overflow")


def data_values(items, types, dtype):
    """Python data for `mt.tensor` (a number or nested lists of them, all bool, int, float or complex: `types`
    holds which) as a numpy array of `dtype`'s values, checked as torch's tensor() checks them: for integer dtypes
    an int must fit int64 (ValueError) and every value the dtype (RuntimeError naming the dtype); float, complex
    and bool dtypes take any value (an int too large for a float raises Python's OverflowError); a complex value
    only goes to a complex dtype (TypeError)."""
    if dtype.is_complex:
        return np.array(items, np.complex128)
    if complex in types:
        raise TypeError("must be real number, not complex" if dtype.is_floating_point or dtype is dtypes.bool_
                        else "'complex' object cannot be interpreted as an integer")
    if dtype.is_floating_point:
        return np.array(items, np.float64)
    if dtype is dtypes.bool_:
        return np.array(items, object).astype(np.bool_)
    if not types:
        return np.array(items, np.int64)
    int_range, float_range = _INT_RANGES[dtype]
    if float not in types:
        values = np.array(items)  # bools and ints: int64, unless an int lies outside it (uint64 takes those)
        if dtype is dtypes.uint64 and values.dtype.kind not in "bi":
            values = np.array(items, object)  # checked below as Python ints, then wrapped as torch wraps -1
            return _checked_ints(values, _INT_RANGES[dtype][0], dtype) % 2**64
        if values.dtype.kind not in "bi":
            raise ValueError("Overflow when unpacking long long")
    elif int not in types:
        values = np.array(items, np.float64)
        int_range = float_range
    else:  # ints and floats: each element on its own, so no int is rounded through a float64
        objects = np.array(items, object)
        values = np.array([_data_int(x, float_range, dtype) for x in objects.flat], np.int64).reshape(objects.shape)
    return _checked_ints(values, int_range, dtype)


def _checked_ints(values, int_range, dtype):
    low, high = int_range
    with np.errstate(invalid="ignore"):
        if not np.all((values >= low) & (values <= high)):  # NaN too
            raise RuntimeError(f"value cannot be converted to type {dtype.name} without overflow")
    return values


def _data_int(x, float_range, dtype):
    if type(x) is float:
        low, high = float_range
        if not low <= x <= high:
            raise RuntimeError(f"value cannot be converted to type {dtype.name} without overflow")
        return int(x)
    if not _INT_LOW <= x < -_INT_LOW:
        raise ValueError("Overflow when unpacking long long")
    return x
