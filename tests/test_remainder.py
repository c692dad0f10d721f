"""`%` (remainder) and `//` (floor_divide) on floats, exact for any quotient, as torch's kernels compute them.

torch: `r = fmod(a, b); if (r != 0 && (r < 0) != (b < 0)) r += b` (integers: `a % b`, the same correction). The
GPU's own float `%` is `a - b * trunc(a / b)` in the operands' precision: float32 3e22 % 7 gave 8.4e14 there
(torch: 3). Triton's interpreter computes it with numpy's exact fmod, so the large-quotient cases failed only on a
GPU (an H200, before the fix: 14 of these tests); the half-type ones failed on both backends, the zero's sign on
the CPU (numpy's np.remainder gives the divisor's sign).

Expected values come from Python's own float `%` and `//` (exact fmod in double, then the sign rule) on the
operands' values, rounded to the result type: for the values here the double result rounds as the float32
kernel's does.
"""
import math

import numpy as np
import pytest

import minitensor as mt

# dividends with quotients far past float32's (and float64's) 24 (53) bits, small ones, signs mixed
LARGE = [3e22, -3e22, 1e30, -1e30, 3.4e38, -3.4e38, 1e10, 123456789.0, 16777217.0, 7.5, -7.5, 5.0, -5.0, 2.5,
         -2.5, 1e-30]
DIVISORS = [7.0, -7.0, 3.3, -3.3, 2.5, -2.5, 0.1, -0.1, 1e-30]


def _f32(x):
    return float(np.float32(x))


def _bf16(x):
    """float32(x) rounded to bfloat16 (nearest even), as a float."""
    bits = int(np.float32(x).view(np.uint32))
    if math.isnan(x):
        return x
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return float(np.uint32(bits & 0xFFFFFFFF).view(np.float32))


ROUND = {"float32": _f32, "float64": float, "float16": lambda x: float(np.float16(np.float32(x))),
         "bfloat16": _bf16}


def py_mod(a, b):
    """Python's float `%`, with a zero divisor giving nan (torch's fmod) instead of ZeroDivisionError."""
    return math.nan if b == 0 else a % b


def values(t):
    t = t.cpu()
    return (t.float() if t.dtype in (mt.bfloat16, mt.float16) else t).numpy().astype(np.float64)


def assert_same(got, expected, label):
    expected = np.asarray(expected, np.float64)
    bad = ~((got == expected) | (np.isnan(got) & np.isnan(expected)))
    assert not bad.any(), f"{label}: " + "; ".join(
        f"[{i}] got {got[i]!r}, expected {expected[i]!r}" for i in np.flatnonzero(bad)[:6])


@pytest.mark.parametrize("name", ["float32", "float64"])
def test_large_quotients_are_exact(device, name):
    """x % b and x % tensor(b) for quotients up to 1e68: every result exact (Python's `%` on the same values)."""
    dt, rnd = getattr(mt, name), ROUND[name]
    a = mt.tensor(LARGE, dtype=dt, device=device)
    av = [rnd(v) for v in LARGE]
    for b in DIVISORS:
        bv = rnd(b)
        expected = [rnd(py_mod(x, bv)) for x in av]
        assert_same(values(a % b), expected, f"{name} % {b}")
        assert_same(values(a % mt.full((len(LARGE),), b, dtype=dt, device=device)), expected,
                    f"{name} % tensor({b})")
        assert_same(values(mt.remainder(b, a)), [rnd(py_mod(bv, x)) for x in av], f"{b} % {name}")


def test_the_issue_examples(device):
    x = mt.tensor([3e22, -3e22, 1e30], device=device)
    assert values(x % 7).tolist() == [3.0, 4.0, 1.0]
    assert values(x % -7).tolist() == [-4.0, -3.0, -6.0]
    assert values(mt.tensor([1e30], device=device) % 3.3).tolist() == [_f32(_f32(1e30) % _f32(3.3))]


def test_infinities_nan_and_zero_divisors(device):
    """fmod's special values, then the sign rule: a finite x % inf is x, or inf when the signs differ."""
    x = mt.tensor([5.0, -5.0, math.inf, math.nan, 5.0, -0.0], device=device)
    assert_same(values(x % math.inf), [5.0, math.inf, math.nan, math.nan, 5.0, -0.0], "% inf")
    assert_same(values(x % -math.inf), [-math.inf, -5.0, math.nan, math.nan, -math.inf, -0.0], "% -inf")
    assert_same(values(x % 0.0), [math.nan] * 6, "% 0")


def test_a_zero_result_keeps_the_dividends_sign(device):
    """torch keeps fmod's zero (numpy's and Python's `%` give the divisor's sign): -100 % 2.5 is -0.0."""
    r = values(mt.tensor([-100.0, 100.0, -7.5, -0.0], device=device) % 2.5)
    assert r.tolist() == [0.0, 0.0, 0.0, 0.0] and np.signbit(r).tolist() == [True, False, True, True]
    r = values(mt.tensor([100.0, -100.0], device=device) % -2.5)
    assert np.signbit(r).tolist() == [False, True]


@pytest.mark.parametrize("name", ["int64", "int32", "int16", "uint8"])
def test_integer_tensor_modulo_a_float_is_float32_and_exact(device, name):
    """The int tensor becomes float32 (torch's promotion with a float number), then the exact remainder."""
    ints = [2**40 + 1, -7, 13, 2**31 - 1, 100, -100, 0, 2**62 + 12345, -2**63]
    t = mt.tensor(ints, dtype=mt.int64, device=device).to(getattr(mt, name))
    held = [int(v) for v in t.cpu().numpy()]
    for b in [2.5, -2.5, 0.3, 7.0]:
        r = t % b
        assert r.dtype == mt.float32
        assert_same(values(r), [_f32(py_mod(_f32(v), _f32(b))) for v in held], f"{name} % {b}")


def test_integer_remainders_take_the_divisors_sign(device):
    i = mt.tensor([7, -7, 2**62 + 5, -2**62 - 5, 0], device=device)
    for b in [3, -3, 1000, -1000, 2**40 + 3]:
        assert values(i % b).astype(np.int64).tolist() == [v % b for v in [7, -7, 2**62 + 5, -2**62 - 5, 0]]
        assert values(i % mt.full((5,), b, device=device)).astype(np.int64).tolist() == \
            [v % b for v in [7, -7, 2**62 + 5, -2**62 - 5, 0]]


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_types_take_the_number_in_their_own_type(device, name):
    """torch's remainder converts a number operand to the tensor's half type first (its other ops keep it in
    float32), then computes fmod in float32: float16 7.5 % 3.3 is 7.5 % 3.30078125 = 0.8984375, not 0.8999."""
    dt, rnd = getattr(mt, name), ROUND[name]
    dividends = [7.5, -7.5, 5.0, -5.0, -2.5, 100.0, 1e4, 60000.0] + ([3e22, -1e30, 1e-30] if name == "bfloat16" else [])
    a = mt.tensor(dividends, device=device).to(dt)
    av = [rnd(v) for v in dividends]
    for b in [3.3, -3.3, 0.1, 7, 1e-30]:
        bv = rnd(b)
        assert_same(values(a % b), [rnd(py_mod(x, bv)) for x in av], f"{name} % {b}")
        assert_same(values(b % a), [rnd(py_mod(bv, x)) for x in av], f"{b} % {name}")
    assert_same(values(a % mt.full((len(av),), 3.3, device=device).to(dt)), [rnd(py_mod(x, rnd(3.3))) for x in av],
                f"{name} % tensor")


def test_floor_divide_shares_the_exact_remainder(device):
    """`//` corrects (x - fmod(x, y)) / y by the remainder's sign: with the GPU's own `%`, uint8 156 // 0.3 gave
    520 there (torch: 519)."""
    u = mt.tensor([156, 250, 3], dtype=mt.uint8, device=device)
    assert values(u // 0.3).tolist() == [_f32(_f32(v) // _f32(0.3)) for v in (156, 250, 3)] == [519.0, 833.0, 9.0]
    x = mt.tensor([3e22, -3e22, 1e10], device=device)
    assert values(x // 7).tolist() == [_f32(_f32(v) // 7.0) for v in (3e22, -3e22, 1e10)]
