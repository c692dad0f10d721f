"""uint16, uint32, uint64, complex64 and complex128: typing, creation, casts, the ops torch has for them (differential
against numpy, and torch where installed), torch's errors for the rest, views, repr, save/load, CAI and DLPack."""
import io
import json
import re
import struct
import warnings

import numpy as np
import pytest

import minitensor as mt

UINTS = [mt.uint16, mt.uint32, mt.uint64]
COMPLEX = [mt.complex64, mt.complex128]
NEW = UINTS + COMPLEX
ALL = [mt.bool, mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, mt.float16, mt.bfloat16, mt.float32, mt.float64,
       *NEW]
rng = np.random.default_rng(11)


def host(t):
    return t.cpu().numpy() if t.dtype is not mt.bfloat16 else t.float().cpu().numpy()


def complex_values(shape, np_dtype=np.complex64):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np_dtype)


def source_values(dtype, shape):
    """Random values of `dtype` every other dtype can hold exactly (torch leaves casts of out-of-range values
    undefined): 0..99, plus a half for float types, and imaginary parts for complex ones."""
    ints = rng.integers(0, 100, shape)
    if dtype is mt.bool:
        return ints % 2 == 1
    if dtype.is_complex:
        return (ints + 0.5 + 1j * rng.integers(-50, 50, shape)).astype(dtype.np)
    if dtype.is_floating_point:
        return (ints + 0.5).astype(np.float32 if dtype is mt.bfloat16 else dtype.np)
    return ints.astype(dtype.np)


def expected_cast(values, dtype):
    """numpy's cast with torch's rule for complex sources: the real part (bool: either part nonzero)."""
    if values.dtype.kind == "c" and not dtype.is_complex:
        values = values != 0 if dtype is mt.bool else values.real
    if dtype is mt.bfloat16:
        return mt.tensor(values.astype(np.float32), dtype=mt.bfloat16).float().numpy()
    if values.dtype.kind == "f" and dtype in (mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, *UINTS):
        values = np.trunc(values)
    return values.astype(dtype.np if dtype is not mt.bool else np.bool_)


# ---------------------------------------------------------------------------------------------- dtypes
def test_dtype_attributes():
    expected = {mt.uint16: (2, False, False), mt.uint32: (4, False, False), mt.uint64: (8, False, False),
                mt.complex64: (8, True, True), mt.complex128: (16, True, True)}
    for dtype, (itemsize, signed, is_complex) in expected.items():
        assert (dtype.itemsize, dtype.is_signed, dtype.is_complex, dtype.is_floating_point) == (
            itemsize, signed, is_complex, False)
        assert str(dtype) == f"minitensor.{dtype.name}"
    assert mt.cfloat is mt.complex64 and mt.cdouble is mt.complex128
    assert mt.complex64.to_real() is mt.float32 and mt.float64.to_complex() is mt.complex128
    assert mt.zeros(2, dtype=complex).dtype is mt.complex128  # Python's complex, as torch takes it
    assert not mt.float32.is_complex and mt.float32.to_real() is mt.float32
    with pytest.raises(RuntimeError, match="Unknown Complex ScalarType for Int"):
        mt.int32.to_complex()
    names = {mt.uint16: "UInt16", mt.uint32: "UInt32", mt.uint64: "UInt64", mt.complex64: "ComplexFloat",
             mt.complex128: "ComplexDouble"}
    for dtype, name in names.items():
        t = mt.zeros(1, dtype=dtype, device="cuda")
        assert t.type() == f"minitensor.cuda.{name}Tensor"
        assert t.cpu().type(f"torch.cuda.{name}Tensor").dtype is dtype
        assert t.is_complex() == dtype.is_complex == mt.is_complex(t)


def test_promote_types_matches_torch():
    torch = pytest.importorskip("torch")
    for a in ALL:
        for b in ALL:
            try:
                expected = str(torch.promote_types(getattr(torch, a.name), getattr(torch, b.name))).split(".")[1]
            except RuntimeError as e:
                with pytest.raises(RuntimeError, match=str(e)):
                    mt.promote_types(a, b)
                continue
            assert mt.promote_types(a, b).name == expected, (a, b)


def test_promotion_rules():
    assert mt.promote_types(mt.complex64, mt.float64) is mt.complex128
    assert mt.promote_types(mt.int64, mt.complex64) is mt.complex64
    assert mt.promote_types(mt.uint32, mt.float16) is mt.float16
    with pytest.raises(RuntimeError, match="Promotion for uint16, uint32, uint64 types is not supported, attempted "
                                           "to promote UInt16 and Char"):
        mt.promote_types(mt.uint16, mt.int8)
    f64, i64 = mt.zeros(2, dtype=mt.float64), mt.zeros(2, dtype=mt.int64)
    assert mt.result_type(f64, 1j) is mt.complex128 and mt.result_type(i64, 1j) is mt.complex64
    assert mt.result_type(mt.zeros(2), mt.tensor(1j, dtype=mt.complex128)) is mt.complex64  # keeps float32's
    assert mt.result_type(mt.zeros(2, dtype=mt.uint16), 1j) is mt.complex64
    assert mt.result_type(mt.zeros(2, dtype=mt.uint16), 5) is mt.uint16
    assert mt.result_type(mt.zeros(2, dtype=mt.uint16), 1.5) is mt.float32
    with pytest.raises(TypeError, match="complex32"):
        mt.result_type(mt.zeros(2, dtype=mt.float16), 1j)


# ---------------------------------------------------------------------------------------------- creation
def test_tensor_from_python_data(device):
    assert mt.tensor([1, 2j], device=device).dtype is mt.complex64
    assert mt.tensor([1, 2j], device=device).tolist() == [1 + 0j, 2j]
    assert mt.tensor(1.5 - 2j, dtype=mt.complex128, device=device).item() == 1.5 - 2j
    assert mt.tensor([2**64 - 1, -1, 3], dtype=mt.uint64, device=device).tolist() == [2**64 - 1, 2**64 - 1, 3]
    assert mt.tensor([-1], dtype=mt.uint32, device=device).tolist() == [2**32 - 1]  # as torch: -1 wraps
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint16 without overflow"):
        mt.tensor([70000], dtype=mt.uint16, device=device)
    with pytest.raises(TypeError, match="must be real number, not complex"):
        mt.tensor([1, 2j], dtype=mt.float32, device=device)
    with pytest.raises(TypeError, match="'complex' object cannot be interpreted as an integer"):
        mt.tensor([1, 2j], dtype=mt.int64, device=device)


@pytest.mark.parametrize("dtype", NEW, ids=str)
def test_factories_and_fill(device, dtype):
    value = 3 + 2j if dtype.is_complex else 7
    assert host(mt.full((2, 3), value, dtype=dtype, device=device)).tolist() == [[value] * 3] * 2
    assert host(mt.ones(3, dtype=dtype, device=device)).tolist() == [1, 1, 1]
    t = mt.empty(5, 3, dtype=dtype, device=device).t()  # a non-contiguous fill
    t.fill_(value)
    assert host(t).tolist() == [[value] * 5] * 3
    t[1].zero_()
    assert host(t)[1].tolist() == [0] * 5 and host(t)[0].tolist() == [value] * 5
    assert mt.zeros(0, dtype=dtype, device=device).tolist() == []


def test_fill_checks_values_as_torch(device):
    with pytest.raises(RuntimeError, match=r"value cannot be converted to type c10::complex<float> without overflow"):
        mt.zeros(2, dtype=mt.complex64, device=device).fill_(1e39 + 1j)
    assert mt.zeros(1, dtype=mt.complex128, device=device).fill_(1e300j).item() == 1e300j
    with pytest.raises(RuntimeError, match="value cannot be converted to type int64_t without overflow"):
        mt.zeros(2, dtype=mt.int64, device=device).fill_(1 + 1j)
    with pytest.raises(RuntimeError, match="value cannot be converted to type uint16_t without overflow"):
        mt.zeros(2, dtype=mt.uint16, device=device).fill_(70000)
    assert mt.zeros(2, dtype=mt.bool, device=device).fill_(1j).tolist() == [True, True]
    assert mt.zeros(2, device=device).fill_(2 + 0j).tolist() == [2.0, 2.0]
    assert mt.full((1,), 2**64 - 1, dtype=mt.uint64, device=device).item() == 2**64 - 1
    assert mt.full((1,), -1, dtype=mt.uint64, device=device).item() == 2**64 - 1
    assert mt.full((2,), 1j, device=device).dtype is mt.complex64


@pytest.mark.parametrize("dtype", NEW, ids=str)
def test_numpy_round_trip(dtype):
    values = source_values(dtype, (3, 4))
    t = mt.from_numpy(values)
    assert t.dtype is dtype and t.numpy() is not None and np.shares_memory(t.numpy(), values)
    assert mt.tensor(values, device="cuda").cpu().numpy().tolist() == values.tolist()
    assert mt.tensor(values[:, ::2]).tolist() == values[:, ::2].tolist()


# ---------------------------------------------------------------------------------------------- casts
@pytest.mark.parametrize("src", ALL, ids=str)
def test_casts_between_every_dtype_pair(device, src):
    """copy_/to between every pair, a transposed (non-contiguous) source of odd size, against numpy with torch's
    rule for complex sources; and torch itself where installed."""
    values = source_values(src, (5, 3))
    t = mt.tensor(values, dtype=src, device=device).t()
    try:
        torch = __import__("torch")
    except ImportError:
        torch = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for dst in ALL:
            got = host(t.to(dst))
            assert got.tolist() == expected_cast(values.T, dst).tolist(), (src, dst)
            if torch is not None and dst is not mt.bfloat16 and src is not mt.bfloat16:
                reference = torch.from_numpy(np.ascontiguousarray(values.T)).to(getattr(torch, dst.name))
                assert got.tolist() == reference.tolist(), (src, dst)


def test_complex_to_real_warns_as_torch(device):
    with pytest.warns(UserWarning, match="Casting complex values to real discards the imaginary part"):
        mt.tensor([1 + 2j], device=device).float()


def test_broadcast_copy_into_complex_view(device):
    dst = mt.zeros(3, 4, dtype=mt.complex128, device=device)
    dst[:, 1:3].copy_(mt.tensor([1.5, -2.0], dtype=mt.float16, device=device))
    assert host(dst)[:, 1:3].tolist() == [[1.5, -2.0]] * 3 and host(dst)[:, 0].tolist() == [0, 0, 0]


# ---------------------------------------------------------------------------------------------- complex ops
COMPLEX_BINARY = [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
                  ("eq", np.equal), ("ne", np.not_equal), ("logical_and", np.logical_and),
                  ("logical_or", np.logical_or), ("logical_xor", np.logical_xor)]


def assert_close(got, expected, dtype):
    rtol = 1e-5 if dtype in (mt.complex64, mt.float32) else 1e-12
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)
    assert got.dtype == np.asarray(expected).dtype


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
@pytest.mark.parametrize("name, function", COMPLEX_BINARY, ids=[n for n, _ in COMPLEX_BINARY])
def test_complex_binary_ops_match_numpy(device, dtype, name, function):
    a = complex_values((3, 5), dtype.np)
    b = complex_values((5,), dtype.np)
    a[0, :2] = 0  # zeros for the logical ops
    b[1] = 0j
    ta, tb = mt.tensor(a, device=device), mt.tensor(b, device=device)
    op = getattr(mt, name)
    with np.errstate(all="ignore"):
        assert_close(host(op(ta, tb)), function(a, b), dtype)  # broadcast
        assert_close(host(op(ta.t(), tb[:3])), function(a.T, b[:3]), dtype)  # non-contiguous
        if name not in ("logical_and", "logical_or", "logical_xor"):
            number = 2.5 - 1.5j
            assert_close(host(op(ta, number)), function(a, dtype.np.type(number)), dtype)
            assert_close(host(op(ta, 3)), function(a, dtype.np.type(3)), dtype)
            real = rng.standard_normal(5).astype(np.float32)  # a real tensor operand: imaginary part 0
            assert_close(host(op(mt.tensor(real, device=device), ta)), function(real.astype(dtype.np), a), dtype)
            ints = rng.integers(1, 9, 5).astype(np.int32)
            assert_close(host(op(ta, mt.tensor(ints, device=device))), function(a, ints.astype(dtype.np)), dtype)
    assert op(mt.zeros(0, 5, dtype=dtype, device=device), tb).shape == (0, 5)


def test_complex_division_by_zero_and_mixed_precision(device):
    t = mt.tensor([1 + 2j, 0j, 3 - 1j], device=device)
    got = host(t / 0)
    assert np.isinf(got[0].real) and np.isinf(got[0].imag) and np.isnan(got[1].real)
    wide = mt.tensor([0.1 + 0.2j], dtype=mt.complex128, device=device)
    assert (t[:1] + wide).dtype is mt.complex128
    assert (mt.tensor([1.5], dtype=mt.float64, device=device) * t[:1]).dtype is mt.complex128
    assert (mt.tensor([True], device=device) + t[:1]).tolist() == [2 + 2j]


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_complex_unary_ops_and_in_place(device, dtype):
    a = complex_values((4, 3), dtype.np)
    t = mt.tensor(a, device=device).t()
    assert_close(host(-t), -a.T, dtype)
    assert_close(host(t.abs()), np.abs(a.T), dtype)
    assert t.abs().dtype is dtype.to_real()
    assert_close(host(t.conj()), np.conj(a.T), dtype)
    assert_close(host(mt.square(t)), a.T * a.T, dtype)
    assert host(mt.logical_not(mt.tensor([0j, 1j], device=device))).tolist() == [True, False]
    u = mt.tensor(a, device=device)
    u += 1 - 1j
    u *= mt.tensor(a, device=device)
    assert_close(host(u), (a + dtype.np.type(1 - 1j)) * a, dtype)
    assert mt.tensor([3e38 + 3e38j], device=device).abs().tolist() == [float("inf")]  # hypot, as torch


def test_complex_reductions_match_numpy(device):
    a = complex_values((3, 4, 5))
    t = mt.tensor(a, device=device)
    np.testing.assert_allclose(t.sum().item(), a.sum(), rtol=1e-5)
    assert_close(host(t.sum((0, 2))), a.sum((0, 2)), mt.complex64)
    assert_close(host(t.permute(2, 0, 1).mean(1, keepdim=True)), a.transpose(2, 0, 1).mean(1, keepdims=True),
                 mt.complex64)
    assert mt.tensor([1, 2], device=device).sum(dtype=mt.complex64).item() == 3
    assert mt.tensor(1 + 2j, device=device).sum().item() == 1 + 2j
    assert mt.tensor([0j, 1j], device=device).any().item() and not mt.tensor([0j, 1j], device=device).all().item()
    assert mt.equal(t, t) and not mt.equal(t, t + 1)


def test_real_imag_and_views_share_memory(device):
    a = complex_values((3, 4))
    t = mt.tensor(a, device=device)
    assert t.real.tolist() == a.real.tolist() and t.imag.tolist() == a.imag.tolist()
    assert t.t().imag.stride() == (2, 8) and t.imag.storage_offset() == 1
    r = mt.view_as_real(t)
    assert r.shape == (3, 4, 2) and r.stride() == (8, 2, 1) and r.dtype is mt.float32
    assert r.data_ptr() == t.data_ptr() and mt.view_as_complex(r).data_ptr() == t.data_ptr()
    t.imag.fill_(5)  # writes through the view
    t.real[0].add_(1)
    assert host(t)[0].tolist() == (a.real[0] + 1 + 5j).astype(np.complex64).tolist()
    assert host(t)[1].tolist() == (a.real[1] + 5j).astype(np.complex64).tolist()
    assert mt.real(mt.ones(2, device=device)).tolist() == [1, 1]
    assert mt.view_as_complex(mt.zeros(4, 2, dtype=mt.float64, device=device)[::2]).shape == (2,)


@pytest.mark.parametrize("make, message", [
    (lambda d: mt.view_as_real(mt.zeros(3, device=d)), "view_as_real is only supported for complex tensors"),
    (lambda d: mt.view_as_complex(mt.zeros(3, device=d)), "Tensor must have a last dimension of size 2"),
    (lambda d: mt.view_as_complex(mt.zeros(3, 2, dtype=mt.int32, device=d)),
     "view_as_complex is only supported for half, float and double tensors, but got a tensor of scalar type: Int"),
    (lambda d: mt.view_as_complex(mt.zeros(2, 3, device=d)[:, :2]),
     "Tensor must have a stride divisible by 2 for all but last dimension"),
    (lambda d: mt.view_as_complex(mt.zeros(5, device=d)[1:].view(2, 2)), "Tensor must have a storage_offset"),
    (lambda d: mt.view_as_complex(mt.zeros(2, 2, device=d).t()), "Tensor must have a last dimension with stride 1"),
    (lambda d: mt.zeros(3, device=d).imag, "imag is not implemented for tensors with non-complex dtypes."),
])
def test_view_errors(device, make, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        make(device)


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_complex_where(device, dtype):
    a = complex_values((2, 5), dtype.np)
    real = rng.standard_normal(5).astype(np.float32)
    mask = rng.random((2, 5)) < 0.5
    t, m = mt.tensor(a, device=device), mt.tensor(mask, device=device)
    assert host(mt.where(m, t, 0.5j)).tolist() == np.where(mask, a, dtype.np.type(0.5j)).tolist()
    got = mt.where(m[:, :1], mt.tensor(real, device=device), t.t().t())
    assert got.dtype is dtype and host(got).tolist() == np.where(mask[:, :1], real.astype(dtype.np), a).tolist()
    assert mt.where(m, t, t.to(mt.complex128)).dtype is mt.complex128


@pytest.mark.parametrize("dtype", COMPLEX, ids=str)
def test_complex_indexing(device, dtype):
    a = complex_values((3, 4), dtype.np)
    t = mt.tensor(a, device=device)
    index = rng.integers(0, 3, (2, 4))
    got = t.gather(0, mt.tensor(index, device=device))
    assert host(got).tolist() == np.take_along_axis(a, index, 0).tolist()
    assert host(t.t().index_select(-1, mt.tensor([2, 0], device=device))).tolist() == a.T[:, [2, 0]].tolist()
    assert mt.tensor(5j, dtype=dtype, device=device).index_select(0, mt.tensor([0], device=device)).item() == 5j
    t[mt.tensor([0, 2], device=device)] = 1 - 1j
    assert host(t)[[0, 2]].tolist() == [[1 - 1j] * 4] * 2 and host(t)[1].tolist() == a[1].tolist()


# ---------------------------------------------------------------------------------------------- unsigned ops
@pytest.mark.parametrize("dtype", UINTS, ids=str)
def test_unsigned_ops_match_numpy(device, dtype):
    high = np.iinfo(dtype.np).max
    a = rng.integers(0, high, (3, 5), dtype=dtype.np, endpoint=True)
    b = rng.integers(1, 1000, (5,), dtype=dtype.np)
    ta, tb = mt.tensor(a, device=device), mt.tensor(b, device=device)
    for op, function in [("mul", np.multiply), ("bitwise_and", np.bitwise_and), ("bitwise_or", np.bitwise_or),
                         ("bitwise_xor", np.bitwise_xor), ("eq", np.equal), ("ne", np.not_equal)]:
        with np.errstate(all="ignore"):
            assert host(getattr(mt, op)(ta.t(), tb[:3])).tolist() == function(a.T, b[:3]).tolist(), op
            assert host(getattr(mt, op)(ta, 7)).tolist() == function(a, dtype.np.type(7)).tolist(), op
    np.testing.assert_allclose(host(ta / tb), a.astype(np.float32) / b.astype(np.float32), rtol=1e-6)
    assert (ta / tb).dtype is mt.float32 and (ta + 1.5).dtype is mt.float32
    np.testing.assert_allclose(host(ta.sqrt()), np.sqrt(a.astype(np.float32)), rtol=1e-6)
    assert host(ta.floor()).tolist() == a.tolist() and host(ta ** 1).tolist() == a.tolist()
    assert host(ta ** 0).tolist() == np.ones_like(a).tolist()
    assert host(ta == high).tolist() == (a == high).tolist()
    assert host(ta == -1).tolist() == (a == high).tolist()  # -1 wraps to the largest value, as in torch
    assert host(ta * -1).tolist() == (a * dtype.np.type(high)).tolist()
    assert ta.sum().item() == int(a.astype(np.uint64).sum().astype(np.int64)) and ta.sum().dtype is mt.int64
    assert ta.any().item() and mt.equal(ta, ta) and host(ta.all(0)).tolist() == a.all(0).tolist()
    where = mt.where(mt.tensor([True, False, True, False, True], device=device), ta, tb)
    assert host(where).tolist() == np.where([True, False, True, False, True], a, b).tolist()


# ---------------------------------------------------------------------------------------------- torch's errors
def missing(kernel, dtype):
    """torch's NotImplementedError text for a kernel with no instance for `dtype` ({device}: the device type)."""
    return f'"{kernel}" not implemented for \'{dtype}\''


NI, RE = NotImplementedError, RuntimeError
REFUSALS = [  # (dtype, op(lib, x) with lib minitensor or torch, exception type, message)
    (mt.uint32, lambda lib, x: x + x, NI, missing("add_stub", "UInt32")),
    (mt.uint16, lambda lib, x: x - 1, NI, missing("add_stub", "UInt16")),
    (mt.uint64, lambda lib, x: x // x, NI, missing("div_floor_{device}", "UInt64")),
    (mt.uint16, lambda lib, x: x % 3, NI, missing("remainder_{device}", "UInt16")),
    (mt.uint32, lambda lib, x: x ** 2, NI, missing("pow", "UInt32")),
    (mt.uint32, lambda lib, x: x ** x, NI, missing("pow", "UInt32")),
    (mt.uint16, lambda lib, x: x < x, NI, missing("lt_{device}", "UInt16")),
    (mt.uint64, lambda lib, x: lib.maximum(x, x), NI, missing("maximum_{device}", "UInt64")),
    (mt.uint16, lambda lib, x: -x, NI, missing("neg_{device}", "UInt16")),
    (mt.uint32, lambda lib, x: x.abs(), NI, missing("abs_{device}", "UInt32")),
    (mt.uint16, lambda lib, x: ~x, NI, missing("bitwise_not_{device}", "UInt16")),
    (mt.uint16, lambda lib, x: x.logical_not(), NI, missing("logical_not_{device}", "UInt16")),
    (mt.uint16, lambda lib, x: lib.logical_and(x, x), NI, missing("logical_and_{device}", "UInt16")),
    (mt.uint32, lambda lib, x: x.relu(), NI, missing("clamp_min_scalar_{device}", "UInt32")),
    (mt.uint16, lambda lib, x: x.clamp(0, 1), NI, missing("clamp_scalar_{device}", "UInt16")),
    (mt.uint16, lambda lib, x: x.max(), NI, missing("max_all", "UInt16")),
    (mt.uint16, lambda lib, x: x.min(0), NI, missing("min_{device}", "UInt16")),
    (mt.uint16, lambda lib, x: x.sum(dtype=lib.uint16), NI, missing("sum_{device}", "UInt16")),
    (mt.uint16, lambda lib, x: x.uniform_(), NI, missing("check_uniform_bounds", "UInt16")),
    (mt.uint16, lambda lib, x: x.bernoulli_(0.5), NI, missing("bernoulli_scalar_{device}_", "UInt16")),
    (mt.uint64, lambda lib, x: x.random_(), NI, missing("random_kernel_{device}", "UInt64")),
    (mt.uint16, lambda lib, x: x.gather(0, lib.zeros(1, dtype=lib.int64, device=x.device)), NI,
     missing("scatter_gather_tensor_{device}", "UInt16")),
    (mt.uint32, lambda lib, x: x.index_select(0, lib.zeros(1, dtype=lib.int64, device=x.device)), NI,
     missing("index_select", "UInt32")),
    (mt.uint16, lambda lib, x: x + lib.ones(1, dtype=lib.int8), RE,
     "Promotion for uint16, uint32, uint64 types is not supported, attempted to promote UInt16 and Char"),
    (mt.complex64, lambda lib, x: x < x, NI, missing("lt_{device}", "ComplexFloat")),
    (mt.complex128, lambda lib, x: x // 2, NI, missing("div_floor_{device}", "ComplexDouble")),
    (mt.complex64, lambda lib, x: x % x, NI, missing("remainder_{device}", "ComplexFloat")),
    (mt.complex64, lambda lib, x: x & x, NI, missing("bitwise_and_{device}", "ComplexFloat")),
    (mt.complex64, lambda lib, x: x.bitwise_not(), NI, missing("bitwise_not_{device}", "ComplexFloat")),
    (mt.complex64, lambda lib, x: lib.maximum(x, x), RE, "maximum not implemented for complex tensors."),
    (mt.complex64, lambda lib, x: x.clamp(0, 1), NI, "clamp is not supported for complex types"),
    (mt.complex64, lambda lib, x: x.relu(), NI, "clamp is not supported for complex types"),
    (mt.complex128, lambda lib, x: x.floor(), NI, "floor is not supported for complex inputs"),
    (mt.complex64, lambda lib, x: x.ceil(), NI, "ceil is not supported for complex inputs"),
    (mt.complex64, lambda lib, x: x.max(), NI, missing("max_all", "ComplexFloat")),
    (mt.complex64, lambda lib, x: x.max(0), RE, "max(): does not support complex input"),
    (mt.complex64, lambda lib, x: x.random_(0, 3), RE,
     "check_random_bounds handles only integral, floating-point and boolean types"),
    (mt.complex64, lambda lib, x: x.bernoulli_(0.5), NI, missing("bernoulli_scalar_{device}_", "ComplexFloat")),
    (mt.uint32, lambda lib, x: lib.arange(3, dtype=lib.uint32), NI, missing("arange_cpu", "UInt32")),
    (mt.complex64, lambda lib, x: lib.arange(3, dtype=lib.complex64), NI, missing("arange_cpu", "ComplexFloat")),
]


@pytest.mark.parametrize("dtype, op, error, message", REFUSALS, ids=[f"{i}" for i in range(len(REFUSALS))])
def test_ops_torch_lacks_raise_its_error(device, dtype, op, error, message):
    x = mt.ones(3, dtype=dtype, device=device)
    before = host(x).tolist()
    with pytest.raises(error) as info:
        op(mt, x)
    assert str(info.value) == message.format(device=device)
    assert host(x).tolist() == before  # a refused in-place op leaves its tensor as it was


def test_refusals_say_what_torch_says():
    """The same expressions on torch's CPU tensors raise the same exception types and messages."""
    torch = pytest.importorskip("torch")
    for dtype, op, error, message in REFUSALS:
        with pytest.raises(error) as info:
            op(torch, torch.ones(3, dtype=getattr(torch, dtype.name)))
        assert str(info.value).splitlines()[0] == message.format(device="cpu"), message


# ---------------------------------------------------------------------------------------------- repr
def test_repr_like_torch():
    assert repr(mt.tensor([1 + 2j, 3.25 - 1j])) == "tensor([1.0000+2.j, 3.2500-1.j])"
    assert repr(mt.tensor(1 + 2j)) == "tensor(1.+2.j)"
    assert repr(mt.tensor([1 + 2j], dtype=mt.complex128)) == "tensor([1.+2.j], dtype=minitensor.complex128)"
    assert repr(mt.tensor([5, 2], dtype=mt.uint32)) == "tensor([5, 2], dtype=minitensor.uint32)"
    assert repr(mt.tensor([], dtype=mt.complex64)) == "tensor([], dtype=minitensor.complex64)"
    torch = pytest.importorskip("torch")
    for values in ([1 + 2j, 3.25 - 1j], [float("nan") + 1j, float("inf") - 2j], [1.5 + 2e9j, 3.5 + 1e9j]):
        assert repr(mt.tensor(values)) == repr(torch.tensor(values)).replace("torch.", "minitensor.")


# ---------------------------------------------------------------------------------------------- files
@pytest.mark.parametrize("dtype", NEW, ids=str)
def test_save_load_round_trip(tmp_path, dtype):
    values = source_values(dtype, (2, 3))
    t = mt.tensor(values, device="cuda")
    mt.save({"t": t, "view": t[:, 1:]}, tmp_path / "x.pt")
    loaded = mt.load(tmp_path / "x.pt")
    assert loaded["t"].dtype is dtype and host(loaded["t"]).tolist() == values.tolist()
    assert loaded["view"].untyped_storage().data_ptr() == loaded["t"].untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", NEW, ids=str)
def test_torch_loads_minitensor_files_and_the_reverse(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    values = source_values(dtype, (3, 2))
    mt.save({"t": mt.tensor(values), "v": mt.tensor(values)[1:]}, tmp_path / "mt.pt")
    loaded = torch.load(tmp_path / "mt.pt", weights_only=True)
    assert loaded["t"].dtype == getattr(torch, dtype.name) and loaded["t"].tolist() == values.tolist()
    assert loaded["v"].tolist() == values[1:].tolist()
    torch.save({"t": torch.from_numpy(values), "v": torch.from_numpy(values).t()}, tmp_path / "torch.pt")
    back = mt.load(tmp_path / "torch.pt")
    assert back["t"].dtype is dtype and back["v"].tolist() == values.T.tolist()


def test_safetensors_names_of_the_new_dtypes(tmp_path):
    tensors = {"a": mt.tensor([1, 65535], dtype=mt.uint16), "b": mt.tensor([2**32 - 1], dtype=mt.uint32),
               "c": mt.tensor([2**64 - 1], dtype=mt.uint64), "d": mt.tensor([1 + 2j, -3j], device="cuda")}
    mt.save_safetensors(tensors, tmp_path / "x.safetensors")
    data = (tmp_path / "x.safetensors").read_bytes()
    header = json.loads(data[8:8 + struct.unpack("<Q", data[:8])[0]])
    assert {name: header[name]["dtype"] for name in tensors} == {"a": "U16", "b": "U32", "c": "U64", "d": "C64"}
    loaded = mt.load_safetensors(tmp_path / "x.safetensors")
    assert {k: (v.dtype, v.tolist()) for k, v in loaded.items()} == {
        k: (v.dtype, v.tolist()) for k, v in tensors.items()}
    with pytest.raises(TypeError, match="complex128"):
        mt.save_safetensors({"x": mt.zeros(1, dtype=mt.complex128)}, tmp_path / "y.safetensors")


# ---------------------------------------------------------------------------------------------- interop
@pytest.mark.parametrize("dtype, typestr", [(mt.uint16, "<u2"), (mt.uint32, "<u4"), (mt.uint64, "<u8"),
                                            (mt.complex64, "<c8"), (mt.complex128, "<c16")], ids=str)
def test_cuda_array_interface(dtype, typestr):
    values = source_values(dtype, (3, 4))
    t = mt.tensor(values, device="cuda").t()
    desc = t.__cuda_array_interface__
    assert desc["typestr"] == typestr and desc["strides"] == (dtype.itemsize, 4 * dtype.itemsize)
    holder = type("Foreign", (), {"__cuda_array_interface__": desc})()
    back = mt.as_tensor(holder)
    assert back.dtype is dtype and back.data_ptr() == t.data_ptr() and host(back).tolist() == values.T.tolist()


@pytest.mark.parametrize("dtype", NEW, ids=str)
def test_dlpack_both_ways(dtype):
    values = source_values(dtype, (3, 4))
    t = mt.tensor(values)
    exported = np.from_dlpack(t)  # numpy imports minitensor's CPU capsule
    assert exported.dtype == dtype.np and exported.tolist() == values.tolist()
    assert np.shares_memory(exported, t.numpy())
    imported = mt.from_dlpack(values[:, ::2])
    assert imported.dtype is dtype and imported.tolist() == values[:, ::2].tolist()
    on_device = mt.tensor(values, device="cuda")
    again = mt.from_dlpack(on_device.__dlpack__())
    assert again.dtype is dtype and again.data_ptr() == on_device.data_ptr()
    assert host(again).tolist() == values.tolist()


def test_dlpack_with_torch():
    torch = pytest.importorskip("torch")
    for dtype in NEW:
        values = source_values(dtype, (2, 3))
        theirs = torch.from_dlpack(mt.tensor(values))
        assert theirs.dtype == getattr(torch, dtype.name) and theirs.tolist() == values.tolist()
        ours = mt.from_dlpack(torch.from_numpy(values))
        assert ours.dtype is dtype and ours.tolist() == values.tolist()


def test_pickle_and_bytes_io_of_complex():
    buf = io.BytesIO()
    mt.save(mt.tensor([1j, 2]), buf)
    buf.seek(0)
    assert mt.load(buf).tolist() == [1j, 2]


def test_users_triton_kernels_take_unsigned_tensors_and_float_views_of_complex_ones():
    triton = pytest.importorskip("triton")
    tl = triton.language

    @triton.jit
    def double(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    u = mt.tensor([1, 2, 2**31], dtype=mt.uint32, device="cuda")
    double[(1,)](u, 3, BLOCK=4)
    assert u.tolist() == [2, 4, 0]  # wraps as uint32
    c = mt.tensor([1 + 2j, -3j], device="cuda")
    double[(1,)](mt.view_as_real(c), 4, BLOCK=4)
    assert c.tolist() == [2 + 4j, -6j]
    if mt.cuda.backend() == "sim":
        with pytest.raises(TypeError, match="Triton has no complex type"):
            double[(1,)](c, 4, BLOCK=4)
