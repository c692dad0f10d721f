"""dtypes, torch's type-promotion rules (checked through the dtype and values of `+`) and mt.device.

Expected dtypes come from an independent re-statement of torch's rules (c10 promoteTypes table and
at::native::result_type's "dimensioned > zero-dim > wrapped number" priority with category combining),
expected values from numpy.
"""
import itertools
import re

import numpy as np
import pytest

import minitensor as mt

DEVICES = ["cpu", "cuda"]

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
ITEMSIZE = {"bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
            "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
FLOATS = {"float16", "bfloat16", "float32", "float64"}
INTS = {"uint8", "int8", "int16", "int32", "int64"}
NP = {"bool": np.bool_, "uint8": np.uint8, "int8": np.int8, "int16": np.int16, "int32": np.int32,
      "int64": np.int64, "float16": np.float16, "float32": np.float32, "float64": np.float64}


def D(name):
    return getattr(mt, name)


def name_of(dt):
    for n in NAMES:
        if D(n) == dt:
            return n
    raise AssertionError(f"unknown dtype {dt!r}")


# --------------------------------------------------------------------------------------------
# reference rules (torch)
# --------------------------------------------------------------------------------------------
def ref_promote(a, b):
    """torch.promote_types for the ten dtypes (c10/core/ScalarType.cpp table)."""
    if a == b:
        return a
    if a == "bool":
        return b
    if b == "bool":
        return a
    fa, fb = a in FLOATS, b in FLOATS
    if fa and fb:
        if {a, b} == {"float16", "bfloat16"}:
            return "float32"
        return a if ITEMSIZE[a] > ITEMSIZE[b] else b
    if fa:
        return a
    if fb:
        return b
    if {a, b} == {"uint8", "int8"}:
        return "int16"
    return a if ITEMSIZE[a] > ITEMSIZE[b] else b


def _combine(higher, lower):
    """at::native::combine_categories (no complex types here)."""
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher in FLOATS:
        return higher
    if higher == "bool" or lower in FLOATS:
        return ref_promote(higher, lower)
    return higher


def _scalar_dtype(v):
    # wrapped numbers: bool -> bool, int -> int64, float -> the default dtype (float32)
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int64"
    return "float32"


def ref_result_type(*ops):
    """ops: ("dim", name) | ("zero", name) | ("scalar", value)."""
    state = {"dim": None, "zero": None, "scalar": None}
    for kind, x in ops:
        dt = _scalar_dtype(x) if kind == "scalar" else x
        state[kind] = dt if state[kind] is None else ref_promote(state[kind], dt)
    return _combine(state["dim"], _combine(state["zero"], state["scalar"]))


def bf16_round(x):
    x = np.asarray(x, dtype=np.float32)
    u = np.ascontiguousarray(x).reshape(-1).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    return r.astype(np.uint32).view(np.float32).reshape(np.shape(x))


def cast_np(values, name):
    """values (float64 / int64 / bool numpy) cast to dtype `name`, returned as a comparable numpy array."""
    if name == "bfloat16":
        return bf16_round(np.asarray(values, np.float64).astype(np.float32))
    return np.asarray(values).astype(NP[name])


def to_np(t):
    if t.dtype == mt.bfloat16:
        t = t.float()
    return np.asarray(t.cpu().numpy())


def small_values(rng, name, shape):
    """Random small values exactly representable in every dtype (0..4, or random bools)."""
    if name == "bool":
        return rng.random(shape) < 0.5
    return rng.integers(0, 5, size=shape)


def make(values, name, device):
    """A minitensor of dtype `name` holding `values` (small ints / bools).

    0-d tensors are made by indexing a 1-element tensor, so promotion is checked even where
    `mt.tensor(<0-d data>)` is broken (test_tensor_views.py checks that factory)."""
    if np.ndim(values) == 0:
        return make(np.reshape(values, (1,)), name, device)[0]
    if name == "bfloat16":
        return mt.tensor(np.asarray(values, np.float32), device=device).to(mt.bfloat16)
    return mt.tensor(np.asarray(values).astype(NP[name]), device=device)


def expected_add(a_vals, b_vals, res):
    """Value of a + b computed exactly then cast to the result dtype `res`."""
    if res == "bool":
        return np.logical_or(np.asarray(a_vals, bool), np.asarray(b_vals, bool))
    if res in FLOATS:
        return cast_np(np.asarray(a_vals, np.float64) + np.asarray(b_vals, np.float64), res)
    return (np.asarray(a_vals).astype(np.int64) + np.asarray(b_vals).astype(np.int64)).astype(NP[res])


def check_add(result, exp_name, exp_vals):
    assert result.dtype == D(exp_name), f"got {result.dtype}, expected minitensor.{exp_name}"
    got = to_np(result)
    exp = np.asarray(exp_vals)
    assert got.shape == exp.shape
    np.testing.assert_array_equal(got, exp.astype(got.dtype))


# --------------------------------------------------------------------------------------------
# dtypes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_dtype_str_repr_itemsize_float(name):
    dt = D(name)
    assert str(dt) == f"minitensor.{name}"
    assert repr(dt) == f"minitensor.{name}"
    assert dt.itemsize == ITEMSIZE[name]
    assert dt.is_floating_point is (name in FLOATS)


def test_str_float32_exact():
    assert str(mt.float32) == "minitensor.float32"


@pytest.mark.parametrize("alias,name", [("half", "float16"), ("float", "float32"), ("double", "float64"),
                                        ("short", "int16"), ("int", "int32"), ("long", "int64")])
def test_dtype_aliases(alias, name):
    assert getattr(mt, alias) == D(name)
    assert getattr(mt, alias) is D(name)
    assert str(getattr(mt, alias)) == f"minitensor.{name}"
    assert hash(getattr(mt, alias)) == hash(D(name))


def test_dtypes_distinct_and_hashable():
    dts = [D(n) for n in NAMES]
    assert len(set(dts)) == len(NAMES)
    for a, b in itertools.combinations(dts, 2):
        assert a != b
    assert {d: n for d, n in zip(dts, NAMES)}[mt.float32] == "float32"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_tensor_dtype_and_element_size(name, device):
    t = mt.zeros(3, dtype=D(name), device=device)
    assert t.dtype == D(name)
    assert t.dtype is D(name)
    assert t.element_size() == ITEMSIZE[name]
    assert t.nbytes == 3 * ITEMSIZE[name]
    assert t.dtype.is_floating_point is (name in FLOATS)


# --------------------------------------------------------------------------------------------
# the reference rules themselves, on the cases torch documents (guards the test's own oracle)
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("ops,expected", [
    ((("dim", "uint8"), ("dim", "int8")), "int16"),
    ((("dim", "float16"), ("dim", "bfloat16")), "float32"),
    ((("dim", "int64"), ("dim", "float16")), "float16"),
    ((("dim", "bool"), ("dim", "uint8")), "uint8"),
    ((("dim", "int32"), ("scalar", 5)), "int32"),
    ((("dim", "float16"), ("scalar", 2.5)), "float16"),
    ((("dim", "int32"), ("scalar", 2.5)), "float32"),
    ((("dim", "int64"), ("scalar", 2.5)), "float32"),
    ((("dim", "bool"), ("scalar", 1)), "int64"),
    ((("dim", "bool"), ("scalar", True)), "bool"),
    ((("dim", "int32"), ("zero", "float64")), "float64"),
    ((("dim", "float32"), ("zero", "float64")), "float32"),
    ((("dim", "int8"), ("zero", "int64")), "int8"),
    ((("dim", "uint8"), ("zero", "int8")), "uint8"),
    ((("zero", "int32"), ("scalar", 2.5)), "float32"),
    ((("zero", "float64"), ("scalar", 2.5)), "float64"),
])
def test_reference_rules_match_torch_docs(ops, expected):
    assert ref_result_type(*ops) == expected


# --------------------------------------------------------------------------------------------
# promotion, observed through `+`
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a,b,expected", [
    ("uint8", "int8", "int16"), ("int8", "uint8", "int16"), ("float16", "bfloat16", "float32"),
    ("bfloat16", "float16", "float32"), ("int64", "float16", "float16"), ("int32", "bfloat16", "bfloat16"),
    ("bool", "int8", "int8"), ("bool", "float64", "float64"), ("uint8", "int16", "int16"),
    ("int8", "int16", "int16"), ("int32", "int64", "int64"), ("float16", "float32", "float32"),
    ("bfloat16", "float64", "float64"), ("uint8", "bool", "uint8"),
])
def test_named_tensor_tensor_promotions(a, b, expected, device):
    rng = np.random.default_rng(1)
    va, vb = small_values(rng, a, (5,)), small_values(rng, b, (5,))
    r = make(va, a, device) + make(vb, b, device)
    check_add(r, expected, expected_add(va, vb, expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a", NAMES)
def test_tensor_tensor_promotion_lattice(a, device):
    rng = np.random.default_rng(NAMES.index(a))
    failures = []
    for b in NAMES:
        va, vb = small_values(rng, a, (3,)), small_values(rng, b, (3,))
        exp = ref_promote(a, b)
        assert exp == ref_promote(b, a)
        x, y = make(va, a, device), make(vb, b, device)
        for r in (x + y, y + x):
            if r.dtype != D(exp):
                failures.append(f"{a} + {b}: got {r.dtype}, expected minitensor.{exp}")
                continue
            got = to_np(r)
            want = expected_add(va, vb, exp)
            if not np.array_equal(got, want.astype(got.dtype)):
                failures.append(f"{a} + {b}: values {got.tolist()} != {want.tolist()}")
    assert not failures, "\n".join(failures)


SCALARS = [True, False, 3, -2, 2.5, -0.5]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a", NAMES)
def test_tensor_scalar_promotion(a, device):
    rng = np.random.default_rng(100 + NAMES.index(a))
    va = small_values(rng, a, (4,))
    x = make(va, a, device)
    failures = []
    for s in SCALARS:
        exp = ref_result_type(("dim", a), ("scalar", s))
        for r in (x + s, s + x):
            if r.dtype != D(exp):
                failures.append(f"{a} tensor + {s!r}: got {r.dtype}, expected minitensor.{exp}")
                continue
            got = to_np(r)
            want = expected_add(va, np.full(va.shape, s), exp)
            if not np.array_equal(got, want.astype(got.dtype)):
                failures.append(f"{a} tensor + {s!r}: values {got.tolist()} != {want.tolist()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a,s,expected", [
    ("int32", 5, "int32"), ("int8", 100, "int8"), ("uint8", 7, "uint8"), ("float16", 2.5, "float16"),
    ("bfloat16", 2.5, "bfloat16"), ("int32", 2.5, "float32"), ("int64", 2.5, "float32"),
    ("uint8", 0.5, "float32"), ("bool", 1, "int64"), ("bool", True, "bool"), ("bool", 1.5, "float32"),
    ("float64", 3, "float64"), ("float16", True, "float16"), ("int16", False, "int16"),
])
def test_named_tensor_scalar_promotions(a, s, expected, device):
    rng = np.random.default_rng(2)
    va = small_values(rng, a, (6,))
    r = make(va, a, device) + s
    check_add(r, expected, expected_add(va, np.full(va.shape, s), expected))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a", NAMES)
def test_dim_tensor_plus_zero_dim_tensor(a, device):
    """0-d tensors rank below dimensioned tensors: they only matter when of a higher category."""
    rng = np.random.default_rng(200 + NAMES.index(a))
    failures = []
    for b in NAMES:
        va, vb = small_values(rng, a, (3,)), small_values(rng, b, ())
        exp = ref_result_type(("dim", a), ("zero", b))
        x, z = make(va, a, device), make(vb, b, device)
        assert z.dim() == 0
        for r in (x + z, z + x):
            if r.dtype != D(exp):
                failures.append(f"{a}[3] + {b}[]: got {r.dtype}, expected minitensor.{exp}")
                continue
            got = to_np(r)
            want = expected_add(va, np.broadcast_to(vb, va.shape), exp)
            if not np.array_equal(got, want.astype(got.dtype)):
                failures.append(f"{a}[3] + {b}[]: values {got.tolist()} != {want.tolist()}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a", NAMES)
def test_zero_dim_tensor_plus_zero_dim_and_scalar(a, device):
    rng = np.random.default_rng(300 + NAMES.index(a))
    va = small_values(rng, a, ())
    x = make(va, a, device)
    failures = []
    for b in NAMES:  # two 0-d tensors: plain promote_types
        vb = small_values(rng, b, ())
        exp = ref_promote(a, b)
        r = x + make(vb, b, device)
        if r.dtype != D(exp):
            failures.append(f"{a}[] + {b}[]: got {r.dtype}, expected minitensor.{exp}")
        elif r.dim() != 0 or not np.array_equal(to_np(r), expected_add(va, vb, exp).astype(to_np(r).dtype)):
            failures.append(f"{a}[] + {b}[]: wrong value/shape {to_np(r)!r}")
    for s in SCALARS:  # a 0-d tensor outranks a Python scalar of the same category
        exp = ref_result_type(("zero", a), ("scalar", s))
        r = x + s
        if r.dtype != D(exp):
            failures.append(f"{a}[] + {s!r}: got {r.dtype}, expected minitensor.{exp}")
        elif not np.array_equal(to_np(r), expected_add(va, s, exp).astype(to_np(r).dtype)):
            failures.append(f"{a}[] + {s!r}: wrong value {to_np(r)!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("device", DEVICES)
def test_zero_dim_named_cases(device):
    i32 = mt.tensor(np.array([1, 2, 3], np.int32), device=device)
    f32 = mt.tensor(np.array([1.5, 2.5], np.float32), device=device)
    i8 = mt.tensor(np.array([1, -2], np.int8), device=device)
    def zero_d(v, dtype=None):  # a 0-d tensor (through indexing, independent of mt.tensor(scalar))
        z = mt.tensor([v], dtype=dtype, device=device)[0]
        assert z.dim() == 0
        return z

    assert (i32 + zero_d(2.0, mt.float64)).dtype == mt.float64
    assert (f32 + zero_d(2.0, mt.float64)).dtype == mt.float32
    assert (i8 + zero_d(1000)).dtype == mt.int8
    assert (zero_d(3, mt.int32) + 2.5).dtype == mt.float32
    assert (zero_d(3, mt.int32) + 2).dtype == mt.int32
    assert (zero_d(True) + True).dtype == mt.bool


@pytest.mark.parametrize("device", DEVICES)
def test_inplace_add_cannot_lower_category(device):
    """torch: `int_tensor += 2.5` raises (result type Float can't be cast to Long); the other way works."""
    t = mt.tensor([1, 2, 3], device=device)
    with pytest.raises(RuntimeError):
        t += 2.5
    np.testing.assert_array_equal(to_np(t), [1, 2, 3])
    f = mt.tensor(np.array([0.5, 1.5], np.float16), device=device)
    f += mt.tensor([1, 2], device=device)
    assert f.dtype == mt.float16
    np.testing.assert_array_equal(to_np(f), np.array([1.5, 3.5], np.float16))
    b = mt.tensor([True, False], device=device)
    with pytest.raises(RuntimeError):
        b += 1


# --------------------------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("s,type_,index", [("cpu", "cpu", None), ("cuda", "cuda", None), ("cuda:0", "cuda", 0),
                                           ("cuda:1", "cuda", 1), ("cuda:13", "cuda", 13)])
def test_device_parse(s, type_, index):
    d = mt.device(s)
    assert d.type == type_
    assert d.index == index
    assert str(d) == s
    assert mt.device(d) == d
    assert str(mt.device(d)) == s


def test_device_type_index_form():
    d = mt.device("cuda", 1)
    assert d.type == "cuda" and d.index == 1 and str(d) == "cuda:1"
    assert d == mt.device("cuda:1")
    d0 = mt.device("cuda", 0)
    assert str(d0) == "cuda:0" and d0.index == 0
    dt = mt.device(("cuda", 2))
    assert dt.type == "cuda" and dt.index == 2 and str(dt) == "cuda:2"
    assert dt == mt.device("cuda:2")


def test_device_eq_hash():
    assert mt.device("cuda:1") == mt.device("cuda:1")
    assert mt.device("cuda:1") != mt.device("cuda:0")
    assert mt.device("cuda") != mt.device("cuda:0")  # torch: an unindexed device is a different device
    assert mt.device("cuda") == mt.device("cuda")
    assert mt.device("cpu") != mt.device("cuda")
    assert hash(mt.device("cuda:1")) == hash(mt.device("cuda", 1))
    assert hash(mt.device("cpu")) == hash(mt.device("cpu"))
    s = {mt.device("cuda:0"), mt.device("cuda", 0), mt.device("cpu"), mt.device("cpu"), mt.device("cuda:1")}
    assert len(s) == 3
    assert {mt.device("cuda:1"): "x"}[mt.device("cuda", 1)] == "x"


@pytest.mark.parametrize("bad", ["cuda0", "cuda:", "cuda:x", "cuda:1:2", "cuda: 1", "cuda:-1", "cpu0", "cuda:0 ",
                                 ":0"])
def test_invalid_device_string_message(bad):
    with pytest.raises(RuntimeError, match="^" + re.escape(f"Invalid device string: '{bad}'") + "$"):
        mt.device(bad)


def test_invalid_device_string_cuda0_exact():
    with pytest.raises(RuntimeError) as ei:
        mt.device("cuda0")
    assert str(ei.value) == "Invalid device string: 'cuda0'"


@pytest.mark.parametrize("bad", ["gpu", "", "CUDA", "cuda1x"])
def test_invalid_device_other(bad):
    with pytest.raises(RuntimeError):
        mt.device(bad)


@pytest.mark.parametrize("bad", ["cuda0", "gpu"])
def test_factory_rejects_invalid_device(bad):
    with pytest.raises(RuntimeError):
        mt.zeros(2, device=bad)


def test_cuda_is_available_and_backend():
    assert mt.cuda.is_available() is True
    assert mt.cuda.backend() in ("nvidia", "sim")
    assert mt.cuda.device_count() >= 1


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", ("cuda",), ("cuda", 0)])
def test_cuda_tensor_device(spec):
    t = mt.ones(2, 3, device=spec if isinstance(spec, str) else mt.device(*spec))
    assert t.is_cuda is True
    assert t.device == mt.device("cuda:0")
    assert t.device.type == "cuda" and t.device.index == 0
    assert str(t.device) == "cuda:0"


@pytest.mark.parametrize("spec", ["cpu", ("cpu",), None])
def test_cpu_tensor_device(spec):
    if spec is None:
        t = mt.ones(2, 3)
    else:
        t = mt.ones(2, 3, device=spec if isinstance(spec, str) else mt.device(*spec))
    assert t.is_cuda is False
    assert t.device == mt.device("cpu")
    assert t.device.type == "cpu" and t.device.index is None
    assert str(t.device) == "cpu"


def test_cuda_device_index_out_of_range():
    n = mt.cuda.device_count()
    with pytest.raises(RuntimeError):
        mt.zeros(2, device=f"cuda:{n}")
    with pytest.raises(RuntimeError):
        mt.zeros(2, device=mt.device("cuda", n + 3))
