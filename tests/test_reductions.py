"""Reductions (sum mean min max all any), equal, isclose and allclose on CPU and "cuda" (the simulator on a
machine without a GPU) against numpy on random data: every dtype, 0-d and empty tensors, dims as int,
tuple and negative, keepdim, strided, transposed and broadcast views, the two-pass split path, NaN, ties,
and torch's result dtypes and errors.
"""
import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import hypothesis.extra.numpy as hnp

import minitensor as mt

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}
HYP = settings(max_examples=30, deadline=None)
OPS = ["sum", "mean", "max", "min", "all", "any"]


def seed_of(*parts):
    return zlib.crc32(repr(parts).encode())


def rand_values(name, shape, rng):
    """Random values held exactly by dtype `name` (float32 for bfloat16); small integers, so ties happen."""
    if name == "bool":
        return rng.random(shape) < 0.5
    if name == "uint8":
        return rng.integers(0, 12, shape).astype(np.uint8)
    if name.startswith("int"):
        return rng.integers(-9, 10, shape).astype(name)
    if name in ("float16", "bfloat16"):
        return (rng.integers(-255, 256, shape) / 4.0).astype(np.float32 if name == "bfloat16" else np.float16)
    return (rng.standard_normal(shape) * 8).astype(name)


def make(values, name, device):
    return mt.tensor(np.asarray(values), dtype=getattr(mt, name), device=device)


def host(t):
    """A tensor's values as numpy (bfloat16 as float32)."""
    if t.dtype == mt.bfloat16:
        t = t.float()
    return np.asarray(t.cpu().numpy())


@st.composite
def views(draw, name, max_dims=3):
    """(numpy values, minitensor view) of one random layout: sliced with steps and offsets, permuted, or
    broadcast along a dim."""
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=5))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    device = draw(st.sampled_from(["cpu", "cuda"]))
    nd = len(shape)
    starts = [draw(st.integers(0, 1)) for _ in range(nd)]
    steps = [draw(st.integers(1, 2)) for _ in range(nd)]
    base_shape = tuple(a + s * n for a, s, n in zip(starts, steps, shape))
    base = rand_values(name, base_shape, rng)
    t = make(base, name, device)
    index = tuple(slice(a, a + s * n, s) for a, s, n in zip(starts, steps, shape))
    v, tv = base[index], t[index]
    if nd >= 2 and draw(st.booleans()):
        perm = draw(st.permutations(range(nd)))
        v, tv = v.transpose(perm), tv.permute(*perm)
    d = draw(st.integers(0, nd - 1)) if nd else 0
    if nd >= 1 and v.shape[d] and draw(st.booleans()):  # broadcast one dim, cut to size 1, to 3
        v, tv = v[(slice(None),) * d + (slice(0, 1),)], tv[(slice(None),) * d + (slice(0, 1),)]
        target = v.shape[:d] + (3,) + v.shape[d + 1:]
        v, tv = np.broadcast_to(v, target), tv.expand(*target)
    return v, tv


@st.composite
def dims_for(draw, ndim, single=False):
    """None, an int or a tuple of distinct dims, each maybe negative."""
    bound = max(ndim, 1)
    if single:
        return draw(st.integers(-bound, bound - 1))
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        return None
    if kind == "int":
        return draw(st.integers(-bound, bound - 1))
    chosen = draw(st.lists(st.integers(0, bound - 1), unique=True, max_size=bound))
    return tuple(d - bound if draw(st.booleans()) else d for d in chosen)


def axes(dim, ndim):
    if dim is None or dim == ():
        return tuple(range(ndim))
    dims = dim if isinstance(dim, tuple) else (dim,)
    return tuple(sorted(d % max(ndim, 1) for d in dims if d % max(ndim, 1) < ndim))


def expected_dtype(op, name):
    if op == "sum":
        return name if name in FLOATS else "int64"
    if op in ("all", "any"):
        return "uint8" if name == "uint8" else "bool"
    return name


def check_close(got, ref, name, magnitude):
    """Float results within what the accumulation (float32, or float64) and the output rounding allow."""
    acc_eps = EPS["float64"] if name == "float64" else EPS["float32"]
    tol = 4 * acc_eps * magnitude + EPS[name] * np.abs(ref)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(got.astype(np.float64) - ref) <= tol) & ~(np.isnan(got) & np.isnan(ref))
    assert not bad.any(), f"got {got[bad]}, expected {np.asarray(ref)[bad]}"


def reference(op, v, ax, keepdim):
    """numpy's answer for a torch reduction over axes `ax`."""
    x = v.astype(np.float64) if v.dtype.kind == "f" else v
    if op == "sum":
        return np.sum(x.astype(np.float64 if v.dtype.kind == "f" else np.int64), axis=ax, keepdims=keepdim)
    if op == "mean":
        with np.errstate(all="ignore"):
            return np.sum(x, axis=ax, keepdims=keepdim) / math.prod(v.shape[a] for a in ax)
    if op in ("all", "any"):
        return getattr(np, op)(v != 0, axis=ax, keepdims=keepdim)
    return getattr(np, op)(x, axis=ax, keepdims=keepdim)


# ---------------------------------------------------------------------------------------------- properties
@HYP
@given(data=st.data(), name=st.sampled_from(NAMES), op=st.sampled_from(OPS), keepdim=st.booleans())
def test_reduce_matches_numpy(data, name, op, keepdim):
    v, t = data.draw(views(name))
    dim = data.draw(dims_for(v.ndim))
    ax = axes(dim, v.ndim)
    if op == "mean" and name not in FLOATS:
        with pytest.raises(RuntimeError, match="mean\\(\\): could not infer output dtype"):
            t.mean(dim, keepdim)
        return
    if op in ("max", "min") and v.size == 0:
        with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
            getattr(t, op)()
        return
    if op in ("max", "min"):  # the whole-tensor form: over a dim they return indices too (tested below)
        r, dim, ax, keepdim = getattr(t, op)(), None, tuple(range(v.ndim)), False
    else:
        r = getattr(mt, op)(t, dim, keepdim)
    ref = reference(op, v, ax, keepdim)
    assert r.dtype == getattr(mt, expected_dtype(op, name))
    assert r.device == t.device
    assert tuple(r.shape) == np.shape(ref)
    got = host(r)
    if name in FLOATS and op in ("sum", "mean"):
        magnitude = np.sum(np.abs(v.astype(np.float64)), axis=ax, keepdims=keepdim)
        if op == "mean":
            magnitude = magnitude / max(math.prod(v.shape[a] for a in ax), 1)
        check_close(got, ref, name, magnitude)
    else:
        np.testing.assert_array_equal(got, np.asarray(ref).astype(got.dtype))


@HYP
@given(data=st.data(), name=st.sampled_from(NAMES), op=st.sampled_from(["max", "min"]), keepdim=st.booleans())
def test_min_max_dim_matches_numpy(data, name, op, keepdim):
    v, t = data.draw(views(name))
    dim = data.draw(dims_for(v.ndim, single=True))
    if v.ndim and v.shape[dim] == 0:
        with pytest.raises(IndexError, match=f"{op}\\(\\): Expected reduction dim {dim % v.ndim} to have non-zero"):
            getattr(t, op)(dim)
        return
    values, indices = getattr(t, op)(dim, keepdim)
    x = v.astype(np.float32) if name == "bfloat16" else v
    if v.ndim == 0:
        ref_v, ref_i = x, np.int64(0)
    else:
        ref_v = getattr(np, op)(x, axis=dim, keepdims=keepdim)
        ref_i = getattr(np, "arg" + op)(x, axis=dim, keepdims=keepdim)  # first occurrence, as torch
    assert values.dtype == t.dtype and indices.dtype == mt.int64
    assert tuple(values.shape) == np.shape(ref_v) == tuple(indices.shape)
    np.testing.assert_array_equal(host(values), np.asarray(ref_v).astype(host(values).dtype))
    np.testing.assert_array_equal(host(indices), ref_i)


# ---------------------------------------------------------------------------------------------- dtypes
@pytest.mark.parametrize("name", ["bool", "uint8", "int8", "int16", "int32"])
def test_integer_sums_accumulate_in_int64(device, name):
    big = {"bool": True, "uint8": 250, "int8": 127, "int16": 32000, "int32": 2**31 - 1}[name]
    t = mt.full((3, 40), big, dtype=getattr(mt, name), device=device)
    assert t.sum().dtype == mt.int64
    assert t.sum().item() == 120 * int(big)
    assert host(t.sum(1)).tolist() == [40 * int(big)] * 3


def test_int64_sum_wraps_like_torch(device):
    t = mt.tensor([2**62, 2**62, 2**62], dtype=mt.int64, device=device)
    assert t.sum().item() == -(2**62)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_types_accumulate_in_float32(device, name):
    # in its own type the sum would stall at 2048 (float16) or 256 (bfloat16)
    n = 3000 if name == "float16" else 1000
    t = mt.ones(n, dtype=getattr(mt, name), device=device)
    s = t.sum()
    assert s.dtype == getattr(mt, name) and s.item() == n
    assert t.mean().item() == 1.0


def test_sum_and_mean_dtype_argument(device):
    t = make(np.array([[1, 2], [3, 4]], np.int32), "int32", device)
    assert t.sum(dtype=mt.float64).dtype == mt.float64 and t.sum(dtype=mt.float64).item() == 10.0
    assert t.sum(0, dtype=mt.int16).dtype == mt.int16
    m = t.mean(1, dtype=mt.float32)
    assert m.dtype == mt.float32 and host(m).tolist() == [1.5, 3.5]
    with pytest.raises(RuntimeError, match="Optional dtype must be either a floating point or complex dtype. Got: Long"):
        t.mean(dtype=mt.int64)


@pytest.mark.parametrize("name,torch_name", [("int64", "Long"), ("bool", "Bool"), ("uint8", "Byte")])
def test_mean_of_integers_raises(device, name, torch_name):
    t = make(np.ones(3), name, device)
    with pytest.raises(RuntimeError, match=f"mean\\(\\): could not infer output dtype. Input dtype must be either a "
                                           f"floating point or complex dtype. Got: {torch_name}"):
        t.mean()


def test_mean_checks_the_dtype_before_the_dims(device):
    """torch says that an int tensor has no mean before it looks at the dims."""
    t = make(np.ones(2), "int64", device)
    for dim in (5, (0, 0), -3):
        with pytest.raises(RuntimeError, match="^mean\\(\\): could not infer output dtype. Input dtype must be"):
            t.mean(dim)
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.sum(5)


@pytest.mark.parametrize("op", OPS)
def test_keepdim_must_be_a_bool(device, op):
    t = make(np.ones(2), "float32", device)
    for bad in ("x", None, 1, 0.0):
        with pytest.raises(TypeError, match=f"^{op}\\(\\): argument 'keepdim' must be bool, not "
                                            f"{type(bad).__name__}$"):
            getattr(t, op)(0, keepdim=bad)
    r = getattr(t, op)(0, keepdim=np.bool_(True))
    assert (r.values if op in ("max", "min") else r).shape == (1,)


@pytest.mark.parametrize("op", OPS)
def test_checks_hold_after_an_equal_valid_call(device, op):
    """True == 1 == 1.0 as dict keys: a run kept for a valid call must not let an invalid equal one through."""
    t = make(np.ones((2, 3)), "float32", device)
    getattr(t, op)(1, keepdim=True), getattr(t, op)(0, keepdim=False)
    for bad in (1, 0.0):
        with pytest.raises(TypeError, match="argument 'keepdim' must be bool"):
            getattr(t, op)(1, keepdim=bad)
    with pytest.raises(TypeError, match="argument 'dim' must be int"):
        getattr(t, op)(1.0)
    if op not in ("max", "min"):
        getattr(t, op)((0, 1))
        with pytest.raises(TypeError, match="argument 'dim' must be int or tuple of ints, not float"):
            getattr(t, op)((0, 1.0))


def test_all_any_types(device):
    u = make(np.array([3, 0, 7], np.uint8), "uint8", device)
    assert u.all().dtype == mt.uint8 and u.all().item() == 0 and u.any().item() == 1
    f = make(np.array([0.5, float("nan")], np.float32), "float32", device)
    assert f.all().dtype == mt.bool and f.all().item() is True  # NaN is true
    assert make(np.zeros(4), "float16", device).any().item() is False


# ---------------------------------------------------------------------------------------------- empty, 0-d, shapes
def test_empty_tensors(device):
    e = mt.empty(0, 3, device=device)
    assert e.sum().item() == 0.0 and e.sum().shape == ()
    assert host(e.sum(0)).tolist() == [0.0, 0.0, 0.0]
    assert tuple(e.sum(1).shape) == (0,)
    assert math.isnan(e.mean().item())
    assert np.isnan(host(e.mean(0))).all()
    assert e.all().item() is True and e.any().item() is False
    assert host(e.all(0)).tolist() == [True] * 3
    assert mt.empty(0, dtype=mt.int32, device=device).sum().item() == 0
    for op in ("max", "min"):
        with pytest.raises(RuntimeError, match=f"{op}\\(\\): Expected reduction dim to be specified for "
                                               "input.numel\\(\\) == 0"):
            getattr(e, op)()
        with pytest.raises(IndexError, match=f"{op}\\(\\): Expected reduction dim 0 to have non-zero size"):
            getattr(e, op)(0)
        values, indices = getattr(e, op)(1)
        assert tuple(values.shape) == (0,) and tuple(indices.shape) == (0,)
        assert tuple(getattr(e, op)(1, keepdim=True).values.shape) == (0, 1)


def test_zero_dim(device):
    t = make(np.float32(2.5), "float32", device)
    for dim in (None, 0, -1, (), (0,)):
        assert t.sum(dim).shape == () and t.sum(dim).item() == 2.5
    assert t.sum(0, keepdim=True).shape == ()
    values, indices = t.max(0)
    assert values.item() == 2.5 and indices.item() == 0 and indices.shape == ()
    assert t.min().item() == 2.5 and t.mean().item() == 2.5 and t.any().item() is True
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.sum(1)


def test_keepdim_shapes_and_dims(device):
    t = make(rand_values("float32", (2, 3, 4), np.random.default_rng(0)), "float32", device)
    assert tuple(t.sum((0, 2), keepdim=True).shape) == (1, 3, 1)
    assert tuple(t.sum([-1, 0]).shape) == (3,)
    assert tuple(t.sum(dim=()).shape) == ()  # an empty dim list reduces everything, as torch's sum
    assert tuple(t.max(1, True).values.shape) == (2, 1, 4)
    with pytest.raises(IndexError, match="Dimension out of range \\(expected to be in range of \\[-3, 2\\], but got 3\\)"):
        t.sum(3)
    with pytest.raises(RuntimeError, match="dim 0 appears multiple times in the list of dims"):
        t.sum((0, -3))
    with pytest.raises(TypeError):
        t.max((0, 1))


def test_return_types(device):
    t = make(np.array([[1.0, 5.0, 5.0], [7.0, 2.0, 7.0]], np.float32), "float32", device)
    r = t.max(1)
    assert isinstance(r, tuple) and isinstance(r, mt.return_types.max)
    values, indices = r
    assert r[0] is values and r.indices is indices
    assert host(values).tolist() == [5.0, 7.0] and host(indices).tolist() == [1, 0]  # first of equal values
    assert "values=" in repr(r) and "indices=" in repr(r)
    r = mt.min(t, 0, keepdim=True)
    assert isinstance(r, mt.return_types.min) and host(r.indices).tolist() == [[0, 1, 0]]


def test_max_min_with_a_tensor_are_elementwise(device):
    a = make(np.array([1.0, 5.0]), "float32", device)
    b = make(np.array([3.0, 2.0]), "float32", device)
    assert host(a.max(b)).tolist() == [3.0, 5.0] and host(mt.min(a, b)).tolist() == [1.0, 2.0]


# ---------------------------------------------------------------------------------------------- NaN, ties
@pytest.mark.parametrize("name", FLOATS)
def test_nan_propagates_in_min_max(device, name):
    v = np.array([[1.0, np.nan, 3.0, np.nan], [-2.0, 4.0, -np.inf, 0.5]], np.float32)
    t = make(v, name, device)
    assert math.isnan(t.max().item()) and math.isnan(t.min().item())
    values, indices = t.max(1)
    assert math.isnan(host(values)[0]) and host(values)[1] == 4.0
    assert host(indices).tolist() == [1, 1]  # the first NaN
    values, indices = t.min(1)
    assert math.isnan(host(values)[0]) and host(values)[1] == -np.inf and host(indices).tolist() == [1, 2]
    assert math.isnan(t.sum().item())


def test_all_equal_to_the_identity_gives_index_0(device):
    t = mt.full((2, 5), float("-inf"), device=device)
    assert host(t.max(1).indices).tolist() == [0, 0]
    i = mt.full((7,), -2**63, dtype=mt.int64, device=device)
    assert i.max(0).indices.item() == 0 and i.max().item() == -2**63


# ---------------------------------------------------------------------------------------------- large and strided
def test_split_reduction_full_and_over_dims(device):
    """Big enough that the cuda plan splits the reduced range over programs and adds a second pass."""
    rng = np.random.default_rng(7)
    v = rng.standard_normal(300_001).astype(np.float32)
    v[[17, 250_000]] = 9.5  # equal maxima in different splits: the first wins
    v[123_456] = -9.5
    t = make(v, "float32", device)
    assert abs(t.sum().item() - v.astype(np.float64).sum()) < 1e-3
    assert abs(t.mean().item() - v.astype(np.float64).mean()) < 1e-8
    values, indices = t.max(0)
    assert values.item() == 9.5 and indices.item() == 17
    assert t.min(0).indices.item() == 123_456 and t.min().item() == -9.5
    assert t.sum().item() == t.sum().item()  # deterministic
    assert (t > 9).any().item() is True and (t > -10).all().item() is True
    cols = make(rng.integers(-5, 6, (100_001, 3)).astype(np.int32), "int32", device)
    c = host(cols.cpu())
    assert host(cols.sum(0)).tolist() == c.astype(np.int64).sum(0).tolist()
    np.testing.assert_array_equal(host(cols.max(0).indices), c.argmax(0))
    small = make(c + 5, "uint8", device)  # partials in the input's own type
    np.testing.assert_array_equal(host(small.min(0).values), c.min(0) + 5)
    np.testing.assert_array_equal(host(small.min(0).indices), c.argmin(0))


def test_float32_sum_is_deterministic(device):
    t = mt.randn(200_003, device=device) * 1000
    first = t.sum().item()
    assert all(t.sum().item() == first for _ in range(2))
    assert host(t.view(1, -1).sum(1))[0] == host(t.view(1, -1).sum(1))[0]


def test_many_dims_that_do_not_collapse(device):
    """Ten dims permuted: more than four kept dims that do not merge, reduced through a contiguous copy."""
    rng = np.random.default_rng(3)
    v = rng.integers(-50, 50, (2,) * 10).astype(np.int64)
    perm = (3, 8, 1, 6, 0, 9, 4, 2, 7, 5)
    t = make(v, "int64", device).permute(*perm)
    w = v.transpose(perm)
    dims = (0, 2, 4, 6, 8)
    np.testing.assert_array_equal(host(t.sum(dims)), w.sum(dims))
    np.testing.assert_array_equal(host(t.max(9).indices), w.argmax(9))


def test_int64_offsets_on_cuda():
    """Three elements 2^30 bytes apart: offsets past 2^31 need 64-bit indexing."""
    base = mt.empty(2**31 + 16, dtype=mt.int8, device="cuda")
    base[0], base[2**30], base[2**31] = 5, -7, 9
    view = base[:: 2**30]
    assert view.sum().item() == 7
    assert view.max(0).indices.item() == 2
    del base, view


# ---------------------------------------------------------------------------------------------- equal / allclose
def test_equal(device):
    rng = np.random.default_rng(11)
    v = rng.integers(-100, 100, (4, 6))
    a = make(v, "int32", device)
    assert mt.equal(a, make(v, "float32", device)) is True  # compared in the promoted type
    assert mt.equal(a.t(), make(v.T.copy(), "int64", device)) is True
    w = v.copy()
    w[3, 5] += 1
    assert a.equal(make(w, "int32", device)) is False
    assert mt.equal(a, a[:3]) is False  # shapes differ
    assert mt.equal(mt.empty(0, 2, device=device), mt.empty(0, 2, device=device)) is True
    nan = make(np.array([1.0, np.nan]), "float32", device)
    assert mt.equal(nan, nan) is False
    assert mt.equal(make(v, "bool", device), make(v != 0, "bool", device)) is True


def test_equal_across_devices_raises():
    with pytest.raises(RuntimeError, match="Cannot compare two tensors on different devices"):
        mt.equal(mt.ones(2), mt.ones(2, device="cuda"))


@settings(max_examples=25, deadline=None)
@given(data=st.data(), name=st.sampled_from(NAMES), equal_nan=st.booleans(),
       rtol=st.sampled_from([0.0, 1e-5, 1e-2]), atol=st.sampled_from([0.0, 1e-8, 0.5]))
def test_isclose_matches_numpy(data, name, equal_nan, rtol, atol):
    a, ta = data.draw(views(name, max_dims=2))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    b = rand_values(name, a.shape, rng)
    if name in FLOATS:  # near values, exact copies and specials
        b = np.where(rng.random(a.shape) < 0.5, a.astype(b.dtype) * (1 + rng.choice([0, 1e-6, 1e-3], a.shape)), b)
        b = np.where(rng.random(a.shape) < 0.1, np.array(np.nan, b.dtype), b).astype(b.dtype)
    tb = make(b, name, ta.device.type)
    got = host(mt.isclose(ta, tb, rtol, atol, equal_nan))
    x, y = (a.astype(np.float64), host(tb).astype(np.float64)) if name == "float64" else \
        (a.astype(np.float32), host(tb).astype(np.float32)) if name in FLOATS or name == "bool" else (a, b)
    with np.errstate(all="ignore"):
        wide = np.float64 if name == "float64" else np.float32
        diff = np.abs(x - y).astype(wide)
        ref = (x == y) | (equal_nan & np.isnan(x) & np.isnan(y)) if name in FLOATS else (x == y)
        if rtol or atol:
            ref = ref | (np.isfinite(diff) & (diff <= wide(atol) + np.abs(wide(rtol) * y.astype(wide))))
    np.testing.assert_array_equal(got, ref)
    assert mt.allclose(ta, tb, rtol, atol, equal_nan) is bool(ref.all())


def test_allclose(device):
    a = make(np.array([1.0, 2.0, np.inf, np.nan], np.float32), "float32", device)
    b = make(np.array([1.0 + 1e-6, 2.0, np.inf, np.nan], np.float32), "float32", device)
    assert mt.allclose(a, b) is False and mt.allclose(a, b, equal_nan=True) is True
    assert a.allclose(b, rtol=0, atol=0, equal_nan=True) is False
    assert mt.allclose(make(np.ones((3, 2)), "float64", device), make(np.ones(2), "float64", device)) is True
    with pytest.raises(RuntimeError, match="Float did not match Double"):
        mt.allclose(a, make(np.ones(4), "float64", device))
    with pytest.raises(RuntimeError, match="rtol must be greater than or equal to zero, but got -1"):
        mt.allclose(a, b, rtol=-1)
    i = make(np.array([100, -100], np.int8), "int8", device)
    j = make(np.array([-100, 100], np.int8), "int8", device)
    assert mt.allclose(i, j, atol=60) is True  # torch's int8 difference wraps: |100 - -100| is 56
