"""CUDA graphs (mt.cuda.CUDAGraph, mt.cuda.graph, make_graphed_callables) on the "cuda" device: replays against
numpy and against eager runs, static inputs and outputs, random ops, the calls a capture refuses and the
recovery after them, captures with several streams and threads, and a graph on a second device.

The allocator's side of graphs (private pools, snapshots, statistics, MemPool) is in test_graphs_pools.py.
Tensors are small: on the simulator every kernel program runs in Triton's interpreter.
"""
import threading

import numpy as np
import pytest

import minitensor as mt
from graph_helpers import DEV, capturing, close, dev, other_stream, rand, values
from helpers import run_python

pytestmark = pytest.mark.usefixtures("clean_cuda_state")

CAPTURE_ERROR = "operation not permitted when stream is capturing"


def eager_check_on(stream=None):
    """Eager ops on `stream` (default: the current one) after a capture: their results against numpy."""
    data = rand(33)
    with mt.cuda.stream(stream):
        t = dev(data)
        r = (t * 3 - 1).sum()
        close(values(t * 3 - 1), data * 3 - 1)
        close(r.item(), float((data * 3 - 1).sum()), rtol=1e-4)


# ============================================================================================== replay vs eager
def _chain(x, y):
    """Pointwise ops, casts, reductions, fill_ and copies: a tuple of outputs."""
    a = x * 2.5 + y
    w = mt.where(a > 0.5, a, y * -1.0)
    h = w.to(mt.float16).to(mt.float32)
    i = (a * 4).to(mt.int32)
    s = a.sum()
    m = w.max()
    mean_rows = a.mean(dim=1)
    col_max = h.max(dim=0).values
    f = mt.empty(5, 3, device=DEV).fill_(-2.75)
    c = mt.empty(x.shape, device=DEV)
    c.copy_(w)
    cl = h.clone()
    tc = a.t().contiguous()
    return a, w, h, i, s, m, mean_rows, col_max, f, c, cl, tc


def _chain_numpy(x, y):
    a = (x * np.float32(2.5) + y).astype(np.float32)
    w = np.where(a > 0.5, a, y * np.float32(-1.0))
    h = w.astype(np.float16).astype(np.float32)
    i = (a * 4).astype(np.int32)
    return (a, w, h, i, a.sum(), w.max(), a.mean(axis=1), h.max(axis=0), np.full((5, 3), -2.75, np.float32), w,
            h, np.ascontiguousarray(a.T))


def _check_outputs(outputs, expected):
    assert len(outputs) == len(expected)
    for k, (out, exp) in enumerate(zip(outputs, expected)):
        got = values(out)
        assert got.shape == np.shape(exp), k
        close(got, exp, rtol=1e-4, atol=1e-4)


def _replay_against_eager(fn, args, expected):
    """fn(*args) eagerly and as a replayed graph: both against numpy's `expected`, and equal to each other."""
    eager = fn(*args)
    _check_outputs(eager, expected)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        static = fn(*args)
    g.replay()
    _check_outputs(static, expected)
    for e, s in zip(eager, static):
        assert s.dtype == e.dtype and s.shape == e.shape
        np.testing.assert_array_equal(values(s), values(e))
    return g, static


def test_replay_matches_eager_and_numpy():
    xd, yd = rand(6, 8), rand(6, 8)
    x, y = dev(xd), dev(yd)
    g, static = _replay_against_eager(_chain, (x, y), _chain_numpy(xd, yd))
    xd2 = rand(6, 8)
    x.copy_(mt.tensor(xd2))
    g.replay()
    _check_outputs(static, _chain_numpy(xd2, yd))


def test_replay_gather_and_index_select():
    xd = rand(6, 8)
    rows = np.array([5, 0, 3, 3], dtype=np.int64)
    cols = np.random.randint(0, 8, (6, 3)).astype(np.int64)
    x, idx_rows, idx_cols = dev(xd), dev(rows), dev(cols)

    def fn(x, idx_rows, idx_cols):
        a = x * 2
        return a.gather(1, idx_cols), a.index_select(0, idx_rows), x.t().index_select(1, idx_rows[:2])

    expected = (np.take_along_axis(xd * 2, cols, 1), (xd * 2)[rows], xd.T[:, rows[:2]])
    g, static = _replay_against_eager(fn, (x, idx_rows, idx_cols), expected)
    rows2 = np.array([1, 1, 2, 4], dtype=np.int64)
    idx_rows.copy_(mt.tensor(rows2))
    g.replay()
    _check_outputs(static, (np.take_along_axis(xd * 2, cols, 1), (xd * 2)[rows2], xd.T[:, rows2[:2]]))


def test_capture_does_not_run_the_work():
    """Captured work runs at replay, not at capture: an output allocated and filled in the capture holds
    nothing useful before the first replay, and a static input written in the capture changes only at replay."""
    xd = rand(16)
    x = dev(xd)
    acc = dev(np.zeros(16, np.float32) + 1)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        acc.add_(x)
    np.testing.assert_array_equal(values(acc), np.ones(16, np.float32))
    g.replay()
    close(values(acc), 1 + xd)
    g.replay()
    g.replay()
    close(values(acc), 1 + 3 * xd)


def test_inplace_update_of_static_inputs_between_replays():
    xd, bd = rand(4, 5), rand(5)
    x, b = dev(xd), dev(bd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        out = (x * b).sum(dim=1)
        big = (x - b).max()
    ptr = out.data_ptr()
    g.replay()
    first = values(out)
    close(first, (xd * bd).sum(axis=1), rtol=1e-4)
    close(values(big), (xd - bd).max())
    # update the inputs in place: by a copy from the host, by eager kernels
    xd2 = rand(4, 5)
    x.copy_(mt.tensor(xd2))
    b.mul_(2)
    g.replay()
    assert out.data_ptr() == ptr
    close(values(out), (xd2 * bd * 2).sum(axis=1), rtol=1e-4)
    close(values(big), (xd2 - 2 * bd).max())
    x.fill_(0.5)
    g.replay()
    close(values(out), (0.5 * bd * 2).sum() * np.ones(4), rtol=1e-4)
    assert not np.allclose(first, values(out))


def test_outputs_are_overwritten_by_the_next_replay_in_stream_order():
    """Replays and eager updates on one stream, with no host wait between them: each replay's output is the
    same tensor, holding that replay's values."""
    xd = rand(32)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        out = x * x + 1
    snapshots = []
    for k in range(3):
        x.add_(1.0)
        g.replay()
        snapshots.append(out.clone())
    for k, snap in enumerate(snapshots):
        close(values(snap), (xd + k + 1) ** 2 + 1, rtol=1e-5)
    close(values(out), (xd + 3) ** 2 + 1)


def test_replay_on_other_streams():
    xd = rand(24)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    s = other_stream()
    with mt.cuda.graph(g, stream=s):
        out = x.abs() + 2
    side = other_stream(s)
    with mt.cuda.stream(side):
        g.replay()
    side.synchronize()
    close(values(out), np.abs(xd) + 2)
    x.mul_(-2)
    s.wait_stream(mt.cuda.current_stream())
    with mt.cuda.stream(s):  # the capture's own stream
        g.replay()
    s.synchronize()
    close(values(out), np.abs(xd) * 2 + 2)
    x.mul_(3)
    g.replay()  # the default stream
    close(values(out), np.abs(xd) * 6 + 2)


def test_static_inputs_with_storage_offset_and_stride_zero():
    based, rowd = rand(40), rand(1, 5)
    base, row = dev(based), dev(rowd)
    view = base[7:27].view(4, 5)
    assert view.storage_offset() == 7
    expanded = row.expand(4, 5)
    assert expanded.stride() == (0, 1)
    tview = base[3:23].view(5, 4).t()  # offset and transposed
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        out = view * expanded + tview
        sums = expanded.sum(dim=0)
    g.replay()

    def expected(b, r):
        return b[7:27].reshape(4, 5) * r + b[3:23].reshape(5, 4).T

    close(values(out), expected(based, rowd))
    close(values(sums), 4 * rowd[0])
    based2, rowd2 = rand(40), rand(1, 5)
    base.copy_(mt.tensor(based2))
    row.copy_(mt.tensor(rowd2))
    g.replay()
    close(values(out), expected(based2, rowd2))
    close(values(sums), 4 * rowd2[0])
    # writing into an offset view of a static input changes only that part
    view[1].fill_(10.0)
    g.replay()
    b3 = based2.copy()
    b3[12:17] = 10.0
    close(values(out), expected(b3, rowd2))


def test_static_output_written_through_views():
    """A capture that writes into views (an offset slice, a transposed view) of a tensor made before it."""
    target = dev(np.zeros((4, 6), np.float32))
    xd = rand(6, 4)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        target[1:3].copy_(x.t()[1:3])
        target[3, 2:].fill_(7.0)
    g.replay()
    exp = np.zeros((4, 6), np.float32)
    exp[1:3] = xd.T[1:3]
    exp[3, 2:] = 7.0
    np.testing.assert_array_equal(values(target), exp)


# ============================================================================================== random ops
N_RANDOM = 2048


def _random_chain(like, buf_u, buf_n, buf_b, buf_r, strided):
    u = mt.rand(N_RANDOM, device=DEV)
    n = mt.randn(N_RANDOM, device=DEV)
    ul = mt.rand_like(like)
    buf_u.uniform_(-2.0, 3.0)
    buf_n.normal_(5.0, 0.5)
    buf_b.bernoulli_(0.25)
    ri = mt.randint(3, 9, (N_RANDOM,), device=DEV)
    buf_r.random_(0, 7)
    strided.uniform_(10.0, 11.0)
    return u, n, ul, buf_u, buf_n, buf_b, ri, buf_r, strided


def _random_buffers():
    return dev(rand(N_RANDOM)), dev(rand(N_RANDOM)), dev(rand(N_RANDOM)), dev(rand(N_RANDOM)), dev(rand(32, 16)).t()


def _check_random_stats(outs):
    u, n, ul, bu, bn, bb, ri, br, st = [values(t) for t in outs]
    assert 0 <= u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.05 and len(np.unique(u)) > N_RANDOM // 2
    assert abs(n.mean()) < 0.15 and 0.85 < n.std() < 1.15
    assert 0 <= ul.min() and ul.max() < 1 and abs(ul.mean() - 0.5) < 0.05
    assert not np.any(u[:N_RANDOM] == ul[:N_RANDOM])  # two ops of one graph draw different numbers
    assert -2 <= bu.min() and bu.max() < 3 and abs(bu.mean() - 0.5) < 0.2
    assert abs(bn.mean() - 5) < 0.08 and 0.4 < bn.std() < 0.6
    assert set(np.unique(bb)) <= {0.0, 1.0} and 0.18 < bb.mean() < 0.32
    assert ri.dtype == np.int64 and set(np.unique(ri)) == set(range(3, 9))
    assert set(np.unique(br)) == set(map(float, range(7)))
    assert st.shape == (16, 32) and 10 <= st.min() and st.max() < 11 and len(np.unique(st)) > 256


def test_random_ops_draw_new_numbers_on_each_replay():
    like = dev(rand(N_RANDOM))
    bufs = _random_buffers()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        outs = _random_chain(like, *bufs)
    draws = []
    for _ in range(3):
        g.replay()
        _check_random_stats(outs)
        draws.append([values(t) for t in outs])
    for k in range(len(outs)):
        for a, b in ((0, 1), (1, 2), (0, 2)):
            same = np.mean(draws[a][k] == draws[b][k])
            if k in (5, 6, 7):  # few distinct values: about as many equal as chance gives
                assert same < 0.9, k
            else:
                assert same < 0.01, k


def test_manual_seed_reproduces_a_replay_and_matches_eager():
    like = dev(rand(N_RANDOM))
    bufs = _random_buffers()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        outs = _random_chain(like, *bufs)
    mt.manual_seed(1234)
    g.replay()
    first = [values(t) for t in outs]
    g.replay()
    second = [values(t) for t in outs]
    mt.manual_seed(1234)
    g.replay()
    again = [values(t) for t in outs]
    g.replay()
    again2 = [values(t) for t in outs]
    for k in range(len(outs)):
        np.testing.assert_array_equal(again[k], first[k], err_msg=str(k))
        np.testing.assert_array_equal(again2[k], second[k], err_msg=str(k))
    assert not np.array_equal(first[0], second[0])
    # the same ops run eagerly after the same seed draw the same numbers (as torch's graphed RNG)
    mt.manual_seed(1234)
    eager = [values(t) for t in _random_chain(like, *_random_buffers())]
    for k in range(len(outs)):
        np.testing.assert_array_equal(eager[k], first[k], err_msg=str(k))


def test_random_and_deterministic_parts_of_one_graph():
    xd = rand(N_RANDOM)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        noise = mt.rand(N_RANDOM, device=DEV)
        masked = mt.where(noise < 0.5, x, x * 0)
        total = x.sum()
    g.replay()
    nz, mz = values(noise), values(masked)
    np.testing.assert_array_equal(mz, np.where(nz < 0.5, xd, 0 * xd))
    assert 0.4 < (nz < 0.5).mean() < 0.6
    close(values(total), xd.sum(), rtol=1e-4)
    g.replay()
    assert not np.array_equal(values(noise), nz)
    np.testing.assert_array_equal(values(masked), np.where(values(noise) < 0.5, xd, 0 * xd))


def test_register_generator_state():
    g = mt.cuda.CUDAGraph()
    s = other_stream()
    with mt.cuda.stream(s):
        g.capture_begin()
        try:
            g.register_generator_state(mt.cuda.default_generators[0])
            out = mt.rand(256, device=DEV)
        finally:
            g.capture_end()
    g.replay()
    a = values(out)
    g.replay()
    b = values(out)
    assert 0 <= a.min() and a.max() < 1 and not np.any(a == b)
    with pytest.raises(TypeError):
        g.register_generator_state(object())
    with pytest.raises(RuntimeError):
        g.register_generator_state(mt.cuda.default_generators[0])  # no capture underway


def test_replays_and_eager_draws_share_the_generator():
    """A replay advances the generator as the same ops run eagerly would: replays and eager draws
    interleaved after a seed give the numbers the all-eager sequence gives after that seed."""
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        a = mt.rand(300, device=DEV)
        b = mt.randn(7, 11, device=DEV)

    def eager_pair():
        return values(mt.rand(300, device=DEV)), values(mt.randn(7, 11, device=DEV))

    mt.manual_seed(77)
    g.replay()
    r1 = values(a), values(b)
    e1 = values(mt.rand(64, device=DEV))
    g.replay()
    r2 = values(a), values(b)
    mt.manual_seed(77)
    x1 = eager_pair()
    y1 = values(mt.rand(64, device=DEV))
    x2 = eager_pair()
    for got, exp in ((r1, x1), (r2, x2)):
        np.testing.assert_array_equal(got[0], exp[0])
        np.testing.assert_array_equal(got[1], exp[1])
    np.testing.assert_array_equal(e1, y1)
    assert not np.array_equal(r1[0], r2[0])
    # replays and eager calls draw disjoint numbers
    for draw in (r1[0][:64], r2[0][:64]):
        assert np.mean(draw == e1) < 0.05


def test_bernoulli_with_tensor_probabilities_follows_the_static_input():
    n = 2048
    p = dev(np.full(n, 0.1, np.float32))
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        draws = mt.bernoulli(p)
    g.replay()
    low = values(draws)
    assert set(np.unique(low)) <= {0.0, 1.0} and 0.06 < low.mean() < 0.14
    p.fill_(0.9)
    g.replay()
    high = values(draws)
    assert 0.86 < high.mean() < 0.94
    pd = np.where(np.arange(n) % 2 == 0, 0.0, 1.0).astype(np.float32)
    p.copy_(mt.tensor(pd))
    g.replay()
    np.testing.assert_array_equal(values(draws), pd)


def test_random_dtypes_in_a_graph():
    g = mt.cuda.CUDAGraph()
    i64 = mt.empty(1000, dtype=mt.int64, device=DEV)
    with mt.cuda.graph(g):
        f64 = mt.randn(1000, dtype=mt.float64, device=DEV)
        f16 = mt.rand(1000, dtype=mt.float16, device=DEV)
        i64.random_(-(2**40), 2**40)
        i8 = mt.randint(-5, 5, (1000,), dtype=mt.int8, device=DEV)
    draws = []
    for _ in range(2):
        g.replay()
        a, b, c, d = values(f64), values(f16), values(i64), values(i8)
        assert a.dtype == np.float64 and abs(a.mean()) < 0.2 and 0.8 < a.std() < 1.2
        assert b.dtype == np.float16 and 0 <= b.min() and b.max() < 1 and abs(b.mean() - 0.5) < 0.06
        assert c.dtype == np.int64 and -(2**40) <= c.min() and c.max() < 2**40 and np.abs(c).max() > 2**35
        assert d.dtype == np.int8 and set(np.unique(d)) == set(range(-5, 5))
        draws.append((a, c))
    assert not np.any(draws[0][0] == draws[1][0])
    assert not np.array_equal(draws[0][1], draws[1][1])


# ============================================================================================== misuse
def test_capture_on_default_stream_is_refused():
    x = dev(rand(8))
    g = mt.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graphs must be captured on a non-default stream"):
        g.capture_begin()
    assert not mt.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="CUDA graphs must be captured on a non-default stream"):
        with mt.cuda.graph(mt.cuda.CUDAGraph(), stream=mt.cuda.default_stream()):
            pass
    assert not mt.cuda.is_current_stream_capturing()
    assert mt.cuda.current_stream().cuda_stream == 0
    # the refused graph can still be captured on a side stream
    with mt.cuda.graph(g):
        out = x + 1
    g.replay()
    close(values(out), values(x) + 1)


def test_second_capture_on_one_graph_is_refused():
    x = dev(rand(8))
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        out = x * 2
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        with mt.cuda.graph(g):
            x * 3
    assert not mt.cuda.is_current_stream_capturing()
    g.replay()
    close(values(out), values(x) * 2)


def test_capture_end_on_another_stream_is_refused():
    xd = rand(8)
    x = dev(xd)
    s1 = other_stream()
    s2 = other_stream(s1)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s1), capturing(g, s1):
        out = x - 4
        with mt.cuda.stream(s2):
            with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on."):
                g.capture_end()
        assert mt.cuda.is_current_stream_capturing()
    assert not mt.cuda.is_current_stream_capturing()
    g.replay()
    close(values(out), xd - 4)


def test_replay_without_capture_is_refused():
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        mt.cuda.CUDAGraph().replay()


def test_invalid_capture_error_mode():
    s = other_stream()
    with mt.cuda.stream(s):
        with pytest.raises(ValueError):
            mt.cuda.CUDAGraph().capture_begin(capture_error_mode="strict")
        assert not mt.cuda.is_current_stream_capturing()


def test_is_current_stream_capturing():
    s = other_stream()
    assert mt.cuda.is_current_stream_capturing() is False
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        assert mt.cuda.is_current_stream_capturing() is True
        with mt.cuda.stream(mt.cuda.default_stream()):
            assert mt.cuda.is_current_stream_capturing() is False
        assert mt.cuda.is_current_stream_capturing() is True
        mt.zeros(4, device=DEV)
    assert mt.cuda.is_current_stream_capturing() is False
    with mt.cuda.stream(s):
        assert mt.cuda.is_current_stream_capturing() is False


def test_empty_capture_warns():
    g = mt.cuda.CUDAGraph()
    with pytest.warns(UserWarning, match="The CUDA Graph is empty"):
        with mt.cuda.graph(g):
            pass
    g.replay()
    mt.cuda.synchronize()


def test_pinned_allocation_in_a_capture_keeps_it_valid():
    """A pinned host tensor made inside a capture (a size the host cache has no block for): the allocation
    works (on a GPU, cuMemHostAlloc runs in the relaxed capture mode), and the capture goes on and ends. A block
    freed before, whose copy's event is still queued, stays queued: no event is queried during a capture."""
    xd = rand(16)
    x = dev(xd)
    staged = mt.empty(5 << 10, dtype=mt.uint8, pin_memory=True)
    mt.cuda.sleep(20)
    mt.empty(5 << 10, dtype=mt.uint8, device="cuda").copy_(staged, non_blocking=True)  # its event pends
    del staged
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g, s):
        y = x * 2
        pinned = mt.empty(3 << 20, dtype=mt.uint8, pin_memory=True)
        assert pinned.is_pinned()
        z = y + 1
    g.replay()
    close(values(z), xd * 2 + 1)


def test_capture_that_does_work_does_not_warn():
    import warnings
    x = dev(rand(4))
    g = mt.cuda.CUDAGraph()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with mt.cuda.graph(g):
            x.add_(1)


# ============================================================================================== illegal calls
def _recorded_event(stream):
    e = mt.cuda.Event()
    e.record(stream)
    return e


ILLEGAL = {
    "synchronize": lambda s, t: mt.cuda.synchronize(),
    "synchronize_device0": lambda s, t: mt.cuda.synchronize(0),
    "stream_synchronize": lambda s, t: s.synchronize(),
    "stream_query": lambda s, t: s.query(),
    "current_stream_synchronize": lambda s, t: mt.cuda.current_stream().synchronize(),
    "event_query": lambda s, t: _recorded_event(s).query(),
    "event_synchronize": lambda s, t: _recorded_event(s).synchronize(),
    "cpu": lambda s, t: t.cpu(),
    "item": lambda s, t: t[0].item(),
    "numpy_force": lambda s, t: t.numpy(force=True),
    "tolist": lambda s, t: t.tolist(),
    "float": lambda s, t: float(t[1]),
    "to_cpu": lambda s, t: t.to("cpu"),
    "host_to_device_tensor": lambda s, t: mt.tensor(np.ones(3, np.float32), device=DEV),
    "host_to_device_copy_": lambda s, t: t.copy_(mt.tensor(np.ones(t.shape, np.float32))),
    "device_to_host_copy_": lambda s, t: mt.empty(t.shape).copy_(t),
    # pinned buffers made before the capture (PINNED): the copies alone are tested here
    "pinned_host_to_device_non_blocking": lambda s, t: t.copy_(PINNED["src"], non_blocking=True),
    "device_to_pinned_host_non_blocking": lambda s, t: PINNED["dst"].copy_(t, non_blocking=True),
    "empty_cache": lambda s, t: mt.cuda.empty_cache(),
    # "global" mode: host waits for work outside the capture are refused too
    "uncaptured_stream_synchronize": lambda s, t: other_stream(s).synchronize(),
    "uncaptured_stream_query": lambda s, t: other_stream(s).query(),
    "uncaptured_event_query": lambda s, t: _recorded_event(other_stream(s)).query(),
    "uncaptured_event_synchronize": lambda s, t: _recorded_event(other_stream(s)).synchronize(),
    "default_stream_cpu": lambda s, t: _on_default_stream(lambda: mt.zeros(3, device=DEV).cpu()),
}


PINNED = {}


def _on_default_stream(fn):
    with mt.cuda.stream(mt.cuda.default_stream()):
        return fn()


@pytest.mark.parametrize("call", sorted(ILLEGAL))
def test_illegal_call_in_capture_is_refused_and_capture_still_ends(call):
    xd = rand(16)
    x = dev(xd)
    PINNED["src"], PINNED["dst"] = mt.ones(16, pin_memory=True), mt.empty(16, pin_memory=True)
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g, s):
        y = x * 2
        with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR) as info:
            ILLEGAL[call](s, y)
        assert isinstance(info.value, RuntimeError) and info.value.code == 900
        assert mt.cuda.is_current_stream_capturing()
        z = y + 1
    assert not mt.cuda.is_current_stream_capturing()
    g.replay()
    close(values(z), xd * 2 + 1)
    x.fill_(3.0)
    g.replay()
    close(values(z), np.full(16, 7.0))
    # the capture's stream, the default stream and another stream work eagerly
    eager_check_on(s)
    eager_check_on(None)
    eager_check_on(other_stream(s))
    s.synchronize()
    assert s.query()
    mt.cuda.synchronize()
    mt.cuda.empty_cache()


def test_illegal_call_inside_graph_context_aborts_the_capture():
    xd = rand(16)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
        with mt.cuda.graph(g) as ctx:
            y = x * 2
            y.cpu()
    stream = ctx.capture_stream
    assert not mt.cuda.is_current_stream_capturing()
    assert mt.cuda.current_stream().cuda_stream == 0
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    with mt.cuda.stream(stream):
        assert not mt.cuda.is_current_stream_capturing()
    eager_check_on(stream)
    eager_check_on(None)
    del y
    # a new graph captures on the same side stream
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2) as ctx2:
        out = x * 5
    assert ctx2.capture_stream.cuda_stream == stream.cuda_stream
    g2.replay()
    close(values(out), xd * 5)


def test_exception_inside_graph_context_aborts_the_capture():
    xd = rand(16)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with pytest.raises(ZeroDivisionError):
        with mt.cuda.graph(g) as ctx:
            y = x * 2
            1 / 0
    assert not mt.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    eager_check_on(ctx.capture_stream)
    eager_check_on(None)
    mt.cuda.synchronize()
    # the work recorded before the exception never ran
    del y
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2):
        out = x + 0.5
    g2.replay()
    close(values(out), xd + 0.5)


def test_capturing_stream_cannot_wait_for_work_before_the_capture():
    xd = rand(16)
    x = dev(xd)
    s = other_stream()
    early = other_stream(s)
    before = mt.cuda.Event()
    early.wait_stream(mt.cuda.current_stream())  # x's copy
    with mt.cuda.stream(early):
        pre = x + 1
        before.record()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g, s):
        y = x * 2
        with pytest.raises(RuntimeError):
            s.wait_event(before)
        with pytest.raises(RuntimeError):
            s.wait_stream(early)
        z = y - 1
    g.replay()
    close(values(z), xd * 2 - 1)
    mt.cuda.current_stream().wait_stream(early)  # pre's kernel ran on `early`: read it after that stream's work
    close(values(pre), xd + 1)
    eager_check_on(s)
    eager_check_on(early)


def test_reset_during_capture_is_refused():
    x = dev(rand(16))
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g, s):
        y = x + 1
        with pytest.raises(RuntimeError):
            g.reset()
        assert mt.cuda.is_current_stream_capturing()
    g.replay()
    close(values(y), values(x) + 1)


def test_pool_and_reset_outside_a_capture():
    g = mt.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        g.pool()
    g.reset()  # nothing captured: nothing to drop
    x = dev(rand(8))
    with mt.cuda.graph(g):
        y = x + 1
    g.replay()
    close(values(y), values(x) + 1)
    g.reset()
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()


def test_reset_lets_the_graph_capture_again():
    """torch's reset() destroys the executable graph and gives its pool up: the same instance can then capture
    a new graph, in a new pool (or a shared one), and replays only the new work."""
    xd = rand(64)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        first = x * 2
    first_pool = g.pool()
    g.replay()
    g.reset()
    with mt.cuda.graph(g):
        second = x + 3
    assert g.pool() != first_pool  # the first pool was given up; the new capture has its own
    first.fill_(-1.0)
    g.replay()
    close(values(second), xd + 3)
    np.testing.assert_array_equal(values(first), np.full(64, -1.0, np.float32))  # the first graph is gone
    # once more, into another graph's pool
    other = mt.cuda.CUDAGraph()
    with mt.cuda.graph(other):
        base = x - 1
    g.reset()
    with mt.cuda.graph(g, pool=other.pool()):
        third = base * 4
    assert g.pool() == other.pool()
    other.replay()
    g.replay()
    close(values(third), (xd - 1) * 4)
    with pytest.raises(RuntimeError, match="already owns a captured graph"):  # without reset(): refused
        with mt.cuda.graph(g):
            x + 2
    g.replay()
    close(values(third), (xd - 1) * 4)


def test_a_failed_capture_leaves_the_graph_free_to_capture():
    xd = rand(16)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with pytest.raises(ValueError):
        with mt.cuda.graph(g):
            x + 1
            raise ValueError("inside the capture")
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    with mt.cuda.graph(g):
        y = x * 5
    g.replay()
    close(values(y), xd * 5)


def test_capture_begin_during_its_own_capture_is_refused():
    x = dev(rand(16))
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g, s):
        y = x + 1
        with pytest.raises(RuntimeError, match="already capturing"):
            g.capture_begin()
        assert mt.cuda.is_current_stream_capturing()
    g.replay()
    close(values(y), values(x) + 1)


def test_graph_context_passes_the_capture_error_mode():
    xd = rand(16)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, capture_error_mode="relaxed"):
        y = x * 2
        with mt.cuda.stream(mt.cuda.default_stream()):
            close(values(x), xd)  # allowed: a relaxed capture refuses only what touches its streams
        with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
            y.cpu()
    g.replay()
    close(values(y), xd * 2)
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2, capture_error_mode="thread_local"):
        z = x + 2
        with mt.cuda.stream(mt.cuda.default_stream()):
            with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
                x.cpu()
    g2.replay()
    close(values(z), xd + 2)
    with pytest.raises(ValueError):
        with mt.cuda.graph(mt.cuda.CUDAGraph(), capture_error_mode="lenient"):
            pass
    assert not mt.cuda.is_current_stream_capturing()
    assert mt.cuda.current_stream().cuda_stream == 0


def test_second_graph_on_a_capturing_stream_is_refused():
    xd = rand(16)
    x = dev(xd)
    s = other_stream()
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g1, s):
        y = x * 2
        with pytest.raises(RuntimeError):
            g2.capture_begin()
        assert mt.cuda.is_current_stream_capturing()
        z = y + 1
    g1.replay()
    close(values(z), xd * 2 + 1)
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g2.replay()
    with mt.cuda.graph(g2, stream=s):  # the refused graph captures later
        w = x - 2
    g2.replay()
    close(values(w), xd - 2)


def test_capture_end_without_begin_and_abort_without_capture():
    g = mt.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        g.capture_end()
    g.abort_capture()  # nothing underway: nothing to do
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()


# ============================================================================================== threads
def _run_thread(target):
    errors = []

    def wrapped():
        try:
            target()
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
    t = threading.Thread(target=wrapped)
    t.start()
    t.join(120)
    assert not t.is_alive(), "thread hung"
    if errors:
        raise errors[0]


def test_thread_local_capture_lets_other_threads_wait_and_copy():
    xd = rand(64)
    x = dev(xd)
    other_data = rand(50)
    (dev(other_data) * 2).sum().item()  # kernels loaded before the capture
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    results = {}

    def other():
        mine = other_stream(s)
        with mt.cuda.stream(mine):
            t = dev(other_data)  # host -> device
            u = t * 2
            results["cpu"] = values(u)  # device -> host
            results["item"] = u.sum().item()
            e = mt.cuda.Event()
            e.record()
            e.synchronize()
            results["query"] = e.query()
            mine.synchronize()
            results["stream_query"] = mine.query()
            assert not mt.cuda.is_current_stream_capturing()

    with mt.cuda.stream(s), capturing(g, s, capture_error_mode="thread_local"):
        y = x * 3
        _run_thread(other)
        # the capturing thread itself may not wait, even for the default stream
        with mt.cuda.stream(mt.cuda.default_stream()):
            with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
                x.cpu()
        z = y + x
    close(results["cpu"], other_data * 2)
    close(results["item"], float((other_data * 2).sum()), rtol=1e-4)
    assert results["query"] is True and results["stream_query"] is True
    g.replay()
    close(values(z), xd * 4)


def test_global_capture_refuses_other_threads_host_waits():
    xd, od = rand(64), rand(40)
    x, t = dev(xd), dev(od)
    (t * 2).sum()
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    seen = {}

    def other():
        mine = other_stream(s)
        with mt.cuda.stream(mine):
            u = t * 2  # a launch on an uncaptured stream is allowed
            for name, call in (("cpu", u.cpu), ("item", lambda: u.sum().item()),
                               ("stream_synchronize", mine.synchronize), ("synchronize", mt.cuda.synchronize)):
                try:
                    call()
                    seen[name] = "ran"
                except mt.cuda.CudaError as exc:
                    seen[name] = str(exc)
            seen["u"] = u

    with mt.cuda.stream(s), capturing(g, s):  # "global"
        y = x + 1
        _run_thread(other)
        z = y * y
    for name in ("cpu", "item", "stream_synchronize", "synchronize"):
        assert CAPTURE_ERROR in seen[name], (name, seen[name])
    mt.cuda.synchronize()
    g.replay()
    close(values(z), (xd + 1) ** 2)
    close(values(seen["u"]), od * 2)  # the other thread's launch ran eagerly

    def after():
        close(values(t * 2), od * 2)
    _run_thread(after)


def test_relaxed_capture_refuses_only_its_own_streams():
    xd = rand(32)
    x = dev(xd)
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s), capturing(g, s, capture_error_mode="relaxed"):
        y = x * 2
        with mt.cuda.stream(mt.cuda.default_stream()):
            close(values(x), xd)  # a host copy on an uncaptured stream, from the capturing thread
        with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
            y.cpu()  # on the capturing stream
        with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
            s.synchronize()
        with pytest.raises(mt.cuda.CudaError, match=CAPTURE_ERROR):
            _recorded_event(s).query()
        z = y - x
    g.replay()
    close(values(z), xd)


def test_thread_local_capture_must_end_on_its_thread():
    xd = rand(16)
    x = dev(xd)
    s = other_stream()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s):
        g.capture_begin(capture_error_mode="thread_local")
    try:
        with mt.cuda.stream(s):
            y = x * 2

        def end_elsewhere():
            with mt.cuda.stream(s):
                with pytest.raises(RuntimeError):
                    g.capture_end()
        _run_thread(end_elsewhere)
        with mt.cuda.stream(s):
            assert mt.cuda.is_current_stream_capturing()
            z = y + 1
    except BaseException:
        with mt.cuda.stream(s):
            g.abort_capture()
        raise
    with mt.cuda.stream(s):
        g.capture_end()
    g.replay()
    close(values(z), xd * 2 + 1)


ABORT_FROM_ANOTHER_THREAD_SCRIPT = """
    import threading
    import minitensor as mt

    x = mt.ones(8, device="cuda")
    (x * 3).cpu()
    s = mt.cuda.Stream()
    g = mt.cuda.CUDAGraph()

    def begin():  # a thread that begins a capture and dies without ending it
        with mt.cuda.stream(s):
            g.capture_begin(capture_error_mode="thread_local")
            x * 2
    t = threading.Thread(target=begin)
    t.start()
    t.join()
    try:
        g.abort_capture()
        print("aborted")
    except RuntimeError as exc:
        print("refused" if "must end on the thread that began it" in str(exc) else exc)
    with mt.cuda.stream(s):
        print("capturing" if mt.cuda.is_current_stream_capturing() else "not capturing")
    print("ok")
"""


def test_abort_of_a_thread_local_capture_from_another_thread():
    """CUDA ends a thread-local capture only on its thread: abort_capture() from another one is refused, and the
    stream still captures. (A subprocess: a capture that cannot end would spoil the stream for later tests.)"""
    assert run_python(ABORT_FROM_ANOTHER_THREAD_SCRIPT).split() == ["refused", "capturing", "ok"]


def test_two_threads_capture_their_own_graphs():
    xd = rand(64)
    x = dev(xd)
    (x * 2 + 1).sum()
    barrier = threading.Barrier(2, timeout=60)
    graphs = {}

    def capture(k):
        s = mt.cuda.Stream()
        g = mt.cuda.CUDAGraph()
        with mt.cuda.stream(s), capturing(g, s, capture_error_mode="thread_local"):
            barrier.wait()  # both captures underway
            y = x * (k + 2) + 1
            barrier.wait()
            total = y.sum()
            assert mt.cuda.is_current_stream_capturing()
            barrier.wait()
        graphs[k] = g, y, total

    errors = []

    def run(k):
        try:
            capture(k)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    assert not mt.cuda.is_current_stream_capturing()
    for k in range(2):
        g, y, total = graphs[k]
        g.replay()
        close(values(y), xd * (k + 2) + 1)
        close(values(total), (xd * (k + 2) + 1).sum(), rtol=1e-4)
    assert graphs[0][0].pool() != graphs[1][0].pool()


# ============================================================================================== several streams
def test_fork_join_capture():
    xd = rand(48)
    x = dev(xd)
    s = other_stream()
    s2 = other_stream(s)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        a = x * 2
        s2.wait_stream(s)
        with mt.cuda.stream(s2):
            assert mt.cuda.is_current_stream_capturing()
            b = a + 1
            b2 = b.sum()
        c = a * 3
        s.wait_stream(s2)
        d = b * c + b2
    assert not mt.cuda.is_current_stream_capturing()
    g.replay()
    a_ = xd * 2
    b_ = a_ + 1
    close(values(d), b_ * (a_ * 3) + b_.sum(), rtol=1e-4, atol=1e-3)
    x.copy_(mt.tensor(xd * -1))
    g.replay()
    a_ = -xd * 2
    b_ = a_ + 1
    close(values(d), b_ * (a_ * 3) + b_.sum(), rtol=1e-4, atol=1e-3)
    # the forked stream is an ordinary stream again
    with mt.cuda.stream(s2):
        assert not mt.cuda.is_current_stream_capturing()
    eager_check_on(s2)


def test_fork_join_by_events():
    xd = rand(48)
    x = dev(xd)
    s = other_stream()
    s2 = other_stream(s)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        a = x + 1
        forked = mt.cuda.Event()
        forked.record()
        s2.wait_event(forked)
        with mt.cuda.stream(s2):
            b = a * a
            joined = mt.cuda.Event()
            joined.record()
        s.wait_event(joined)
        c = b - a
    g.replay()
    close(values(c), (xd + 1) ** 2 - (xd + 1), rtol=1e-5)
    eager_check_on(s2)


def test_nested_fork_join_with_random_ops_on_a_joined_stream():
    xd = rand(64)
    x = dev(xd)
    s = other_stream()
    s2 = other_stream(s)
    s3 = other_stream(s, s2)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        a = x * 2
        s2.wait_stream(s)
        with mt.cuda.stream(s2):
            noise = mt.rand(64, device=DEV)
            b = a + noise
            s3.wait_stream(s2)
            with mt.cuda.stream(s3):
                assert mt.cuda.is_current_stream_capturing()
                c = b * 3
            s2.wait_stream(s3)
            d = c - noise
        s.wait_stream(s2)
        e = d + 1
    draws = []
    for _ in range(2):
        g.replay()
        n = values(noise)
        assert 0 <= n.min() and n.max() < 1
        close(values(e), (xd * 2 + n) * 3 - n + 1, rtol=1e-5, atol=1e-5)
        draws.append(n)
    assert not np.any(draws[0] == draws[1])


def test_waiting_for_another_captures_event_is_refused():
    xd = rand(16)
    x = dev(xd)
    s1 = other_stream()
    s2 = other_stream(s1)
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with capturing(g1, s1, capture_error_mode="relaxed"), capturing(g2, s2, capture_error_mode="relaxed"):
        with mt.cuda.stream(s1):
            a = x + 1
            e1 = mt.cuda.Event()
            e1.record()
        with pytest.raises(RuntimeError):
            s2.wait_event(e1)
        with mt.cuda.stream(s2):
            b = x * 4
    g1.replay()
    g2.replay()
    close(values(a), xd + 1)
    close(values(b), xd * 4)


def test_ending_a_capture_while_another_global_capture_is_underway():
    """Instantiating a graph is an unsafe call, which CUDA refuses while another "global" capture is underway
    (invalidating that capture); minitensor instantiates in the relaxed mode, so both captures end and replay."""
    xd = rand(16)
    x = dev(xd)
    s1 = other_stream()
    s2 = other_stream(s1)
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with mt.cuda.stream(s1):
        g1.capture_begin()
        a = x * 2
    try:
        with mt.cuda.stream(s2):
            g2.capture_begin()
            b = x * 3
            g2.capture_end()
        with mt.cuda.stream(s1):
            a2 = a + 1  # the first capture goes on
    except BaseException:
        with mt.cuda.stream(s1):
            g1.abort_capture()
        raise
    with mt.cuda.stream(s1):
        g1.capture_end()
    g1.replay()
    close(values(a2), xd * 2 + 1)
    g2.replay()
    close(values(b), xd * 3)
    eager_check_on(s2)


def test_unjoined_fork_fails_capture_end():
    xd = rand(16)
    x = dev(xd)
    s = other_stream()
    s2 = other_stream(s)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.stream(s):
        g.capture_begin()
        try:
            a = x * 2
            s2.wait_stream(s)
            with mt.cuda.stream(s2):
                b = a + 1
        except BaseException:
            g.abort_capture()
            raise
        with pytest.raises(mt.cuda.CudaError) as info:
            g.capture_end()
        assert info.value.code == 904  # CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        assert not mt.cuda.is_current_stream_capturing()
    with mt.cuda.stream(s2):
        assert not mt.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    del a, b
    eager_check_on(s)
    eager_check_on(s2)
    eager_check_on(None)
    mt.cuda.synchronize()
    # both streams capture again
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2, stream=s):
        s2.wait_stream(s)
        with mt.cuda.stream(s2):
            out = x - 1
        s.wait_stream(s2)
    g2.replay()
    close(values(out), xd - 1)


def test_uncaptured_stream_runs_eagerly_during_a_capture():
    xd = rand(16)
    x = dev(xd)
    (x + 1)
    s = other_stream()
    side = other_stream(s)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        y = x * 2
        with mt.cuda.stream(side):
            assert not mt.cuda.is_current_stream_capturing()
            eager = x + 1  # not captured: runs now
    side.synchronize()
    close(values(eager), xd + 1)
    g.replay()
    close(values(y), xd * 2)


# ============================================================================================== make_graphed_callables
def test_make_graphed_callables_single():
    def fn(a, b):
        return (a * b + 1).sum(dim=0)

    ad, bd = rand(5, 6), rand(5, 6)
    sa, sb = dev(ad), dev(bd)
    graphed = mt.cuda.make_graphed_callables(fn, (sa, sb))
    close(values(sa), ad)  # warm-up and capture leave the sample inputs as they were
    a1, b1 = rand(5, 6), rand(5, 6)
    out1 = graphed(dev(a1), dev(b1))
    close(values(out1), (a1 * b1 + 1).sum(axis=0), rtol=1e-4)
    close(values(out1), values(fn(dev(a1), dev(b1))), rtol=1e-6)
    close(values(sa), a1)  # arguments are copied into the static inputs
    close(values(sb), b1)
    a2, b2 = rand(5, 6), rand(5, 6)
    out2 = graphed(dev(a2), dev(b2))
    assert out2 is out1
    close(values(out2), (a2 * b2 + 1).sum(axis=0), rtol=1e-4)
    # passing the static inputs themselves
    sa.mul_(2)
    out3 = graphed(sa, sb)
    assert out3 is out1
    close(values(out3), (2 * a2 * b2 + 1).sum(axis=0), rtol=1e-4)


def test_make_graphed_callables_several():
    def f1(a):
        return a * 2, a.max()

    def f2(a, b):
        return mt.where(a > b, a, b) - 1

    ad, bd = rand(20), rand(20)
    g1, g2 = mt.cuda.make_graphed_callables((f1, f2), ((dev(ad),), (dev(ad), dev(bd))), num_warmup_iters=1)
    x1, x2 = rand(20), rand(20)
    d, m = g1(dev(x1))
    close(values(d), x1 * 2)
    close(values(m), x1.max())
    r = g2(d, dev(x2))
    close(values(r), np.maximum(x1 * 2, x2) - 1)
    d2, _ = g1(dev(x2))
    assert d2 is d
    close(values(d), x2 * 2)
    with pytest.raises(TypeError):
        g2(dev(x1))


# ============================================================================================== kernels, devices
def test_factories_in_a_capture():
    """Tensors made on the device inside a capture: their values come from the replay."""
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        z = mt.zeros(3, 4, device=DEV)
        o = mt.ones(5, dtype=mt.int32, device=DEV)
        f = mt.full((2, 2), 7.5, device=DEV)
        fl = mt.full_like(z, -1)
    g.replay()
    np.testing.assert_array_equal(values(z), np.zeros((3, 4), np.float32))
    np.testing.assert_array_equal(values(o), np.ones(5, np.int32))
    np.testing.assert_array_equal(values(f), np.full((2, 2), 7.5, np.float32))
    np.testing.assert_array_equal(values(fl), -np.ones((3, 4), np.float32))


def test_arange_is_refused_in_a_capture_and_the_capture_goes_on():
    """arange computes its values on the host (docs/API.md, Gaps): its copy is refused, the capture stays valid."""
    x = dev(np.arange(6, dtype=np.float32))
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        with pytest.raises(mt.cuda.CudaError, match="operation not permitted when stream is capturing"):
            mt.arange(10, device=DEV)
        y = x * 2
    g.replay()
    np.testing.assert_array_equal(values(y), np.arange(6, dtype=np.float32) * 2)


def test_kernel_first_used_inside_a_capture():
    """Ops and dtypes no other test of this file uses: their kernels are compiled or loaded in the capture."""
    ad = (np.random.permutation(600)[:21] - 300).reshape(3, 7).astype(np.int16)  # no ties for argmin
    bd = np.random.randint(1, 9, (7, 3)).astype(np.int16).T
    cd = np.random.randint(0, 255, 21).astype(np.uint8)
    a, b, c = dev(ad), dev(np.ascontiguousarray(bd.T)).t(), dev(cd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        fd = a // b
        rem = a % b
        xo = (c ^ 0x5A).bitwise_not()
        mn = a.min(dim=1)
    g.replay()
    np.testing.assert_array_equal(values(fd), ad // bd)
    np.testing.assert_array_equal(values(rem), ad % bd)
    np.testing.assert_array_equal(values(xo), ~(cd ^ np.uint8(0x5A)))
    np.testing.assert_array_equal(values(mn.values), ad.min(axis=1))
    np.testing.assert_array_equal(values(mn.indices), ad.argmin(axis=1))


TWO_DEVICES_SCRIPT = """
    import numpy as np
    import minitensor as mt

    def values(t):
        return t.cpu().numpy()

    xd = np.random.rand(32).astype(np.float32) + 0.5
    x0 = mt.tensor(xd, device="cuda:0")
    with mt.cuda.device(1):
        x1 = mt.tensor(xd, device="cuda:1")
        g = mt.cuda.CUDAGraph()
        with mt.cuda.graph(g) as ctx:
            assert ctx.capture_stream.device == mt.device("cuda:1")
            out = x1 * 2 + 1
            noise = mt.rand(64, device="cuda:1")
            total = out.sum()
        assert out.device == mt.device("cuda:1")
        pool_segments = [s for s in mt.cuda.memory_snapshot() if s["segment_pool_id"] == g.pool()]
        assert pool_segments and all(s["device"] == 1 for s in pool_segments), pool_segments
    assert mt.cuda.current_device() == 0
    g.replay()  # from device 0: the graph replays on its own device
    mt.cuda.synchronize(1)
    assert np.allclose(values(out), xd * 2 + 1)
    assert np.allclose(values(total), (xd * 2 + 1).sum(), rtol=1e-4)
    n1 = values(noise)
    with mt.cuda.device(1):
        x1.copy_(mt.tensor(xd * 3))
        g.replay()
    mt.cuda.synchronize(1)
    assert np.allclose(values(out), xd * 6 + 1)
    assert not np.any(values(noise) == n1) and 0 <= n1.min() and n1.max() < 1
    # device 0 captures and replays meanwhile
    g0 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g0):
        out0 = x0 - 1
    g0.replay()
    assert np.allclose(values(out0), xd - 1)
    assert out0.device == mt.device("cuda:0")
    g.reset()
    del out, noise, total
    mt.cuda.empty_cache()
    assert not [s for s in mt.cuda.memory_snapshot() if s["device"] == 1 and s["segment_pool_id"] != (0, 0)]

    # a MemPool of device 1: only that device's allocations go to it
    with mt.cuda.device(1):
        pool = mt.cuda.MemPool()
    try:
        mt.cuda.use_mem_pool(pool, device=0)
        raise AssertionError("use_mem_pool accepted another device")
    except ValueError:
        pass
    with mt.cuda.use_mem_pool(pool):
        on1 = mt.empty(1000, device="cuda:1")
        on0 = mt.empty(1000, device="cuda:0")
    def pool_of(t):
        return next((s["device"], s["segment_pool_id"]) for s in mt.cuda.memory_snapshot()
                    if s["address"] <= t.data_ptr() < s["address"] + s["total_size"])
    assert pool_of(on1) == (1, pool.id), pool_of(on1)
    assert pool_of(on0) == (0, (0, 0)), pool_of(on0)
    print("ok")
"""


def test_graph_on_second_simulated_device():
    out = run_python(TWO_DEVICES_SCRIPT, {"MINITENSOR_BACKEND": "sim", "MINITENSOR_SIM_DEVICES": "2"})
    assert out.split() == ["ok"]


def test_graph_on_second_device_here():
    if mt.cuda.device_count() < 2:
        pytest.skip("one cuda device: the second device runs on the two-device simulator")
    out = run_python(TWO_DEVICES_SCRIPT, {"MINITENSOR_BACKEND": mt.cuda.backend()})
    assert out.split() == ["ok"]
