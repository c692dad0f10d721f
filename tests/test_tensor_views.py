"""Tensor core: factories, metadata, views, item assignment and conversions, on "cpu" and "cuda".

Expected values come from numpy on the same random data; expected strides / viewability from torch's
documented rules (contiguous strides use max(size, 1); `view` follows at::detail::computeStride).
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitensor as mt

DEVICES = ["cpu", "cuda"]
NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATS = {"float16", "bfloat16", "float32", "float64"}
INTS = {"uint8", "int8", "int16", "int32", "int64"}
ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
            "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
NP = {"bool": np.bool_, "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32,
      "int64": np.int64, "float16": np.float16, "float32": np.float32, "float64": np.float64}
HYP = settings(max_examples=30, deadline=None)


def D(name):
    return getattr(mt, name)


def bf16_round(x):
    """float32 -> nearest-even bfloat16 value, kept in a float32 array."""
    x = np.asarray(x, dtype=np.float32)
    u = np.ascontiguousarray(x).reshape(-1).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def rand_np(rng, shape, name):
    """Random data for dtype `name` (bfloat16: float32 values that are exact in bfloat16)."""
    shape = tuple(shape)
    if name == "bool":
        return np.asarray(rng.random(shape) < 0.5)
    if name in INTS:
        info = np.iinfo(NP[name])
        return np.asarray(rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=NP[name]))
    v = np.asarray(rng.standard_normal(shape) * 8)
    if name == "bfloat16":
        return bf16_round(v.astype(np.float32))
    return v.astype(NP[name])


def make(rng, shape, name, device):
    """A random tensor and its numpy twin. 0-d tensors are made as a view of a 1-element tensor, so
    that the view tests do not depend on `mt.tensor(<0-d data>)` (checked by the factory tests)."""
    a = rand_np(rng, shape, name)
    src = a.reshape(1) if a.ndim == 0 else a
    if name == "bfloat16":
        t = mt.tensor(src, dtype=mt.bfloat16, device=device)
    else:
        t = mt.tensor(src, device=device)
    if a.ndim == 0:
        t = t.view(())
    return t, a


def to_np(t):
    """Values of a minitensor as numpy (bfloat16 as float32)."""
    if t.dtype == mt.bfloat16:
        t = t.float()
    return np.asarray(t.cpu().numpy())


def assert_values(t, a, name=None):
    a = np.asarray(a)
    assert tuple(t.shape) == a.shape, f"shape {tuple(t.shape)} != {a.shape}"
    if name is not None:
        assert t.dtype == D(name)
    got = to_np(t)
    assert got.shape == a.shape
    np.testing.assert_array_equal(got, a)


def np_elem_strides(a):
    return tuple(s // a.itemsize for s in a.strides)


def np_elem_offset(view, base):
    return (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // base.itemsize


def contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def ref_is_contiguous(shape, strides):
    if math.prod(shape) == 0:
        return True
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1:
            if s != expected:
                return False
            expected *= n
    return True


def ref_view_strides(oldshape, oldstride, newshape):
    """at::detail::computeStride: the strides of `view(newshape)`, or None when view is impossible."""
    oldshape, oldstride, newshape = list(oldshape), list(oldstride), list(newshape)
    if not oldshape:
        return tuple([1] * len(newshape))
    numel = math.prod(oldshape)
    if numel == 0 and oldshape == newshape:
        return tuple(oldstride)
    newstride = [0] * len(newshape)
    if numel == 0:
        return contiguous_strides(newshape)
    view_d = len(newshape) - 1
    chunk_base_stride = oldstride[-1]
    tensor_numel = 1
    view_numel = 1
    for tensor_d in range(len(oldshape) - 1, -1, -1):
        tensor_numel *= oldshape[tensor_d]
        if tensor_d == 0 or (oldshape[tensor_d - 1] != 1
                             and oldstride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or newshape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel *= newshape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = oldstride[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(newstride)


def same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def check_strides_where_it_matters(t, expected):
    """Strides must match on every dim of size > 1 (other dims' strides are never observable)."""
    got = t.stride()
    assert len(got) == len(expected)
    for n, g, e in zip(t.shape, got, expected):
        if n > 1:
            assert g == e, f"strides {got} != {expected} for shape {tuple(t.shape)}"


def scalar_for(rng, name):
    """A Python scalar exactly representable in dtype `name`."""
    if name == "bool":
        return bool(rng.random() < 0.5)
    if name in INTS:
        info = np.iinfo(NP[name])
        return int(rng.integers(info.min, info.max, endpoint=True))
    return float(rng.integers(-100, 100)) / 4


shapes_st = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
pos_shapes_st = st.lists(st.integers(1, 5), min_size=1, max_size=4).map(tuple)
names_st = st.sampled_from(NAMES)
seeds_st = st.integers(0, 2**32 - 1)


def draw_strided(data, device, min_dim=0, allow_empty=True):
    """A random (often non-contiguous) view of a random tensor, and the numpy twin of it."""
    shape = data.draw(shapes_st if allow_empty else pos_shapes_st, label="shape")
    while len(shape) < min_dim:
        shape = shape + (2,)
    name = data.draw(names_st, label="dtype")
    rng = np.random.default_rng(data.draw(seeds_st, label="seed"))
    base, a = make(rng, shape, name, device)
    base_a, t = a, base
    if len(shape) > 1:
        perm = data.draw(st.permutations(range(len(shape))), label="perm")
        t, a = t.permute(*perm), a.transpose(perm)
    if len(shape) > 0:
        sl = []
        for n in t.shape:
            start = data.draw(st.integers(0, max(n - 1, 0)))
            step = data.draw(st.integers(1, 2))
            sl.append(slice(start, None, step))
        if data.draw(st.booleans()):
            t, a = t[tuple(sl)], a[tuple(sl)]
    return base, base_a, t, a, name, rng


def draw_index(data, shape):
    """A basic index: ints (negative too), slices (steps 1-3, out-of-range bounds), None and one `...`."""
    ndim = len(shape)
    k = data.draw(st.integers(0, ndim), label="k")
    use_ellipsis = data.draw(st.booleans(), label="ellipsis")

    def entry(n):
        kinds = ["slice"] + (["int"] if n > 0 else [])
        kind = data.draw(st.sampled_from(kinds))
        if kind == "int":
            return data.draw(st.integers(-n, n - 1))
        bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
        return slice(data.draw(bound), data.draw(bound), data.draw(st.one_of(st.none(), st.integers(1, 3))))

    if use_ellipsis:
        k1 = data.draw(st.integers(0, k))
        k2 = k - k1
        items = [entry(n) for n in shape[:k1]] + [Ellipsis] + [entry(n) for n in shape[ndim - k2:]]
    else:
        items = [entry(n) for n in shape[:k]]
    for _ in range(data.draw(st.integers(0, 2))):
        items.insert(data.draw(st.integers(0, len(items))), None)
    if len(items) == 1 and data.draw(st.booleans()):
        return items[0]
    return tuple(items)


# ============================================================================================
# factories
# ============================================================================================
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("data,name,shape", [
    ([1.0, 2.5, -3.0], "float32", (3,)),
    ([1, 2, -3], "int64", (3,)),
    ([True, False, True], "bool", (3,)),
    ([1, 2.5], "float32", (2,)),
    ([True, 2], "int64", (2,)),
    ([[1, 2, 3], [4, 5, 6]], "int64", (2, 3)),
    ([[1.5], [2]], "float32", (2, 1)),
    (2.5, "float32", ()),
    (7, "int64", ()),
    (False, "bool", ()),
    ([], "float32", (0,)),
    ([[], []], "float32", (2, 0)),
    ([[[1, 2]], [[3, 4]], [[5, -6]]], "int64", (3, 1, 2)),
])
def test_tensor_from_python_infers_dtype(data, name, shape, device):
    t = mt.tensor(data, device=device)
    assert t.dtype == D(name)
    assert t.shape == shape
    assert t.device.type == device
    exp = np.array(data, dtype=NP[name])
    np.testing.assert_array_equal(to_np(t), exp)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_tensor_from_python_with_dtype(name, device):
    rng = np.random.default_rng(3)
    vals = rand_np(rng, (3, 5), name)
    t = mt.tensor(vals.tolist(), dtype=D(name), device=device)
    assert_values(t, vals, name)


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_float_list_to_int_dtype_truncates(device):
    t = mt.tensor([1.7, -2.7, 3.2], dtype=mt.int32, device=device)
    assert_values(t, np.array([1.7, -2.7, 3.2]).astype(np.int32), "int32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for n in NAMES if n != "bfloat16"])
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 1, 3), (2, 0, 3)])
def test_tensor_from_numpy_keeps_dtype(name, shape, device):
    rng = np.random.default_rng(4)
    a = rand_np(rng, shape, name)
    t = mt.tensor(a, device=device)
    assert_values(t, a, name)
    assert t.is_contiguous()
    assert t.stride() == contiguous_strides(shape)
    # mt.tensor copies
    if a.size:
        before = a.copy()
        with np.errstate(all="ignore"):
            a[...] = ~a if name == "bool" else a + 1
        np.testing.assert_array_equal(to_np(t), before)


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_from_noncontiguous_numpy(device):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((5, 6))[::2, 1::3].T
    t = mt.tensor(a, device=device)
    assert_values(t, a, "float64")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_zeros_ones_empty_full(name, device):
    dt = D(name)
    ref_np = np.float32 if name == "bfloat16" else NP[name]
    for args in [(2, 3), ((2, 3),), ([2, 3],)]:
        z = mt.zeros(*args, dtype=dt, device=device)
        assert_values(z, np.zeros((2, 3), ref_np), name)
        o = mt.ones(*args, dtype=dt, device=device)
        assert_values(o, np.ones((2, 3), ref_np), name)
        e = mt.empty(*args, dtype=dt, device=device)
        assert e.shape == (2, 3) and e.dtype == dt and e.device.type == device and e.is_contiguous()
    for shape in [(), (0,), (7,), (1, 4, 3)]:
        assert mt.zeros(shape, dtype=dt, device=device).shape == shape
        assert mt.empty(shape, dtype=dt, device=device).shape == shape
    rng = np.random.default_rng(6)
    v = scalar_for(rng, name)
    f = mt.full((3, 5), v, dtype=dt, device=device)
    assert_values(f, np.full((3, 5), v, ref_np), name)


@pytest.mark.parametrize("device", DEVICES)
def test_factory_default_dtypes(device):
    assert mt.zeros(2, device=device).dtype == mt.float32
    assert mt.ones(2, device=device).dtype == mt.float32
    assert mt.empty(2, device=device).dtype == mt.float32
    assert mt.rand(2, device=device).dtype == mt.float32
    assert mt.randn(2, device=device).dtype == mt.float32
    assert mt.full((2,), 1.5, device=device).dtype == mt.float32
    assert mt.full((2,), 7, device=device).dtype == mt.int64
    assert mt.full((2,), True, device=device).dtype == mt.bool
    assert_values(mt.full((2, 3), -7, device=device), np.full((2, 3), -7, np.int64), "int64")
    assert_values(mt.full([4], 2.25, device=device), np.full(4, 2.25, np.float32), "float32")
    assert_values(mt.full((2,), True, device=device), np.full(2, True), "bool")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("args,kwargs", [
    ((5,), {}), ((0,), {}), ((2, 11, 3), {}), ((10, 0, -3), {}), ((-5, 5), {}), ((3, 3), {}),
    ((5,), {"dtype": "float64"}), ((1.0, 2.0, 0.25), {}), ((0, 1, 0.125), {}), ((2.5, -1.0, -0.5), {}),
    ((0, 7, 2), {"dtype": "int16"}), ((1, 4), {"dtype": "float16"}), ((0.5, 6), {}),
])
def test_arange(args, kwargs, device):
    kw = {k: D(v) for k, v in kwargs.items()}
    t = mt.arange(*args, device=device, **kw)
    is_float = any(isinstance(x, float) for x in args)
    name = kwargs.get("dtype", "float32" if is_float else "int64")
    exp = np.arange(*args, dtype=np.float64).astype(NP[name])
    assert t.dtype == D(name)
    assert t.shape == exp.shape
    np.testing.assert_allclose(to_np(t).astype(np.float64), exp.astype(np.float64), rtol=1e-6, atol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_rand_randn_randint(device):
    for args in [(3, 5), ((3, 5),), ([3, 5],)]:
        assert mt.rand(*args, device=device).shape == (3, 5)
        assert mt.randn(*args, device=device).shape == (3, 5)
    r = to_np(mt.rand(1000, device=device))
    assert r.dtype == np.float32 and r.shape == (1000,)
    assert (r >= 0).all() and (r < 1).all()
    assert len(np.unique(r)) > 900
    assert 0.4 < r.mean() < 0.6
    n = to_np(mt.randn(2000, device=device))
    assert -0.2 < n.mean() < 0.2 and 0.8 < n.std() < 1.2
    assert (n < 0).any() and (n > 0).any()
    for name in ["float64", "float16", "bfloat16"]:
        x = mt.rand(7, dtype=D(name), device=device)
        assert x.dtype == D(name)
        v = to_np(x)
        assert (v >= 0).all() and (v <= 1).all()
        assert mt.randn(2, 3, dtype=D(name), device=device).dtype == D(name)
    ri = mt.randint(-3, 10, (400,), device=device)
    assert ri.dtype == mt.int64 and ri.shape == (400,)
    v = to_np(ri)
    assert v.min() >= -3 and v.max() < 10
    assert set(np.unique(v).tolist()) == set(range(-3, 10))
    r8 = mt.randint(0, 5, (2, 3), dtype=mt.uint8, device=device)
    assert r8.dtype == mt.uint8 and r8.shape == (2, 3)
    assert (to_np(r8) < 5).all()
    assert mt.rand(0, device=device).shape == (0,)
    assert mt.rand((), device=device).shape == ()


@pytest.mark.parametrize("device", DEVICES)
def test_random_factories_differ_between_calls(device):
    a, b = to_np(mt.rand(64, device=device)), to_np(mt.rand(64, device=device))
    assert not np.array_equal(a, b)
    mt.manual_seed(1234)
    c = to_np(mt.randn(64, device=device))
    mt.manual_seed(1234)
    d = to_np(mt.randn(64, device=device))
    np.testing.assert_array_equal(c, d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_like_factories(name, device):
    rng = np.random.default_rng(7)
    src, _ = make(rng, (3, 4), name, device)
    src = src[:, 1:]  # non-contiguous input
    ref_np = np.float32 if name == "bfloat16" else NP[name]
    for fn, exp in [(mt.zeros_like, np.zeros((3, 3), ref_np)), (mt.ones_like, np.ones((3, 3), ref_np))]:
        r = fn(src)
        assert r.device == src.device
        assert_values(r, exp, name)
    e = mt.empty_like(src)
    assert e.shape == (3, 3) and e.dtype == D(name) and e.device == src.device
    v = scalar_for(rng, name)
    assert_values(mt.full_like(src, v), np.full((3, 3), v, ref_np), name)
    z = mt.zeros_like(src, dtype=mt.float64)
    assert_values(z, np.zeros((3, 3)), "float64")
    if name in FLOATS:
        r = mt.rand_like(src)
        assert r.shape == (3, 3) and r.dtype == D(name) and r.device == src.device
        assert ((to_np(r) >= 0) & (to_np(r) <= 1)).all()
        assert mt.randn_like(src).dtype == D(name)


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bfloat16"])
def test_from_numpy_shares_memory(name):
    rng = np.random.default_rng(8)
    a = rand_np(rng, (4, 5), name)
    t = mt.from_numpy(a)
    assert t.device == mt.device("cpu") and t.dtype == D(name) and t.shape == (4, 5)
    assert t.data_ptr() == a.ctypes.data
    assert_values(t, a, name)
    v = scalar_for(rng, name)
    a[1, 2] = v
    assert t[1, 2].item() == a[1, 2].item()
    w = scalar_for(rng, name)
    t[3, 4] = w
    assert a[3, 4] == np.array(w, NP[name])
    assert_values(t, a, name)


def test_from_numpy_strided_and_0d():
    rng = np.random.default_rng(9)
    a = rng.standard_normal((6, 7))
    v = a[1::2, ::3]
    t = mt.from_numpy(v)
    assert t.stride() == np_elem_strides(v)
    assert t.data_ptr() == v.ctypes.data
    assert_values(t, v, "float64")
    s = mt.from_numpy(np.array(3.5, np.float32))
    assert s.shape == () and s.dtype == mt.float32 and s.item() == 3.5


# ============================================================================================
# metadata
# ============================================================================================
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_metadata_basic(name, device):
    rng = np.random.default_rng(10)
    t, a = make(rng, (2, 3, 5), name, device)
    assert t.shape == (2, 3, 5) and isinstance(t.shape, tuple)
    assert t.size() == (2, 3, 5)
    assert [t.size(d) for d in range(-3, 3)] == [2, 3, 5, 2, 3, 5]
    assert t.stride() == (15, 5, 1)
    assert [t.stride(d) for d in range(-3, 3)] == [15, 5, 1, 15, 5, 1]
    assert t.storage_offset() == 0
    assert t.numel() == 30 and t.dim() == 3 and len(t) == 2
    assert t.element_size() == ITEMSIZE[name]
    assert t.nbytes == 30 * ITEMSIZE[name]
    assert t.is_contiguous()
    assert t.is_cuda == (device == "cuda")
    st_ = t.untyped_storage()
    assert st_.nbytes() == 30 * ITEMSIZE[name]
    assert st_.size() == st_.nbytes()
    assert st_.device == t.device
    assert t.data_ptr() == st_.data_ptr()
    v = t[1, 1:, ::2]
    assert v.shape == (2, 3) and v.stride() == (5, 2)
    assert v.storage_offset() == 15 + 5
    assert v.data_ptr() == t.data_ptr() + 20 * ITEMSIZE[name]
    assert v.untyped_storage().data_ptr() == st_.data_ptr()
    assert v.untyped_storage().nbytes() == st_.nbytes()
    assert v.nbytes == 6 * ITEMSIZE[name]
    assert not v.is_contiguous()
    assert_values(v, a[1, 1:, ::2], name)


@pytest.mark.parametrize("device", DEVICES)
def test_metadata_0d_and_empty(device):
    s = mt.tensor(3.0, device=device)
    assert s.shape == () and s.size() == () and s.stride() == () and s.dim() == 0 and s.numel() == 1
    assert s.is_contiguous() and s.nbytes == 4
    with pytest.raises(TypeError):
        len(s)
    e = mt.zeros(2, 0, 3, device=device)
    assert e.numel() == 0 and e.dim() == 3 and len(e) == 2 and e.nbytes == 0
    assert e.stride() == contiguous_strides((2, 0, 3))
    assert e.is_contiguous()
    assert e.untyped_storage().nbytes() == 0
    assert to_np(e).shape == (2, 0, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_T_and_t(device):
    rng = np.random.default_rng(11)
    for shape in [(), (5,), (3, 4), (1, 6)]:
        t, a = make(rng, shape, "int32", device)
        for r in (t.T, t.t()):
            assert_values(r, a.T, "int32")
            assert same_storage(r, t)
    t, a = make(rng, (3, 4), "float32", device)
    assert t.T.stride() == (1, 4) and t.t().stride() == (1, 4)
    assert not t.T.is_contiguous()
    t3 = mt.zeros(2, 3, 4, device=device)
    with pytest.raises(RuntimeError):
        t3.t()


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_strided_metadata_matches_numpy(device, data):
    base, base_a, t, a, name, _ = draw_strided(data, device)
    assert t.shape == a.shape
    assert t.numel() == a.size
    assert t.dim() == a.ndim
    assert t.nbytes == a.size * ITEMSIZE[name]
    assert same_storage(t, base)
    assert t.untyped_storage().nbytes() == base.numel() * ITEMSIZE[name]
    if a.size:
        assert t.stride() == np_elem_strides(a)
        off = np_elem_offset(a, base_a)
        assert t.storage_offset() == off
        assert t.data_ptr() == base.data_ptr() + off * ITEMSIZE[name]
        assert t.data_ptr() == t.untyped_storage().data_ptr() + t.storage_offset() * ITEMSIZE[name]
        assert t.is_contiguous() == ref_is_contiguous(a.shape, np_elem_strides(a))
    assert_values(t, a, name)


# ============================================================================================
# basic indexing
# ============================================================================================
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_basic_indexing_matches_numpy(device, data):
    base, base_a, t, a, name, rng = draw_strided(data, device)
    idx = draw_index(data, a.shape)
    expected = np.asarray(a[idx])
    v = t[idx]
    assert v.shape == expected.shape, f"{idx!r}"
    assert v.dtype == D(name)
    assert_values(v, expected)
    assert same_storage(v, base)
    if expected.size:
        check_strides_where_it_matters(v, np_elem_strides(a[idx]) if isinstance(a[idx], np.ndarray) else ())
    # writing through the view is seen in the base
    if expected.size:
        s = scalar_for(rng, name)
        v[...] = s
        a[idx] = s
        assert_values(t, a)
        assert_values(base, base_a)


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_setitem_scalar_and_tensor_broadcast(device, data):
    base, base_a, t, a, name, rng = draw_strided(data, device)
    idx = draw_index(data, a.shape)
    target_shape = np.asarray(a[idx]).shape
    if data.draw(st.booleans(), label="use tensor value"):
        drop = data.draw(st.integers(0, len(target_shape)))
        vshape = tuple(1 if data.draw(st.booleans()) else n for n in target_shape[drop:])
        vt, va = make(rng, vshape, name, device)
        t[idx] = vt
        a[idx] = va
    else:
        s = scalar_for(rng, name)
        t[idx] = s
        a[idx] = s
    assert_values(t, a)
    assert_values(base, base_a)  # the base changed exactly where the view is


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_setitem_through_views_seen_in_base(name, device):
    rng = np.random.default_rng(12)
    t, a = make(rng, (4, 5), name, device)
    s = scalar_for(rng, name)
    col = t.t()[2]  # a strided view: column 2
    col[1:] = s
    a[1:, 2] = s
    assert_values(t, a, name)
    vt, va = make(rng, (1, 2), name, device)
    blk = t[::2, 1::2]
    blk[...] = vt
    a[::2, 1::2] = va
    assert_values(t, a, name)
    t[-1] = vt[0, 1]  # 0-d tensor value broadcast along a row
    a[-1] = va[0, 1]
    assert_values(t, a, name)


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_casts_value(device):
    rng = np.random.default_rng(13)
    t, a = make(rng, (3, 4), "int32", device)
    t[0] = 2.75  # float scalar into an int tensor: truncated
    a[0] = 2
    t[1, :2] = mt.tensor([-1.9, 7.2], device=device)  # float32 tensor into an int tensor
    a[1, :2] = [-1, 7]
    assert_values(t, a, "int32")
    f, fa = make(rng, (5,), "float16", device)
    f[1:3] = mt.tensor([3, 4], device=device)
    fa[1:3] = [3, 4]
    assert_values(f, fa, "float16")
    b, ba = make(rng, (4,), "bool", device)
    b[:] = mt.tensor([0, 3, 0, -1], device=device)
    assert_values(b, np.array([False, True, False, True]), "bool")


@pytest.mark.parametrize("device", DEVICES)
def test_indexing_errors(device):
    t = mt.zeros(3, 4, device=device)
    for idx in [3, -4, (0, 4), (1, -5), (slice(None), 4), (Ellipsis, 7)]:
        with pytest.raises(IndexError):
            t[idx]
        with pytest.raises(IndexError):
            t[idx] = 1.0
    for idx in [(0, 0, 0), (0, None, 0, 0), (slice(None),) * 3]:
        with pytest.raises(IndexError):
            t[idx]
    with pytest.raises(IndexError):
        t[..., 0, ...]
    s = mt.tensor(1.5, device=device)
    with pytest.raises(IndexError):
        s[0]
    assert s[...].shape == () and s[None].shape == (1,)
    with pytest.raises(ValueError):  # torch: "step must be greater than zero"
        t[::-1]
    with pytest.raises(ValueError):
        t[:, ::0]


# ============================================================================================
# view / reshape
# ============================================================================================
def draw_same_numel_shape(data, numel, allow_infer):
    if numel == 0:
        k = data.draw(st.integers(1, 4))
        shape = [data.draw(st.integers(0, 4)) for _ in range(k)]
        shape[data.draw(st.integers(0, k - 1))] = 0
        return tuple(shape), tuple(shape)
    primes, n, p = [], numel, 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    k = data.draw(st.integers(1, 5))
    dims = [1] * k
    for pr in primes:
        dims[data.draw(st.integers(0, k - 1))] *= pr
    shape = tuple(dims)
    if allow_infer and data.draw(st.booleans()):
        j = data.draw(st.integers(0, k - 1))
        return shape, tuple(-1 if i == j else d for i, d in enumerate(shape))
    return shape, shape


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_view_and_reshape_follow_torch_rules(device, data):
    base, base_a, t, a, name, _ = draw_strided(data, device)
    newshape, arg = draw_same_numel_shape(data, a.size, allow_infer=a.size > 0)
    expected = a.reshape(newshape)
    pred = ref_view_strides(a.shape, np_elem_strides(a) if a.size else t.stride(), newshape)
    as_tuple = data.draw(st.booleans())
    if pred is None:
        with pytest.raises(RuntimeError):
            t.view(arg) if as_tuple else t.view(*arg)
    else:
        v = t.view(arg) if as_tuple else t.view(*arg)
        assert v.shape == newshape
        assert_values(v, expected)
        if a.size:
            assert same_storage(v, base)
            assert v.data_ptr() == t.data_ptr()
            check_strides_where_it_matters(v, pred)
    r = t.reshape(arg) if as_tuple else t.reshape(*arg)
    assert r.shape == newshape
    assert_values(r, expected)
    if a.size:
        if pred is not None:
            assert r.data_ptr() == t.data_ptr(), "reshape must return a view when view is possible"
        else:
            assert r.is_contiguous()
            assert not same_storage(r, base), "reshape of a non-viewable tensor must copy"


@pytest.mark.parametrize("device", DEVICES)
def test_view_errors(device):
    t = mt.zeros(2, 3, 4, device=device)
    with pytest.raises(RuntimeError):
        t.view(5, 5)
    with pytest.raises(RuntimeError):
        t.view(-1, 5)
    with pytest.raises(RuntimeError):
        t.view(-1, -1)
    with pytest.raises(RuntimeError):
        t.reshape(7, -1)
    with pytest.raises(RuntimeError):
        t.permute(2, 0, 1).view(24)
    with pytest.raises(RuntimeError):
        t.transpose(0, 1).view(-1)
    assert t.permute(1, 0, 2).view(3, 2, 2, 2).shape == (3, 2, 2, 2)


# ============================================================================================
# transpose / permute / expand / squeeze / unsqueeze / flatten / narrow
# ============================================================================================
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_transpose_permute(device, data):
    base, base_a, t, a, name, _ = draw_strided(data, device, min_dim=1)
    nd = a.ndim
    d0 = data.draw(st.integers(-nd, nd - 1))
    d1 = data.draw(st.integers(-nd, nd - 1))
    v = t.transpose(d0, d1)
    e = np.swapaxes(a, d0, d1)
    assert_values(v, e, name)
    assert same_storage(v, base)
    if a.size:
        check_strides_where_it_matters(v, np_elem_strides(e))
    perm = data.draw(st.permutations(range(nd)))
    perm = [p - nd if data.draw(st.booleans()) else p for p in perm]
    for p in (t.permute(*perm), t.permute(perm), t.permute(tuple(perm))):
        e = a.transpose([q % nd for q in perm])
        assert_values(p, e, name)
        assert same_storage(p, base)
        if a.size:
            check_strides_where_it_matters(p, np_elem_strides(e))


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_expand(device, data):
    base, base_a, t, a, name, _ = draw_strided(data, device)
    if a.size and data.draw(st.booleans()):  # make some size-1 dims to expand
        sl = tuple(slice(0, 1) if data.draw(st.booleans()) else slice(None) for _ in a.shape)
        t, a = t[sl], a[sl]
    lead = [data.draw(st.integers(0, 3)) for _ in range(data.draw(st.integers(0, 2)))]
    target, arg = list(lead), list(lead)
    for n in a.shape:
        if n == 1:
            m = data.draw(st.integers(0, 4))
            target.append(m)
            arg.append(m)
        else:
            target.append(n)
            arg.append(-1 if data.draw(st.booleans()) else n)
    e = np.broadcast_to(a, target)
    v = t.expand(*arg) if data.draw(st.booleans()) else t.expand(tuple(arg))
    assert_values(v, e, name)
    assert same_storage(v, base)
    if e.size:
        check_strides_where_it_matters(v, np_elem_strides(e))
    # expanding to an incompatible size is an error
    if any(n > 1 for n in a.shape):
        bad = [n + 1 if n > 1 else n for n in a.shape]
        with pytest.raises(RuntimeError):
            t.expand(*bad)


@pytest.mark.parametrize("device", DEVICES)
def test_expand_errors_and_stride0(device):
    t = mt.tensor([[1], [2], [3]], device=device)
    e = t.expand(2, 3, 4)
    assert e.stride() == (0, 1, 0)
    assert not e.is_contiguous()
    assert_values(e, np.broadcast_to(np.array([[1], [2], [3]]), (2, 3, 4)), "int64")
    assert_values(e.contiguous(), np.broadcast_to(np.array([[1], [2], [3]]), (2, 3, 4)), "int64")
    with pytest.raises(RuntimeError):
        t.expand(4)  # fewer sizes than dims
    with pytest.raises(RuntimeError):
        t.expand(2, 4)
    with pytest.raises(RuntimeError):
        t.expand(-1, 3, 4)  # -1 is not allowed for a new leading dim


@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_squeeze_unsqueeze_flatten_narrow(device, data):
    base, base_a, t, a, name, _ = draw_strided(data, device)
    nd = a.ndim
    # squeeze()
    assert_values(t.squeeze(), np.squeeze(a), name)
    assert same_storage(t.squeeze(), base)
    if nd:
        d = data.draw(st.integers(-nd, nd - 1))
        e = np.squeeze(a, axis=d) if a.shape[d] == 1 else a
        assert_values(t.squeeze(d), e, name)
    # unsqueeze
    d = data.draw(st.integers(-nd - 1, nd))
    u = t.unsqueeze(d)
    assert_values(u, np.expand_dims(a, d), name)
    assert same_storage(u, base)
    # flatten(start, end)
    if nd:
        s = data.draw(st.integers(-nd, nd - 1))
        e_ = data.draw(st.integers(-nd, nd - 1))
        if s % nd <= e_ % nd:
            sh = a.shape[:s % nd] + (math.prod(a.shape[s % nd:e_ % nd + 1]),) + a.shape[e_ % nd + 1:]
            assert_values(t.flatten(s, e_), a.reshape(sh), name)
        else:
            with pytest.raises(RuntimeError):
                t.flatten(s, e_)
        assert_values(t.flatten(), a.reshape(-1), name)
        # narrow
        d = data.draw(st.integers(-nd, nd - 1))
        n = a.shape[d]
        start = data.draw(st.integers(-n, n)) if n else 0
        st0 = start + n if start < 0 else start
        length = data.draw(st.integers(0, n - st0))
        nv = t.narrow(d, start, length)
        sl = [slice(None)] * nd
        sl[d % nd] = slice(st0, st0 + length)
        assert_values(nv, a[tuple(sl)], name)
        assert same_storage(nv, base)
        with pytest.raises(RuntimeError):
            t.narrow(d, st0, n - st0 + 1)
    else:
        assert_values(t.flatten(), a.reshape(1), name)


@pytest.mark.parametrize("device", DEVICES)
def test_dim_errors(device):
    t = mt.zeros(2, 3, device=device)
    for fn in [lambda: t.size(2), lambda: t.size(-3), lambda: t.stride(2), lambda: t.stride(-3),
               lambda: t.transpose(0, 2), lambda: t.transpose(-3, 0), lambda: t.squeeze(2),
               lambda: t.unsqueeze(3), lambda: t.unsqueeze(-4), lambda: t.flatten(0, 2),
               lambda: t.narrow(2, 0, 1), lambda: t.permute(0, 2)]:
        with pytest.raises(IndexError):
            fn()
    with pytest.raises(IndexError):
        mt.tensor(1.0, device=device).size(0)
    with pytest.raises(RuntimeError):
        t.permute(0)  # wrong number of dims
    with pytest.raises(RuntimeError):
        t.permute(0, 0)  # repeated dim
    with pytest.raises(RuntimeError):
        t.narrow(1, 2, 2)  # start + length > size
    with pytest.raises(RuntimeError):
        t.view(5)


# ============================================================================================
# contiguous / clone
# ============================================================================================
@pytest.mark.parametrize("device", DEVICES)
@given(data=st.data())
@HYP
def test_contiguous_and_clone(device, data):
    base, base_a, t, a, name, rng = draw_strided(data, device)
    c = t.contiguous()
    assert c.is_contiguous()
    assert_values(c, a, name)
    assert c.device == t.device and c.dtype == t.dtype
    if t.is_contiguous():
        assert c.data_ptr() == t.data_ptr()
    elif a.size:
        check_strides_where_it_matters(c, contiguous_strides(a.shape))
        assert not same_storage(c, base)
    k = t.clone()
    assert_values(k, a, name)
    assert k.device == t.device and k.dtype == t.dtype
    if a.size:
        assert not same_storage(k, base)
        s = scalar_for(rng, name)
        before = to_np(base)
        k[...] = s
        np.testing.assert_array_equal(to_np(base), before)  # the clone is independent
        np.testing.assert_array_equal(to_np(t), a)


# ============================================================================================
# conversions
# ============================================================================================
RTOL = {"float16": 1e-3, "bfloat16": 2 ** -7, "float32": 1e-6, "float64": 1e-12}


def conversion_source(rng, src, dst, shape):
    """Source values (in src's value set) whose conversion to dst is well defined."""
    if src == "bool":
        return rand_np(rng, shape, "bool")
    if src in INTS:
        a = rand_np(rng, shape, src)
        if dst == "float16":
            a = np.clip(a.astype(np.int64), -60000, 60000).astype(NP[src])
        return a
    # floating source
    fmax = {"float16": 60000.0, "bfloat16": 1e30, "float32": 1e30, "float64": 1e30}[src]
    if dst in INTS:
        info = np.iinfo(NP[dst])
        lo, hi = (0.0 if dst == "uint8" else info.min * 0.9), min(info.max * 0.9, fmax)
        lo = max(lo, -fmax)
        v = rng.uniform(lo, hi, size=shape)
        small = rng.uniform(max(lo, -5), 5, size=shape)
        v = np.where(rng.random(shape) < 0.5, small, v)
    else:
        v = rng.standard_normal(shape) * 100
    if dst == "bool":
        v = np.where(rng.random(shape) < 0.3, 0.0, v)
    if src == "bfloat16":
        return bf16_round(v.astype(np.float32))
    return v.astype(NP[src])


def expected_conversion(a, dst):
    with np.errstate(all="ignore"):
        if dst == "bfloat16":
            return bf16_round(np.asarray(a).astype(np.float64).astype(np.float32))
        return np.asarray(a).astype(NP[dst])


def assert_converted(t, a_src, dst):
    exp = expected_conversion(a_src, dst)
    assert t.dtype == D(dst)
    assert tuple(t.shape) == exp.shape
    got = to_np(t)
    if dst in FLOATS:
        np.testing.assert_allclose(got.astype(np.float64), exp.astype(np.float64), rtol=RTOL[dst], atol=0)
    else:
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("src", NAMES)
def test_to_dtype_all_pairs(src, device):
    rng = np.random.default_rng(20 + NAMES.index(src))
    failures = []
    for dst in NAMES:
        a = conversion_source(rng, src, dst, (3, 7))
        t = mt.tensor(a, dtype=D(src), device=device) if src == "bfloat16" else mt.tensor(a, device=device)
        assert t.dtype == D(src)
        views = [(t.to(D(dst)), a), (t.to(dtype=D(dst)), a), (t[:, ::2].to(D(dst)), a[:, ::2]),
                 (t[1].to(D(dst)), a[1]), (t[0, 0].to(D(dst)), a[0, 0])]
        for r, ref in views:
            try:
                assert r.device == t.device
                assert_converted(r, ref, dst)
            except AssertionError as e:
                failures.append(f"{src} -> {dst}: {e}")
                break
    assert not failures, "\n".join(failures)


METHODS = {"float": "float32", "double": "float64", "half": "float16", "bfloat16": "bfloat16", "int": "int32",
           "long": "int64", "short": "int16", "char": "int8", "byte": "uint8", "bool": "bool"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("method", sorted(METHODS))
def test_conversion_methods(method, device):
    rng = np.random.default_rng(30)
    dst = METHODS[method]
    for src in ["float32", "int16", "bool", "float64"]:
        a = conversion_source(rng, src, dst, (5,))
        t = mt.tensor(a, device=device)
        r = getattr(t, method)()
        assert r.device == t.device
        assert_converted(r, a, dst)
        if src == dst:
            assert r is t  # torch: no conversion needed -> self


@pytest.mark.parametrize("src_dev", DEVICES)
@pytest.mark.parametrize("dst_dev", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_to_device(name, src_dev, dst_dev):
    rng = np.random.default_rng(31)
    t, a = make(rng, (3, 5), name, src_dev)
    for r, ref in [(t.to(dst_dev), a), (t.to(mt.device(dst_dev)), a), (t.to(device=dst_dev), a),
                   (t[:, 1::2].to(dst_dev), a[:, 1::2]), (t.T.to(dst_dev), a.T), (t[2, 3].to(dst_dev), a[2, 3])]:
        assert r.device.type == dst_dev
        assert r.dtype == D(name)
        assert_values(r, ref, name)
        if src_dev != dst_dev:
            assert not same_storage(r, t)
    if src_dev == dst_dev:
        assert t.to(dst_dev) is t
    # device and dtype together
    r = t.to(dst_dev, mt.float64)
    assert r.device.type == dst_dev and r.dtype == mt.float64
    np.testing.assert_array_equal(to_np(r), a.astype(np.float64))
    r = t.to(device=dst_dev, dtype=mt.float64)
    assert r.device.type == dst_dev and r.dtype == mt.float64
    np.testing.assert_array_equal(to_np(r), a.astype(np.float64))


@pytest.mark.parametrize("device", DEVICES)
def test_to_returns_self_or_copy(device):
    rng = np.random.default_rng(32)
    t, a = make(rng, (4,), "float32", device)
    assert t.to(mt.float32) is t
    assert t.to(t.device) is t
    c = t.to(mt.float32, copy=True)
    assert c is not t and not same_storage(c, t)
    assert_values(c, a, "float32")
    c2 = t.to(device, copy=True)
    assert c2 is not t and not same_storage(c2, t)
    assert_values(c2, a, "float32")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_cpu_and_cuda_methods(name, device):
    rng = np.random.default_rng(33)
    t, a = make(rng, (2, 3), name, device)
    c = t.cpu()
    assert c.device == mt.device("cpu")
    assert_values(c, a, name)
    g = t.cuda()
    assert g.device == mt.device("cuda:0") and g.is_cuda
    assert_values(g, a, name)
    assert_values(t[:, ::2].cuda(), a[:, ::2], name)
    assert_values(t.T.cpu(), a.T, name)
    if device == "cpu":
        assert c is t
    else:
        assert g is t
        assert t.cuda(0) is t


@pytest.mark.parametrize("name", [n for n in NAMES if n != "bfloat16"])
def test_numpy_cpu_shares_memory(name):
    rng = np.random.default_rng(34)
    t, a = make(rng, (3, 4), name, "cpu")
    n = t.numpy()
    assert n.dtype == np.dtype(NP[name])
    np.testing.assert_array_equal(n, a)
    v = scalar_for(rng, name)
    n[2, 1] = v
    assert t[2, 1].item() == n[2, 1].item()
    tv = t[:, 1::2]
    nv = tv.numpy()
    assert np_elem_strides(nv) == tv.stride()
    np.testing.assert_array_equal(nv, n[:, 1::2])
    arr = np.asarray(t)
    assert arr.dtype == np.dtype(NP[name]) and arr.shape == (3, 4)
    np.testing.assert_array_equal(arr, n)
    np.testing.assert_array_equal(np.array(t[1:]), n[1:])


@pytest.mark.parametrize("device", DEVICES)
def test_numpy_unsupported(device):
    b = mt.ones(3, dtype=mt.bfloat16, device=device)
    with pytest.raises(TypeError):
        b.numpy()
    if device == "cuda":
        t = mt.ones(3, device="cuda")
        with pytest.raises(TypeError):
            t.numpy()
        with pytest.raises(TypeError):
            np.asarray(t)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_tolist_item_and_python_scalars(name, device):
    rng = np.random.default_rng(35)
    ptype = bool if name == "bool" else float if name in FLOATS else int
    for shape in [(), (4,), (2, 3), (2, 0), (1, 2, 1)]:
        t, a = make(rng, shape, name, device)
        lst = t.tolist()
        assert lst == a.tolist()
        flat = lst
        while isinstance(flat, list) and flat:
            flat = flat[0]
        if not isinstance(flat, list):
            assert type(flat) is ptype
    for shape in [(), (1,), (1, 1, 1)]:
        t, a = make(rng, shape, name, device)
        x = a.reshape(()).item()
        it = t.item()
        assert type(it) is ptype and it == x
        assert bool(t) == bool(x)
        assert float(t) == float(x)
        assert int(t) == int(x)  # truncates toward zero for floats
    t, _ = make(rng, (3,), name, device)
    e = mt.empty(0, dtype=D(name), device=device)
    for x in (t, e):
        with pytest.raises(RuntimeError):
            x.item()
        with pytest.raises(RuntimeError):
            bool(x)
        with pytest.raises(ValueError):
            float(x)
        with pytest.raises(ValueError):
            int(x)


@pytest.mark.parametrize("device", DEVICES)
def test_int_of_float_truncates(device):
    assert int(mt.tensor(2.75, device=device)) == 2
    assert int(mt.tensor([-2.75], device=device)) == -2
    assert float(mt.tensor([[7]], device=device)) == 7.0 and type(float(mt.tensor(7, device=device))) is float


@pytest.mark.parametrize("device", DEVICES)
def test_repr(device):
    rng = np.random.default_rng(36)
    t, a = make(rng, (2, 3), "float32", device)
    r = repr(t)
    assert r.startswith("tensor(")
    if device == "cuda":
        assert "device='cuda:0'" in r
    else:
        assert "device=" not in r
    assert "tensor(" in repr(mt.tensor(5, device=device))
    assert "tensor(" in repr(mt.zeros(0, device=device))
    assert "tensor(" in str(mt.ones(2, dtype=mt.bfloat16, device=device))
    assert ("device='cuda:0'" in repr(mt.ones(2, dtype=mt.int8, device=device))) == (device == "cuda")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", [n for n in NAMES if n != "bfloat16"])
def test_tensor_from_numpy_scalar_keeps_dtype(name, device):
    """torch.tensor(np.float64(2.5)) is a 0-d float64 tensor: numpy scalars keep their dtype."""
    rng = np.random.default_rng(14)
    x = rand_np(rng, (), name)[()]
    assert isinstance(x, np.generic)
    t = mt.tensor(x, device=device)
    assert t.shape == () and t.dtype == D(name)
    assert t.item() == x.item()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_copy_between_partly_overlapping_views_is_refused(device):
    """As torch: t[1:] = t[:-1] would depend on the order elements are copied in; the data stays as it was.
    A view copied onto itself, or onto a disjoint part of its storage, is fine."""
    values = np.random.default_rng(5).standard_normal(9).astype(np.float32)
    t = mt.tensor(values, device=device)
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        t[1:] = t[:-1]
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        t[:5].copy_(t[2:7])
    np.testing.assert_array_equal(t.cpu().numpy(), values)
    t[:4] = t[5:]
    t[2:6].copy_(t[2:6])
    expected = values.copy()
    expected[:4] = values[5:]
    np.testing.assert_array_equal(t.cpu().numpy(), expected)
