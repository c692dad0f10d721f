"""The allocator's side of CUDA graphs and of mt.cuda.MemPool, on the "cuda" device: which pool a capture's
allocations come from (memory_snapshot()'s "segment_pool_id"), reuse inside a private pool, pools shared by
graphs, memory_stats()/memory_reserved()/memory_allocated() through capture, replay, reset and release, failed
captures giving their pool back, record_stream during a capture, and use_mem_pool.

Counts are taken relative to the state at the start of each test, so that what other tests keep alive does
not matter. Tensors are small: on the simulator every kernel program runs in Triton's interpreter.
"""
import gc
import threading

import numpy as np
import pytest

import minitensor as mt
from graph_helpers import DEV, capturing, close, dev, other_stream, rand, values
from helpers import run_python

pytestmark = pytest.mark.usefixtures("clean_cuda_state")

GENERAL = (0, 0)


def segment_of(ptr):
    """memory_snapshot()'s segment holding address `ptr`."""
    found = [s for s in mt.cuda.memory_snapshot() if s["address"] <= ptr < s["address"] + s["total_size"]]
    assert len(found) == 1, (hex(ptr), found)
    return found[0]


def pool_of(t):
    return segment_of(t.data_ptr())["segment_pool_id"]


def block_state(ptr):
    return next(b["state"] for b in segment_of(ptr)["blocks"] if b["address"] == ptr)


def private_segments(pool=None):
    """(address, size, pool id) of the segments of private pools (of `pool` alone if given)."""
    return sorted((s["address"], s["total_size"], s["segment_pool_id"]) for s in mt.cuda.memory_snapshot()
                  if s["segment_pool_id"] != GENERAL and (pool is None or s["segment_pool_id"] == pool))


def live_private_blocks():
    """Blocks handed out from private pools, counted as torch's test_cudagraph_trees does."""
    return sum(1 for s in mt.cuda.memory_snapshot() if s["segment_pool_id"] != GENERAL
               for b in s["blocks"] if b["state"] == "active_allocated")


def all_segments():
    return sorted((s["address"], s["total_size"], s["segment_pool_id"]) for s in mt.cuda.memory_snapshot())


# ============================================================================================== which pool
def test_capture_allocations_come_from_the_graphs_private_pool():
    xd = rand(256)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g) as ctx:
        y = x * 2
        big = mt.empty(300_000, device=DEV)  # > 1 MiB: the large pool
        big.fill_(1.5)
        assert mt.cuda.memory_allocated() >= 300_000 * 4
    pool = g.pool()
    assert isinstance(pool, tuple) and len(pool) == 2 and pool != GENERAL
    assert pool[0] > 0 and pool[1] == 0  # a capture's own pool: torch's (n, 0)
    assert pool_of(y) == pool
    assert pool_of(big) == pool
    assert segment_of(big.data_ptr())["segment_type"] == "large"
    assert segment_of(y.data_ptr())["segment_type"] == "small"
    assert pool_of(x) == GENERAL
    # after the capture, allocations on the capture's stream and on others come from the general cache again
    with mt.cuda.stream(ctx.capture_stream):
        w = x * 3
    v = x * 4
    assert pool_of(w) == GENERAL and pool_of(v) == GENERAL
    g.replay()
    close(values(y), xd * 2)
    assert np.all(values(big) == 1.5)
    close(values(w), xd * 3)


def test_joined_stream_allocations_come_from_the_pool():
    xd = rand(64)
    x = dev(xd)
    s = other_stream()
    s2 = other_stream(s)
    s3 = other_stream(s, s2)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        a = x + 1
        s2.wait_stream(s)
        with mt.cuda.stream(s2):
            b = a * 2
        with mt.cuda.stream(s3):  # not joined: eager, general cache
            c = x * 5
        s.wait_stream(s2)
    assert pool_of(a) == g.pool() and pool_of(b) == g.pool()
    assert pool_of(c) == GENERAL
    s3.synchronize()
    close(values(c), xd * 5)
    g.replay()
    close(values(b), (xd + 1) * 2)


def test_two_concurrent_captures_use_their_own_pools():
    xd = rand(64)
    x = dev(xd)
    s1 = other_stream()
    s2 = other_stream(s1)
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with capturing(g1, s1, capture_error_mode="relaxed"), capturing(g2, s2, capture_error_mode="relaxed"):
        with mt.cuda.stream(s1):
            a = x * 2
        with mt.cuda.stream(s2):
            b = x * 3
        with mt.cuda.stream(s1):
            a2 = a + 1
    assert g1.pool() != g2.pool()
    assert pool_of(a) == pool_of(a2) == g1.pool()
    assert pool_of(b) == g2.pool()
    g2.replay()
    g1.replay()
    close(values(a2), xd * 2 + 1)
    close(values(b), xd * 3)


# ============================================================================================== reuse in a pool
def test_general_block_freed_in_capture_is_not_given_to_the_capture():
    """A block of the general cache freed during a capture goes back to the general cache: the capture's next
    allocation of that size comes from its pool, and eager tensors that get the block later are not
    overwritten by replays."""
    xd = rand(1024)
    x = dev(xd)
    s = other_stream()
    with mt.cuda.stream(s):
        pre = x * 1
    pre_ptr = pre.data_ptr()
    assert pool_of(pre) == GENERAL
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, stream=s):
        del pre
        y = x * 2
        assert y.data_ptr() != pre_ptr
    assert pool_of(y) == g.pool()
    with mt.cuda.stream(s):
        later = mt.full((1024,), 4.0, device=DEV)
        assert later.data_ptr() == pre_ptr  # the general cache's block, reused eagerly
        g.replay()
        g.replay()
    s.synchronize()
    np.testing.assert_array_equal(values(later), np.full(1024, 4.0, np.float32))
    close(values(y), xd * 2)


def test_block_freed_in_capture_is_reused_only_inside_the_pool():
    xd = rand(1024)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g) as ctx:
        t = x * 2
        freed = t.data_ptr()
        del t
        u = x * 3  # same size, same stream: the block just freed
        assert u.data_ptr() == freed
        t2 = x + 1
        freed2 = t2.data_ptr()
        del t2
    assert block_state(freed2) == "inactive"
    assert segment_of(freed2)["segment_pool_id"] == g.pool()
    # the pool's free block is not for eager allocations, on the capture's stream or on others
    with mt.cuda.stream(ctx.capture_stream):
        e1 = mt.empty(1024, device=DEV)
    e2 = mt.empty(1024, device=DEV)
    e3 = x * 7
    for e in (e1, e2, e3):
        assert e.data_ptr() != freed2
        assert pool_of(e) == GENERAL
    g.replay()
    close(values(u), xd * 3)
    close(values(e3), xd * 7)


def test_two_graphs_share_a_pool_and_chain():
    xd = rand(128)
    x = dev(xd)
    g1 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1):
        o1 = x * 2 + 1
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2, pool=g1.pool()):
        o2 = o1 * o1 - x
    assert g2.pool() == g1.pool()
    assert pool_of(o1) == pool_of(o2) == g1.pool()
    assert len(private_segments(g1.pool())) >= 1
    for data in (xd, rand(128), rand(128)):
        x.copy_(mt.tensor(data))
        g1.replay()
        g2.replay()
        close(values(o1), data * 2 + 1)
        close(values(o2), (data * 2 + 1) ** 2 - data, rtol=1e-5, atol=1e-4)


def test_graphs_sharing_a_pool_reuse_blocks_freed_in_an_earlier_capture():
    xd = rand(1024)
    x = dev(xd)
    g1 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1):
        t = x * 2
        freed = t.data_ptr()
        out1 = t + 1
        del t
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2, pool=g1.pool()):
        out2 = x * 3
    assert out2.data_ptr() == freed
    g3 = mt.cuda.CUDAGraph()  # a pool of its own: nothing of g1's
    with mt.cuda.graph(g3):
        out3 = x * 4
    assert out3.data_ptr() != freed and pool_of(out3) == g3.pool() != g1.pool()
    for g in (g1, g2, g3):
        g.replay()
    close(values(out1), xd * 2 + 1)
    close(values(out2), xd * 3)
    close(values(out3), xd * 4)


def test_graph_pool_handle_shared_by_two_graphs():
    xd = rand(128)
    x = dev(xd)
    handle = mt.cuda.graph_pool_handle()
    assert isinstance(handle, tuple) and len(handle) == 2 and handle != GENERAL
    assert handle[0] == 0 and handle[1] > 0  # torch's (0, n)
    assert mt.cuda.graph_pool_handle() != handle
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1, pool=handle):
        o1 = x.sum()
    with mt.cuda.graph(g2, pool=handle):
        o2 = x - o1
    assert g1.pool() == g2.pool() == handle
    assert pool_of(o1) == pool_of(o2) == handle
    g1.replay()
    g2.replay()
    close(values(o2), xd - xd.sum(), rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError):
        with mt.cuda.graph(mt.cuda.CUDAGraph(), pool="not a pool"):
            pass
    assert not mt.cuda.is_current_stream_capturing()


# ============================================================================================== statistics
def test_memory_accounting_through_capture_replay_reset_and_release():
    xd, bd = rand(1000), rand(1000)
    x, b = dev(xd), dev(bd)
    mt.cuda.empty_cache()
    reserved0, allocated0 = mt.cuda.memory_reserved(), mt.cuda.memory_allocated()
    segments0, private0 = all_segments(), private_segments()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        y = x
        for _ in range(4):
            y = y + b  # allocating chain: each step frees the one before
    out = y
    del y
    pool = g.pool()
    assert len(private_segments(pool)) >= 1
    assert mt.cuda.memory_reserved() > reserved0
    assert mt.cuda.memory_allocated() == allocated0 + 4096  # only the output is live
    assert [s for s in all_segments() if s[2] == GENERAL] == [s for s in segments0 if s[2] == GENERAL]

    stats1 = mt.cuda.memory_stats()
    reserved1, allocated1, segments1 = mt.cuda.memory_reserved(), mt.cuda.memory_allocated(), all_segments()
    for k in range(5):
        g.replay()
    mt.cuda.synchronize()
    stats2 = mt.cuda.memory_stats()
    for key in ("num_device_alloc", "num_device_free", "allocation.all.allocated", "allocation.all.current",
                "segment.all.current", "allocated_bytes.all.allocated", "reserved_bytes.all.current"):
        assert stats2[key] == stats1[key], key
    assert (mt.cuda.memory_reserved(), mt.cuda.memory_allocated(), all_segments()) == \
           (reserved1, allocated1, segments1)
    close(values(out), xd + 4 * bd, rtol=1e-5, atol=1e-5)

    # reset: the graph is gone, its pool's segment stays while the output lives
    g.reset()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        g.replay()
    assert mt.cuda.memory_reserved() == reserved1
    mt.cuda.empty_cache()
    assert segment_of(out.data_ptr())["segment_pool_id"] == pool
    assert mt.cuda.memory_reserved() == reserved1
    close(values(out), xd + 4 * bd, rtol=1e-5, atol=1e-5)
    del out
    assert mt.cuda.memory_allocated() == allocated0
    mt.cuda.empty_cache()
    assert mt.cuda.memory_reserved() == reserved0
    assert private_segments() == private0
    assert all_segments() == segments0


def test_random_graph_replays_allocate_nothing():
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        r = mt.randn(512, device=DEV)
        s = (r * 2).sum()
    g.replay()
    mt.cuda.synchronize()
    before = mt.cuda.memory_stats()
    reserved = mt.cuda.memory_reserved()
    seen = set()
    for _ in range(4):
        g.replay()
        seen.add(float(values(s)))
    after = mt.cuda.memory_stats()
    assert len(seen) == 4
    assert mt.cuda.memory_reserved() == reserved
    # the replays' host copies (values) allocate nothing on the device either
    for key in ("num_device_alloc", "allocation.all.current", "segment.all.current"):
        assert after[key] == before[key], key


def test_pool_freed_when_the_graph_is_deleted_and_outputs_freed():
    x = dev(rand(1000))
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        tmp = x * 2
        out = tmp + 1
        del tmp
    g.replay()
    pool = g.pool()
    del out  # the graph still holds its pool
    mt.cuda.empty_cache()
    assert len(private_segments(pool)) >= 1
    assert mt.cuda.memory_reserved() > reserved0
    del g
    gc.collect()
    mt.cuda.empty_cache()
    assert private_segments(pool) == []
    assert private_segments() == private0
    assert mt.cuda.memory_reserved() == reserved0


def test_shared_pool_lives_while_any_of_its_graphs_does():
    xd = rand(1000)
    x = dev(xd)
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1):
        a = x + 1
    with mt.cuda.graph(g2, pool=g1.pool()):
        b = a * 2
    pool = g1.pool()
    g1.replay()
    g2.replay()
    close(values(b), (xd + 1) * 2)
    g1.reset()
    del a  # g1 is gone with its output; g2 still reads that memory
    mt.cuda.empty_cache()
    assert len(private_segments(pool)) >= 1
    g2.replay()
    close(values(b), (xd + 1) * 2)
    g2.reset()
    mt.cuda.empty_cache()
    assert len(private_segments(pool)) >= 1  # b lives
    del b
    _check_no_pool_left(reserved0, private0)


def test_live_blocks_in_private_pools_across_recordings():
    xd = rand(64)
    x = dev(xd)
    base = live_private_blocks()
    g1 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1):
        tmp = x * 3
        a1, b1 = tmp + 1, tmp - 1
        del tmp
    assert live_private_blocks() == base + 2
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2):
        c2, d2, e2 = x + 2, x * x, x.sum()
    assert live_private_blocks() == base + 5
    g3 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g3, pool=g1.pool()):
        f3 = a1 * b1
    assert live_private_blocks() == base + 6
    del b1
    assert live_private_blocks() == base + 5
    g1.replay()
    g3.replay()
    close(values(f3), (xd * 3 + 1) * (xd * 3 - 1), rtol=1e-5, atol=1e-4)
    g1.reset()
    assert live_private_blocks() == base + 5
    del a1
    assert live_private_blocks() == base + 4
    for _ in range(2):
        g2.replay()
    assert live_private_blocks() == base + 4
    del c2, d2, e2
    g2.reset()
    mt.cuda.empty_cache()
    assert live_private_blocks() == base + 1
    del f3, g3
    gc.collect()
    mt.cuda.empty_cache()
    assert live_private_blocks() == base


def test_a_kept_graph_context_keeps_neither_the_graph_nor_its_pool():
    """`with mt.cuda.graph(g) as ctx` (for ctx.capture_stream; torch's gives None): once the block ends the
    context lets go of the graph and of `pool=`, so deleting two graphs sharing a pool and their outputs gives
    the pool's segment back while `ctx` lives on (before, ctx.cuda_graph kept the pool in use, 2 MiB reserved)."""
    xd = rand(1000)
    x = dev(xd)
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1) as ctx:
        a = x + 1
    with mt.cuda.graph(g2, pool=g1.pool(), stream=ctx.capture_stream) as ctx:
        b = a * 2
    g1.replay()
    g2.replay()
    close(values(b), (xd + 1) * 2)
    assert len(private_segments(g1.pool())) == 1
    del g1, g2, a, b
    gc.collect()
    mt.cuda.synchronize()
    mt.cuda.empty_cache()
    assert private_segments() == private0
    assert mt.cuda.memory_reserved() == reserved0
    # a MemPool given as pool= is not kept either
    mempool = mt.cuda.MemPool()
    g3 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g3, pool=mempool) as ctx:
        c = x * 3
    g3.replay()
    close(values(c), xd * 3)
    del g3, c, mempool
    gc.collect()
    mt.cuda.synchronize()
    mt.cuda.empty_cache()
    assert private_segments() == private0
    assert mt.cuda.memory_reserved() == reserved0
    assert ctx.capture_stream is not None
    with pytest.raises(RuntimeError, match="captured its block already"):
        with ctx:
            pass
    assert not mt.cuda.is_current_stream_capturing()


# ============================================================================================== failed captures
def _check_no_pool_left(reserved0, private0):
    gc.collect()
    mt.cuda.empty_cache()
    assert private_segments() == private0
    assert mt.cuda.memory_reserved() == reserved0


def test_exception_in_capture_gives_the_pool_back():
    xd = rand(256)
    x = dev(xd)
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    g = mt.cuda.CUDAGraph()
    with pytest.raises(KeyError):
        with mt.cuda.graph(g) as ctx:
            y = x * 2
            big = mt.empty(300_000, device=DEV)
            pool = g.pool()
            raise KeyError("boom")
    assert not mt.cuda.is_current_stream_capturing()
    assert pool_of(y) == pool and pool_of(big) == pool
    with mt.cuda.stream(ctx.capture_stream):
        z = x + 1
        assert pool_of(z) == GENERAL
        close(values(z), xd + 1)
    del y, big, z
    _check_no_pool_left(reserved0, private0)


def test_illegal_call_in_capture_gives_the_pool_back():
    x = dev(rand(256))
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    g = mt.cuda.CUDAGraph()
    with pytest.raises(mt.cuda.CudaError, match="operation not permitted when stream is capturing"):
        with mt.cuda.graph(g):
            y = x * 2
            mt.cuda.empty_cache()
    assert not mt.cuda.is_current_stream_capturing()
    assert len(private_segments()) > len(private0)  # y still lives
    del y
    _check_no_pool_left(reserved0, private0)


def test_unjoined_fork_gives_the_pool_back():
    xd = rand(256)
    x = dev(xd)
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    s = other_stream()
    s2 = other_stream(s)
    g = mt.cuda.CUDAGraph()
    with pytest.raises(mt.cuda.CudaError):
        with mt.cuda.graph(g, stream=s):
            y = x * 2
            s2.wait_stream(s)
            with mt.cuda.stream(s2):
                z = y + 1
    assert not mt.cuda.is_current_stream_capturing()
    with mt.cuda.stream(s2):
        w = x - 1
    assert pool_of(w) == GENERAL
    s2.synchronize()
    close(values(w), xd - 1)
    del y, z, w
    _check_no_pool_left(reserved0, private0)


def test_capture_after_a_failed_capture_reuses_nothing_of_its_pool():
    """A failed capture's pool is given up: the next capture gets a pool of its own and right values."""
    xd = rand(256)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with pytest.raises(RuntimeError):
        with mt.cuda.graph(g):
            y = x * 2
            raise RuntimeError("fail")
    failed_pool = pool_of(y)
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2):
        z = x * 3
    assert g2.pool() != failed_pool and pool_of(z) == g2.pool()
    g2.replay()
    close(values(z), xd * 3)


def test_out_of_memory_in_capture_aborts_it():
    xd = rand(256)
    x = dev(xd)
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    total = mt.cuda.get_device_properties().total_memory
    mt.cuda.set_per_process_memory_fraction((reserved0 + (8 << 20)) / total)
    try:
        g = mt.cuda.CUDAGraph()
        with pytest.raises(mt.OutOfMemoryError, match="allocated in private pools"):
            with mt.cuda.graph(g):
                y = x * 2
                mt.empty(64 << 20, dtype=mt.uint8, device=DEV)
        assert not mt.cuda.is_current_stream_capturing()
        assert values(y).shape == (256,)  # y (never computed: no replay) is still a usable tensor
    finally:
        mt.cuda.set_per_process_memory_fraction(1.0)
    del y
    _check_no_pool_left(reserved0, private0)
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2):
        z = x - 2
    g2.replay()
    close(values(z), xd - 2)


def test_freed_output_memory_is_not_handed_to_eager_tensors():
    """A graph's outputs freed while it lives go back to its pool: the replays keep writing there, so no eager
    tensor may get that memory."""
    xd = rand(1024)
    x = dev(xd)
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g) as ctx:
        out = x * 2
        keep = out + 1
        other = x + 3
    freed, freed2 = out.data_ptr(), other.data_ptr()
    del out
    with mt.cuda.stream(ctx.capture_stream):  # the stream and size the freed block was allocated for
        eager = [mt.empty(1024, device=DEV)]
        del other
        eager.append(mt.empty(1024, device=DEV))
        for e in eager:
            e.fill_(9.0)
    eager += [mt.full((1024,), 9.0, device=DEV) for _ in range(3)]
    assert all(e.data_ptr() not in (freed, freed2) and pool_of(e) == GENERAL for e in eager)
    ctx.capture_stream.synchronize()
    g.replay()
    g.replay()
    for e in eager:
        np.testing.assert_array_equal(values(e), np.full(1024, 9.0, np.float32))
    close(values(keep), xd * 2 + 1)


# ============================================================================================== record_stream
def test_record_stream_in_capture_defers_reuse_until_the_capture_ends():
    xd = rand(1024)
    x = dev(xd)
    s = other_stream()
    side = other_stream(s)
    g1 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g1, stream=s):
        t = x * 2
        recorded = t.data_ptr()
        t.record_stream(side)
        del t
        assert block_state(recorded) == "active_pending_free"
        u = x * 3
        assert u.data_ptr() != recorded  # not reused during the capture
        v = x + 1
        plain = v.data_ptr()
        del v
        w = x - 1
        assert w.data_ptr() == plain  # a block no other stream used is reused at once
    g1.replay()
    close(values(u), xd * 3)
    close(values(w), xd - 1)
    mt.cuda.synchronize()
    # after the capture the block goes back to its pool: a capture sharing the pool gets it again
    g2 = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g2, pool=g1.pool(), stream=s):
        r = x * 4
    assert block_state(recorded) == "active_allocated"
    assert r.data_ptr() == recorded
    g2.replay()
    close(values(r), xd * 4)


def test_two_captures_into_one_pool_end_in_either_order():
    """g2 captures into g1's pool while g1 still captures, and g1 ends first: g2's later allocations still come
    from the pool, and eager work on g1's stream from the general cache (g1's end closed g2's route before)."""
    xd = rand(256)
    x = dev(xd)
    x + 1  # the kernel loaded before the captures
    s1 = other_stream()
    s2 = other_stream(s1)
    g1, g2 = mt.cuda.CUDAGraph(), mt.cuda.CUDAGraph()
    with mt.cuda.stream(s1):
        g1.capture_begin(capture_error_mode="relaxed")
        a = x + 1
    try:
        with mt.cuda.stream(s2):
            g2.capture_begin(pool=g1.pool(), capture_error_mode="relaxed")
            b = x + 2
    except BaseException:
        g1.abort_capture()
        raise
    with mt.cuda.stream(s1):
        g1.capture_end()
    with mt.cuda.stream(s2):
        c = x + 3  # g2 still captures
    with mt.cuda.stream(s1):
        d = x + 4  # eager, after g1's capture
    with mt.cuda.stream(s2):
        g2.capture_end()
    assert [pool_of(t) for t in (a, b, c)] == [g1.pool()] * 3
    assert pool_of(d) == GENERAL
    g1.replay()
    g2.replay()
    close(values(a), xd + 1)
    close(values(c), xd + 3)
    close(values(d), xd + 4)


def test_use_mem_pool_contexts_of_two_threads_exit_in_either_order():
    pool = mt.cuda.MemPool()
    entered, first_left, done = threading.Event(), threading.Event(), threading.Event()
    pools = {}

    def second():
        with mt.cuda.use_mem_pool(pool):
            entered.set()
            first_left.wait(10)
            pools["second, inside"] = pool_of(mt.empty(1000, device=DEV))
        done.set()
    worker = threading.Thread(target=second)
    with mt.cuda.use_mem_pool(pool):
        worker.start()
        assert entered.wait(10)
    first_left.set()  # this thread's context exits first
    pools["first, outside"] = pool_of(mt.empty(1000, device=DEV))
    worker.join(10)
    assert done.is_set()
    assert pools == {"second, inside": pool.id, "first, outside": GENERAL}
    assert pool.use_count() == 1


def test_reset_while_a_replay_is_in_flight():
    """reset() right after a replay launched on a stream that has not run it yet: the memory the graph
    uses (its random generator's state, its pool) is not handed to new tensors before the replay is done."""
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        r = mt.rand(64, device=DEV)
        out = r * 0 + 1
    g.replay()
    mt.zeros(2, dtype=mt.int64, device=DEV)  # kernels loaded before the gate closes
    mt.zeros(64, device=DEV)
    mt.cuda.synchronize()
    side = other_stream()
    gate = mt.cuda.Gate()
    try:
        with mt.cuda.stream(side):
            gate.wait()
            g.replay()
        g.reset()
        del g
        gc.collect()
        small = [mt.zeros(2, dtype=mt.int64, device=DEV) for _ in range(8)]
        mt.cuda.default_stream().synchronize()  # the zeros are written before the replay runs
    finally:
        gate.open()
    mt.cuda.synchronize()
    for t in small:
        np.testing.assert_array_equal(values(t), [0, 0])
    np.testing.assert_array_equal(values(out), np.ones(64, np.float32))


# ============================================================================================== MemPool
def test_use_mem_pool_routes_this_threads_allocations():
    xd = rand(64)
    x = dev(xd)
    pool = mt.cuda.MemPool()
    assert isinstance(pool.id, tuple) and pool.id != GENERAL
    assert pool.use_count() == 1
    from_other_thread = []
    with mt.cuda.use_mem_pool(pool):
        assert pool.use_count() == 2
        a = mt.empty(1000, device=DEV)
        b = x * 2
        big = mt.empty(400_000, device=DEV)
        t = threading.Thread(target=lambda: from_other_thread.append(mt.empty(1000, device=DEV)))
        t.start()
        t.join()
    assert pool.use_count() == 1
    c = mt.empty(1000, device=DEV)
    for tensor in (a, b, big):
        assert pool_of(tensor) == pool.id
    assert pool_of(c) == GENERAL
    assert pool_of(from_other_thread[0]) == GENERAL
    snap = pool.snapshot()
    assert snap and all(s["segment_pool_id"] == pool.id for s in snap)
    addresses = {blk["address"] for s in snap for blk in s["blocks"] if blk["state"] == "active_allocated"}
    assert {a.data_ptr(), b.data_ptr(), big.data_ptr()} <= addresses
    assert c.data_ptr() not in addresses
    close(values(b), xd * 2)


def test_mem_pool_block_freed_outside_the_context_stays_in_the_pool():
    x = dev(rand(1000))
    pool = mt.cuda.MemPool()
    with mt.cuda.use_mem_pool(pool):
        a = mt.empty(1000, device=DEV)
    pa = a.data_ptr()
    del a
    b = mt.empty(1000, device=DEV)  # same size, same stream, right after the free
    c = x * 2
    assert pa not in (b.data_ptr(), c.data_ptr())
    assert pool_of(b) == pool_of(c) == GENERAL
    with mt.cuda.use_mem_pool(pool):
        d = mt.empty(1000, device=DEV)
    assert d.data_ptr() == pa


def test_mem_pool_deleted_while_its_blocks_live():
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    pool = mt.cuda.MemPool()
    pool_id = pool.id
    xd = rand(1000)
    with mt.cuda.use_mem_pool(pool):
        a = dev(xd) * 3
    del pool
    gc.collect()
    mt.cuda.empty_cache()
    assert pool_of(a) == pool_id
    close(values(a), xd * 3)
    del a
    mt.cuda.empty_cache()
    assert private_segments(pool_id) == []
    assert private_segments() == private0
    assert mt.cuda.memory_reserved() == reserved0


def test_mem_pool_memory_is_freed_after_the_pool_is_deleted():
    mt.cuda.empty_cache()
    reserved0, private0 = mt.cuda.memory_reserved(), private_segments()
    pool = mt.cuda.MemPool()
    with mt.cuda.use_mem_pool(pool):
        a = mt.empty(1000, device=DEV)
        big = mt.empty(400_000, device=DEV)
    first = a.data_ptr()
    del a, big
    mt.cuda.empty_cache()  # the pool is in use: its segments stay
    assert len(pool.snapshot()) >= 1
    assert mt.cuda.memory_reserved() > reserved0
    assert mt.cuda.memory_allocated() >= 0
    with mt.cuda.use_mem_pool(pool):
        again = mt.empty(1000, device=DEV)
    assert again.data_ptr() == first  # cached in the pool
    del again
    pool_id = pool.id
    del pool
    gc.collect()
    mt.cuda.empty_cache()
    assert private_segments(pool_id) == []
    assert private_segments() == private0
    assert mt.cuda.memory_reserved() == reserved0


def test_graph_captured_into_a_mem_pool():
    xd = rand(64)
    x = dev(xd)
    mt.cuda.empty_cache()
    reserved0 = mt.cuda.memory_reserved()
    pool = mt.cuda.MemPool()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g, pool=pool):
        assert pool.use_count() == 2
        out = x * 2 - 1
    assert g.pool() == pool.id
    assert pool_of(out) == pool.id
    assert pool.use_count() == 2  # the MemPool and the graph
    g.replay()
    close(values(out), xd * 2 - 1)
    g.reset()
    assert pool.use_count() == 1
    pool_id = pool.id
    del pool, out
    gc.collect()
    mt.cuda.empty_cache()
    assert private_segments(pool_id) == []
    assert mt.cuda.memory_reserved() == reserved0


def test_mem_pool_arguments():
    pool = mt.cuda.MemPool()
    assert pool.allocator is None
    with pytest.raises(NotImplementedError):
        mt.cuda.MemPool(allocator=object())
    assert pool.snapshot() == []  # nothing allocated in it yet


def test_graphs_and_pools_need_the_caching_allocator():
    """MINITENSOR_NO_CACHING=1 frees every block straight to the driver, during a capture too: a capture and a
    MemPool are refused, and eager work goes on."""
    out = run_python("""
        import minitensor as mt
        x = mt.ones(8, device="cuda")
        s = mt.cuda.Stream()
        with mt.cuda.stream(s):
            g = mt.cuda.CUDAGraph()
            try:
                g.capture_begin()
                print("capture: accepted")
                g.abort_capture()
            except RuntimeError as exc:
                print("capture:", "refused" if "caching allocator" in str(exc) else exc)
            print("capturing:", mt.cuda.is_current_stream_capturing())
            y = x * 2
        try:
            mt.cuda.MemPool()
            print("mempool: accepted")
        except RuntimeError as exc:
            print("mempool:", "refused" if "caching allocator" in str(exc) else exc)
        s.synchronize()
        print("eager:", y.cpu().numpy().tolist() == [2.0] * 8)
    """, {"MINITENSOR_NO_CACHING": "1"})
    assert out.splitlines() == ["capture: refused", "capturing: False", "mempool: refused", "eager: True"]


def test_use_mem_pool_argument_checks():
    with pytest.raises(TypeError):
        mt.cuda.use_mem_pool(mt.cuda.graph_pool_handle())
    pool = mt.cuda.MemPool()
    with pytest.raises(TypeError):
        with mt.cuda.use_mem_pool(object()):
            pass
    assert pool.use_count() == 1
    # an exception inside the context closes the route
    with pytest.raises(ValueError):
        with mt.cuda.use_mem_pool(pool):
            raise ValueError
    assert pool.use_count() == 1
    t = mt.empty(100, device=DEV)
    assert pool_of(t) == GENERAL
