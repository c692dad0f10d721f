"""Python numbers converted to tensor elements: no silent overflow, on either device.

torch has two conversions of a number, and minitensor mirrors both (expected outcomes checked against torch 2.13):
- a value to store (`fill_`, `full`, `t[i] = v`, clamp's bounds, where's numbers, `alpha`) is checked against the
  dtype: "value cannot be converted to type int8_t without overflow";
- an operand of arithmetic (`t + 300`, `t == 300`) wraps to the dtype's width like a C cast.
Both refuse an int that no 64-bit integer holds (OverflowError). `mt.tensor(data)` checks integer targets and
refuses ints past int64 (ValueError), as torch's tensor() does.
"""
import math

import numpy as np
import pytest

import minitensor as mt

NAN, INF = math.nan, math.inf


def D(name):
    return getattr(mt, name)


def overflow(cpp):
    return pytest.raises(RuntimeError, match=f"^value cannot be converted to type {cpp} without overflow$")


def too_big():
    return pytest.raises(OverflowError, match="^int too big to convert$")


# ---------------------------------------------------------------------------------------------- stored values
# (dtype, value, expected element or the C++ type name torch's error gives)
STORED = [
    ("int8", 300, "int8_t"), ("int8", -129, "int8_t"), ("int8", 127.5, "int8_t"), ("int8", -128.5, "int8_t"),
    ("int8", NAN, "int8_t"), ("int8", INF, "int8_t"), ("int8", 127, 127), ("int8", -128.0, -128),
    ("int8", 127.25, "int8_t"), ("int8", np.int64(300), "int8_t"), ("int8", np.float32(300), "int8_t"),
    ("uint8", -1, 255), ("uint8", -255, 1), ("uint8", -256, "uint8_t"), ("uint8", 256, "uint8_t"),
    ("uint8", -1.0, "uint8_t"), ("uint8", -0.5, "uint8_t"), ("uint8", 255.5, "uint8_t"), ("uint8", True, 1),
    ("int16", 2**40, "int16_t"), ("int16", -32768, -32768),
    ("int32", 2**40, "int"), ("int32", 2.0**31, "int"), ("int32", 2147483647.5, "int"), ("int32", -2**31, -2**31),
    ("int64", 2**63, "int64_t"), ("int64", 1e300, "int64_t"), ("int64", NAN, "int64_t"), ("int64", -2**63, -2**63),
    ("int64", 2**63 - 1, 2**63 - 1), ("int64", 2.0**63, "int64_t"),  # torch casts 2.0**63 to -2**63: refused here
    ("float16", 1e10, "c10::Half"), ("float16", 65504.9, "c10::Half"), ("float16", 2**16, "c10::Half"),
    ("float16", 1e5, "c10::Half"), ("float16", 65504, 65504.0), ("float16", -INF, -INF), ("float16", INF, INF),
    ("bfloat16", 1e300, "c10::BFloat16"), ("bfloat16", 2**63, 2.0**63),
    ("float32", 1e300, "float"), ("float32", 3.4028235677973366e38, "float"), ("float32", 2**63, 2.0**63),
    ("float64", 1e300, 1e300), ("float64", 2**64 - 1, 2.0**64),
    ("bool", 300, True), ("bool", NAN, True), ("bool", 0.0, False), ("bool", 2**63, True),
]


def _assert_stored(t, expected):
    got = t.tolist()
    assert got == [expected] * len(got) and type(got[0]) is type(expected), got


@pytest.mark.parametrize("name, value, expected", STORED)
def test_fill_checks_the_value(device, name, value, expected):
    t = mt.full((3,), 7, dtype=D(name), device=device)
    if isinstance(expected, str):
        with overflow(expected):
            t.fill_(value)
        assert t.tolist() == [7, 7, 7]  # a refused fill leaves the tensor as it was
    else:
        _assert_stored(t.fill_(value), expected)


@pytest.mark.parametrize("name, value, expected", STORED)
def test_full_checks_the_value(device, name, value, expected):
    if isinstance(expected, str):
        before = mt.cuda.memory_allocated()
        with overflow(expected):
            mt.full((1000,), value, dtype=D(name), device=device)
        assert mt.cuda.memory_allocated() == before
    else:
        _assert_stored(mt.full((2,), value, dtype=D(name), device=device), expected)


@pytest.mark.parametrize("name, value, expected", STORED)
def test_item_assignment_checks_the_value(device, name, value, expected):
    t = mt.full((3,), 7, dtype=D(name), device=device)
    if isinstance(expected, str):
        with overflow(expected):
            t[0] = value
        assert t.tolist() == [7, 7, 7]
    else:
        first = t.tolist()[0]
        t[1:] = value
        assert t.tolist()[0] == first
        _assert_stored(t[1:], expected)


@pytest.mark.parametrize("name", ["bool", "uint8", "int8", "int64", "float16", "float32", "float64"])
def test_stored_int_past_64_bits_raises_overflow_error(device, name):
    t = mt.zeros(3, dtype=D(name), device=device)
    for value in (2**64, -2**63 - 1, 2**70):
        with too_big():
            t.fill_(value)
        with too_big():
            mt.full((3,), value, dtype=D(name), device=device)
        with too_big():
            t[1] = value
    assert not t.cpu().numpy().any()


def test_full_infers_int64_and_checks_it(device):
    with overflow("int64_t"):
        mt.full((3,), 2**63, device=device)
    with too_big():
        mt.full((3,), 2**70, device=device)


def test_fill_with_a_tensor_casts_like_a_copy(device):
    """A 0-d tensor value is cast as copy_ casts (wrapping), as torch does; only numbers are checked."""
    t = mt.zeros(3, dtype=mt.int8, device=device)
    assert t.fill_(mt.tensor(300, device=device)).tolist() == [44] * 3
    assert t.fill_(mt.tensor(300.7)).tolist() == [44] * 3
    half = mt.zeros(2, dtype=mt.float16, device=device)
    assert half.fill_(mt.tensor(1e5, device=device)).tolist() == [INF] * 2


def test_fill_refuses_what_is_not_a_real_number(device):
    t = mt.zeros(3, device=device)
    for value in ("x", None, [1]):
        with pytest.raises(TypeError, match="real number"):
            t.fill_(value)
    with pytest.raises(RuntimeError, match="value cannot be converted to type float without overflow"):
        t.fill_(1j)  # as torch: a complex value with an imaginary part does not fit a real type


# ---------------------------------------------------------------------------------------------- tensor(data)
TENSOR_DATA = [  # (data, dtype name or None, expected list/value, or an exception and the start of its message)
    (2**63, None, (ValueError, "Overflow when unpacking long long")),
    ([2**63], None, (ValueError, "Overflow when unpacking long long")),
    ([1, 2**70], None, (ValueError, "Overflow when unpacking long long")),
    ([[1], [2**70]], None, (ValueError, "Overflow when unpacking long long")),
    ([2**63, -1], None, (ValueError, "Overflow when unpacking long long")),  # numpy makes this float64
    ([2**64 - 1], "uint8", (ValueError, "Overflow when unpacking long long")),
    (-2**63 - 1, None, (ValueError, "Overflow when unpacking long long")),
    ([300], "uint8", (RuntimeError, "value cannot be converted to type uint8 without overflow")),
    ([300], "int8", (RuntimeError, "value cannot be converted to type int8 without overflow")),
    ([300.0], "int8", (RuntimeError, "value cannot be converted to type int8 without overflow")),
    ([127.9], "int8", (RuntimeError, "value cannot be converted to type int8 without overflow")),
    ([-0.5], "uint8", (RuntimeError, "value cannot be converted to type uint8 without overflow")),
    ([-256], "uint8", (RuntimeError, "value cannot be converted to type uint8 without overflow")),
    ([True, 300], "int8", (RuntimeError, "value cannot be converted to type int8 without overflow")),
    ([2**40], "int32", (RuntimeError, "value cannot be converted to type int32 without overflow")),
    (NAN, "int64", (RuntimeError, "value cannot be converted to type int64 without overflow")),
    ([NAN], "int64", (RuntimeError, "value cannot be converted to type int64 without overflow")),
    (INF, "int32", (RuntimeError, "value cannot be converted to type int32 without overflow")),
    (1e20, "int64", (RuntimeError, "value cannot be converted to type int64 without overflow")),
    ([1.5, 2**63], "int64", (ValueError, "Overflow when unpacking long long")),
    ([2**1030], "float64", (OverflowError, "int too large to convert to float")),
    ([2**1030, 1.5], None, (OverflowError, "int too large to convert to float")),
    ([-1], "uint8", [255]), ([-255], "uint8", [1]), ([-128, 127], "int8", [-128, 127]),
    ([127.9, -128.9], "int16", [127, -128]), ([2**63 - 1, -2**63], None, [2**63 - 1, -2**63]),
    ([2**53 + 1, 0.5], "int64", [2**53 + 1, 0]),  # exact: the int is not rounded through a float64
    ([1e5], "float16", [INF]), ([1e39], "float32", [INF]), ([1e39], None, [INF]),  # torch does not check floats
    ([2**70], "float32", [2.0**70]), ([[1.5], [2**70]], None, [[1.5], [2.0**70]]), ([2**63], "float64", [2.0**63]),
    ([300], "bool", [True]), ([2**70], "bool", [True]), ([NAN, 0.0], "bool", [True, False]),
    ([True, 2], None, [1, 2]), ([1, 2.5], None, [1.0, 2.5]), ([], None, []), ([[], []], "int8", [[], []]),
]


@pytest.mark.parametrize("data, name, expected", TENSOR_DATA)
def test_tensor_from_python_data(device, data, name, expected):
    dtype = None if name is None else D(name)
    if isinstance(expected, tuple):
        kind, message = expected
        with pytest.raises(kind, match="^" + message):
            mt.tensor(data, dtype=dtype, device=device)
    else:
        t = mt.tensor(data, dtype=dtype, device=device)
        assert t.tolist() == expected
        if name is None:  # torch's inference: bool, int64, or the default float when any element is a float
            kinds = {type(x) for x in np.array(data, dtype=object).flat}
            assert t.dtype is (mt.float32 if float in kinds or not kinds else mt.int64 if int in kinds else mt.bool)


def test_tensor_from_numpy_scalars_checks_like_numbers(device):
    """A numpy scalar is a number (checked; it keeps its dtype when none is given); a numpy array is cast as
    numpy casts, as torch does."""
    with overflow("int8"):
        mt.tensor(np.int64(300), dtype=mt.int8, device=device)
    with overflow("int8"):
        mt.tensor([np.int64(300)], dtype=mt.int8, device=device)
    with overflow("int8"):
        mt.tensor(np.float64(NAN), dtype=mt.int8, device=device)
    with overflow("int8"):
        mt.tensor([mt.tensor(300)], dtype=mt.int8, device=device)
    assert mt.tensor(np.float64(1e5), dtype=mt.float16, device=device).item() == INF
    assert mt.tensor(np.int8(-5), device=device).dtype is mt.int8
    assert mt.tensor(np.array([300]), dtype=mt.int8, device=device).tolist() == [44]


def test_tensor_data_of_other_types_is_refused():
    for data in (["a"], [1, None], [[1, 2], [3]]):  # complex numbers are data (tests/test_new_dtypes.py)
        with pytest.raises((TypeError, ValueError)):
            mt.tensor(data)


# ---------------------------------------------------------------------------------------------- op operands
def test_arithmetic_number_past_64_bits_raises(device):
    """An operand no 64-bit integer holds is refused on both devices (cuda used to give 0 or the low bits)."""
    i64 = mt.tensor([1], device=device)
    i8 = mt.ones(3, dtype=mt.int8, device=device)
    f32 = mt.ones(3, device=device)
    b = mt.ones(3, dtype=mt.bool, device=device)
    for _ in range(2):  # the second round runs the cached (warm) paths
        for op in (lambda: i64 + 2**70, lambda: i64 + 2**64, lambda: i8 * 2**70, lambda: f32 + 2**70,
                   lambda: b + 2**70, lambda: i8 == 2**70, lambda: 2**70 - i64, lambda: i64 + (-2**63 - 1)):
            with too_big():
                op()
        assert (i64 + 2).tolist() == [3] and (i8 * 3).tolist() == [3] * 3


def test_arithmetic_operands_wrap_like_torch(device):
    assert (mt.tensor([1], device=device) + 2**63).tolist() == [-2**63 + 1]
    assert (mt.tensor([1], device=device) + (2**63 - 1)).tolist() == [-2**63]
    assert (mt.ones(2, dtype=mt.int32, device=device) + 2**40).tolist() == [1, 1]
    assert (mt.ones(2, dtype=mt.int8, device=device) * 300).tolist() == [44, 44]
    assert (mt.ones(2, dtype=mt.uint8, device=device) + -1).tolist() == [0, 0]
    assert (mt.tensor([44], dtype=mt.int8, device=device) == 300).tolist() == [True]
    assert (mt.ones(2, dtype=mt.float16, device=device) + 1e10).tolist() == [INF, INF]
    t = mt.ones(1, dtype=mt.int8, device=device)
    t += 300
    assert t.tolist() == [45]


def test_clamp_bounds_are_checked_against_the_result_type(device):
    i8 = mt.tensor([44, -100], dtype=mt.int8, device=device)
    for _ in range(2):
        with overflow("int8_t"):
            i8.clamp(max=300)
        with overflow("int8_t"):
            i8.clamp(min=-300)
        with too_big():
            i8.clamp(max=2**70)
        with overflow("c10::Half"):
            mt.ones(2, dtype=mt.float16, device=device).clamp(max=1e10)
        with overflow("float"):
            mt.ones(2, device=device).clamp(max=1e39)
        assert i8.clamp(max=10).tolist() == [10, -100]
    assert mt.ones(3, dtype=mt.uint8, device=device).clamp(min=-1).tolist() == [255] * 3  # -1 is 255, as torch
    assert i8.clamp(max=300.5).dtype is mt.float32  # a float bound makes the result float


def test_where_numbers_are_checked_against_the_result_type(device):
    cond = mt.tensor([True, False], device=device)
    i8 = mt.tensor([1, 2], dtype=mt.int8, device=device)
    for _ in range(2):
        with overflow("int8_t"):
            mt.where(cond, i8, 300)
        with too_big():
            mt.where(cond, i8, 2**70)
        with too_big():
            mt.where(cond, mt.ones(2, device=device), 2**70)
        with overflow("c10::Half"):
            mt.where(cond, mt.ones(2, dtype=mt.float16, device=device), 1e10)
        with overflow("int64_t"):
            mt.where(cond, 1, 2**63)
        assert mt.where(cond, i8, 5).tolist() == [1, 5]
    assert mt.where(cond, mt.ones(2, dtype=mt.uint8, device=device), -1).tolist() == [1, 255]


# the simulator's interpreter casts the float32 kernel argument 1e39 with numpy, which warns; a GPU does not
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_pow_exponent_is_checked_against_the_result_type(device):
    """torch's pow(tensor, number) stores its exponent in the result type (float32 and float64 take it as a
    double); the other arithmetic operators wrap their numbers."""
    i8 = mt.tensor([2, 3], dtype=mt.int8, device=device)
    for _ in range(2):
        for exponent in (300, 128, 256):
            with overflow("int8_t"):
                i8 ** exponent
        with overflow("int8_t"):
            mt.pow(i8, 300)
        with overflow("int64_t"):
            mt.tensor([2, 3], device=device) ** 2**63
        with overflow("int64_t"):
            mt.tensor([True], device=device) ** 2**63
        with overflow("uint8_t"):
            mt.ones(1, dtype=mt.uint8, device=device) ** 256
        with overflow("c10::Half"):
            mt.ones(2, dtype=mt.float16, device=device) ** 1e10
        with overflow("c10::BFloat16"):
            mt.ones(2, dtype=mt.bfloat16, device=device) ** 1e39
        with too_big():
            i8 ** 2**70
        with pytest.raises(RuntimeError, match="Integers to negative integer powers are not allowed"):
            i8 ** -129  # the sign is checked first, as in torch
        t = i8.clone()
        with overflow("int8_t"):
            t.pow_(300)
        assert t.tolist() == [2, 3]
    assert (i8 ** 127).tolist() == [0, -85]
    assert (300 ** i8).tolist() == [-112, -64]  # a number base wraps
    assert (mt.ones(2, device=device) ** 1e39).tolist() == [1.0, 1.0]
    assert (mt.full((2,), 2.0, dtype=mt.float64, device=device) ** 2**63).tolist() == [INF, INF]
    assert (i8 // 300).tolist() == [0, 0] and (i8 % 300).tolist() == [2, 3] and (i8 & 300).tolist() == [0, 0]


def test_alpha_is_checked_against_the_result_type(device):
    i8 = mt.ones(1, dtype=mt.int8, device=device)
    with overflow("int8_t"):
        mt.add(i8, i8, alpha=300)
    with overflow("int8_t"):
        i8.sub(3, alpha=300)
    with overflow("c10::Half"):
        mt.add(mt.ones(2, dtype=mt.float16, device=device), 1, alpha=1e10)
    with overflow("float"):
        mt.add(mt.ones(2, device=device), mt.ones(2, device=device), alpha=1e39)
    with too_big():
        mt.add(mt.tensor([1], device=device), mt.tensor([1], device=device), alpha=2**70)
    assert mt.add(mt.tensor([1], device=device), 4, alpha=2**62).tolist() == [1]  # 4 * 2**62 wraps, as in torch
    assert mt.add(i8, 3, alpha=100).tolist() == [45]  # 301 wraps to 45 in int8
    assert i8.tolist() == [1]


# ---------------------------------------------------------------------------------------------- arange, isclose
def test_arange_checks_its_numbers(device):
    with too_big():
        mt.arange(2**70, device=device)
    with overflow("int64_t"):
        mt.arange(2**63 - 3, 2**63, device=device)
    with overflow("int64_t"):
        mt.arange(0, 1e30, 1e29, dtype=mt.int64, device=device)
    for end in (NAN, INF):
        with pytest.raises(RuntimeError, match=f"^unsupported range: 0 -> {end}$"):
            mt.arange(0, end, device=device)
    with pytest.raises(RuntimeError, match="^step must be nonzero$"):  # as torch
        mt.arange(0, 3, NAN, device=device)
    with pytest.raises(RuntimeError, match="^upper bound and lower bound inconsistent with step sign$"):
        mt.arange(3, 0, device=device)
    with pytest.raises(RuntimeError, match=r"^invalid size, possible overflow\?$"):
        mt.arange(0, 1e30, device=device)
    with pytest.raises(NotImplementedError, match=f"\"arange_{device}\" not implemented for 'Bool'"):
        mt.arange(3, dtype=mt.bool, device=device)
    with pytest.raises(TypeError, match="^arange\\(\\): argument 'end' must be a real number, not str$"):
        mt.arange("3", device=device)
    with pytest.raises(TypeError, match="^arange\\(\\): argument 'step' must be a real number, not str$"):
        mt.arange(0, 3, "x", device=device)
    assert mt.arange(0, 300, 100, dtype=mt.int8, device=device).tolist() == [0, 100, -56]  # wraps, as torch
    assert mt.arange(2**63 - 3, 2**63 - 1, device=device).tolist() == [2**63 - 3, 2**63 - 2]
    assert mt.arange(0, 3, INF, device=device).tolist() == []
    assert mt.arange(mt.tensor(3), device=device).tolist() == [0, 1, 2]
    assert mt.arange(np.int64(2), 3.5, device=device).tolist() == [2.0, 3.0]


def test_isclose_checks_its_tolerances(device):
    a = mt.ones(2, device=device)
    for name in ("rtol", "atol"):
        for bad in ("x", None, [1e-5]):
            with pytest.raises(TypeError, match=f"^isclose\\(\\): argument '{name}' must be float, not "):
                mt.isclose(a, a, **{name: bad})
        with pytest.raises(RuntimeError, match=f"^{name} must be greater than or equal to zero, but got nan$"):
            mt.isclose(a, a, **{name: NAN})
        with pytest.raises(RuntimeError, match=f"^{name} must be greater than or equal to zero, but got -1"):
            mt.allclose(a, a, **{name: -1})
    assert mt.isclose(a, a + 1, rtol=2**70).tolist() == [True, True]
