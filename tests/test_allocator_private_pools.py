"""The device caching allocator's private pools (allocator/private_pools.py), against test_allocator_policy's fake
driver: routes of allocations to a pool, reuse inside a pool only, what a capture's route stops (event queries
and records, segment frees, empty_cache), a pool's lifetime through use counts and empty_cache, statistics and
the snapshot's invariants with pools in play.

Rules from docs/allocator.md ("Private pools"), checked with literal numbers. The FakeDriver hands out segments
from a bump pointer, so segments come in address order of their malloc.
"""
import collections
import random
import re
import threading
import types

import pytest

from minitensor.allocator import DeviceCachingAllocator
from minitensor.allocator import settings as alloc_settings
from minitensor.allocator.block import QUEUED
from minitensor.base.errors import CudaError, OutOfMemoryError
from test_allocator_policy import KiB, MiB, S1, S2, AllocatorMachine, FakeDriver

S3 = 0x3000
GENERAL = (0, 0)
P, Q = (1, 0), (0, 5)  # a graph's pool (graph_pool_handle-like) and a MemPool's


class EventLog(FakeDriver):
    """The fake driver, with its event calls logged in `event_calls` as (name, stream or event)."""

    def __init__(self, capacity=1 << 40):
        super().__init__(capacity)
        self.event_calls = []

    def event_record(self, event, stream):
        self.event_calls.append(("record", stream))
        super().event_record(event, stream)

    def event_query(self, event):
        self.event_calls.append(("query", event))
        return super().event_query(event)

    def event_synchronize(self, event):
        self.event_calls.append(("synchronize", event))
        super().event_synchronize(event)


def make(capacity=1 << 40, conf=""):
    driver = EventLog(capacity)
    return driver, DeviceCachingAllocator(driver, 0, alloc_settings.parse(conf))


def on(*streams):
    """A route's `matches` for a capture on these streams."""
    return frozenset(streams).__contains__


def segment_of(a, ptr):
    found = [s for s in a.snapshot() if s["address"] <= ptr < s["address"] + s["total_size"]]
    assert len(found) == 1, (hex(ptr), found)
    return found[0]


def pool_of(a, block):
    return segment_of(a, block.ptr)["segment_pool_id"]


def state_of(a, block):
    return next(b["state"] for b in segment_of(a, block.ptr)["blocks"] if b["address"] == block.ptr)


def segments(a, pool_id=None):
    """(address, total_size) of the segments of one pool (of all, with their pool id, when None)."""
    if pool_id is None:
        return [(s["address"], s["total_size"], s["segment_pool_id"]) for s in a.snapshot()]
    return [(s["address"], s["total_size"]) for s in a.snapshot() if s["segment_pool_id"] == pool_id]


def check(driver, a):
    """test_allocator_policy's invariants: no overlap, every segment byte in one block, every current statistic
    equals its recount from the snapshot, reserved equals the driver's bytes."""
    AllocatorMachine.state_is_consistent(types.SimpleNamespace(a=a, driver=driver))


# ============================================================================================== private pools
# --------------------------------------------------------------------------- which cache an allocation uses
def test_route_sends_matched_streams_to_the_pool():
    driver, a = make()
    g = a.alloc(4 * KiB, S1)
    a.free(g)  # a general cached block of the right size on S1
    a.begin_allocate_to_pool(P, on(S1), False)
    assert a.pool_use_count(P) == 1
    x = a.alloc(4 * KiB, S1)  # routed: not the general block, a new segment of the pool
    assert x.ptr != g.ptr and driver.calls == [("malloc", 2 * MiB), ("malloc", 2 * MiB)]
    y = a.alloc(4 * KiB, S2)  # not matched: the general cache (a new segment on S2)
    z = a.alloc(3 * MiB, S1)  # routed, large
    w = a.alloc(4 * KiB, 0)
    assert driver.calls[2:] == [("malloc", 2 * MiB), ("malloc", 20 * MiB), ("malloc", 2 * MiB)]
    assert [(s["address"], s["stream"], s["segment_type"], s["segment_pool_id"]) for s in a.snapshot()] == [
        (g.ptr, S1, "small", GENERAL), (x.ptr, S1, "small", P), (y.ptr, S2, "small", GENERAL),
        (z.ptr, S1, "large", P), (w.ptr, 0, "small", GENERAL)]
    a.end_allocate_to_pool(P)
    assert a.alloc(4 * KiB, S1).ptr == g.ptr  # the general cache kept its block
    assert a.pool_use_count(P) == 1  # the route's user stays until release_pool
    check(driver, a)


def test_newest_matching_route_wins():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1, S2), False)
    a.begin_allocate_to_pool(Q, on(S1), False)
    x, y = a.alloc(4 * KiB, S1), a.alloc(4 * KiB, S2)
    assert (pool_of(a, x), pool_of(a, y)) == (Q, P)
    a.end_allocate_to_pool(Q)
    assert pool_of(a, a.alloc(4 * KiB, S1)) == P
    check(driver, a)


def test_general_block_freed_during_a_route_goes_back_to_the_general_cache():
    driver, a = make()
    g = a.alloc(4 * KiB, S1)
    a.begin_allocate_to_pool(P, on(S1), True)
    a.free(g)
    x = a.alloc(4 * KiB, S1)  # routed: not g
    assert x.ptr != g.ptr and pool_of(a, x) == P and pool_of(a, g) == GENERAL
    a.end_allocate_to_pool(P)
    assert a.alloc(4 * KiB, S1).ptr == g.ptr
    check(driver, a)


# --------------------------------------------------------------------------- reuse inside a pool only
def test_block_freed_during_the_route_is_reused_in_its_pool_only():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(4 * KiB, S1)
    a.free(x)
    x2 = a.alloc(4 * KiB, S1)
    assert x2.ptr == x.ptr and driver.calls == [("malloc", 2 * MiB)]
    a.free(x2)
    a.end_allocate_to_pool(P)
    g = a.alloc(4 * KiB, S1)  # a general allocation on the same stream: not the pool's free block
    assert g.ptr != x.ptr and pool_of(a, g) == GENERAL
    assert driver.calls == [("malloc", 2 * MiB), ("malloc", 2 * MiB)]
    a.begin_allocate_to_pool(P, on(S1), True)  # the pool's next capture gets it again
    assert a.alloc(4 * KiB, S1).ptr == x.ptr
    assert len(driver.calls) == 2
    check(driver, a)


@pytest.mark.parametrize("nbytes", [4 * KiB, 20 * MiB])  # a split block (rejoins its free rest) / a whole segment
def test_victim_shortcut_never_hands_out_a_private_block(nbytes):
    """After the route closes, frees are queued without the lock again and the next allocation of the same size
    on the same stream may take the queued block as the "victim": never a private pool's."""
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(nbytes, S1)
    a.end_allocate_to_pool(P)
    a.free(x)
    assert x.state == QUEUED  # the lock-free free: the shortcut is live
    g = a.alloc(nbytes, S1)
    assert g.ptr != x.ptr and pool_of(a, g) == GENERAL and pool_of(a, x) == P
    assert state_of(a, x) == "inactive"
    for _ in range(2):  # a general block is still the victim, and repeats
        a.free(g)
        assert a.alloc(nbytes, S1) is g
    assert state_of(a, x) == "inactive"
    assert len([c for c in driver.calls if c[0] == "malloc"]) == 2
    check(driver, a)


def test_configure_during_a_route_keeps_the_shortcuts_off():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), False)
    a.configure(alloc_settings.parse(""))  # plain settings, but a route is open
    x = a.alloc(4 * KiB, S1)
    a.free(x)
    assert x.state != QUEUED and state_of(a, x) == "inactive"
    assert a.alloc(4 * KiB, S1).ptr == x.ptr
    a.end_allocate_to_pool(P)
    g = a.alloc(4 * KiB, S1)
    a.free(g)
    assert g.state == QUEUED  # the route closed: frees are queued again
    assert pool_of(a, g) == GENERAL
    check(driver, a)


def test_exact_size_shortcut_never_hands_out_a_private_block():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    x, keep = a.alloc(4 * KiB, S1), a.alloc(4 * KiB, S1)  # x: a free split block of exactly 4 KiB once freed
    a.free(x)
    a.end_allocate_to_pool(P)
    a.memory_stats()  # settled: x sits in the pool's 4 KiB bin
    g = a.alloc(4 * KiB, S1)
    assert g.ptr != x.ptr and pool_of(a, g) == GENERAL and keep.ptr == x.ptr + 4 * KiB
    check(driver, a)


def test_routes_sharing_a_pool_reuse_each_others_blocks():
    driver, a = make()
    # two graphs captured one after the other into one pool (torch: capture_begin(pool=g1.pool()))
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(4 * KiB, S1)
    out = a.alloc(3 * MiB, S1)  # the first graph's output, freed after its capture
    a.free(x)
    a.end_allocate_to_pool(P)
    a.free(out)
    a.begin_allocate_to_pool(P, on(S1), True)
    assert a.pool_use_count(P) == 2
    assert a.alloc(4 * KiB, S1).ptr == x.ptr
    assert a.alloc(3 * MiB, S1).ptr == out.ptr
    a.end_allocate_to_pool(P)
    assert driver.calls == [("malloc", 2 * MiB), ("malloc", 20 * MiB)]
    # two routes open at once to one pool: the newer one reuses what was freed under the older, and back
    a.begin_allocate_to_pool(P, on(S2), False)
    y = a.alloc(8 * KiB, S2)
    a.begin_allocate_to_pool(P, on(S1, S2), False)
    a.free(y)
    y2 = a.alloc(8 * KiB, S2)
    assert y2.ptr == y.ptr
    a.free(y2)
    a.end_allocate_to_pool(P)  # closes the newest route to P
    assert a.alloc(8 * KiB, S2).ptr == y.ptr
    # a route to another pool on the same stream gets none of P's free blocks
    a.begin_allocate_to_pool(Q, on(S1), False)
    q = a.alloc(4 * KiB, S1)
    assert q.ptr != x.ptr and pool_of(a, q) == Q
    assert a.pool_use_count(P) == 4 and a.pool_use_count(Q) == 1  # two captures, two routes: ends keep users
    check(driver, a)


def test_routes_sharing_a_pool_close_in_any_order():
    """Two captures into one pool at once (torch: capture_begin(pool=g1.pool()) while g1 captures) may end in
    either order: each end names its route and closes that one, so the capture still underway keeps allocating
    from the pool and the ended one's stream allocates from the general cache again (closing the newest route
    instead swapped them)."""
    driver, a = make()
    first, second = on(S1), on(S2)
    a.begin_allocate_to_pool(P, first, True)
    a.begin_allocate_to_pool(P, second, True)
    a.end_allocate_to_pool(P, first)  # the older capture ends first
    assert pool_of(a, a.alloc(4 * KiB, S2)) == P
    assert pool_of(a, a.alloc(4 * KiB, S1)) == GENERAL
    with pytest.raises(RuntimeError, match="no allocation is routed to pool .* by this route"):
        a.end_allocate_to_pool(P, first)
    a.end_allocate_to_pool(P, second)
    assert pool_of(a, a.alloc(4 * KiB, S2)) == GENERAL
    assert a.pool_use_count(P) == 2  # the ends keep the users until release_pool
    check(driver, a)


# --------------------------------------------------------------------------- what a capture stops
def test_capture_allocations_query_no_event():
    driver, a = make()
    b = a.alloc(4 * KiB, 0)
    driver.busy(S2)
    a.record_stream(b, S2)
    a.free(b)  # an event pends on S2
    assert driver.event_calls == [("record", S2)]
    a.begin_allocate_to_pool(P, on(S1), True)
    a.alloc(4 * KiB, S1)  # routed
    a.alloc(4 * KiB, 0)  # not routed: still no event query while a stream captures
    a.alloc(3 * MiB, S1)
    driver.finish(S2)
    a.alloc(512, S2)
    assert driver.event_calls == [("record", S2)]
    assert state_of(a, b) == "active_pending_free"
    a.end_allocate_to_pool(P)
    a.alloc(512, S3)  # the first allocation after the capture polls
    assert [name for name, _ in driver.event_calls] == ["record", "query"]
    assert state_of(a, b) == "inactive"
    check(driver, a)


def test_record_stream_free_during_capture_records_its_event_after_the_capture():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(4 * KiB, S1)
    driver.busy(S2)
    a.record_stream(x, S2)
    a.free(x)
    assert driver.event_calls == []  # no event recorded while a stream captures
    assert state_of(a, x) == "active_pending_free"
    s = a.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["active_bytes.all.current"] == 4 * KiB
    y = a.alloc(4 * KiB, S1)
    assert y.ptr == x.ptr + 4 * KiB  # x waits
    a.end_allocate_to_pool(P)
    assert driver.event_calls == [("record", S2)]
    driver.busy(S2)  # work queued after the event: not waited for
    a.alloc(512, 0)  # polls: S2 not done with x yet
    assert state_of(a, x) == "active_pending_free"
    driver.finished[S2] = 1  # S2 finished what was queued when the event was recorded
    a.alloc(512, 0)
    assert state_of(a, x) == "inactive" and pool_of(a, x) == P
    a.begin_allocate_to_pool(P, on(S1), True)
    assert a.alloc(4 * KiB, S1).ptr == x.ptr
    check(driver, a)


def test_deferred_events_wait_for_the_last_capture():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    a.begin_allocate_to_pool(Q, on(S3), True)
    x = a.alloc(4 * KiB, S1)
    a.record_stream(x, S2)
    a.free(x)
    a.end_allocate_to_pool(P)
    assert driver.event_calls == []  # Q still captures
    a.begin_allocate_to_pool(P, on(S1), False)  # a route that is no capture does not hold the events back ...
    a.end_allocate_to_pool(P)
    assert driver.event_calls == []  # ... nor does its end record them
    a.end_allocate_to_pool(Q)
    assert driver.event_calls == [("record", S2)]
    a.alloc(512, 0)  # S2 had no work queued: complete at the first poll
    assert state_of(a, x) == "inactive"
    check(driver, a)


def test_empty_cache_refused_while_capturing():
    driver, a = make()
    g = a.alloc(4 * KiB, 0)
    a.free(g)  # a cached segment empty_cache would give back
    a.begin_allocate_to_pool(P, on(S1), False)
    a.empty_cache()  # a route that is no capture (use_mem_pool) allows it
    assert driver.calls == [("malloc", 2 * MiB), ("free", 2 * MiB)]
    g = a.alloc(4 * KiB, 0)
    a.free(g)
    a.begin_allocate_to_pool(Q, on(S2), True)
    with pytest.raises(CudaError, match="operation not permitted when stream is capturing") as e:
        a.empty_cache()
    assert e.value.code == 900 and isinstance(e.value, RuntimeError)
    assert driver.calls[-1] == ("malloc", 2 * MiB) and driver.event_calls == []
    a.end_allocate_to_pool(Q)  # the last capture: P's route is none
    a.empty_cache()
    assert driver.calls[-1] == ("free", 2 * MiB)
    check(driver, a)


def test_out_of_memory_during_capture_frees_nothing():
    driver, a = make(capacity=64 * MiB)
    g = a.alloc(30 * MiB, 0)
    a.free(g)  # 30 MiB cached in the general cache: the ladder would free it
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(4 * KiB, S1)
    n = len(driver.calls)
    with pytest.raises(OutOfMemoryError) as e:
        a.alloc(40 * MiB, S1)  # 32 MiB used + 40 > 64
    assert driver.calls[n:] == [("malloc", 40 * MiB)]  # asked once, nothing freed
    assert driver.event_calls == []
    assert re.fullmatch(  # the private bytes themselves: test_out_of_memory_message_counts_private_free_bytes
        r"CUDA out of memory\. Tried to allocate 40\.00 MiB\. GPU 0 has a total capacity of 64\.00 MiB of which "
        r"32\.00 MiB is free\. Of the allocated memory 4\.00 KiB is allocated by minitensor, with [0-9.]+ [KM]iB "
        r"allocated in private pools \(e\.g\., CUDA Graphs\), and 32\.00 MiB is reserved by minitensor but "
        r"unallocated\. If reserved but unallocated memory is large try setting "
        r"MINITENSOR_ALLOC_CONF=expandable_segments:True to avoid fragmentation\.", str(e.value)), str(e.value)
    s = a.memory_stats()
    assert s["num_ooms"] == 1 and s["num_alloc_retries"] == 0 and s["num_sync_all_streams"] == 0
    with pytest.raises(OutOfMemoryError, match="allocated in private pools"):
        a.alloc(40 * MiB, S2)  # an allocation the route does not take is stopped the same way
    assert driver.calls[n:] == [("malloc", 40 * MiB)] * 2
    a.end_allocate_to_pool(P)
    y = a.alloc(40 * MiB, S1)  # after the capture the ladder frees the general 30 MiB, not the pool's (in use)
    assert driver.calls[n + 2:] == [("malloc", 40 * MiB), ("free", 30 * MiB), ("malloc", 40 * MiB)]
    assert pool_of(a, y) == GENERAL and segments(a, P) == [(x.ptr, 2 * MiB)]
    check(driver, a)


def test_out_of_memory_message_counts_private_free_bytes():
    """torch's message sums the cached (free) blocks of the private pools (CUDACachingAllocator.cpp, malloc's
    OOM branch: get_size_block over each graph pool's large_blocks and small_blocks), and leaves the phrase out
    when they hold none."""
    driver, a = make(capacity=64 * MiB)
    a.begin_allocate_to_pool(P, on(S1), True)
    a.alloc(3 * MiB, S1)  # a 20 MiB private segment: 17 MiB of it cached
    with pytest.raises(OutOfMemoryError) as e:
        a.alloc(80 * MiB, S1)
    assert "Of the allocated memory 3.00 MiB is allocated by minitensor, with 17.00 MiB allocated in private " \
           "pools (e.g., CUDA Graphs), and 17.00 MiB is reserved" in str(e.value), str(e.value)
    driver, a = make(capacity=64 * MiB)
    a.begin_allocate_to_pool(P, on(S1), True)
    a.alloc(20 * MiB, S1)  # a whole private segment handed out: nothing cached in the pool
    with pytest.raises(OutOfMemoryError) as e:
        a.alloc(80 * MiB, S1)
    assert "Of the allocated memory 20.00 MiB is allocated by minitensor, and 0 bytes is reserved" in str(e.value), \
        str(e.value)


def test_garbage_collection_waits_for_the_capture():
    driver, a = make(capacity=1024 * MiB, conf="garbage_collection_threshold:0.5")
    a.set_memory_fraction(0.5, 1024 * MiB)  # collect above 256 MiB reserved
    g = a.alloc(300 * MiB, 0)
    a.free(g)
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(100 * MiB, S1)
    assert driver.calls == [("malloc", 300 * MiB), ("malloc", 100 * MiB)]
    a.end_allocate_to_pool(P)
    a.alloc(100 * MiB, S2)  # now the old general block goes; the pool's segment is no candidate
    assert driver.calls[2:] == [("free", 300 * MiB), ("malloc", 100 * MiB)]
    assert segments(a, P) == [(x.ptr, 100 * MiB)]
    check(driver, a)


# --------------------------------------------------------------------------- lifetime
def test_released_pool_is_freed_by_empty_cache():
    driver, a = make()
    general = a.alloc(4 * KiB, 0)
    a.free(general)
    a.begin_allocate_to_pool(P, on(S1), True)
    x, y = a.alloc(4 * KiB, S1), a.alloc(3 * MiB, S1)
    a.free(x)
    a.free(y)
    a.end_allocate_to_pool(P)
    a.empty_cache()  # the graph still uses its pool: only the general segment goes
    assert driver.calls[-1] == ("free", 2 * MiB) and len(driver.calls) == 4
    assert segments(a, P) == [(x.ptr, 2 * MiB), (y.ptr, 20 * MiB)] and a.reserved_bytes() == 22 * MiB
    a.release_pool(P)
    assert a.pool_use_count(P) == 0
    assert segments(a, P) == [(x.ptr, 2 * MiB), (y.ptr, 20 * MiB)]  # release alone frees nothing
    a.empty_cache()
    assert driver.calls[4:] == [("free", 20 * MiB), ("free", 2 * MiB)]
    assert a.reserved_bytes() == 0 and a.snapshot() == [] and driver.used == 0
    assert a.pool_use_count(P) == 0
    s = a.memory_stats()
    assert s["num_device_free"] == 3 and s["segment.all.current"] == 0
    with pytest.raises(RuntimeError, match=r"pool \(1, 0\) is not in use"):
        a.release_pool(P)  # gone
    a.begin_allocate_to_pool(P, on(S1), True)  # the id again: a new pool, new segments
    z = a.alloc(4 * KiB, S1)
    assert pool_of(a, z) == P and a.pool_use_count(P) == 1 and driver.calls[-1] == ("malloc", 2 * MiB)
    check(driver, a)


def test_pool_in_use_keeps_its_segments():
    driver, a = make()
    a.create_pool(Q)  # a MemPool
    tid = threading.get_ident()
    a.begin_allocate_to_pool(Q, lambda s: threading.get_ident() == tid, False)  # use_mem_pool
    assert a.pool_use_count(Q) == 2
    x = a.alloc(4 * KiB, 0)
    a.free(x)
    a.end_allocate_to_pool(Q)
    a.release_pool(Q)
    assert a.pool_use_count(Q) == 1
    for _ in range(2):
        a.empty_cache()
        assert segments(a, Q) == [(x.ptr, 2 * MiB)] and driver.calls == [("malloc", 2 * MiB)]
    a.release_pool(Q)  # the MemPool dies
    a.empty_cache()
    assert driver.calls == [("malloc", 2 * MiB), ("free", 2 * MiB)] and a.snapshot() == []
    check(driver, a)


def test_freeable_pool_keeps_a_segment_with_a_live_block():
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    out = a.alloc(4 * KiB, S1)  # the graph's output, alive after the graph
    tmp = a.alloc(3 * MiB, S1)
    a.free(tmp)
    a.end_allocate_to_pool(P)
    a.release_pool(P)
    a.empty_cache()
    assert driver.calls == [("malloc", 2 * MiB), ("malloc", 20 * MiB), ("free", 20 * MiB)]
    assert segments(a, P) == [(out.ptr, 2 * MiB)] and a.reserved_bytes() == 2 * MiB
    a.free(out)  # back to its pool, whenever it is freed
    assert segments(a, P) == [(out.ptr, 2 * MiB)] and state_of(a, out) == "inactive"
    g = a.alloc(4 * KiB, S1)
    assert pool_of(a, g) == GENERAL and g.ptr != out.ptr
    a.free(g)
    a.empty_cache()
    assert driver.calls[3:] == [("malloc", 2 * MiB), ("free", 2 * MiB), ("free", 2 * MiB)]
    assert a.snapshot() == [] and driver.used == 0 and a.reserved_bytes() == 0
    check(driver, a)


def test_freed_pool_comes_back_in_use():
    """A freeable pool still holding a live block is the same pool when a graph uses its id again."""
    driver, a = make()
    a.begin_allocate_to_pool(P, on(S1), True)
    out = a.alloc(4 * KiB, S1)
    a.end_allocate_to_pool(P)
    a.release_pool(P)
    a.begin_allocate_to_pool(P, on(S1), True)
    assert a.pool_use_count(P) == 1
    a.free(out)
    assert a.alloc(4 * KiB, S1).ptr == out.ptr
    a.end_allocate_to_pool(P)
    a.empty_cache()  # in use again: kept
    assert segments(a, P) == [(out.ptr, 2 * MiB)]
    check(driver, a)


def test_use_counts():
    driver, a = make()
    assert a.pool_use_count(Q) == 0
    a.create_pool(Q)
    a.create_pool(Q)
    a.begin_allocate_to_pool(Q, on(S1), False)
    assert a.pool_use_count(Q) == 3
    a.end_allocate_to_pool(Q)
    assert a.pool_use_count(Q) == 3  # ending a route keeps its user
    for n in (2, 1, 0):
        a.release_pool(Q)
        assert a.pool_use_count(Q) == n
    with pytest.raises(RuntimeError, match=r"pool \(0, 5\) is not in use"):
        a.release_pool(Q)
    assert a.pool_use_count(Q) == 0 and a.pool_use_count(P) == 0
    a.empty_cache()
    a.create_pool(Q)  # gone and made again
    assert a.pool_use_count(Q) == 1
    assert driver.calls == []


def test_misuse_raises():
    driver, a = make()
    with pytest.raises(RuntimeError, match=r"pool \(7, 7\) is not in use"):
        a.release_pool((7, 7))
    with pytest.raises(RuntimeError, match=r"no allocation is routed to pool \(1, 0\)"):
        a.end_allocate_to_pool(P)
    a.begin_allocate_to_pool(P, on(S1), True)
    with pytest.raises(RuntimeError, match=r"no allocation is routed to pool \(0, 5\)"):
        a.end_allocate_to_pool(Q)
    with pytest.raises(RuntimeError, match=r"pool \(1, 0\) is released while allocations are still routed"):
        a.release_pool(P)  # its last user, with its route open
    assert a.pool_use_count(P) == 1
    a.end_allocate_to_pool(P)
    with pytest.raises(RuntimeError, match=r"no allocation is routed to pool \(1, 0\)"):
        a.end_allocate_to_pool(P)  # already closed
    assert a.pool_use_count(P) == 1
    a.release_pool(P)
    # nothing above left a capture underway
    a.empty_cache()
    x = a.alloc(4 * KiB, S1)
    assert pool_of(a, x) == GENERAL


# --------------------------------------------------------------------------- statistics
def test_statistics_count_private_segments():
    driver, a = make()
    g = a.alloc(1000, 0)
    a.begin_allocate_to_pool(P, on(S1), True)
    x = a.alloc(1000, S1)
    y = a.alloc(3 * MiB, S1)
    s = a.memory_stats()
    assert s["reserved_bytes.all.current"] == 24 * MiB and a.reserved_bytes() == 24 * MiB
    assert (s["segment.all.current"], s["segment.small_pool.current"], s["segment.large_pool.current"]) == (3, 2, 1)
    assert (s["reserved_bytes.small_pool.current"], s["reserved_bytes.large_pool.current"]) == (4 * MiB, 20 * MiB)
    assert s["allocated_bytes.all.current"] == 2048 + 3 * MiB and s["requested_bytes.all.current"] == 2000 + 3 * MiB
    assert s["inactive_split.all.current"] == 3 and s["num_device_alloc"] == 3
    assert a.allocated_bytes() == 2048 + 3 * MiB
    check(driver, a)
    a.record_stream(x, S2)
    driver.busy(S2)
    a.free(x)  # pending until the capture ends
    a.free(y)
    check(driver, a)
    assert a.memory_stats()["active_bytes.all.current"] == 2048
    a.end_allocate_to_pool(P)
    a.release_pool(P)
    check(driver, a)
    a.empty_cache()  # waits for S2, frees the pool's two segments; g's segment is split
    s = a.memory_stats()
    assert s["reserved_bytes.all.current"] == 2 * MiB and s["segment.all.current"] == 1
    assert s["reserved_bytes.all.peak"] == 24 * MiB and s["reserved_bytes.all.freed"] == 22 * MiB
    assert s["num_device_free"] == 2 and s["num_sync_all_streams"] == 1
    assert s["allocated_bytes.all.current"] == 1024 and s["active_bytes.all.current"] == 1024
    assert segments(a) == [(g.ptr, 2 * MiB, GENERAL)]
    check(driver, a)


# --------------------------------------------------------------------------- routes by thread (use_mem_pool)
def test_thread_route_leaves_other_threads_in_the_general_cache():
    driver, a = make()
    tid = threading.get_ident()
    a.create_pool(Q)
    a.begin_allocate_to_pool(Q, lambda s: threading.get_ident() == tid, False)
    mine = [a.alloc(4 * KiB, S1), a.alloc(4 * KiB, 0)]
    theirs = []

    def other_thread():
        theirs.append(a.alloc(4 * KiB, S1))
        a.free(mine[0])  # freed by another thread: back to Q all the same
        theirs.append(a.alloc(4 * KiB, S1))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert [pool_of(a, b) for b in mine] == [Q, Q]
    assert [pool_of(a, b) for b in theirs] == [GENERAL, GENERAL]
    assert theirs[1].ptr == theirs[0].ptr + 4 * KiB
    assert a.alloc(4 * KiB, S1).ptr == mine[0].ptr  # this thread reuses it in Q
    a.end_allocate_to_pool(Q)
    a.release_pool(Q)
    check(driver, a)


# --------------------------------------------------------------------------- random sequences
@pytest.mark.parametrize("seed", range(12))
def test_random_sequences_keep_pools_apart(seed):
    """Random allocations, frees, record_stream, stream progress, routes (captures or not) opening and closing,
    releases and empty_cache: every block handed out lies in a segment of the pool its route chose (the general
    cache without one) and of its stream, a capture never frees a segment nor queries or synchronizes an event,
    and the invariants hold after every step."""
    rng = random.Random(seed)
    driver, a = make(capacity=160 * MiB)
    streams = [0, S1, S2, S3]
    live = []  # (block, pool id, stream)
    routes = []  # (pool id, streams, capture), oldest first
    unreleased = collections.Counter()  # users that closed routes left (graphs alive), for release_pool
    sizes = [512, 4 * KiB, 4 * KiB, 64 * KiB, MiB + 1, 3 * MiB, 24 * MiB]
    for _ in range(200):
        capturing = any(capture for _, _, capture in routes)
        n, n_events = len(driver.calls), len(driver.event_calls)
        op = rng.choice(["alloc"] * 5 + ["free"] * 4 + ["record", "busy", "finish", "begin", "end", "release",
                                                          "empty"])
        if op == "alloc":
            stream, nbytes = rng.choice(streams), rng.choice(sizes)
            pool = next((p for p, accepted, _ in reversed(routes) if stream in accepted), GENERAL)
            try:
                block = a.alloc(nbytes, stream)
            except OutOfMemoryError:
                pass
            else:
                live.append((block, pool, stream))
        elif op == "free" and live:
            a.free(live.pop(rng.randrange(len(live)))[0])
        elif op == "record" and live:
            a.record_stream(rng.choice(live)[0], rng.choice(streams))
        elif op == "busy":
            driver.busy(rng.choice(streams))
        elif op == "finish":
            driver.finish(rng.choice(streams))
        elif op == "begin" and len(routes) < 3:
            pool_id = rng.choice([P, Q, (2, 0)])
            accepted = frozenset(rng.sample(streams[1:], rng.randint(1, 2)))
            capture = rng.random() < 0.6
            a.begin_allocate_to_pool(pool_id, accepted.__contains__, capture)
            routes.append((pool_id, accepted, capture))
        elif op == "end" and routes:
            pool_id = rng.choice(routes)[0]
            a.end_allocate_to_pool(pool_id)
            i = max(i for i, r in enumerate(routes) if r[0] == pool_id)
            routes.pop(i)
            unreleased[pool_id] += 1
        elif op == "release" and +unreleased:
            pool_id = rng.choice(sorted(+unreleased))
            a.release_pool(pool_id)
            unreleased[pool_id] -= 1
        elif op == "empty":
            if capturing:
                with pytest.raises(CudaError, match="operation not permitted when stream is capturing"):
                    a.empty_cache()
            else:
                a.empty_cache()
        if capturing:
            assert all(c[0] == "malloc" for c in driver.calls[n:]), (op, driver.calls[n:])
            assert all(c[0] == "record" for c in driver.event_calls[n_events:]) and not (
                op != "end" and driver.event_calls[n_events:]), (op, driver.event_calls[n_events:])
        check(driver, a)
        for block, pool, stream in live:
            seg = segment_of(a, block.ptr)
            assert (seg["segment_pool_id"], seg["stream"]) == (pool, stream), (op, block, pool, stream)
        for pool_id in (P, Q, (2, 0)):
            open_routes = sum(1 for r in routes if r[0] == pool_id)
            assert a.pool_use_count(pool_id) == open_routes + unreleased[pool_id]
    while routes:
        a.end_allocate_to_pool(routes.pop()[0])
    for block, _, _ in live:
        a.free(block)
    for stream in streams:
        driver.finish(stream)
    a.empty_cache()
    kept = {s["segment_pool_id"] for s in a.snapshot()}  # only pools still used by someone
    assert kept <= {p for p in (P, Q, (2, 0)) if a.pool_use_count(p)}
    for pool_id in (P, Q, (2, 0)):
        for _ in range(a.pool_use_count(pool_id)):
            a.release_pool(pool_id)
    a.empty_cache()
    assert a.snapshot() == [] and driver.used == 0 and a.reserved_bytes() == 0
    check(driver, a)
