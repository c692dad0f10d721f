"""gather, index_select and item assignment from tensors, on "cpu" and "cuda" (the simulator without a GPU).

Expected values come from explicit numpy loops over random data; every dtype, odd and empty shapes, 0-d
tensors, sliced / transposed / broadcast inputs and indices. Out-of-range indices raise IndexError: on the
CPU and the simulator at the call, on a GPU at the latest at the next synchronising call.
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minitensor as mt

from helpers import host, random_values

DEVICES = ["cpu", "cuda"]
NAMES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
HYP = settings(max_examples=25, deadline=None)


def D(name):
    return getattr(mt, name)


def check(t, expected, name, device):
    assert t.dtype == D(name) and t.device.type == device
    assert tuple(t.shape) == np.shape(expected)
    assert t.is_contiguous()
    np.testing.assert_array_equal(host(t), np.asarray(expected))


@st.composite
def layouts(draw, ndim, broadcast=True):
    """How to carve a view of a given rank from a larger base: per dim a start, a step or a broadcast
    (size 1 expanded), then a permutation of the dims."""
    perm = draw(st.permutations(range(ndim))) if ndim else []
    dims = [(draw(st.integers(0, 2)), draw(st.integers(1, 3)), broadcast and draw(st.integers(0, 4)) == 0)
            for _ in range(ndim)]
    return list(perm), dims


def make_view(layout, shape, fill, name, device):
    """(numpy view, minitensor view) of `shape`, built the same way from one base filled by fill(shape)."""
    perm, dims = layout
    stored = [shape[p] for p in perm]  # the view before permuting: its dim j becomes dim perm[j]
    base_shape = [1 if bcast else start + step * n for n, (start, step, bcast) in zip(stored, dims)]
    base = fill(base_shape)
    view_np, view_mt = base, mt.tensor(base, dtype=D(name), device=device)
    if shape:
        cut = tuple(slice(0, 1) if bcast else slice(start, start + step * n, step)
                    for n, (start, step, bcast) in zip(stored, dims))
        view_np, view_mt = np.broadcast_to(view_np[cut], stored), view_mt[cut].expand(*stored)
        inverse = [int(i) for i in np.argsort(perm)]
        view_np, view_mt = view_np.transpose(inverse), view_mt.permute(*inverse)
    return view_np, view_mt


def raises_index_error(fn, match):
    """fn() raises IndexError, at the call or (on a GPU) at the next synchronising call."""
    with pytest.raises(IndexError, match=match):
        fn()
        mt.cuda.synchronize()


# ==============================================================================================
# gather
# ==============================================================================================
def gather_reference(src, dim, idx):
    src = src.reshape(src.shape or (1,))
    out = np.empty(idx.shape, src.dtype)
    for pos in np.ndindex(*idx.shape):
        p = list(pos or (0,))
        p[dim] = idx[pos]
        out[pos] = src[tuple(p)]
    return out


@st.composite
def gather_cases(draw):
    ndim = draw(st.integers(0, 3))
    in_shape = tuple(draw(st.integers(0, 5)) for _ in range(ndim))
    dim = draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1))
    d = dim % max(ndim, 1)
    if ndim == 0:
        index_shape = draw(st.sampled_from([(), (1,), (3,)]))
    else:
        index_shape = tuple((draw(st.integers(0, 6)) if in_shape[d] else 0) if i == d else
                            draw(st.integers(0, in_shape[i])) for i in range(ndim))
    return in_shape, dim, index_shape


@pytest.mark.parametrize("device", DEVICES)
@HYP
@given(case=gather_cases(), name=st.sampled_from(NAMES), data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_gather_matches_numpy(device, case, name, data, seed):
    in_shape, dim, index_shape = case
    rng = np.random.default_rng(seed)
    src_np, src = make_view(data.draw(layouts(len(in_shape))), in_shape, lambda s: random_values(rng, s, name), name,
                            device)
    size = (in_shape or (1,))[dim]
    idx_np, idx = make_view(data.draw(layouts(len(index_shape))), index_shape,
                            lambda s: rng.integers(0, max(size, 1), size=s), "int64", device)
    out = src.gather(dim, idx) if data.draw(st.booleans()) else mt.gather(src, dim, idx)
    check(out, gather_reference(src_np, dim % max(len(in_shape), 1), idx_np), name, device)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_odd_large_and_repeated_calls(device):
    """Many blocks; the memoised fast path (same signature, new data) gives fresh results."""
    rng = np.random.default_rng(7)
    n = 100_003
    for _ in range(2):
        src_np = rng.standard_normal(n).astype(np.float32)
        idx_np = rng.integers(0, n, size=n)
        out = mt.tensor(src_np, device=device).gather(0, mt.tensor(idx_np, device=device))
        check(out, src_np[idx_np], "float32", device)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_rank6_permuted(device):
    """More dims than the kernel takes at once: the plan loops over the leading ones."""
    rng = np.random.default_rng(11)
    base = rng.integers(-1000, 1000, size=(2, 3, 2, 3, 2, 3)).astype(np.int32)
    perm = (5, 3, 1, 0, 2, 4)
    src_np, src = base.transpose(perm), mt.tensor(base, device=device).permute(*perm)
    idx_np = rng.integers(0, 3, size=(3, 3, 2, 2, 1, 2))
    idx = mt.tensor(idx_np, device=device)
    check(src.gather(2, idx), gather_reference(src_np, 2, idx_np), "int32", device)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_0d(device):
    x = mt.tensor(2.5, device=device)
    check(x.gather(0, mt.tensor(0, device=device)), np.float32(2.5), "float32", device)
    check(x.gather(-1, mt.tensor([0, 0, 0], device=device)), np.full(3, 2.5, np.float32), "float32", device)
    row = mt.tensor([4, 5, 6], device=device)
    check(row.gather(0, mt.tensor(2, device=device)), np.int64(6), "int64", device)


@pytest.mark.parametrize("device", DEVICES)
def test_gather_empty_index_skips_checks(device):
    x = mt.ones(3, 4, device=device)
    out = x.gather(1, mt.empty(0, dtype=mt.int32, device=device))  # torch checks nothing for an empty index
    check(out, np.empty(0, np.float32), "float32", device)
    check(x.gather(0, mt.empty(2, 0, dtype=mt.int64, device=device)), np.empty((2, 0), np.float32), "float32",
          device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [3, -1, -4, 2**40])
def test_gather_out_of_range_raises(device, bad):
    x = mt.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device=device)
    idx = mt.tensor([[0, bad], [2, 1]], device=device)
    raises_index_error(lambda: x.gather(1, idx), f"index {bad} is out of bounds for dimension 1 with size 3")
    # the device is still usable and the error is reported once
    check(x.gather(1, mt.tensor([[2], [0]], device=device)), [[3.0], [4.0]], "float32", device)
    mt.cuda.synchronize()


@pytest.mark.parametrize("device", DEVICES)
def test_gather_out_of_range_through_host_copy(device):
    """The error surfaces at the latest when the result is read back (.cpu() synchronises)."""
    x = mt.arange(5, device=device)
    raises_index_error(lambda: x.gather(0, mt.tensor([1, 5, 2], device=device)).cpu(), "index 5 is out of bounds")


@pytest.mark.parametrize("device", DEVICES)
def test_gather_from_empty_dim_raises(device):
    x = mt.empty(0, dtype=mt.float32, device=device)
    raises_index_error(lambda: x.gather(0, mt.tensor([0], device=device)),
                       "index 0 is out of bounds for dimension 0 with size 0")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["float32", "int8", "bfloat16"])
def test_gather_takes_an_int32_index(device, name):
    """As torch 2.x (and index_select): int32 indices gather what int64 ones do, and are checked the same way."""
    rng = np.random.default_rng(5)
    src = random_values(rng, (4, 6), name)
    x = mt.tensor(src, dtype=D(name), device=device)
    idx = rng.integers(0, 6, (4, 9))
    for layout in (lambda t: t, lambda t: t.t().contiguous().t(), lambda t: t[:, ::2]):
        index32 = layout(mt.tensor(idx, dtype=mt.int32, device=device))
        index64 = layout(mt.tensor(idx, device=device))
        assert np.array_equal(host(x.gather(1, index32)), host(x.gather(1, index64)))
        assert np.array_equal(host(mt.gather(x, 1, index32)), np.take_along_axis(src, host(index64), 1))
    for bad in (6, -1):
        raises_index_error(lambda: x.gather(1, mt.tensor([[0, bad]], dtype=mt.int32, device=device)),
                           f"index {bad} is out of bounds for dimension 1 with size 6")


@pytest.mark.parametrize("device", DEVICES)
def test_gather_argument_errors(device):
    x = mt.ones(2, 3, device=device)
    for bad in (mt.int16, mt.uint8, mt.float32, mt.bool):
        with pytest.raises(RuntimeError, match=r"^gather\(\): Expected dtype int32/int64 for index$"):
            x.gather(0, mt.tensor([[0]], dtype=bad, device=device))
    with pytest.raises(RuntimeError, match="Index tensor must have the same number of dimensions as input tensor"):
        x.gather(0, mt.tensor([0], device=device))
    with pytest.raises(RuntimeError, match=r"Size does not match at dimension 1 expected index \[1, 4\] to be "
                                           r"smaller than self \[2, 3\] apart from dimension 0"):
        x.gather(0, mt.zeros(1, 4, dtype=mt.int64, device=device))
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but "
                                         r"got 2\)"):
        x.gather(2, mt.zeros(1, 1, dtype=mt.int64, device=device))
    with pytest.raises(TypeError, match="must be Tensor"):
        x.gather(0, [[0]])
    with pytest.raises(TypeError, match="must be Tensor"):
        mt.gather([[1.0]], 0, mt.zeros(1, 1, dtype=mt.int64, device=device))
    with pytest.raises(TypeError, match="'dim'"):
        x.gather(0.0, mt.zeros(1, 1, dtype=mt.int64, device=device))
    other = "cpu" if device == "cuda" else "cuda"
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x.gather(0, mt.zeros(1, 1, dtype=mt.int64, device=other))


# ==============================================================================================
# index_select
# ==============================================================================================
@st.composite
def index_select_cases(draw):
    ndim = draw(st.integers(0, 3))
    in_shape = tuple(draw(st.integers(0, 5)) for _ in range(ndim))
    dim = draw(st.integers(-max(ndim, 1), max(ndim, 1) - 1))
    if ndim == 0:
        count = 1
    elif in_shape[dim % ndim] == 0:
        count = 0
    else:
        count = draw(st.integers(0, 7))
    index_0d = count == 1 and draw(st.booleans())
    return in_shape, dim, count, index_0d


@pytest.mark.parametrize("device", DEVICES)
@HYP
@given(case=index_select_cases(), name=st.sampled_from(NAMES), index_type=st.sampled_from(["int32", "int64"]),
       data=st.data(), seed=st.integers(0, 2**32 - 1))
def test_index_select_matches_numpy(device, case, name, index_type, data, seed):
    in_shape, dim, count, index_0d = case
    rng = np.random.default_rng(seed)
    src_np, src = make_view(data.draw(layouts(len(in_shape))), in_shape, lambda s: random_values(rng, s, name), name,
                            device)
    size = (in_shape or (1,))[dim]
    index_shape = () if index_0d else (count,)
    idx_np, idx = make_view(data.draw(layouts(len(index_shape))), index_shape,
                            lambda s: rng.integers(0, max(size, 1), size=s), index_type, device)
    out = src.index_select(dim, idx) if data.draw(st.booleans()) else mt.index_select(src, dim, idx)
    expected = np.take(src_np.reshape(in_shape or (1,)), idx_np.reshape(-1), axis=dim % max(len(in_shape), 1))
    check(out, expected.reshape(out.shape), name, device)
    expected_shape = list(in_shape)
    if in_shape:
        expected_shape[dim] = count
    assert list(out.shape) == expected_shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", NAMES)
def test_index_select_whole_rows(device, name):
    """Selecting along a leading dim moves whole contiguous rows: rows whose starts are all 16-byte aligned
    (vector copies) and rows that are not (odd row length, or a view starting mid-row)."""
    rng = np.random.default_rng(sum(map(ord, name)))
    even, odd = random_values(rng, (5, 7, 32), name), random_values(rng, (4, 6, 33), name)
    t_even, t_odd = mt.tensor(even, dtype=D(name), device=device), mt.tensor(odd, dtype=D(name), device=device)
    views = [(even, t_even), (even[:, 2:], t_even[:, 2:]), (even[:, :, 1:], t_even[:, :, 1:]), (odd, t_odd)]
    for view_np, view in views:
        for dim in (0, 1):
            idx = rng.integers(0, view_np.shape[dim], size=9)
            out = view.index_select(dim, mt.tensor(idx, device=device))
            check(out, np.take(view_np, idx, axis=dim), name, device)


@pytest.mark.parametrize("device", DEVICES)
def test_index_select_rank7_permuted(device):
    rng = np.random.default_rng(12)
    base = rng.standard_normal((2, 3, 2, 3, 2, 3, 5)).astype(np.float32)
    perm = (5, 3, 1, 0, 2, 4, 6)  # the last dim stays contiguous: whole rows, outer dims looped on the host
    src_np, src = base.transpose(perm), mt.tensor(base, device=device).permute(*perm)
    idx = rng.integers(0, 3, size=4)
    check(src.index_select(2, mt.tensor(idx, device=device)), np.take(src_np, idx, axis=2), "float32", device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [4, -1, -5])
def test_index_select_out_of_range_raises(device, bad):
    x = mt.arange(12, device=device).reshape(3, 4)
    raises_index_error(lambda: x.index_select(1, mt.tensor([1, bad], dtype=mt.int32, device=device)),
                       f"index out of range in self.*index {bad} is out of bounds for dimension 1 with size 4")
    check(x.index_select(0, mt.tensor([2, 0], device=device)), [[8, 9, 10, 11], [0, 1, 2, 3]], "int64", device)


@pytest.mark.parametrize("device", DEVICES)
def test_index_select_argument_errors(device):
    x = mt.ones(2, 3, device=device)
    with pytest.raises(IndexError, match=r"index_select\(\): Index is supposed to be a vector"):
        x.index_select(0, mt.zeros(1, 1, dtype=mt.int64, device=device))
    with pytest.raises(RuntimeError, match=r"index_select\(\): Expected dtype int32 or int64 for index"):
        x.index_select(0, mt.zeros(1, dtype=mt.int16, device=device))
    with pytest.raises(RuntimeError, match=r"Index to scalar can have only 1 value, got 2 value\(s\)"):
        mt.tensor(1.0, device=device).index_select(0, mt.zeros(2, dtype=mt.int64, device=device))
    with pytest.raises(IndexError, match="Dimension out of range"):
        x.index_select(-3, mt.zeros(1, dtype=mt.int64, device=device))
    other = "cpu" if device == "cuda" else "cuda"
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x.index_select(0, mt.zeros(1, dtype=mt.int64, device=other))


# ==============================================================================================
# more than 2^31 elements: int64 offsets (2 GiB of int8, only a few pages written)
# ==============================================================================================
def test_gather_and_index_select_beyond_int32_offsets():
    n = 2**31 + 64
    big = mt.empty(n, dtype=mt.int8, device="cuda")
    for position, value in ((5, -3), (2**31 + 3, 99), (2**31 + 20, 77), (n - 7, 42)):
        big[position] = value
    out = big.gather(0, mt.tensor([n - 7, 5, n - 7], device="cuda"))  # contiguous index
    check(out, np.array([42, -3, 42], np.int8), "int8", "cuda")
    strided_index = mt.tensor([[n - 7, 5], [5, n - 7]], device="cuda").t()  # non-unit index strides
    check(big.view(1, n).expand(2, n).gather(1, strided_index), np.array([[42, -3], [-3, 42]], np.int8), "int8",
          "cuda")
    rows = big[:2**31 + 32].view(2, 2**30 + 16)  # row 1 ends beyond 2^31
    out = host(rows.index_select(1, mt.tensor([5, 2**30 + 4], device="cuda")))  # along the last dim
    assert out[0, 0] == -3 and out[1, 1] == 77
    far_rows = big.as_strided((2, 8), (2**31, 1))  # whole rows, the second at 2^31
    out = host(far_rows.index_select(0, mt.tensor([1, 0], device="cuda")))
    assert out[0, 3] == 99 and out[1, 5] == -3
    raises_index_error(lambda: big.gather(0, mt.tensor([n], device="cuda")), f"index {n} is out of bounds")


# ==============================================================================================
# item assignment from tensors
# ==============================================================================================
@pytest.mark.parametrize("device", DEVICES)
def test_setitem_strips_leading_unit_dims_of_value(device):
    t = mt.zeros(2, 3, device=device)
    t[0] = mt.tensor([[[1.0, 2.0, 3.0]]], device=device)  # (1, 1, 3) into a (3,) row, as torch allows
    t[1, 1] = mt.tensor([7.0], device=device)  # (1,) into a 0-d element
    t[1, 2:] = mt.tensor([[9.0]], device=device)  # broadcast after stripping
    check(t, [[1.0, 2.0, 3.0], [0.0, 7.0, 9.0]], "float32", device)
    with pytest.raises(RuntimeError, match=r"output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        t[0] = mt.ones(2, 3, device=device)


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_value_from_other_device_and_dtype(device):
    other = "cpu" if device == "cuda" else "cuda"
    t = mt.zeros(2, 4, dtype=mt.int16, device=device)
    t[:, 1:3] = mt.tensor([[-1.75], [2.5]], device=other)  # float32 on the other device, cast by truncation
    t[1, 0] = mt.tensor(True)  # 0-d bool CPU tensor
    check(t, [[0, -1, -1, 0], [1, 2, 2, 0]], "int16", device)


@pytest.mark.parametrize("device", DEVICES)
@HYP
@given(data=st.data(), name=st.sampled_from(NAMES), value_name=st.sampled_from(NAMES),
       seed=st.integers(0, 2**32 - 1))
def test_setitem_broadcast_matches_numpy(device, data, name, value_name, seed):
    """t[slices] = tensor of any dtype, broadcast (fewer dims, size-1 dims, extra leading 1s), from either
    device. Values are integers in [0, 100], exact in every dtype, so the cast is plain."""
    rng = np.random.default_rng(seed)
    shape = tuple(data.draw(st.integers(1, 4)) for _ in range(data.draw(st.integers(1, 3))))
    base = random_values(rng, shape, name)
    t = mt.tensor(base, dtype=D(name), device=device)
    index = tuple(slice(data.draw(st.integers(0, n - 1)), None, data.draw(st.integers(1, 2))) for n in shape)
    target_shape = base[index].shape
    keep = data.draw(st.integers(0, len(target_shape)))
    vshape = [1 if data.draw(st.booleans()) else n for n in target_shape[len(target_shape) - keep:]]
    v = rng.random(vshape) < 0.5 if value_name == "bool" else rng.integers(0, 101, size=vshape)
    vt = mt.tensor(v, dtype=D(value_name), device=device if data.draw(st.booleans()) else "cpu")
    t[index] = vt.reshape([1] * data.draw(st.integers(0, 2)) + vshape)
    expected = base.copy()
    expected[index] = (v != 0) if name == "bool" else v
    np.testing.assert_array_equal(host(t), expected)
