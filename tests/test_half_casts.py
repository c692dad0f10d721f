"""float16 and bfloat16 conversions, exhaustively: every bit pattern to bool and to float32, float32 (subnormals,
nan, the rounding boundaries) to both, and bfloat16 values through the other kernels (reductions, matmul,
complex casts, random bounds).

Triton's interpreter holds bfloat16 as its uint16 bits: its own conversions to and from float32 turned subnormals
into other values or zero and truncated instead of rounding, and `x != 0` compared the bits, so on the simulator
bfloat16 -0.0 cast to True, bfloat16 subnormals compared equal to 0, and a bfloat16 sum or product came out
truncated (1 + 0.005859375 gave 1.0, not 1.0078125). A GPU converts exactly and rounds to nearest even.
"""
import numpy as np
import pytest

import minitensor as mt

ALL_BITS = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def bf16_values(bits):
    """The float32 values of bfloat16 bit patterns (exact: bfloat16 is float32's upper half)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def bf16_bits(x):
    """float32 values rounded to bfloat16 bits, to nearest even; nan stays a nan."""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded)


def from_bits(bits, dtype, device):
    return mt.tensor(bits.view(np.int16), device=device).view(dtype)


def float_sample():
    """float32 bit patterns: random ones, every subnormal's neighbourhood (both signs), the bfloat16 rounding
    midpoints (ties both ways), infinities, nans (quiet, signalling, negative) and the largest finite values."""
    rng = np.random.default_rng(20240607)
    subnormal = np.arange(0, 1 << 17, 3, dtype=np.uint32)
    ties = (rng.integers(0, 1 << 15, 4096, dtype=np.uint32) << 16) | 0x8000
    special = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7F7FFFFF,
                        0xFF7FFFFF, 0x7F7F8000, 0x80000000, 0x00000000, 0x00008000, 0x00018000, 0x3F808000,
                        0x3F818000], np.uint32)
    return np.concatenate([rng.integers(0, 1 << 32, 50000, dtype=np.uint64).astype(np.uint32), subnormal,
                           subnormal | 0x80000000, ties, special])


def assert_bits_equal(got, expected, what, inputs):
    bad = np.flatnonzero(got != expected)
    assert not len(bad), f"{what}: {len(bad)} wrong, e.g. " + ", ".join(
        f"{int(inputs[i]):#x} -> {int(got[i]):#x} (expected {int(expected[i]):#x})" for i in bad[:6])


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_every_half_value_to_bool_and_to_float32(device, name):
    """Every one of the 65536 patterns: to bool (nan True, -0.0 False, subnormals True), compared with 0, and
    widened to float32 and float64 exactly; through the contiguous, strided and copy_ kernels."""
    dtype = getattr(mt, name)
    values = bf16_values(ALL_BITS) if name == "bfloat16" else ALL_BITS.view(np.float16).astype(np.float32)
    truth = (values != 0) | np.isnan(values)
    t = from_bits(ALL_BITS, dtype, device)
    for what, got, expected in [("to(bool)", t.to(mt.bool), truth), ("bool() strided", t[::3].bool(), truth[::3]),
                                ("copy_ into bool", mt.empty(t.shape, dtype=mt.bool, device=device).copy_(t), truth),
                                ("!= 0", t != 0, truth), ("== 0", t == 0, ~truth),
                                ("logical_not", mt.logical_not(t), ~truth)]:
        bad = np.flatnonzero(got.cpu().numpy() != expected)
        assert not len(bad), f"{name} {what}: {len(bad)} wrong, e.g. bits " + ", ".join(
            f"{int(ALL_BITS[::3 if 'strided' in what else 1][i]):#06x}" for i in bad[:8])
    widened = t.float().cpu().numpy()
    keep = ~np.isnan(values)
    assert_bits_equal(widened.view(np.uint32)[keep], values.view(np.uint32)[keep], f"{name} -> float32",
                      ALL_BITS[keep])
    assert np.isnan(widened[~keep]).all()
    with np.errstate(invalid="ignore"):  # a signalling nan widened
        assert np.array_equal(t.double().cpu().numpy(), values.astype(np.float64), equal_nan=True)


def test_float32_to_bfloat16_rounds_to_nearest_even(device):
    bits = float_sample()
    x = bits.view(np.float32)
    got = mt.tensor(x, device=device).to(mt.bfloat16).view(mt.int16).cpu().numpy().view(np.uint16)
    expected = bf16_bits(x)
    nan = np.isnan(x)
    assert_bits_equal(got[~nan], expected[~nan], "float32 -> bfloat16", bits[~nan])
    assert np.isnan(bf16_values(got[nan])).all(), "a nan must stay a nan"
    back = mt.tensor(x, device=device).to(mt.bfloat16).float().cpu().numpy()
    assert np.array_equal(back, bf16_values(expected), equal_nan=True)


def test_float32_to_float16_and_bool(device):
    bits = float_sample()
    x = bits.view(np.float32)
    t = mt.tensor(x, device=device)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16)
    got = t.to(mt.float16).cpu().numpy()
    assert np.array_equal(got, expected, equal_nan=True)
    assert np.array_equal(t.to(mt.bool).cpu().numpy(), (x != 0) | np.isnan(x))


def test_bfloat16_subnormals_through_the_other_kernels(device):
    """Reductions, matmul and complex casts widen bfloat16 exactly too."""
    bits = np.array([0x0001, 0x0003, 0x0040, 0x8001, 0x007F, 0x0010], np.uint16)
    values = bf16_values(bits)
    t = from_bits(bits, mt.bfloat16, device)
    assert t.sum(dtype=mt.float32).item() == np.float32(values.astype(np.float64).sum())
    assert t.max().float().item() == values.max() and t.min().float().item() == values.min()
    assert np.array_equal(t.to(mt.complex64).cpu().numpy().real, values)
    m = t[:4].reshape(2, 2)
    product = (m @ mt.ones(2, 2, dtype=mt.bfloat16, device=device)).float().cpu().numpy()
    assert product.tolist() == [[values[:2].sum()] * 2, [values[2:4].sum()] * 2]


def test_bfloat16_results_round_to_nearest_even(device):
    """1 + 0.005859375 is 1.0078125 in bfloat16 (the nearer of 1.0 and 1.0078125), from every kernel."""
    s = mt.tensor([1.0, 0.005859375], dtype=mt.bfloat16, device=device)
    assert (s[:1] + s[1:]).float().item() == 1.0078125
    assert s.sum().float().item() == 1.0078125
    a = mt.ones(1, 2, dtype=mt.bfloat16, device=device)
    assert (a @ s.reshape(2, 1)).float().item() == 1.0078125


def test_bfloat16_uniform_keeps_subnormal_bounds(device):
    """uniform_ rounds its bounds to the dtype and draws in [low, high): with subnormal bounds, every value is a
    bfloat16 subnormal in that range."""
    low, high = 1e-39, 2e-39
    mt.manual_seed(0)
    r = mt.empty(4096, dtype=mt.bfloat16, device=device).uniform_(low, high).float().cpu().numpy()
    lo, hi = bf16_values(bf16_bits(np.float32([low, high])))
    assert (r >= lo).all() and (r < hi).all() and len(np.unique(r)) > 1
