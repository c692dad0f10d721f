"""index_put_ / index_put and item assignment with tensor indices, on "cpu" and "cuda" (the simulator without a GPU).

Expected values come from numpy on random data (fancy assignment, np.add.at for accumulate), for every dtype,
duplicate indices, bool masks, broadcast and non-contiguous operands, empty problems; errors as torch words them;
and torch itself where installed.
"""
import warnings

import numpy as np
import pytest

import minitensor as mt

from helpers import host, random_values

NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def as_mt(array, name, device):
    return mt.tensor(array, dtype=getattr(mt, name), device=device)


def reference(base, key, vals, accumulate):
    out = base.copy()
    if accumulate:
        np.add.at(out, key, vals)
    else:
        out[key] = vals
    return out


def check(got, expected, name):
    if name in ("float32", "float64"):
        np.testing.assert_allclose(host(got), expected, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(host(got), expected)


def raises_index_error(fn, match):
    """fn() raises IndexError, at the call or (on a GPU) at the next synchronising call."""
    with pytest.raises(IndexError, match=match):
        fn()
        mt.cuda.synchronize()


# ==============================================================================================
# values against numpy
# ==============================================================================================
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("accumulate", [False, True])
def test_two_broadcast_indices_every_dtype(device, name, accumulate):
    """Two index tensors (int64 and int32, with negatives) broadcast to (3, 4) over a (5, 6, 3) tensor; with
    accumulate the indices repeat, so duplicates must all be summed (integers exactly, wrapping)."""
    rng = np.random.default_rng(NAMES.index(name) + 10 * accumulate)
    base = random_values(rng, (5, 6, 3), name, quarters=8)
    if accumulate:
        i0, i1 = rng.integers(-5, 5, size=(3, 1)), rng.integers(-6, 6, size=(4,))
        i0[1] = i0[0]  # duplicates for sure
    else:  # distinct positions: which duplicate wins is undefined
        flat = rng.permutation(30)[:12].reshape(3, 4)
        i0, i1 = flat // 6 - 5, flat % 6
    vals = random_values(rng, (3, 4, 3), name, quarters=8)
    t = as_mt(base, name, device)
    out = t.index_put_((mt.tensor(i0, device=device), mt.tensor(i1, dtype=mt.int32, device=device)),
                       as_mt(vals, name, device), accumulate=accumulate)
    assert out is t
    key = np.broadcast_arrays(i0, i1)
    check(t, reference(base, tuple(key), vals, accumulate), name)


@pytest.mark.parametrize("name", ["bool", "uint8", "int8", "int16", "float16", "bfloat16", "int32"])
def test_accumulate_many_duplicates_in_one_word(device, name):
    """Hundreds of updates to 5 adjacent elements: the 1- and 2-byte types share 32-bit words, which the kernel
    updates by compare-and-swap; every update must land exactly once."""
    rng = np.random.default_rng(1)
    base = random_values(rng, (5,), name, quarters=8)
    idx = rng.integers(0, 5, size=700)
    vals = random_values(rng, (700,), name, quarters=8)
    if name in ("float16", "bfloat16"):
        vals = (rng.integers(0, 2, size=700) / 4.0).astype(np.float32)  # sums up to ~40 stay exact
    t = as_mt(base, name, device)
    t.index_put_((mt.tensor(idx, device=device),), as_mt(vals, name, device), accumulate=True)
    check(t, reference(base, (idx,), vals, True), name)


def test_duplicates_without_accumulate_store_one_of_the_values(device):
    t = mt.zeros(4, device=device)
    vals = np.array([1.0, 2.0, 3.0, 4.0, 5.0], np.float32)
    t.index_put_((mt.tensor([2, 2, 0, 2, -2], device=device),), mt.tensor(vals, device=device))
    got = host(t)
    assert got[0] == 3.0 and got[1] == 0.0 and got[3] == 0.0
    assert got[2] in (1.0, 2.0, 4.0, 5.0)


@pytest.mark.parametrize("accumulate", [False, True])
def test_masks_and_mixed_indices(device, accumulate):
    rng = np.random.default_rng(2)
    base = rng.standard_normal((4, 3, 5)).astype(np.float32)
    mask = rng.random((4, 3)) < 0.5
    vals = rng.standard_normal((int(mask.sum()), 5)).astype(np.float32)
    t = mt.tensor(base, device=device)
    t.index_put_((mt.tensor(mask, device=device),), mt.tensor(vals, device=device), accumulate=accumulate)
    check(t, reference(base, np.nonzero(mask), vals, accumulate), "float32")
    # an int index on dim 0 then a 1-d mask on dim 1, and a 0-d value broadcast everywhere
    cols = np.array([True, False, True])
    t = mt.tensor(base, device=device)
    mask_t = mt.tensor(cols, device="cpu")  # a CPU index may index a cuda tensor, as in torch
    with pytest.raises(IndexError, match="shape mismatch: indexing tensors could not be broadcast together "
                                         r"with shapes \[3\], \[2\]"):
        t.index_put_((mt.tensor([3, 0, 3], device=device), mask_t), mt.tensor(1.5, device=device))
    rows = np.array([[3], [3]])
    t.index_put_((mt.tensor(rows, device=device), mask_t), mt.tensor(1.5, device=device), accumulate=accumulate)
    key = np.broadcast_arrays(rows, np.nonzero(cols)[0])
    check(t, reference(base, tuple(key), np.float32(1.5), accumulate), "float32")


def test_uint8_mask_is_deprecated(device):
    t = mt.zeros(4, device=device)
    with pytest.warns(UserWarning, match="indexing with dtype minitensor.uint8 is now deprecated"):
        t.index_put_((mt.tensor([0, 3, 0, 1], dtype=mt.uint8, device=device),), mt.tensor([1.0, 2.0], device=device))
    np.testing.assert_array_equal(host(t), [0, 1, 0, 2])


@pytest.mark.parametrize("name", ["int16", "bfloat16", "float64"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_non_contiguous_operands(device, name, accumulate):
    """self a transposed, stepped view; values transposed and broadcast along a dim; index a stepped view."""
    rng = np.random.default_rng(3)
    big = random_values(rng, (7, 9, 4), name, quarters=8)
    big_t = as_mt(big, name, device)
    view_t = big_t[1::2, ::2].permute(2, 0, 1)  # (4, 3, 5)
    view_np = big[1::2, ::2].transpose(2, 0, 1)
    idx_full = np.array([3, 1, 3, 0, 1, 3] if accumulate else [3, 1, 0, 2, 1, 9])
    idx_np, idx_t = idx_full[::2], mt.tensor(idx_full, device=device)[::2]
    vals_np = random_values(rng, (5, 1, 3), name, quarters=8)  # -> (3, 1, 5) transposed, broadcast to (3, 3, 5)
    vals_t = as_mt(vals_np, name, device).permute(2, 1, 0).expand(3, 3, 5)
    expected = big.copy()
    expected_view = expected[1::2, ::2].transpose(2, 0, 1)
    expected_view[...] = reference(view_np, (idx_np,), np.broadcast_to(vals_np.transpose(2, 1, 0), (3, 3, 5)),
                                   accumulate)
    view_t.index_put_((idx_t,), vals_t, accumulate=accumulate)
    check(big_t, expected, name)


def test_many_column_dims_and_zero_d_cases(device):
    """Five column dims that no two merge (more than the kernel's four), a 0-d index, 0-d values."""
    rng = np.random.default_rng(4)
    base = rng.standard_normal((3, 4, 4, 4, 4, 4)).astype(np.float32)
    t = mt.tensor(base, device=device)
    vals = rng.standard_normal((2, 2, 2, 2, 2)).astype(np.float32)
    cut = (slice(None),) + (slice(None, None, 2),) * 5
    t[cut].index_put_((mt.tensor(1, device=device),), mt.tensor(vals, device=device), accumulate=True)
    expected = base.copy()
    expected[cut][1] += vals
    check(t, expected, "float32")
    s = mt.zeros((), device=device)
    with pytest.raises(IndexError, match=r"too many indices for tensor of dimension 0 \(got 1\)"):
        s.index_put_((mt.tensor(0, device=device),), mt.tensor(1.0, device=device))


def test_empty_problems(device):
    t = mt.ones(3, 0, device=device)
    t.index_put_((mt.tensor([7], device=device),), mt.tensor(2.0, device=device))  # nothing to write: no check
    t = mt.ones(3, device=device)
    t.index_put_((mt.tensor([], dtype=mt.int64, device=device),), mt.tensor([], device=device), accumulate=True)
    t.index_put_((mt.zeros(3, dtype=mt.bool, device=device),), mt.tensor(5.0, device=device))
    np.testing.assert_array_equal(host(t), [1, 1, 1])
    raises_index_error(lambda: mt.zeros(0, device=device).index_put_((mt.tensor([0], device=device),),
                                                                      mt.tensor(1.0, device=device)),
                       "out of bounds for dimension")


def test_index_put_out_of_place(device):
    t = mt.arange(5.0, device=device)
    out = mt.index_put(t, (mt.tensor([0, 0], device=device),), mt.tensor([1.0, 2.0], device=device), True)
    np.testing.assert_array_equal(host(out), [3, 1, 2, 3, 4])
    np.testing.assert_array_equal(host(t), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(host(t.index_put((mt.tensor([4], device=device),), mt.tensor(9.0, device=device))),
                                  [0, 1, 2, 3, 9])


def test_complex_dtypes(device):
    rng = np.random.default_rng(5)
    base = (rng.standard_normal((4, 2)) + 1j * rng.standard_normal((4, 2))).astype(np.complex64)
    vals = (rng.standard_normal((3, 2)) + 1j * rng.standard_normal((3, 2))).astype(np.complex64)
    idx = np.array([1, 3, 1])
    t = mt.tensor(base, device=device)
    t.index_put_((mt.tensor(idx, device=device),), mt.tensor(vals, device=device), accumulate=True)
    np.testing.assert_allclose(t.cpu().numpy(), reference(base, (idx,), vals, True), rtol=1e-6)


# ==============================================================================================
# item assignment with tensor indices
# ==============================================================================================
def test_setitem_with_tensor_indices(device):
    """torch's order: ints, slices, None and ... make a view, then the tensors index it; rows of adjacent
    tensor indices stand where their dims were, those of separated ones first."""
    rng = np.random.default_rng(6)
    base = rng.standard_normal((3, 4, 5)).astype(np.float32)
    t, expected = mt.tensor(base, device=device), base.copy()
    i, j = np.array([2, 0]), np.array([4, 1])
    T = lambda a: mt.tensor(a, device=device)  # noqa: E731
    cases = [
        ((T(i),), (i,), rng.standard_normal((1, 2, 4, 5))),  # a leading size-1 dim of the value is dropped
        ((slice(None), T(i)), (slice(None), i), rng.standard_normal((3, 2, 5))),
        ((T(i), slice(None), T(j)), (i, slice(None), j), rng.standard_normal((2, 4))),
        ((Ellipsis, T(j)), (Ellipsis, j), rng.standard_normal((3, 4, 2))),
        ((T(base[:, :, 0] > 0),), (base[:, :, 0] > 0,), 7.0),
        ((None, T(i)), (None, i), rng.standard_normal((1, 2, 4, 5))),
    ]
    for index_t, index_np, value in cases:
        value_t = value if isinstance(value, float) else T(value.astype(np.float32))
        value_np = value if isinstance(value, float) else np.asarray(value, np.float32)
        t[index_t] = value_t
        expected[index_np] = value_np.reshape(value_np.shape[1:]) if np.ndim(value_np) == 4 else value_np
        check(t, expected, "float32")
    value = rng.standard_normal((4, 2)).astype(np.float32)
    t[1, :, T(j)] = T(value)  # the int selects first: the rows stand after the sliced dim, unlike numpy
    expected[1][:, j] = value
    check(t, expected, "float32")
    t[T(i)] = 3  # a number is stored as t's dtype
    expected[i] = 3
    check(t, expected, "float32")
    with pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes match, got "
                                           "Float for the destination and Long for the source."):
        t[T(i)] = mt.tensor([1, 2], device=device)


# ==============================================================================================
# errors
# ==============================================================================================
def test_out_of_range_indices(device):
    """IndexError with torch's words, negative ones too; nothing outside the tensor is written."""
    base = mt.zeros(12, device=device)
    t = base[2:7]
    for bad in (5, -6):
        raises_index_error(lambda: t.index_put_((mt.tensor([1, bad, 2], device=device),),
                                                mt.tensor([1.0, 2.0, 3.0], device=device), accumulate=True),
                           f"index {bad} is out of bounds for dimension 0 with size 5")
    raises_index_error(lambda: mt.zeros(3, 4, device=device).index_put_(
        (mt.tensor([0, 1], device=device), mt.tensor([1, 4], device=device)), mt.tensor(1.0, device=device)),
        "index 4 is out of bounds for dimension 1 with size 4")
    outside = host(base)
    assert not outside[:2].any() and not outside[7:].any()
    t.index_put_((mt.tensor([0], device=device),), mt.tensor(1.0, device=device))  # the device is still usable
    assert host(base)[2] == 1.0


def test_argument_errors(device):
    t = mt.zeros(3, 4, device=device)
    i = mt.tensor([0, 1], device=device)
    v = mt.tensor(1.0, device=device)
    cases = [
        (TypeError, "argument 'indices' \\(position 1\\) must be tuple of Tensors, not Tensor",
         lambda: t.index_put_(i, v)),
        (TypeError, "expected Tensor as element 1 in argument 0, but got NoneType", lambda: t.index_put_((i, None), v)),
        (TypeError, "argument 'values' \\(position 2\\) must be Tensor, not float", lambda: t.index_put_((i,), 1.0)),
        (TypeError, "argument 'accumulate' must be bool, not int", lambda: t.index_put_((i,), v, accumulate=1)),
        (RuntimeError, "expected at least one index tensor", lambda: t.index_put_((), v)),
        (IndexError, "too many indices for tensor of dimension 2 \\(got 3\\)", lambda: t.index_put_((i, i, i), v)),
        (IndexError, "tensors used as indices must be long, int, byte or bool tensors",
         lambda: t.index_put_((i.float(),), v)),
        (IndexError, "tensors used as indices must be long, int, byte or bool tensors",
         lambda: t.index_put_((i.to(mt.int16),), v)),
        (IndexError, "The shape of the mask \\[3, 5\\] at index 1 does not match the shape of the indexed tensor "
                     "\\[3, 4\\] at index 1", lambda: t.index_put_((mt.ones(3, 5, dtype=mt.bool, device=device),), v)),
        (RuntimeError, "Index put requires the source and destination dtypes match, got Float for the destination "
                       "and Double for the source.", lambda: t.index_put_((i,), v.double())),
        (RuntimeError, "shape mismatch: value tensor of shape \\[3\\] cannot be broadcast to indexing result of "
                       "shape \\[2, 4\\]", lambda: t.index_put_((i,), mt.zeros(3, device=device))),
        (RuntimeError, "shape mismatch: value tensor of shape \\[1, 1\\] cannot be broadcast to indexing result of "
                       "shape \\[2\\]", lambda: t.index_put_((i, i), mt.zeros(1, 1, device=device))),
        (RuntimeError, "more than one element of the written-to tensor refers to a single memory location",
         lambda: mt.zeros(4, device=device).expand(3, 4).index_put_((i,), v)),
        (RuntimeError, "some elements of the input tensor and the written-to tensor refer to a single memory",
         lambda: t.index_put_((i,), t[0])),
    ]
    if device == "cuda":
        cases.append((RuntimeError, "expected device cuda:0 but got device cpu for value tensor",
                      lambda: t.index_put_((i,), mt.zeros(4))))
    before = host(t)
    for error, match, fn in cases:
        with pytest.raises(error, match=match):
            fn()
    np.testing.assert_array_equal(host(t), before)


# ==============================================================================================
# against torch
# ==============================================================================================
def test_against_torch(device):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    for name in NAMES:
        base = random_values(rng, (6, 3, 2), name, quarters=8)
        vals = random_values(rng, (5, 3, 2), name, quarters=8)
        mask = rng.random(3) < 0.6
        vals_mask = random_values(rng, (int(mask.sum()), 2), name, quarters=8)
        torch_dtype = getattr(torch, name)
        for accumulate in (False, True):
            idx = rng.integers(-6, 6, size=5) if accumulate else rng.permutation(6)[:5] - 6 * (rng.random(5) < 0.5)
            expected = torch.tensor(base).to(torch_dtype)
            expected.index_put_((torch.tensor(idx),), torch.tensor(vals).to(torch_dtype), accumulate=accumulate)
            expected[2][torch.tensor(mask)] = torch.tensor(vals_mask).to(torch_dtype)
            t = as_mt(base, name, device)
            t.index_put_((mt.tensor(idx, device=device),), as_mt(vals, name, device), accumulate=accumulate)
            t[2][mt.tensor(mask, device=device)] = as_mt(vals_mask, name, device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = expected.float().numpy() if name == "bfloat16" else expected.numpy()
            check(t, want, name)
