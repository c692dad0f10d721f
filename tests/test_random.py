"""Random numbers: seeding and offsets, the cuda streams against a numpy Philox4x32-10 written out here (so
the simulated device and the GPU are held to the same numbers), independence from the block size, statistics
of every op and dtype, odd sizes, non-contiguous and empty targets, and torch's errors.
"""
import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitensor as mt

FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int8", "int16", "int32", "int64"]
ALL = ["bool"] + INTS + FLOATS
TORCH_NAME = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
              "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float",
              "float64": "Double"}
DIGITS = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}
N = 20000  # one program on the simulated device
M32 = np.uint64(0xFFFFFFFF)


def D(name):
    return getattr(mt, name)


def seed_of(*parts):
    return zlib.crc32(repr(parts).encode())


def values(t):
    """Host values as float64 (bfloat16 included) or int64/bool."""
    v = t.cpu()
    if t.dtype in (mt.bfloat16, mt.float16):
        v = v.float()
    return np.asarray(v.numpy()).copy()


# ---------------------------------------------------------------------------------------------- reference
def philox_rounds(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 on uint64 arrays holding 32-bit words."""
    for _ in range(10):
        p0, p2 = c0 * np.uint64(0xD2511F53), c2 * np.uint64(0xCD9E8D57)
        c0, c1, c2, c3 = (p2 >> np.uint64(32)) ^ c1 ^ k0, p2 & M32, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + np.uint64(0x9E3779B9)) & M32, (k1 + np.uint64(0xBB67AE85)) & M32
    return np.stack([c0, c1, c2, c3], axis=-1)


def philox(counters, seed):
    """The four words of each counter c, the block (lo32(c), hi32(c), 0, 0) under key (lo32(seed), hi32(seed))."""
    counters = np.asarray(counters, np.uint64)
    zero = np.zeros_like(counters)
    return philox_rounds(counters & M32, counters >> np.uint64(32), zero, zero,
                         np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF))


def words32(seed, offset, n):
    """Element i: lane i % 4 of counter offset + i // 4."""
    return philox(offset + np.arange(-(-n // 4)), seed).reshape(-1)[:n]


def words64(seed, offset, n):
    """Element i: lanes (2j, 2j + 1), j = i % 2, of counter offset + i // 2, as one 64-bit word."""
    w = philox(offset + np.arange(-(-n // 2)), seed).reshape(-1, 2)
    return ((w[:, 0] << np.uint64(32)) | w[:, 1])[:n]


def unit24(w):
    return ((w >> np.uint64(8)).astype(np.float64) * 2.0**-24).astype(np.float32)


@pytest.mark.parametrize("block,key,expected", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_reference_known_answers(block, key, expected):
    """Random123's known-answer vectors for Philox4x32-10."""
    words = philox_rounds(*(np.uint64(x) for x in block + key))
    assert tuple(int(w) for w in words) == expected


def test_cuda_full_range_words_are_philox():
    """random_(from=int64 min) hands out the raw 64-bit words: the known answer for key 0, counter 0."""
    mt.cuda.manual_seed(0)
    t = mt.empty(5, dtype=mt.int64, device="cuda").random_(-(2**63), None)
    assert t.tolist()[0] == 0x6627E8D5E169C58D
    assert np.array_equal(values(t).view(np.uint64), words64(0, 0, 5))


def test_cuda_streams_match_reference_and_offsets_advance():
    seed = 2**64 - 12345  # a seed with the top bit set travels as a negative int64
    mt.cuda.manual_seed(seed)
    assert mt.cuda.initial_seed() == seed
    offset = 0
    for n in (1, 7, 4097):
        got = values(mt.rand(n, device="cuda"))
        assert np.array_equal(got, unit24(words32(seed, offset, n)))
        offset += -(-n // 4)
    got = values(mt.rand(9, dtype=mt.float64, device="cuda"))
    assert np.array_equal(got, (words64(seed, offset, 9) >> np.uint64(11)).astype(np.float64) * 2.0**-53)
    offset += 5
    for name, np_type in (("float16", np.float16), ("bfloat16", None)):
        got = values(mt.rand(11, dtype=D(name), device="cuda"))
        u = unit24(words32(seed, offset, 11))
        r = u.astype(np.float16).astype(np.float32) if np_type else mt.tensor(u).bfloat16().float().numpy()
        assert np.array_equal(got, np.where(r == 1.0, 0.0, r))
        offset += 3
    got = values(mt.randint(-5, 1000, (13,), device="cuda"))
    assert np.array_equal(got, (words32(seed, offset, 13) % np.uint64(1005)).astype(np.int64) - 5)
    offset += 4
    got = values(mt.empty(6, dtype=mt.int64, device="cuda").random_(3, 3 + 2**40))
    assert np.array_equal(got, (words64(seed, offset, 6) % np.uint64(2**40)).astype(np.int64) + 3)
    offset += 3
    got = values(mt.empty(10, dtype=mt.float32, device="cuda").bernoulli_(0.3))
    assert np.array_equal(got, (words32(seed, offset, 10).astype(np.float64) * 2.0**-32 < 0.3).astype(np.float32))
    offset += 3
    p = mt.tensor(np.linspace(0, 1, 10, dtype=np.float32), device="cuda")
    got = values(mt.bernoulli(p))
    assert np.array_equal(got, (unit24(words32(seed, offset, 10)) < p.cpu().numpy()).astype(np.float32))


def test_cuda_uniform_bounds_match_reference():
    """float32 with bounds: u * (b - a) + a rounded once from float64, the same on the GPU and the simulator."""
    mt.cuda.manual_seed(77)
    got = values(mt.empty(100, device="cuda").uniform_(-1.7, 2.3))
    lo, hi = np.float32(-1.7), np.float32(2.3)
    v = (unit24(words32(77, 0, 100)).astype(np.float64) * np.float64(hi - lo) + np.float64(lo)).astype(np.float32)
    assert np.array_equal(got, np.where(v == hi, lo, v))


def test_cuda_normal_matches_box_muller():
    mt.cuda.manual_seed(5)
    got = values(mt.randn(10, device="cuda"))
    u = unit24(words32(5, 0, 12)).astype(np.float64).reshape(-1, 2)
    r, theta = np.sqrt(-2 * np.log(1 - u[:, 0])), 2 * np.pi * u[:, 1]
    expected = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=1).reshape(-1)[:10]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel,dtype,scalars,constexprs,per", [
    ("random.uniform", "fp32", (("fp32", 0.0), ("fp32", 1.0)), (), 4),
    ("random.normal", "fp64", (("fp64", 0.0), ("fp64", 1.0)), (), 2),
    ("random.integers", "i64", (("i64", 0), ("i64", 2**40)), (1,), 2),
])
def test_numbers_do_not_depend_on_block(kernel, dtype, scalars, constexprs, per):
    from minitensor.kernels import launcher, random_plans
    n = 300
    types = ("*" + dtype, "i64", "i64", "i32") + tuple(ty for ty, _ in scalars)
    results = []
    for block in (64, 256, random_plans.BLOCK):
        out = mt.zeros(n, dtype=mt.float32 if dtype == "fp32" else (mt.float64 if dtype == "fp64" else mt.int64),
                       device="cuda")
        launch = launcher.get(kernel, 0, types, constexprs + (False, block))
        launch(-(-n // block), 1, 1, 0, out.data_ptr(), 99, 12345, n, *(v for _, v in scalars))
        results.append(values(out))
    assert all(np.array_equal(results[0], r) for r in results[1:])


# ---------------------------------------------------------------------------------------------- seeding
def _draw_all(device):
    return [values(mt.rand(37, device=device)), values(mt.randn(5, 3, device=device)),
            values(mt.randint(0, 50, (21,), device=device)), values(mt.empty(9, device=device).bernoulli_(0.5)),
            values(mt.empty(6, dtype=mt.int32, device=device).random_()),
            values(mt.empty(4, dtype=mt.float64, device=device).normal_(1.0, 2.0))]


def test_same_seed_same_numbers(device):
    mt.manual_seed(1234)
    first = _draw_all(device)
    mt.manual_seed(1234)
    again = _draw_all(device)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    later = _draw_all(device)  # the offset moved on: new numbers
    assert not np.array_equal(first[0], later[0]) and not np.array_equal(first[1], later[1])
    mt.manual_seed(4321)
    other = _draw_all(device)
    assert not np.array_equal(first[0], other[0])


def test_consecutive_calls_differ(device):
    mt.manual_seed(3)
    a, b = values(mt.rand(64, device=device)), values(mt.rand(64, device=device))
    assert not np.array_equal(a, b)
    assert len(np.intersect1d(a, b)) < 4


def test_seeding_api():
    mt.manual_seed(42)
    assert mt.initial_seed() == 42 and mt.cuda.initial_seed() == 42
    cpu_then = values(mt.rand(8))
    mt.manual_seed(42)
    mt.cuda.manual_seed(7)  # the current cuda device only: the CPU stream goes on from seed 42
    assert mt.cuda.initial_seed() == 7 and mt.initial_seed() == 42
    assert np.array_equal(values(mt.rand(8)), cpu_then)
    a = values(mt.rand(8, device="cuda"))
    mt.cuda.manual_seed(7)  # restarts the offset
    assert np.array_equal(values(mt.rand(8, device="cuda")), a)
    mt.cuda.manual_seed_all(9)
    assert mt.cuda.initial_seed() == 9 and mt.initial_seed() == 42
    mt.manual_seed(-1)
    assert mt.initial_seed() == 2**64 - 1 and mt.cuda.initial_seed() == 2**64 - 1
    with pytest.raises(ValueError, match="Overflow when unpacking long long"):
        mt.manual_seed(2**64)
    mt.manual_seed(1.5)  # int(seed), as torch
    assert mt.initial_seed() == 1


def test_cpu_and_cuda_streams_differ():
    mt.manual_seed(11)
    assert not np.array_equal(values(mt.rand(16)), values(mt.rand(16, device="cuda")))


# ---------------------------------------------------------------------------------------------- statistics
def _six_sigma(sample, mean, std):
    return abs(sample.mean() - mean) <= 6 * std / math.sqrt(sample.size)


@pytest.mark.parametrize("name", FLOATS)
def test_uniform_statistics(device, name):
    mt.manual_seed(seed_of("uniform", name))
    a, b = -3.0, 5.0
    v = values(mt.empty(N, dtype=D(name), device=device).uniform_(a, b)).astype(np.float64)
    assert v.min() >= a and v.max() < b
    assert _six_sigma(v, (a + b) / 2, (b - a) / math.sqrt(12))
    assert abs(v.var() / ((b - a) ** 2 / 12) - 1) < 0.05
    u = values(mt.rand(N, dtype=D(name), device=device)).astype(np.float64)
    assert u.min() >= 0 and u.max() < 1 and _six_sigma(u, 0.5, 1 / math.sqrt(12))
    counts = np.histogram(u, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts - N / 10) < 6 * math.sqrt(N / 10))


@pytest.mark.parametrize("name", FLOATS)
def test_normal_statistics(device, name):
    mt.manual_seed(seed_of("normal", name))
    mean, std = 2.0, 3.0
    v = values(mt.empty(N, dtype=D(name), device=device).normal_(mean, std)).astype(np.float64)
    assert np.all(np.isfinite(v))
    assert _six_sigma(v, mean, std)
    assert abs(v.std() / std - 1) < 0.05
    within = np.mean(np.abs(v - mean) < std)
    assert abs(within - 0.6827) < 0.02
    z = values(mt.randn(N, dtype=D(name), device=device)).astype(np.float64)
    assert _six_sigma(z, 0, 1) and abs(z.std() - 1) < 0.05
    assert abs(np.mean(z > 0) - 0.5) < 0.02


@pytest.mark.parametrize("name", FLOATS)
def test_bernoulli_frequency(device, name):
    mt.manual_seed(seed_of("bernoulli", name))
    p = mt.rand(N, dtype=D(name), device=device)
    out = mt.bernoulli(p)
    assert out.dtype is D(name) and out.device == p.device and out.shape == p.shape
    v, pv = values(out), values(p).astype(np.float64)
    assert set(np.unique(v)) <= {0.0, 1.0}
    assert abs(v.mean() - pv.mean()) <= 6 * math.sqrt(np.sum(pv * (1 - pv))) / N
    low = pv < 0.5  # outcomes follow their own p, not just the average
    assert v[low].mean() < v[~low].mean()
    edges = mt.tensor([0.0, 1.0] * 50, dtype=D(name), device=device)
    assert np.array_equal(values(mt.bernoulli(edges)), values(edges))


@pytest.mark.parametrize("name", ALL)
def test_bernoulli_scalar_p_every_dtype(device, name):
    mt.manual_seed(seed_of("bernoulli_", name))
    t = mt.empty(N, dtype=D(name), device=device).bernoulli_(0.25)
    v = values(t).astype(np.float64)
    assert set(np.unique(v)) <= {0.0, 1.0}
    assert _six_sigma(v, 0.25, math.sqrt(0.25 * 0.75))
    assert values(mt.empty(50, dtype=D(name), device=device).bernoulli_(0)).sum() == 0
    assert values(mt.empty(50, dtype=D(name), device=device).bernoulli_(1)).sum() == 50
    p = mt.full((N,), 0.75, dtype=mt.float64, device=device)
    v = values(mt.empty(N, dtype=D(name), device=device).bernoulli_(p)).astype(np.float64)
    assert _six_sigma(v, 0.75, math.sqrt(0.75 * 0.25))


def test_bernoulli_broadcasts_p(device):
    mt.manual_seed(8)
    p = mt.tensor([[0.0], [1.0], [0.5]], device=device)
    v = values(mt.empty(3, 4000, dtype=mt.int32, device=device).bernoulli_(p))
    assert v[0].sum() == 0 and v[1].sum() == 4000 and abs(v[2].mean() - 0.5) < 0.05
    cpu_p = mt.tensor([0.0, 1.0])  # a CPU p for a cuda tensor moves to its device, as in torch
    assert values(mt.empty(2, device=device).bernoulli_(cpu_p)).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("name", ["int64", "int32", "int16", "float32", "float64", "bfloat16"])
def test_randint_range_and_uniformity(device, name):
    mt.manual_seed(seed_of("randint", name))
    low, high = -7, 13
    v = values(mt.randint(low, high, (N,), dtype=D(name), device=device)).astype(np.int64)
    assert v.min() == low and v.max() == high - 1
    counts = np.bincount(v - low, minlength=high - low)
    expected = N / (high - low)
    assert np.sum((counts - expected) ** 2 / expected) < 60  # chi-square, 19 degrees of freedom
    v = values(mt.randint(5, (100,), device=device))  # randint(high, size)
    assert v.min() >= 0 and v.max() < 5 and v.dtype == np.int64


def _default_top(name):
    """random_()'s largest value: 2^digits for floats, the type's max for integers."""
    if name == "bool":
        return 1
    if name in FLOATS:
        return 2 ** DIGITS[name]
    return int(np.iinfo(np.dtype(name)).max)


@pytest.mark.parametrize("name", ALL)
def test_random_default_range(device, name):
    mt.manual_seed(seed_of("random_", name))
    t = mt.empty(N, dtype=D(name), device=device).random_()
    v = values(t)
    top = _default_top(name)
    if name in FLOATS:
        assert np.all(v == np.round(v))
    v = v.astype(np.float64)
    assert v.min() >= 0 and v.max() <= top
    assert abs(v.mean() / (top / 2) - 1) < 0.05
    if top < 300:
        assert len(np.unique(v)) == top + 1  # every value drawn


@pytest.mark.parametrize("name", ALL)
def test_random_from_to(device, name):
    mt.manual_seed(seed_of("random_from_to", name))
    low, high = (0, 2) if name == "bool" else (0 if name == "uint8" else -20, 21)
    v = values(mt.empty(2000, dtype=D(name), device=device).random_(low, high)).astype(np.int64)
    assert v.min() == low and v.max() == high - 1
    v = values(mt.empty(2000, dtype=D(name), device=device).random_(high)).astype(np.int64)  # random_(to)
    assert v.min() == 0 and v.max() == high - 1
    start = 0 if name == "bool" else 3
    v = values(mt.empty(2000, dtype=D(name), device=device).random_(start, None)).astype(np.float64)
    assert v.min() >= start and v.max() <= _default_top(name)


def test_random_wide_ranges(device):
    mt.manual_seed(21)
    v = values(mt.empty(N, dtype=mt.int64, device=device).random_(-(2**62), 2**62))
    assert v.min() >= -(2**62) and v.max() < 2**62 and v.min() < -(2**61) and v.max() > 2**61
    v = values(mt.empty(N, dtype=mt.int64, device=device).random_(-(2**63), None))  # all 64-bit patterns
    assert (v < 0).mean() > 0.45 and (v > 0).mean() > 0.45
    v = values(mt.empty(N, dtype=mt.float64, device=device).random_())
    assert v.max() <= 2**53 and v.max() > 2**52


# ---------------------------------------------------------------------------------------------- layouts
@pytest.mark.parametrize("shape", [(), (1,), (3,), (5, 7), (2, 3, 4, 5), (4097,)])
def test_odd_sizes(device, shape):
    mt.manual_seed(seed_of("odd", shape))
    t = mt.rand(shape, device=device)
    assert t.shape == shape
    v = values(t)
    assert np.all((v >= 0) & (v < 1))
    if v.size > 4:
        assert len(np.unique(v)) > v.size // 2
    assert mt.randn(shape, device=device).shape == shape
    assert mt.randint(0, 9, shape, device=device).shape == shape


def _strided_views(device):
    base = mt.zeros(6, 10, device=device)
    return base, [base.t(), base[::2, 1::3], base[:, 3]]


@pytest.mark.parametrize("op", ["uniform_", "normal_", "bernoulli_", "random_"])
def test_non_contiguous_targets(device, op):
    """A view gets the numbers a contiguous tensor of its shape gets, and nothing outside it changes."""
    args = {"uniform_": (2.0, 3.0), "normal_": (0.0, 1.0), "bernoulli_": (0.5,), "random_": (1, 50)}[op]
    for k in range(3):
        base, views = _strided_views(device)
        view = views[k]
        mt.manual_seed(seed_of("strided", op, k))
        getattr(view, op)(*args)
        mt.manual_seed(seed_of("strided", op, k))
        expected = getattr(mt.zeros(view.shape, device=device), op)(*args)
        assert np.array_equal(values(view), values(expected))
        marked = mt.zeros(6, 10, device=device)
        marked_view = [marked.t(), marked[::2, 1::3], marked[:, 3]][k]
        marked_view.fill_(1.0)
        untouched = values(marked) == 0
        assert np.all(values(base)[untouched] == 0)


def test_expanded_target_refused(device):
    t = mt.zeros(1, device=device).expand(4)
    with pytest.raises(RuntimeError, match="more than one element of the written-to tensor"):
        t.uniform_()


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 5)])
def test_empty_tensors(device, shape):
    mt.manual_seed(2)
    first = values(mt.rand(4, device=device))
    mt.manual_seed(2)
    for t in (mt.rand(shape, device=device), mt.randn(shape, device=device),
              mt.randint(0, 3, shape, device=device), mt.empty(shape, dtype=mt.int8, device=device).random_(),
              mt.bernoulli(mt.empty(shape, device=device)), mt.empty(shape, device=device).uniform_(1, 2)):
        assert t.shape == shape and t.numel() == 0
    assert np.array_equal(values(mt.rand(4, device=device)), first)  # empty calls take no numbers


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("name", ["bool"] + INTS)
def test_float_only_ops_refuse_other_dtypes(device, name):
    t = mt.empty(3, dtype=D(name), device=device)
    with pytest.raises(NotImplementedError, match=f"\"check_uniform_bounds\" not implemented for '{TORCH_NAME[name]}'"):
        t.uniform_()
    with pytest.raises(NotImplementedError, match=f"\"check_uniform_bounds\" not implemented for '{TORCH_NAME[name]}'"):
        mt.rand(3, dtype=D(name), device=device)
    kernel = "normal_kernel_cpu" if device == "cpu" else "normal_kernel_cuda"
    with pytest.raises(NotImplementedError, match=f"\"{kernel}\" not implemented for '{TORCH_NAME[name]}'"):
        t.normal_()
    with pytest.raises(NotImplementedError, match=f"\"{kernel}\" not implemented for '{TORCH_NAME[name]}'"):
        mt.randn(3, dtype=D(name), device=device)
    if device == "cpu":
        with pytest.raises(NotImplementedError, match=f"\"bernoulli_tensor_cpu_p_\" not implemented for "
                                                      f"'{TORCH_NAME[name]}'"):
            mt.bernoulli(t)
    else:
        with pytest.raises(RuntimeError, match=f"expected probabilities tensor to have floating type, got "
                                               f"{TORCH_NAME[name]}"):
            mt.bernoulli(t)


def test_argument_errors(device):
    t = mt.empty(4, device=device)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to return a \[from, to\) range, but found from=2 > to=1"):
        t.uniform_(2, 1)
    with pytest.raises(RuntimeError, match="from is out of bounds for float"):
        t.uniform_(-math.inf, 0)
    with pytest.raises(RuntimeError, match=r"uniform_ expects to-from <= std::numeric_limits<Float>::max\(\), but "
                                           "found to=3e\\+38 and from=-3e\\+38 which result in to-from to exceed"):
        t.uniform_(-3e38, 3e38)
    with pytest.raises(RuntimeError, match="to is out of bounds for c10::Half"):
        mt.empty(2, dtype=mt.float16, device=device).uniform_(0, 70000)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0, but found std -1"):
        t.normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"bernoulli_ expects p to be in \[0, 1\], but got p=1.5"):
        t.bernoulli_(1.5)
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to', but got from=5 >= to=5"):
        t.random_(5, 5)
    with pytest.raises(RuntimeError, match="random_ expects 'from' to be less than 'to', but got from=3 >= to=1"):
        mt.randint(3, 1, (2,), device=device)
    with pytest.raises(RuntimeError, match="to - 1 is out of bounds for signed char"):
        mt.empty(2, dtype=mt.int8, device=device).random_(0, 300)
    with pytest.raises(RuntimeError, match="from is out of bounds for unsigned char"):
        mt.empty(2, dtype=mt.uint8, device=device).random_(-1, 3)
    with pytest.raises(RuntimeError, match="random_full_64_bits_range_kernel_.* handles only int64, double, float"):
        mt.empty(2, dtype=mt.int8, device=device).random_(-(2**63), None)
    with pytest.warns(UserWarning, match=r"to - 1 is out of bounds \[-\(2\^24\), 2\^24\]"):
        t.random_(0, 2**30)
    with pytest.raises(RuntimeError, match="normal expects std >= 0.0, but found std nan"):
        t.normal_(0, math.nan)
    with pytest.raises(RuntimeError, match="from is out of bounds for float"):
        t.uniform_(math.nan, 1)
    with pytest.raises(TypeError):
        t.random_(0.5, 3)
    with pytest.raises(TypeError):
        t.uniform_("a")
    with pytest.raises(TypeError):
        t.random_(1, 2, 3)


@pytest.mark.parametrize("name, bad", [("float32", 1.5), ("float32", -0.5), ("float32", math.nan),
                                       ("float16", 1.5), ("bfloat16", -1.0), ("float64", 1 + 1e-12)])
def test_bernoulli_tensor_p_out_of_range_raises(device, name, bad):
    """On both devices, as on torch's CPU (the cuda path used to draw 0 below and 1 above, and 0 for NaN); a
    refused bernoulli_ leaves its tensor as it was."""
    p = mt.tensor([0.5, bad, 0.25], dtype=D(name), device=device)
    message = r"^Expected p_in >= 0 && p_in <= 1 to be true, but got false\.$"
    for _ in range(2):  # the second call runs the cached closure
        with pytest.raises(RuntimeError, match=message):
            mt.bernoulli(p)
        t = mt.full((2, 3), 7.0, device=device)
        with pytest.raises(RuntimeError, match=message):
            t.bernoulli_(p)
        with pytest.raises(RuntimeError, match=message):  # a p on the other device, moved first
            t.bernoulli_(p.to("cpu" if device == "cuda" else "cuda"))
        assert values(t).tolist() == [[7.0] * 3] * 2
    assert values(mt.bernoulli(mt.tensor([0.0, 1.0], dtype=D(name), device=device))).tolist() == [0.0, 1.0]


# ---------------------------------------------------------------------------------------------- properties
@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(FLOATS), shape=st.lists(st.integers(0, 9), max_size=3).map(tuple),
       a=st.floats(-100, 100), width=st.floats(0.01, 100), seed=st.integers(0, 2**64 - 1))
def test_uniform_property(name, shape, a, width, seed):
    for device in ("cpu", "cuda"):
        mt.manual_seed(seed)
        t = mt.empty(shape, dtype=D(name), device=device).uniform_(a, a + width)
        mt.manual_seed(seed)
        again = mt.empty(shape, dtype=D(name), device=device).uniform_(a, a + width)
        v = values(t)
        lo, hi = (values(mt.tensor([a, a + width], dtype=D(name))).astype(np.float64))
        assert np.all((v >= lo) & ((v < hi) | (v == lo)))
        assert np.array_equal(v, values(again))


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(ALL), shape=st.lists(st.integers(0, 9), max_size=3).map(tuple),
       low=st.integers(-100, 100), width=st.integers(1, 200), seed=st.integers(-(2**63), 2**63 - 1))
def test_randint_property(name, shape, low, width, seed):
    lowest, highest = (0, 1) if name == "bool" else (-(2**60), 2**60) if name in FLOATS else (
        int(np.iinfo(np.dtype(name)).min), int(np.iinfo(np.dtype(name)).max))
    low = max(low, lowest)
    high = min(low + width, highest + 1)
    low = min(low, high - 1)
    for device in ("cpu", "cuda"):
        mt.manual_seed(seed)
        t = mt.randint(low, high, shape, dtype=D(name), device=device)
        assert t.shape == shape and t.dtype is D(name)
        v = values(t).astype(np.int64)
        assert np.all((v >= low) & (v < high))


@pytest.mark.skipif(mt.cuda.backend() != "nvidia", reason="2^31 elements: too large for the interpreter")
def test_int64_indexing_past_2_31():
    n = 2**31 + 7
    mt.cuda.manual_seed(3)
    t = mt.empty(n, dtype=mt.uint8, device="cuda").random_(0, 256)
    index = np.array([0, 5, 2**31 - 1, 2**31, n - 1])
    words = philox(index // 4, 3)[np.arange(len(index)), index % 4]
    got = [int(t[int(i)].item()) for i in index]
    assert got == [int(w % 256) for w in words]


def test_signature_caches_are_bounded():
    """The checked-once closures are keyed by user sizes: a process that draws many sizes keeps at most
    CACHE_LIMIT of them per cache, and every size still draws right after a cache starts over."""
    from minitensor.ops import random as ops_random
    limit = ops_random.CACHE_LIMIT
    for n in range(1, limit + 20):
        mt.rand(n)
        mt.empty(n).random_(0, 3)
        assert len(ops_random._factories) <= limit and len(ops_random._runs) <= limit
    t = mt.empty(limit + 30).random_(7, 8)
    assert (values(t) == 7).all()
