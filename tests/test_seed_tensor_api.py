"""Tensor API that torch's test_cuda.py uses: logical_and/or/xor/not, square, get_device, type(name),
empty_strided; compared with numpy on random data (NaN and zeros included: they are what logical ops are about),
every dtype, broadcast and non-contiguous operands, on both devices."""
import numpy as np
import pytest

import minitensor as mt

pytestmark = pytest.mark.usefixtures("clean_cuda_state")

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def _data(shape, dtype, seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(-2, 3, size=shape).astype(np.float64)  # many zeros
    if dtype in ("float16", "bfloat16", "float32", "float64"):
        values = values * rng.random(shape)
        values.flat[::7] = np.nan
    if dtype == "uint8":
        values = np.abs(values)
    host = values.astype(np.float32 if dtype == "bfloat16" else dtype)
    t = mt.tensor(host.astype(np.float32) if dtype == "bfloat16" else host).to(getattr(mt, dtype))
    return host, t


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_logical_binary_matches_numpy(device, name, dtype):
    a_np, a = _data((5, 33), dtype, 1)
    b_np, b = _data((33,), "float32", 2)  # broadcast, and a second dtype
    expected = getattr(np, name)(a_np, b_np)
    a, b = a.to(device), b.to(device)
    for result in (getattr(mt, name)(a, b), getattr(a, name)(b), getattr(mt, name)(a.t().contiguous().t(), b)):
        assert result.dtype is mt.bool and result.device == a.device
        np.testing.assert_array_equal(result.cpu().numpy(), expected)
    np.testing.assert_array_equal(getattr(mt, name)(a, 0).cpu().numpy(), getattr(np, name)(a_np, 0))


@pytest.mark.parametrize("dtype", DTYPES)
def test_logical_not_and_its_in_place_form(device, dtype):
    a_np, a = _data((7, 9), dtype, 3)
    a = a.to(device)
    np.testing.assert_array_equal(mt.logical_not(a).cpu().numpy(), np.logical_not(a_np))
    np.testing.assert_array_equal(a[:, ::2].logical_not().cpu().numpy(), np.logical_not(a_np[:, ::2]))
    a.logical_not_()  # keeps a's dtype: 1 where it was zero
    assert a.dtype is getattr(mt, dtype)
    np.testing.assert_array_equal(a.float().cpu().numpy(), np.logical_not(a_np).astype(np.float32))


def test_logical_out_and_in_place_keep_the_destination_dtype(device):
    a = mt.tensor([0.0, 2.0, 0.0, -1.0], device=device)
    b = mt.tensor([1, 0, 0, 3], device=device)
    out = mt.empty(4, dtype=mt.int32, device=device)
    mt.logical_or(a, b, out=out)
    assert out.tolist() == [1, 1, 0, 1]
    a.logical_xor_(b)
    assert a.dtype is mt.float32 and a.tolist() == [1.0, 1.0, 0.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_square_matches_numpy_with_pows_types(device, dtype):
    a_np, a = _data((4, 17), dtype, 4)
    result = mt.square(a.to(device))
    if dtype == "bool":
        assert result.dtype is mt.int64  # torch: a bool squares to int64
        np.testing.assert_array_equal(result.cpu().numpy(), a_np.astype(np.int64))
        return
    assert result.dtype is getattr(mt, dtype)
    expected = (a_np.astype(np.float64) ** 2).astype(a_np.dtype) if a_np.dtype.kind == "f" else a_np * a_np
    rtol = {"float16": 1e-3, "bfloat16": 1e-2}.get(dtype, 1e-6)
    np.testing.assert_allclose(result.float().cpu().numpy() if dtype == "bfloat16" else result.cpu().numpy(),
                               expected, rtol=rtol)


def test_square_in_place():
    a = mt.tensor([1.5, -2.0, 3.0], device="cuda")
    a.square_()
    assert a.tolist() == [2.25, 4.0, 9.0]


def test_logical_ops_on_empty_tensors(device):
    e = mt.empty(0, 3, device=device)
    assert mt.logical_and(e, e).shape == (0, 3) and mt.logical_not(e).dtype is mt.bool


def test_get_device():
    assert mt.ones(2, device="cuda").get_device() == mt.cuda.current_device()
    assert mt.ones(2).get_device() == -1


def test_type_names_and_conversions():
    t = mt.tensor([1.5, -2.0], device="cuda")
    assert t.type() == "minitensor.cuda.FloatTensor" and t.cpu().type() == "minitensor.FloatTensor"
    as_long = t.type("torch.LongTensor")
    assert as_long.dtype is mt.int64 and as_long.device.type == "cpu" and as_long.tolist() == [1, -2]
    as_double = t.cpu().type("minitensor.cuda.DoubleTensor")
    assert as_double.dtype is mt.float64 and as_double.is_cuda
    assert t.type(mt.int32).dtype is mt.int32
    with pytest.raises(ValueError, match="invalid type: 'torch.cuda.ComplexTensor'"):
        t.type("torch.cuda.ComplexTensor")


def test_empty_strided(device):
    t = mt.empty_strided((2, 3), (1, 2), device=device)
    assert t.shape == (2, 3) and t.stride() == (1, 2) and t.untyped_storage().nbytes() == 6 * 4
    t.copy_(mt.arange(6, dtype=mt.float32).reshape(2, 3))
    assert t.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert mt.empty_strided((3, 0), (1, 1), dtype=mt.int64).untyped_storage().nbytes() == 0
    with pytest.raises(RuntimeError, match="mismatch in length of strides and shape"):
        mt.empty_strided((2, 3), (1,))
    with pytest.raises(RuntimeError, match="Negative strides"):
        mt.empty_strided((2, 3), (-1, 1))
