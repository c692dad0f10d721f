"""Elementwise kernels on the "cuda" device (the simulated backend on a machine without a GPU):
fill_/zero_, copy_ with casts and broadcasting, contiguous/clone/to, and + - * / with torch's
type promotion. Every expected value comes from numpy on random data.
"""
import itertools
import operator
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
import hypothesis.extra.numpy as hnp

import helpers
import minitensor as mt

DEV = "cuda"

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int8", "int16", "int32", "int64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
HALF = ("float16", "bfloat16")
# numpy dtype used to hold reference values (bfloat16 values are kept exact in float32)
NP = {n: np.dtype(n) for n in NAMES if n not in ("bool", "bfloat16")}
NP["bool"] = np.dtype(np.bool_)
NP["bfloat16"] = np.dtype(np.float32)
TORCH_NAME = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int",
              "int64": "Long", "float16": "Half", "bfloat16": "BFloat16", "float32": "Float",
              "float64": "Double"}

SETTINGS = settings(max_examples=25, deadline=None)


def seed_of(*parts):
    """A reproducible seed (Python's str hash is salted per process)."""
    return zlib.crc32(repr(parts).encode())


def D(name):
    return getattr(mt, name)


def is_float(n):
    return n in FLOATS


def category(n):
    return 0 if n == "bool" else (2 if is_float(n) else 1)


# ----------------------------------------------------------------------------------------------
# torch's promotion rules, written out independently of minitensor
# ----------------------------------------------------------------------------------------------
_FRANK = {"float16": 0, "bfloat16": 0, "float32": 1, "float64": 2}
_IRANK = {"uint8": 0, "int8": 0, "int16": 1, "int32": 2, "int64": 3}


def promote(a, b):
    """torch.promote_types."""
    if a is None:
        return b
    if b is None or a == b:
        return a
    if a == "bool":
        return b
    if b == "bool":
        return a
    if is_float(a) and is_float(b):
        if {a, b} == {"float16", "bfloat16"}:
            return "float32"
        return a if _FRANK[a] > _FRANK[b] else b
    if is_float(a):
        return a
    if is_float(b):
        return b
    if {a, b} == {"uint8", "int8"}:
        return "int16"
    return a if _IRANK[a] > _IRANK[b] else b


def _combine(higher, lower):
    if higher is None:
        return lower
    if lower is None:
        return higher
    if is_float(higher):
        return higher
    if higher == "bool" or is_float(lower):
        return promote(higher, lower)
    return higher


def result_type(*operands):
    """operands: ("dim", dtype_name) | ("zero", dtype_name) | ("scalar", python_value)."""
    dim = zero = wrapped = None
    for kind, v in operands:
        if kind == "dim":
            dim = promote(dim, v)
        elif kind == "zero":
            zero = promote(zero, v)
        else:
            n = "bool" if isinstance(v, bool) else ("int64" if isinstance(v, int) else "float32")
            wrapped = promote(wrapped, n)
    return _combine(dim, _combine(zero, wrapped))


def can_cast(frm, to):
    if is_float(frm) and not is_float(to):
        return False
    if frm != "bool" and to == "bool":
        return False
    return True


def op_result(op, rt):
    return "float32" if op == "div" and not is_float(rt) else rt


# ----------------------------------------------------------------------------------------------
# data and reference helpers
# ----------------------------------------------------------------------------------------------
def round_bf16(x):
    """float32 -> nearest bfloat16 (ties to even), returned as float32."""
    u = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return u.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def rand_data(name, shape, rng, kind="any"):
    """Random values of dtype `name` (numpy holder dtype NP[name]).

    Integers stay small enough that products fit int8; half-precision floats sit on a grid of
    quarters that bfloat16 and float16 hold exactly. kind="nonzero" avoids 0, "nonneg" avoids < 0.
    """
    shape = tuple(shape)
    if name == "bool":
        a = rng.random(shape) < 0.5
        if kind == "nonzero":
            a = np.ones(shape, dtype=bool)
        return np.asarray(a, dtype=np.bool_)
    if name == "uint8":
        lo = 1 if kind == "nonzero" else 0
        return np.asarray(rng.integers(lo, 16, size=shape), dtype=np.uint8)
    if name in INTS:
        a = rng.integers(-11, 12, size=shape)
        if kind == "nonneg":
            a = np.abs(a)
        if kind == "nonzero":
            a = np.where(a == 0, 7, a)
        return np.asarray(a, dtype=NP[name])
    if name in HALF:
        a = rng.integers(-255, 256, size=shape) / 4.0
    else:
        a = rng.standard_normal(size=shape) * 8.0
    if kind == "nonneg":
        a = np.abs(a)
    if kind == "nonzero":
        a = np.where(np.abs(a) < 1e-3, 1.25, a)
    return np.asarray(a, dtype=NP[name])


def mk(arr, name, device=DEV):
    """minitensor tensor of dtype `name` on `device` holding the values of numpy `arr`."""
    arr = np.asarray(arr)
    return mt.tensor(arr, dtype=D(name), device=device)


def to_np(t):
    """Values of a minitensor tensor as numpy (bfloat16 read through .float())."""
    if t.dtype == mt.bfloat16:
        t = t.float()
    return np.asarray(t.cpu().numpy())


TOL = {"float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2), "float32": (2e-6, 1e-5),
       "float64": (1e-12, 1e-12)}


def as_result(x, name):
    """numpy value(s) rounded to dtype `name` (bfloat16 kept in float32)."""
    x = np.asarray(x)
    if name == "bfloat16":
        return round_bf16(x.astype(np.float32))
    return x.astype(NP[name])


def check(t, expected, name, device="cuda", tol=None):
    """t is a minitensor tensor of dtype `name` on `device` whose values equal numpy `expected`."""
    expected = np.asarray(expected)
    assert t.dtype == D(name), f"dtype {t.dtype}, expected {D(name)}"
    assert tuple(t.shape) == expected.shape, f"shape {tuple(t.shape)}, expected {expected.shape}"
    assert t.device.type == device
    got = to_np(t)
    assert got.shape == expected.shape
    if is_float(name):
        rtol, atol = TOL[tol or name]
        np.testing.assert_allclose(got.astype(np.float64), expected.astype(np.float64),
                                   rtol=rtol, atol=atol, equal_nan=True)
    else:
        np.testing.assert_array_equal(got.astype(NP[name]), expected.astype(NP[name]))


def compute_dtype(name):
    # torch computes half precision in float32 ("opmath") and rounds the result
    return np.float32 if name in HALF else NP[name]


def reference(op, a, b, rt):
    """numpy reference of `a op b` with result dtype rt (torch promotion already applied).
    a, b: numpy arrays or Python scalars."""
    out = op_result(op, rt)
    if is_float(out):
        cd = compute_dtype(out)
    else:
        cd = np.int64
    x = np.asarray(a).astype(cd) if isinstance(a, np.ndarray) else np.asarray(a, dtype=cd)[()]
    y = np.asarray(b).astype(cd) if isinstance(b, np.ndarray) else np.asarray(b, dtype=cd)[()]
    if out in HALF:
        # torch first casts the inputs to the half dtype, then computes in float32
        if isinstance(a, np.ndarray):
            x = as_result(x, out).astype(np.float32)
        if isinstance(b, np.ndarray):
            y = as_result(y, out).astype(np.float32)
    with np.errstate(all="ignore"):
        if op == "add":
            r = x + y
        elif op == "sub":
            r = x - y
        elif op == "mul":
            r = x * y
        else:
            r = x / y
    if out == "bool":
        return np.asarray(r != 0)
    return as_result(r, out)


PYOP = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv}
IOP = {"add": operator.iadd, "sub": operator.isub, "mul": operator.imul, "div": operator.itruediv}
OPS = ["add", "sub", "mul", "div"]


def sub_with_bool(op, *names):
    return op == "sub" and "bool" in names


def scalar_name(v):
    return "bool" if isinstance(v, bool) else ("int64" if isinstance(v, int) else "float32")


# ----------------------------------------------------------------------------------------------
# strided views built identically in numpy and minitensor
# ----------------------------------------------------------------------------------------------
@st.composite
def recipes(draw, shape):
    """How to carve a view of final shape `shape` out of a larger base: per-dim start and step,
    then a permutation of the dims."""
    nd = len(shape)
    perm = tuple(draw(st.permutations(range(nd)))) if nd else ()
    sliced = [0] * nd
    for j, pj in enumerate(perm):
        sliced[pj] = shape[j]
    starts = [draw(st.integers(0, 2)) for _ in range(nd)]
    steps = [draw(st.integers(1, 3)) for _ in range(nd)]
    return tuple(sliced), starts, steps, perm


def build(recipe, name, rng, kind="any", device=DEV):
    sliced, starts, steps, perm = recipe
    base_shape = tuple(a + s * n for a, s, n in zip(starts, steps, sliced))
    base_np = rand_data(name, base_shape, rng, kind)
    base_mt = mk(base_np, name, device)
    if not sliced:
        return base_np, base_mt, base_np, base_mt
    idx = tuple(slice(a, a + s * n, s) for a, s, n in zip(starts, steps, sliced))
    v_np, v_mt = base_np[idx], base_mt[idx]
    if len(perm) >= 2:
        v_np, v_mt = v_np.transpose(perm), v_mt.permute(*perm)
    return base_np, base_mt, v_np, v_mt


shapes_st = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
dtype_st = st.sampled_from(NAMES)
seed_st = st.integers(0, 2**32 - 1)


# ==============================================================================================
# fill_ / zero_
# ==============================================================================================
FILL_VALUES = {"bool": True, "uint8": 201, "int8": -101, "int16": -30001, "int32": 2**31 - 5,
               "int64": 2**40 + 3, "float16": -2.5, "bfloat16": 0.1, "float32": 1.0 / 3.0,
               "float64": 1.0 / 3.0}


@pytest.mark.parametrize("name", NAMES)
def test_fill_every_dtype(name):
    rng = np.random.default_rng(1)
    t = mk(rand_data(name, (3, 7), rng), name)
    v = FILL_VALUES[name]
    r = t.fill_(v)
    assert r is t
    if is_float(name):
        exp = as_result(np.full((3, 7), v, dtype=np.float64), name)
    else:
        exp = np.full((3, 7), v, dtype=NP[name])
    check(t, exp, name)


@pytest.mark.parametrize("name", NAMES)
def test_zero_every_dtype(name):
    rng = np.random.default_rng(2)
    t = mk(rand_data(name, (5, 3), rng, kind="nonzero"), name)
    r = t.zero_()
    assert r is t
    check(t, np.zeros((5, 3), dtype=NP[name]), name)


@pytest.mark.parametrize("name", NAMES)
def test_fill_noncontiguous_leaves_rest(name):
    rng = np.random.default_rng(3)
    base_np = rand_data(name, (4, 9), rng)
    t = mk(base_np, name)
    v = FILL_VALUES[name]
    t[:, ::2].fill_(v)
    exp = base_np.copy()
    exp[:, ::2] = as_result(v, name) if is_float(name) else v
    check(t, exp, name)
    # transposed and sliced: columns 1..3 of t
    t2 = mk(base_np, name)
    t2.t()[1:4].zero_()
    exp2 = base_np.copy()
    exp2[:, 1:4] = 0
    check(t2, exp2, name)


@pytest.mark.parametrize("name", FLOATS)
def test_fill_nonfinite(name):
    t = mt.zeros(3, 3, dtype=D(name), device=DEV)
    t[0].fill_(float("nan"))
    t[1].fill_(float("-inf"))
    t[2].fill_(float("inf"))
    got = to_np(t)
    assert np.isnan(got[0]).all()
    assert (got[1] == -np.inf).all() and (got[2] == np.inf).all()


def test_fill_float_value_into_int_truncates():
    # torch converts the scalar like a C cast: 2.7 -> 2, -2.7 -> -2
    t = mk(np.arange(6, dtype=np.int32), "int32")
    t.fill_(2.7)
    check(t, np.full(6, 2, np.int32), "int32")
    t.fill_(-2.7)
    check(t, np.full(6, -2, np.int32), "int32")


@pytest.mark.parametrize("name", ["float32", "int64", "bool"])
def test_fill_zero_empty(name):
    t = mt.empty(0, 3, dtype=D(name), device=DEV)
    assert t.fill_(1) is t
    assert t.zero_() is t
    check(t, np.zeros((0, 3), dtype=NP[name]), name)


def test_fill_0d():
    t = mk(np.float64(3.5), "float64")
    t.fill_(-0.125)
    check(t, np.float64(-0.125), "float64")
    assert t.item() == -0.125


def test_fill_with_0d_tensor_value():
    # torch accepts a 0-d tensor as the fill value
    t = mk(np.zeros((2, 5), np.float32), "float32")
    t.fill_(mk(np.float32(4.25), "float32"))
    check(t, np.full((2, 5), 4.25, np.float32), "float32")


@SETTINGS
@given(shape=shapes_st, data=st.data(), name=dtype_st, seed=seed_st)
def test_fill_hypothesis(shape, data, name, seed):
    rng = np.random.default_rng(seed)
    recipe = data.draw(recipes(shape))
    base_np, base_mt, v_np, v_mt = build(recipe, name, rng)
    val = rand_data(name, (), rng).item()
    if name == "bfloat16":
        val = float(val)
    v_mt.fill_(val)
    v_np[...] = val  # writes through into base_np
    check(base_mt, base_np, name)
    check(v_mt, v_np, name)


def test_fill_large_odd():
    n = 300_001
    t = mt.empty(n, dtype=mt.float32, device=DEV)
    t.fill_(-1.75)
    got = to_np(t)
    assert got.shape == (n,)
    assert np.all(got == np.float32(-1.75))
    # a strided fill over a large odd tensor touches exactly every other element
    t.zero_()
    t[1::2].fill_(3.0)
    got = to_np(t)
    exp = np.zeros(n, np.float32)
    exp[1::2] = 3.0
    np.testing.assert_array_equal(got, exp)


# ==============================================================================================
# copy_
# ==============================================================================================
def copy_source(src, dst, shape, rng):
    """Source values (numpy, dtype NP[src]) for which the cast src -> dst is defined and exact
    enough to compare, plus the expected destination values."""
    if src == "bool":
        a = rand_data("bool", shape, rng)
    elif src in INTS:
        a = rand_data(src, shape, rng, kind="nonneg" if dst == "uint8" else "any")
    else:
        half = src in HALF or dst in HALF or not is_float(dst)
        if half:
            a = rng.integers(-255, 256, size=shape) / 4.0  # fractions: truncation toward zero
        else:
            a = rng.standard_normal(size=shape) * 8.0
        a = np.array(a, dtype=np.float64)
        if dst == "uint8":
            a = np.abs(a)
        if dst == "bool":
            a[rng.random(shape) < 0.3] = 0.0
        a = np.asarray(a, dtype=NP[src])
    return a, convert(a, src, dst)


def convert(a, src, dst):
    """numpy reference of casting values `a` of dtype src to dtype dst (as torch does)."""
    a = np.asarray(a)
    if dst == "bool":
        return a != 0
    if dst in INTS:
        return np.trunc(a.astype(np.float64)).astype(NP[dst]) if is_float(src) else a.astype(NP[dst])
    return as_result(a.astype(np.float64), dst)


@pytest.mark.parametrize("src,dst", list(itertools.product(NAMES, NAMES)))
def test_copy_cast_every_pair(src, dst):
    rng = np.random.default_rng(seed_of(src, dst))
    a, exp = copy_source(src, dst, (3, 5), rng)
    s = mk(a, src)
    d = mk(rand_data(dst, (3, 5), rng), dst)
    r = d.copy_(s)
    assert r is d
    check(d, exp, dst)
    check(s, a, src)  # source unchanged


@pytest.mark.parametrize("src_shape", [(7,), (1, 7), (4, 1), (), (1, 1)])
def test_copy_broadcast_source(src_shape):
    rng = np.random.default_rng(5)
    a = rand_data("float32", src_shape, rng)
    d = mk(rand_data("float64", (4, 7), rng), "float64")
    d.copy_(mk(a, "float32"))
    check(d, np.broadcast_to(a.astype(np.float64), (4, 7)), "float64")


def test_copy_broadcast_into_noncontiguous_target():
    rng = np.random.default_rng(6)
    base = rand_data("int32", (5, 8), rng)
    t = mk(base, "int32")
    src = rand_data("int16", (5, 1), rng)
    t.t()[::3].copy_(mk(src, "int16").t())  # target: columns 0, 3, 6 of t (transposed view)
    exp = base.copy()
    exp[:, ::3] = src.astype(np.int32)
    check(t, exp, "int32")


def test_copy_source_larger_than_target_raises():
    d = mt.zeros(3, dtype=mt.float32, device=DEV)
    with pytest.raises(RuntimeError):
        d.copy_(mt.zeros(2, 3, dtype=mt.float32, device=DEV))


@pytest.mark.parametrize("src,dst", [("float32", "float32"), ("float64", "float16"), ("int64", "int8"),
                                     ("bool", "float32"), ("bfloat16", "int32")])
def test_copy_noncontiguous_both(src, dst):
    rng = np.random.default_rng(7)
    a, _ = copy_source(src, dst, (6, 10), rng)
    s = mk(a, src)[1::2, ::3].t()             # shape (4, 3), strided and transposed
    base_d = rand_data(dst, (4, 6), rng)
    d = mk(base_d, dst)
    d[:, 1::2].copy_(s)                        # shape (4, 3)
    exp = base_d.copy()
    exp[:, 1::2] = convert(a[1::2, ::3].T, src, dst)
    check(d, exp, dst)


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4),
       data=st.data(), src=dtype_st, dst=dtype_st, seed=seed_st)
def test_copy_hypothesis(shapes, data, src, dst, seed):
    rng = np.random.default_rng(seed)
    dst_shape = shapes.result_shape
    src_shape = shapes.input_shapes[0]
    d_recipe = data.draw(recipes(dst_shape))
    s_recipe = data.draw(recipes(src_shape))
    base_d_np, base_d_mt, v_d_np, v_d_mt = build(d_recipe, dst, rng)
    # source values chosen so the cast is defined
    s_vals, _ = copy_source(src, dst, src_shape, rng)
    _, _, v_s_np, v_s_mt = build(s_recipe, src, rng)
    v_s_mt.copy_(mk(s_vals, src))
    check(v_s_mt, s_vals, src)
    v_d_mt.copy_(v_s_mt)
    v_d_np[...] = convert(np.broadcast_to(s_vals, dst_shape), src, dst)
    check(base_d_mt, base_d_np, dst)


@pytest.mark.parametrize("src,dst", [("float32", "float32"), ("int64", "float64"), ("float64", "int16"),
                                     ("bool", "uint8"), ("float32", "bfloat16"), ("float16", "float32")])
def test_copy_cpu_to_cuda(src, dst):
    rng = np.random.default_rng(8)
    a, exp = copy_source(src, dst, (5, 3), rng)
    s = mk(a, src, device="cpu")
    assert s.device.type == "cpu"
    d = mk(rand_data(dst, (5, 3), rng), dst)
    d.copy_(s)
    check(d, exp, dst)
    # non-contiguous CPU source into a non-contiguous cuda target
    base = rand_data(dst, (3, 10), rng)
    d2 = mk(base, dst)
    d2[:, ::2].copy_(s.t())
    base[:, ::2] = exp.T
    check(d2, base, dst)


@pytest.mark.parametrize("src,dst", [("float32", "float32"), ("int32", "float64"), ("float64", "int64"),
                                     ("uint8", "bool"), ("bfloat16", "float32"), ("float32", "float16")])
def test_copy_cuda_to_cpu(src, dst):
    rng = np.random.default_rng(9)
    a, exp = copy_source(src, dst, (4, 6), rng)
    s = mk(a, src)
    d = mk(rand_data(dst, (4, 6), rng), dst, device="cpu")
    d.copy_(s)
    check(d, exp, dst, device="cpu")
    # non-contiguous cuda source into a non-contiguous cpu target, with broadcasting
    base = rand_data(dst, (6, 3, 2), rng)
    d2 = mk(base, dst, device="cpu")
    d2[:, 1].copy_(s[::2].t())       # (6, 2) <- (6, 2), both strided
    base[:, 1] = exp[::2].T
    check(d2, base, dst, device="cpu")


def test_copy_cuda_to_cpu_broadcast_noncontiguous():
    rng = np.random.default_rng(10)
    a = rand_data("float32", (1, 5), rng)
    base = rand_data("float64", (4, 2, 5), rng)
    d = mk(base, "float64", device="cpu")
    d[:, 1].copy_(mk(a, "float32"))
    base[:, 1] = np.broadcast_to(a.astype(np.float64), (4, 5))
    check(d, base, "float64", device="cpu")


def test_copy_device_to_device_independent_storage():
    rng = np.random.default_rng(11)
    a = rand_data("float32", (9, 7), rng)
    s = mk(a, "float32")
    d = mt.empty(9, 7, dtype=mt.float32, device=DEV)
    d.copy_(s)
    check(d, a, "float32")
    s.fill_(0.0)
    check(d, a, "float32")  # d owns its own memory


def test_copy_overlapping_self_slices():
    # copy between two overlapping-free halves of one tensor
    rng = np.random.default_rng(12)
    a = rand_data("int64", (10,), rng)
    t = mk(a, "int64")
    t[5:].copy_(t[:5])
    exp = a.copy()
    exp[5:] = a[:5]
    check(t, exp, "int64")


def test_copy_large_odd():
    n = 300_001
    rng = np.random.default_rng(13)
    a = rng.integers(-1000, 1000, size=n).astype(np.int32)
    s = mk(a, "int32")
    d = mt.empty(n, dtype=mt.float32, device=DEV)
    d.copy_(s)
    np.testing.assert_array_equal(to_np(d), a.astype(np.float32))
    h = mt.empty(n, dtype=mt.int64, device="cpu")
    h.copy_(s)
    np.testing.assert_array_equal(h.numpy(), a.astype(np.int64))


# ==============================================================================================
# contiguous / clone / to
# ==============================================================================================
def test_contiguous():
    rng = np.random.default_rng(14)
    a = rand_data("float32", (6, 8), rng)
    t = mk(a, "float32")
    assert t.is_contiguous()
    assert t.contiguous() is t  # torch returns self when already contiguous
    v = t[1::2, ::3].t()
    assert not v.is_contiguous()
    c = v.contiguous()
    assert c.is_contiguous()
    assert c.stride() == (3, 1)
    check(c, a[1::2, ::3].T, "float32")
    t.fill_(0.0)
    check(c, a[1::2, ::3].T, "float32")  # a copy, not a view


@pytest.mark.parametrize("name", NAMES)
def test_clone_every_dtype(name):
    rng = np.random.default_rng(15)
    a = rand_data(name, (3, 4, 5), rng)
    t = mk(a, name)
    c = t.clone()
    assert c.data_ptr() != t.data_ptr()
    check(c, a, name)
    v = t[:, ::2, 1:].permute(2, 0, 1)
    cv = v.clone()
    check(cv, a[:, ::2, 1:].transpose(2, 0, 1), name)
    t.zero_()
    check(c, a, name)


def test_clone_preserves_dense_strides():
    # torch's clone keeps the layout (memory_format=preserve_format) of a dense permuted tensor
    t = mk(np.arange(12, dtype=np.float32).reshape(3, 4), "float32").t()
    c = t.clone()
    assert c.stride() == t.stride() == (1, 4)
    check(c, np.arange(12, dtype=np.float32).reshape(3, 4).T, "float32")


def test_clone_empty_and_0d():
    e = mt.empty(0, 4, dtype=mt.int16, device=DEV).clone()
    check(e, np.zeros((0, 4), np.int16), "int16")
    z = mk(np.float64(-7.5), "float64").clone()
    check(z, np.float64(-7.5), "float64")


@pytest.mark.parametrize("src,dst", [(s, d) for s in NAMES for d in NAMES if s != d][::3])
def test_to_dtype(src, dst):
    rng = np.random.default_rng(16)
    a, exp = copy_source(src, dst, (2, 3, 5), rng)
    t = mk(a, src)
    r = t.to(dtype=D(dst))
    assert r.device.type == "cuda"
    check(r, exp, dst)
    v = t.transpose(0, 2)[::2]
    check(v.to(dtype=D(dst)), exp.transpose(2, 1, 0)[::2], dst)


def test_to_same_dtype_returns_self_unless_copy():
    t = mk(np.arange(5, dtype=np.float32), "float32")
    assert t.to(dtype=mt.float32) is t
    c = t.to(dtype=mt.float32, copy=True)
    assert c is not t and c.data_ptr() != t.data_ptr()
    check(c, np.arange(5, dtype=np.float32), "float32")


def test_to_dtype_positional():
    t = mk(np.array([1.5, -2.5, 3.0], np.float32), "float32")
    check(t.to(mt.float64), np.array([1.5, -2.5, 3.0]), "float64")
    check(t.to(mt.int32), np.array([1, -2, 3], np.int32), "int32")


@pytest.mark.parametrize("meth,name", [("float", "float32"), ("double", "float64"), ("half", "float16"),
                                       ("bfloat16", "bfloat16"), ("int", "int32"), ("long", "int64"),
                                       ("short", "int16"), ("char", "int8"), ("byte", "uint8"),
                                       ("bool", "bool")])
def test_conversion_methods(meth, name):
    rng = np.random.default_rng(17)
    a, exp = copy_source("float32", name, (4, 5), rng)
    check(getattr(mk(a, "float32"), meth)(), exp, name)


def test_to_device_roundtrip():
    rng = np.random.default_rng(18)
    a = rand_data("int16", (3, 7), rng)
    h = mk(a, "int16", device="cpu")
    c = h.to("cuda")
    check(c, a, "int16")
    b = c.to(device="cpu", dtype=mt.float32)
    check(b, a.astype(np.float32), "float32", device="cpu")
    check(h.to(device="cuda", dtype=mt.int64), a.astype(np.int64), "int64")


# ==============================================================================================
# + - * /
# ==============================================================================================
PAIRS = list(itertools.product(NAMES, NAMES))


def _binary_case(op, an, bn, a_shape, b_shape, seed):
    rng = np.random.default_rng(seed)
    a = rand_data(an, a_shape, rng)
    b = rand_data(bn, b_shape, rng, kind="nonzero" if op == "div" else "any")
    return a, b


class Failures(helpers.Failures):
    """Runs many cases in one test and reports every failing one (each sim kernel launch is costly,
    so cases share a test instead of each getting their own)."""

    limit = 400


def check_every_op(case, *args):
    """Run `case(op, *args)` for each of + - * / and report every failing op."""
    f = Failures()
    for op in OPS:
        f.run(op, case, op, *args)
    f.check()


def expect_raises(exc_type, fn, *args):
    try:
        fn(*args)
    except exc_type:
        return
    raise AssertionError(f"did not raise {exc_type.__name__}")


def _binary_pair_case(op, an, bn):
    a, b = _binary_case(op, an, bn, (2, 5), (2, 5), seed_of(op, an, bn))
    ta, tb = mk(a, an), mk(b, bn)
    if sub_with_bool(op, an, bn):
        expect_raises(RuntimeError, operator.sub, ta, tb)
        return
    rt = result_type(("dim", an), ("dim", bn))
    check(PYOP[op](ta, tb), reference(op, a, b, rt), op_result(op, rt))


@pytest.mark.parametrize("an,bn", PAIRS)
def test_binary_every_dtype_pair(an, bn):
    check_every_op(_binary_pair_case, an, bn)


def _inplace_pair_case(op, an, bn):
    a, b = _binary_case(op, an, bn, (4, 3), (3,), seed_of(op, an, bn, 1))
    ta, tb = mk(a, an), mk(b, bn)
    ptr = ta.data_ptr()
    rt = result_type(("dim", an), ("dim", bn))
    out = op_result(op, rt)
    if sub_with_bool(op, an, bn) or not can_cast(out, an):
        expect_raises(RuntimeError, IOP[op], ta, tb)
        check(ta, a, an)  # unchanged
        return
    r = IOP[op](ta, tb)
    assert r is ta and ta.data_ptr() == ptr
    exp = reference(op, a, b, rt)
    if an == "bool":
        exp_a = np.asarray(exp) != 0
    elif is_float(an):
        exp_a = as_result(np.asarray(exp).astype(np.float64), an)
    else:
        exp_a = np.asarray(exp).astype(np.int64).astype(NP[an])
    check(ta, exp_a, an)


@pytest.mark.parametrize("an,bn", PAIRS)
def test_inplace_every_dtype_pair(an, bn):
    """+= and /= for every pair; -= and *= for a few partners of each target dtype (same kernels)."""
    f = Failures()
    ops = ["add", "div"] + (["sub", "mul"] if bn in (an, "float32", "int32", "bool") else [])
    for op in ops:
        f.run(op, _inplace_pair_case, op, an, bn)
    f.check()


@pytest.mark.parametrize("op", OPS)
def test_inplace_method_forms(op):
    rng = np.random.default_rng(19)
    a = rand_data("float32", (3, 4), rng)
    b = rand_data("float32", (4,), rng, kind="nonzero")
    t = mk(a, "float32")
    r = getattr(t, op + "_")(mk(b, "float32"))
    assert r is t
    check(t, reference(op, a, b, "float32"), "float32")
    # the scalar form
    r = getattr(t, op + "_")(2.5)
    assert r is t
    check(t, reference(op, reference(op, a, b, "float32"), 2.5, "float32"), "float32")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("an,bn", [("int32", "int64"), ("float16", "bfloat16"), ("bool", "int16")])
def test_functional_and_method_forms(op, an, bn):
    rng = np.random.default_rng(20)
    a = rand_data(an, (2, 3), rng)
    b = rand_data(bn, (2, 3), rng, kind="nonzero")
    ta, tb = mk(a, an), mk(b, bn)
    if sub_with_bool(op, an, bn):
        expect_raises(RuntimeError, mt.sub, ta, tb)
        expect_raises(RuntimeError, ta.sub, tb)
        return
    rt = result_type(("dim", an), ("dim", bn))
    exp = reference(op, a, b, rt)
    check(getattr(mt, op)(ta, tb), exp, op_result(op, rt))
    check(getattr(ta, op)(tb), exp, op_result(op, rt))


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("an,bn,on", [("float32", "float32", "float32"), ("int32", "int32", "float64"),
                                      ("int16", "uint8", "int64"), ("float16", "float16", "float32"),
                                      ("float64", "float32", "bfloat16")])
def test_out_argument(op, an, bn, on):
    rng = np.random.default_rng(21)
    a = rand_data(an, (3, 1), rng)
    b = rand_data(bn, (4,), rng, kind="nonzero")
    ta, tb = mk(a, an), mk(b, bn)
    rt = result_type(("dim", an), ("dim", bn))
    res = op_result(op, rt)
    c = mk(rand_data(on, (3, 4), rng), on)
    if not can_cast(res, on):
        with pytest.raises(RuntimeError):
            getattr(mt, op)(ta, tb, out=c)
        return
    r = getattr(mt, op)(ta, tb, out=c)
    assert r is c
    exp = reference(op, a, b, rt)
    # the computation may happen in the result type or in the out dtype: allow the coarser one
    tol = max([n for n in (res, on) if is_float(n)], key=lambda n: TOL[n][0], default=None)
    check(c, as_result(np.asarray(exp).astype(np.float64), on) if is_float(on)
          else np.asarray(exp).astype(NP[on]), on, tol=tol)


def test_out_noncontiguous():
    rng = np.random.default_rng(22)
    a = rand_data("float32", (3, 4), rng)
    b = rand_data("float32", (3, 4), rng)
    base = rand_data("float32", (4, 6), rng)
    c = mk(base, "float32")
    a = a[:, :3]
    b = b[:, :3]
    r = mt.mul(mk(a, "float32"), mk(b, "float32"), out=c[1:, ::2].t())  # out: (3, 3), strided, transposed
    base[1:, ::2] = (a * b).T
    check(c, base, "float32")
    check(r, a * b, "float32")


@pytest.mark.parametrize("an", ["int32", "int64", "uint8", "bool"])
def test_out_int_for_float_result_raises(an):
    ta = mk(np.array([1, 0, 1]), an)
    c = mt.zeros(3, dtype=mt.int64, device=DEV)
    with pytest.raises(RuntimeError):
        mt.div(ta, ta, out=c)


def test_inplace_cast_error_message():
    t = mk(np.array([1, 2, 3], np.int64), "int64")
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        t /= 2
    with pytest.raises(RuntimeError, match="result type Float can't be cast to the desired output type Long"):
        t += 2.5
    b = mk(np.array([True, False]), "bool")
    with pytest.raises(RuntimeError, match="result type Long can't be cast to the desired output type Bool"):
        b += 1
    check(t, np.array([1, 2, 3]), "int64")


def test_inplace_broadcast_to_larger_shape_raises():
    a = mt.zeros(3, dtype=mt.float32, device=DEV)
    b = mt.ones(4, 3, dtype=mt.float32, device=DEV)
    with pytest.raises(RuntimeError):
        a += b


def test_incompatible_shapes_raise():
    a = mt.zeros(3, dtype=mt.float32, device=DEV)
    b = mt.ones(4, dtype=mt.float32, device=DEV)
    with pytest.raises(RuntimeError):
        a + b


def test_mixed_devices_raise():
    a = mt.zeros(3, dtype=mt.float32, device=DEV)
    b = mt.ones(3, dtype=mt.float32, device="cpu")
    with pytest.raises(RuntimeError):
        a + b


@pytest.mark.parametrize("a_shape,b_shape", [((5, 1, 3), (4, 3)), ((16, 1), (1, 16)), ((1,), (7, 1)),
                                             ((2, 1, 1, 3), (1, 5, 1)), ((), (3, 2)), ((0, 3), (3,)),
                                             ((0,), ()), ((3, 0), (1, 1))])
def test_broadcast_shapes(a_shape, b_shape):
    check_every_op(_broadcast_case, a_shape, b_shape)


def _broadcast_case(op, a_shape, b_shape):
    rng = np.random.default_rng(23)
    a = rand_data("float32", a_shape, rng, kind="nonzero")
    b = rand_data("float32", b_shape, rng, kind="nonzero")
    check(PYOP[op](mk(a, "float32"), mk(b, "float32")), reference(op, a, b, "float32"), "float32")
    check(PYOP[op](mk(b, "float32"), mk(a, "float32")), reference(op, b, a, "float32"), "float32")


@pytest.mark.parametrize("op", OPS)
def test_noncontiguous_inputs(op):
    rng = np.random.default_rng(24)
    a = rand_data("float64", (6, 9), rng)
    b = rand_data("int32", (8, 9), rng, kind="nonzero")
    ta, tb = mk(a, "float64"), mk(b, "int32")
    va, vb = ta[::2, 1::2], tb[::2, ::3].t()    # (3, 4) and (3, 4): sliced-with-step and transposed
    na, nb = a[::2, 1::2], b[::2, ::3].T
    check(PYOP[op](va, vb), reference(op, na, nb, "float64"), "float64")
    check(PYOP[op](vb, va), reference(op, nb, na, "float64"), "float64")
    check(PYOP[op](ta.t(), ta.t()), reference(op, a.T, a.T, "float64"), "float64")


@pytest.mark.parametrize("op", OPS)
def test_inplace_noncontiguous_target(op):
    rng = np.random.default_rng(25)
    base = rand_data("float32", (5, 8), rng)
    b = rand_data("float32", (5, 1), rng, kind="nonzero")
    t = mk(base, "float32")
    v = t.t()[1::3]           # (3, 5): columns 1, 4, 7 of t
    IOP[op](v, mk(b, "float32").t())
    exp = base.copy()
    exp[:, 1::3] = reference(op, base[:, 1::3], b, "float32")
    check(t, exp, "float32")


@pytest.mark.parametrize("an,zn", [("int32", "float64"), ("float16", "float64"), ("int8", "int64"),
                                   ("uint8", "int8"), ("bool", "int32"), ("bool", "float16"),
                                   ("int64", "bool"), ("bfloat16", "float32"), ("float32", "float16"),
                                   ("int16", "bfloat16")])
def test_zero_dim_tensor_promotion(an, zn):
    f = Failures()
    for op in ("add", "sub", "div"):
        if not sub_with_bool(op, an, zn):
            f.run(op, _zero_dim_case, op, an, zn)
    f.check()


def _zero_dim_case(op, an, zn):
    rng = np.random.default_rng(26)
    a = rand_data(an, (3, 4), rng, kind="nonzero")
    z = rand_data(zn, (), rng, kind="nonzero")
    ta, tz = mk(a, an), mk(z, zn)
    assert tz.dim() == 0
    rt = result_type(("dim", an), ("zero", zn))
    check(PYOP[op](ta, tz), reference(op, a, z, rt), op_result(op, rt))
    check(PYOP[op](tz, ta), reference(op, z, a, rt), op_result(op, rt))
    # 0-d op 0-d: ordinary promotion, 0-d result
    rt2 = result_type(("zero", an), ("zero", zn))
    a0 = np.asarray(a[1, 2])
    r = PYOP[op](mk(a0, an), tz)
    assert r.dim() == 0
    check(r, reference(op, a0, z, rt2), op_result(op, rt2))


SCALARS = [3, -0.75, True]


def _scalar_case(name, op, scalar):
    rng = np.random.default_rng(seed_of(name, op, scalar))
    a = rand_data(name, (2, 5), rng, kind="nonzero")
    t = mk(a, name)
    if sub_with_bool(op, name, scalar_name(scalar)):
        expect_raises(RuntimeError, operator.sub, t, scalar)
        expect_raises(RuntimeError, operator.sub, scalar, t)
        return
    rt = result_type(("dim", name), ("scalar", scalar))
    out = op_result(op, rt)
    check(PYOP[op](t, scalar), reference(op, a, scalar, rt), out)
    check(PYOP[op](scalar, t), reference(op, scalar, a, rt), out)


@pytest.mark.parametrize("name", NAMES)
def test_scalar_both_orders(name):
    """tensor op scalar and scalar op tensor, for an int, a float and a bool Python scalar."""
    f = Failures()
    for op in OPS:
        for scalar in SCALARS:
            if scalar is True and op in ("mul", "div"):
                continue  # same promotion as add; keeps the launch count down
            f.run(f"{op} {scalar!r}", _scalar_case, name, op, scalar)
    f.check()


def test_scalar_examples_from_brief():
    rng = np.random.default_rng(28)
    a = rand_data("float32", (7,), rng, kind="nonzero")
    t = mk(a, "float32")
    check(2 - t, np.float32(2) - a, "float32")
    check(t - 2, a - np.float32(2), "float32")
    check(2.5 / t, np.float32(2.5) / a, "float32")
    i = mk(np.array([1, 2, 3, 4, -5], np.int64), "int64")
    check(i / 2, np.array([0.5, 1, 1.5, 2, -2.5], np.float32), "float32")        # true division
    check(7 / i, np.float32(7) / np.array([1, 2, 3, 4, -5], np.float32), "float32")
    check(i / i, np.ones(5, np.float32), "float32")
    check(i + 2.5, np.array([3.5, 4.5, 5.5, 6.5, -2.5], np.float32), "float32")   # default dtype
    check(i * 3, np.array([3, 6, 9, 12, -15]), "int64")
    u = mk(np.array([0, 1, 250], np.uint8), "uint8")
    check(u + 10, np.array([10, 11, 4], np.uint8), "uint8")                       # wraps like torch
    b = mk(np.array([True, False, True]), "bool")
    check(b + b, np.array([True, False, True]), "bool")
    check(b * 1, np.array([1, 0, 1]), "int64")
    check(b / b, np.array([1, np.nan, 1], np.float32), "float32")


def test_int64_values_beyond_32_bits():
    rng = np.random.default_rng(29)
    a = rng.integers(-2**50, 2**50, size=(11,), dtype=np.int64)
    b = rng.integers(-2**50, 2**50, size=(11,), dtype=np.int64)
    ta, tb = mk(a, "int64"), mk(b, "int64")
    check(ta + tb, a + b, "int64")
    check(ta - tb, a - b, "int64")
    check(ta + 2**40, a + 2**40, "int64")
    check(mk(a % 2**20, "int64") * mk(b % 2**20, "int64"), (a % 2**20) * (b % 2**20), "int64")


def test_float64_keeps_double_precision():
    rng = np.random.default_rng(30)
    a = 1.0 + rng.standard_normal(13) * 1e-12
    b = rng.standard_normal(13) * 1e-13
    ta, tb = mk(a, "float64"), mk(b, "float64")
    np.testing.assert_array_equal(to_np(ta + tb), a + b)
    np.testing.assert_array_equal(to_np(ta - tb), a - b)
    np.testing.assert_array_equal(to_np(ta * tb), a * b)
    np.testing.assert_allclose(to_np(ta / tb), a / b, rtol=1e-15)
    np.testing.assert_array_equal(to_np(ta + 1e-13), a + 1e-13)


def test_float_division_by_zero():
    a = mk(np.array([1.0, -1.0, 0.0, 2.5], np.float32), "float32")
    z = mt.zeros(4, dtype=mt.float32, device=DEV)
    got = to_np(a / z)
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2]) and got[3] == np.inf
    gi = to_np(mk(np.array([3, -3, 0], np.int32), "int32") / 0)
    assert gi[0] == np.inf and gi[1] == -np.inf and np.isnan(gi[2])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("name", ["float32", "int64", "bool", "float16"])
def test_empty_tensors(op, name):
    a = mt.empty(0, 3, dtype=D(name), device=DEV)
    b = mt.empty(3, dtype=D(name), device=DEV)
    if sub_with_bool(op, name):
        with pytest.raises(RuntimeError):
            a - b
        return
    rt = result_type(("dim", name), ("dim", name))
    out = op_result(op, rt)
    r = PYOP[op](a, b)
    check(r, np.zeros((0, 3), NP[out]), out)
    r = PYOP[op](a, 2)
    assert tuple(r.shape) == (0, 3)
    if can_cast(out, name):
        assert IOP[op](a, b) is a


def test_add_large_odd():
    n = 300_001
    rng = np.random.default_rng(31)
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ta, tb = mk(a, "float32"), mk(b, "float32")
    np.testing.assert_array_equal(to_np(ta + tb), a + b)
    ta += 1.5
    np.testing.assert_array_equal(to_np(ta), a + np.float32(1.5))
    i = mk(np.arange(n, dtype=np.int32), "int32")
    np.testing.assert_array_equal(to_np(i * 2), np.arange(n, dtype=np.int32) * 2)


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=4),
       data=st.data(), op=st.sampled_from(OPS), an=dtype_st, bn=dtype_st, seed=seed_st)
def test_binary_hypothesis(shapes, data, op, an, bn, seed):
    rng = np.random.default_rng(seed)
    sa, sb = shapes.input_shapes
    _, _, a, ta = build(data.draw(recipes(sa)), an, rng)
    _, _, b, tb = build(data.draw(recipes(sb)), bn, rng, kind="nonzero" if op == "div" else "any")
    if sub_with_bool(op, an, bn):
        with pytest.raises(RuntimeError):
            ta - tb
        return
    zero_a, zero_b = len(sa) == 0, len(sb) == 0
    rt = result_type(("zero" if zero_a else "dim", an), ("zero" if zero_b else "dim", bn))
    check(PYOP[op](ta, tb), reference(op, a, b, rt), op_result(op, rt))


@SETTINGS
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=1, min_dims=0, max_dims=3, max_side=4),
       data=st.data(), op=st.sampled_from(OPS), an=dtype_st, bn=dtype_st, seed=seed_st)
def test_inplace_hypothesis(shapes, data, op, an, bn, seed):
    rng = np.random.default_rng(seed)
    (sb,), sa = shapes.input_shapes, shapes.result_shape
    base_np, base_mt, a, ta = build(data.draw(recipes(sa)), an, rng)
    _, _, b, tb = build(data.draw(recipes(sb)), bn, rng, kind="nonzero" if op == "div" else "any")
    rt = result_type(("zero" if len(sa) == 0 else "dim", an), ("zero" if len(sb) == 0 else "dim", bn))
    out = op_result(op, rt)
    if sub_with_bool(op, an, bn) or not can_cast(out, an):
        before = base_np.copy()
        with pytest.raises(RuntimeError):
            IOP[op](ta, tb)
        check(base_mt, before, an)
        return
    IOP[op](ta, tb)
    exp = reference(op, a, b, rt)
    if an == "bool":
        a[...] = np.asarray(exp) != 0
    elif is_float(an):
        a[...] = as_result(np.asarray(exp).astype(np.float64), an)
    else:
        a[...] = np.asarray(exp).astype(np.int64).astype(NP[an])
    check(base_mt, base_np, an)
