"""Expandable segments (allocator/expandable.py) against a fake driver with virtual memory: growth by pages at
the lowest room, unmapping on empty_cache, the out-of-memory retry and garbage collection, record_stream,
the memory fraction, settings changed at run time, snapshots and history entries, and a hypothesis state
machine: no overlap, every mapped byte in exactly one block, statistics equal to a recount, and nothing mapped
or reserved once everything is freed and the cache emptied. Rules from docs/allocator.md ("Expandable
segments"), checked with literal numbers."""
import collections

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minitensor.allocator import settings as alloc_settings
from minitensor.allocator.device import DeviceCachingAllocator
from minitensor.allocator.block import UNMAPPED
from minitensor.allocator.history import History
from minitensor.base.errors import OutOfMemoryError
from test_allocator_policy import GiB, KiB, MiB, S1, S2, FakeDriver, _recount

EXPANDABLE = "expandable_segments:True"
PAGE = 2 * MiB  # the fake driver's granularity, and the small pool's page
LARGE_PAGE = 20 * MiB


class VmmDriver(FakeDriver):
    """FakeDriver with CUDA's virtual memory calls: reservations from the same bump pointer as segments, pages
    charged to the capacity when mapped, and every misuse an AssertionError."""

    def __init__(self, capacity=1 << 40):
        super().__init__(capacity)
        self.reserved = {}  # reservation address -> size
        self.pages = set()  # mapped granules
        self.allocations = {}  # each mapped page (its own physical allocation): address -> size

    def vmm_granularity(self, device):
        return PAGE

    def vmm_reserve(self, device, nbytes):
        assert nbytes > 0 and nbytes % PAGE == 0
        ptr = self.next_ptr
        self.next_ptr += nbytes + 64 * MiB
        self.reserved[ptr] = nbytes
        self.calls.append(("reserve", nbytes))
        return ptr

    def _pages(self, ptr, nbytes):
        assert nbytes > 0 and ptr % PAGE == 0 and nbytes % PAGE == 0, (ptr, nbytes)
        assert any(base <= ptr and ptr + nbytes <= base + n for base, n in self.reserved.items())
        return set(range(ptr, ptr + nbytes, PAGE))

    def vmm_map(self, device, ptr, nbytes, page):
        pages = self._pages(ptr, nbytes)
        assert not pages & self.pages, "mapped twice"
        assert page % PAGE == 0 and nbytes % page == 0
        if self.used + nbytes > self.capacity:
            raise OutOfMemoryError("fake device full")
        self.pages |= pages
        self.allocations.update((at, page) for at in range(ptr, ptr + nbytes, page))
        self.used += nbytes
        self.calls.append(("map", nbytes))

    def vmm_unmap(self, device, ptr, nbytes):
        pages = self._pages(ptr, nbytes)
        assert pages <= self.pages, "unmapping unmapped pages"
        at = ptr
        while at < ptr + nbytes:
            at += self.allocations.pop(at)  # a KeyError: part of a page
        assert at == ptr + nbytes, "part of a page"
        self.pages -= pages
        self.used -= nbytes
        self.calls.append(("unmap", nbytes))

    def vmm_release(self, device, ptr, nbytes):
        assert not self._pages(ptr, nbytes) & self.pages, "released with pages mapped"
        assert self.reserved.pop(ptr) == nbytes
        self.calls.append(("release", nbytes))


def make(capacity=1 * GiB, conf=EXPANDABLE):
    driver = VmmDriver(capacity)
    return driver, DeviceCachingAllocator(driver, 0, alloc_settings.parse(conf))


def reserved(a):
    return a.memory_stats()["reserved_bytes.all.current"]


def check(a, driver):
    """The invariants of any moment: see ExpandableMachine.state_is_consistent."""
    snapshot = a.snapshot()
    spans, recount = [], collections.Counter()
    mapped = 0
    for seg in snapshot:
        pool = "small_pool" if seg["segment_type"] == "small" else "large_pool"
        at = seg["address"]
        for b in seg["blocks"]:  # every byte of a segment in exactly one block
            assert b["address"] == at
            at += b["size"]
            if b["state"] != "inactive":
                spans.append((b["address"], b["size"]))
            for key, n in _recount(b, len(seg["blocks"]) > 1 and not seg["is_expandable"]):
                recount[key, pool] += n
        assert at == seg["address"] + seg["total_size"]
        if seg["is_expandable"]:
            pages = set(range(seg["address"], at, PAGE))
            assert seg["address"] % PAGE == 0 and at % PAGE == 0 and pages <= driver.pages
            mapped += seg["total_size"]
        else:
            assert driver.live[seg["address"]] == seg["total_size"]
            recount["segment", pool] += 1
        recount["reserved_bytes", pool] += seg["total_size"]
    assert mapped == len(driver.pages) * PAGE, "every mapped page in a segment of the snapshot"
    spans.sort()
    assert all(p + n <= q for (p, n), (q, _) in zip(spans, spans[1:]))  # live blocks never overlap
    stats = a.memory_stats()
    for name in ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                 "active_bytes", "inactive_split_bytes", "requested_bytes"):
        for pool in ("small_pool", "large_pool"):
            assert stats[f"{name}.{pool}.current"] == recount[name, pool], (name, pool)
    assert stats["reserved_bytes.all.current"] == driver.used


# ============================================================================================== the policy
def test_growth_maps_pages_and_tiles_one_range():
    driver, a = make()
    x = a.alloc(3 * MiB, 0)  # large pool: one 20 MiB page
    y = a.alloc(5 * MiB, 0)
    assert (x.ptr + 3 * MiB, reserved(a)) == (y.ptr, LARGE_PAGE)
    z = a.alloc(50 * MiB, 0)  # from 8 MiB, the free 12 MiB left mapped and two more pages, right above
    assert z.ptr == y.ptr + 5 * MiB and reserved(a) == 3 * LARGE_PAGE
    assert driver.calls == [("reserve", 1160 * MiB), ("map", LARGE_PAGE), ("map", 2 * LARGE_PAGE)]  # 9/8 GiB
    a.alloc(1000, 0)  # the small pool has its own segment, of 2 MiB pages
    assert reserved(a) == 3 * LARGE_PAGE + PAGE and driver.calls[-2:] == [("reserve", 1152 * MiB), ("map", PAGE)]
    snap = a.snapshot()
    assert [(s["segment_type"], s["total_size"], s["is_expandable"]) for s in snap] == [
        ("large", 3 * LARGE_PAGE, True), ("small", PAGE, True)]
    stats = a.memory_stats()
    assert (stats["segment.all.current"], stats["num_device_alloc"], stats["inactive_split.all.current"]) == (0, 3, 0)
    check(a, driver)


def test_growing_batches_reuse_the_range_where_segments_fragment():
    """Each step allocates slightly larger tensors than the last and frees the old ones: the default allocator
    keeps adding segments the new sizes no longer fit, an expandable segment maps only the difference."""
    peaks = {}
    for conf in ("", EXPANDABLE):
        driver, a = make(capacity=8 * GiB, conf=conf)
        live = []
        for step in range(12):
            new = [a.alloc((12 + step) * MiB + 37 * KiB, 0) for _ in range(4)]
            for block in live:
                a.free(block)
            live = new
            check(a, driver)
        stats = a.memory_stats()
        peaks[conf] = stats["reserved_bytes.all.peak"] / stats["allocated_bytes.all.peak"]
    assert peaks[EXPANDABLE] < 1.6 < 2.0 < peaks[""]


def test_free_run_below_unmapped_pages_is_grown_in_place():
    driver, a = make()
    x = a.alloc(15 * MiB, 0)
    a.free(x)
    y = a.alloc(30 * MiB, 0)  # the free 20 MiB page plus one more page, from the same address
    assert y.ptr == x.ptr and reserved(a) == 2 * LARGE_PAGE
    check(a, driver)


def test_empty_cache_unmaps_free_pages_and_gives_back_an_empty_segment():
    driver, a = make()
    x = a.alloc(30 * MiB, 0)
    keep = a.alloc(50 * MiB, 0)  # pages 1 to 4 (from 30 MiB to 80 MiB)
    a.free(x)
    a.empty_cache()  # page 0 (0-20 MiB) is free: unmapped; page 1 (20-40) holds the kept block's start
    assert reserved(a) == 3 * LARGE_PAGE and ("unmap", LARGE_PAGE) in driver.calls
    check(a, driver)
    a.free(keep)
    a.empty_cache()
    assert reserved(a) == 0 and driver.pages == set() and driver.reserved == {}
    assert a.snapshot() == [] and a.memory_stats()["num_device_free"] == 2
    z = a.alloc(MiB * 2, 0)  # a new segment
    assert reserved(a) == LARGE_PAGE and len(driver.reserved) == 1
    a.free(z)


def test_pages_of_a_block_another_stream_uses_stay_mapped():
    driver, a = make()
    x = a.alloc(30 * MiB, 0)
    a.record_stream(x, S1)
    driver.busy(S1)
    a.free(x)
    a.empty_cache()  # empty_cache waits for the stream's events (the fake driver completes them)
    assert reserved(a) == 0
    y = a.alloc(30 * MiB, 0)
    a.record_stream(y, S1)
    driver.busy(S1)
    a.free(y)
    a.alloc(1 * MiB, S2)  # an allocation polls the pending events: S1 is still busy, the pages stay
    assert a.snapshot()[0]["blocks"][0]["state"] == "active_pending_free"
    check(a, driver)


def test_out_of_memory_unmaps_cached_pages_then_retries():
    driver, a = make(capacity=100 * MiB)
    x = a.alloc(60 * MiB, 0)
    a.free(x)
    y = a.alloc(70 * MiB, S1)  # another stream's segment: the 60 MiB cached on stream 0 are unmapped first
    stats = a.memory_stats()
    assert stats["num_alloc_retries"] == 1 and reserved(a) == 80 * MiB
    with pytest.raises(OutOfMemoryError, match="CUDA out of memory. Tried to allocate 40.00 MiB"):
        a.alloc(40 * MiB, S1)
    assert a.memory_stats()["num_ooms"] == 1
    check(a, driver)
    a.free(y)


def test_memory_fraction_bounds_the_mapped_pages():
    driver, a = make(capacity=1 * GiB)
    a.set_memory_fraction(0.1, 1 * GiB)  # 102.4 MiB: five 20 MiB pages
    x = a.alloc(100 * MiB, 0)
    with pytest.raises(OutOfMemoryError, match="102.40 MiB allowed"):
        a.alloc(10 * MiB, 0)
    assert reserved(a) == 100 * MiB
    check(a, driver)
    a.free(x)


def test_garbage_collection_unmaps_old_free_pages():
    driver, a = make(capacity=1 * GiB, conf=EXPANDABLE + ",garbage_collection_threshold:0.5")
    a.set_memory_fraction(0.5, 1 * GiB)
    blocks = [a.alloc(100 * MiB, 0) for _ in range(4)]
    for block in blocks:
        a.free(block)
    a.alloc(200 * MiB, S1)  # over the threshold: the cached pages on stream 0 go first
    assert ("unmap", 400 * MiB) in driver.calls
    check(a, driver)


def test_switching_at_run_time_affects_new_growth_only():
    driver, a = make(conf="")
    x = a.alloc(3 * MiB, 0)  # a 20 MiB segment
    a.configure(alloc_settings.parse(EXPANDABLE))
    y = a.alloc(5 * MiB, 0)  # fits the old segment's free part
    assert y.ptr == x.ptr + 3 * MiB and driver.reserved == {}
    z = a.alloc(30 * MiB, 0)  # a miss: grows an expandable segment
    assert len(driver.reserved) == 1 and [s["is_expandable"] for s in a.snapshot()] == [False, True]
    a.configure(alloc_settings.parse(""))
    a.free(z)
    w = a.alloc(30 * MiB, 0)  # off: no new allocation goes into an expandable segment (torch's rule)
    assert w.ptr != z.ptr and [s["is_expandable"] for s in a.snapshot()] == [False, True, False]
    a.configure(alloc_settings.parse(EXPANDABLE))
    v = a.alloc(30 * MiB, 0)  # on again: its free block is used
    assert v.ptr == z.ptr
    check(a, driver)


def test_best_fit_keeps_growth_room_for_last():
    """torch's get_free_block: a free block with unmapped pages above it counts as that much bigger, so a fit
    elsewhere is taken first, and growth stays at the top."""
    driver, a = make()
    low = a.alloc(8 * MiB, 0)
    keep = a.alloc(6 * MiB, 0)  # 14 MiB of the first 20 MiB page: 6 MiB free above, then unmapped pages
    a.free(low)  # an 8 MiB fit below a mapped block
    x = a.alloc(5 * MiB, 0)  # the best fit is the 6 MiB at the top, but it can grow to 1160 MiB
    assert x.ptr == low.ptr
    y = a.alloc(5 * MiB, 0)  # the top one is the only fit now
    assert y.ptr == keep.ptr + 6 * MiB
    check(a, driver)


def _growth_room_layout(allocator_type, x_mib):
    """[2][big 30, freed][2][x][the rest of the second 20 MiB page, free][unmapped]: x, with unmapped pages close
    above it, and `big`, a free fit elsewhere."""
    driver = VmmDriver(1 * GiB)
    a = allocator_type(driver, 0, alloc_settings.parse(EXPANDABLE))
    blocks = [a.alloc(n * MiB, 0) for n in (2, 30, 2, x_mib)]
    a.free(blocks[1])
    a.memory_stats()  # completes the free: big is cached
    return a, driver, blocks[1].ptr, blocks[3]


@pytest.mark.parametrize("allocator_type", [DeviceCachingAllocator, "Unhurried"])
def test_shortcuts_keep_growth_room_for_last(allocator_type):
    """The exact-size bin and the victim handed out again (device.py's shortcuts) take torch's choice too: a
    block with unmapped pages above it only when no other block fits (the other fits here is `big`)."""
    allocator_type = Unhurried if allocator_type == "Unhurried" else allocator_type
    a, driver, big, x = _growth_room_layout(allocator_type, 6)  # x fills the second page: unmapped pages above
    assert x.next.state == UNMAPPED
    a.free(x)
    a.memory_stats()  # completes the free: x is cached, an exact-size bin of its own
    assert a.alloc(6 * MiB, 0).ptr == big
    a, driver, big, x = _growth_room_layout(allocator_type, 6)
    a.free(x)
    assert a.alloc(6 * MiB, 0).ptr == big  # the victim x, alone, can grow: big first
    a, driver, big, x = _growth_room_layout(allocator_type, 5)  # 1 MiB free above x, then unmapped pages
    a.free(x)
    assert a.alloc(5 * MiB, 0).ptr == big  # the victim x, merged with the free 1 MiB, can grow: big first
    check(a, driver)


def test_history_records_maps_and_unmaps():
    driver, a = make()
    a.record_history(History())
    x = a.alloc(30 * MiB, 0)
    a.free(x)
    a.empty_cache()
    _, trace = a.history_snapshot()
    assert [(e["action"], e["size"]) for e in trace] == [
        ("segment_map", 2 * LARGE_PAGE), ("alloc", 30 * MiB), ("free_requested", 30 * MiB),
        ("free_completed", 30 * MiB), ("segment_unmap", 2 * LARGE_PAGE), ("snapshot", 0)]


# ============================================================================================== state machine
SIZES = st.one_of(st.integers(1, 4 * KiB), st.sampled_from([512, 64 * KiB, MiB, MiB + 1]),
                  st.integers(MiB + 1, 24 * MiB), st.sampled_from([20 * MiB, 41 * MiB, 60 * MiB]))
STREAMS = st.sampled_from([0, 0, S1, S2])
CONFS = st.sampled_from([EXPANDABLE, EXPANDABLE, "", EXPANDABLE + ",max_split_size_mb:40",
                         EXPANDABLE + ",roundup_power2_divisions:4"])


class Unhurried(DeviceCachingAllocator):
    """The allocator without its shortcuts (the victim handed out again, the exact-size bin): every request takes
    the general path, which the shortcuts must agree with."""

    def _set_plain(self):
        super()._set_plain()
        self._plain = False


class ExpandableMachine(RuleBasedStateMachine):
    """Random sequences through an allocator with expandable segments and through the same allocator without its
    shortcuts: the invariants of `check` after every step, and both give the same blocks, statistics and driver
    calls (the default allocator's own model is test_allocator_policy's AllocatorMachine)."""

    def __init__(self):
        super().__init__()
        self.drivers = (VmmDriver(300 * MiB), VmmDriver(300 * MiB))
        self.a = DeviceCachingAllocator(self.drivers[0], 0, alloc_settings.parse(EXPANDABLE))
        self.b = Unhurried(self.drivers[1], 0, alloc_settings.parse(EXPANDABLE))
        self.live = []  # (block of a, block of b)

    def both(self, call, *args):
        return getattr(self.a, call)(*args), getattr(self.b, call)(*args)

    @rule(nbytes=SIZES, stream=STREAMS)
    def alloc(self, nbytes, stream):
        try:
            block = self.a.alloc(nbytes, stream)
        except OutOfMemoryError:
            with pytest.raises(OutOfMemoryError):
                self.b.alloc(nbytes, stream)
            return
        self.live.append((block, self.b.alloc(nbytes, stream)))
        assert self.live[-1][0].ptr == self.live[-1][1].ptr

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1 << 20), again=st.booleans())
    def free(self, i, again):
        block, other = self.live.pop(i % len(self.live))
        nbytes, stream = block.requested, block.stream
        self.a.free(block)
        self.b.free(other)
        if again:  # the hot loop's free-then-allocate
            self.alloc(nbytes, stream)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def record_stream(self, data, stream):
        block, other = self.live[data.draw(st.integers(0, len(self.live) - 1))]
        self.a.record_stream(block, stream)
        self.b.record_stream(other, stream)

    @rule(stream=STREAMS, finish=st.booleans())
    def stream_work(self, stream, finish):
        for driver in self.drivers:
            (driver.finish if finish else driver.busy)(stream)

    @rule()
    def empty_cache(self):
        self.both("empty_cache")

    @rule(conf=CONFS)
    def configure(self, conf):
        self.both("configure", alloc_settings.parse(conf))

    @rule(fraction=st.sampled_from([0.3, 0.6, 1.0]))
    def memory_fraction(self, fraction):
        self.both("set_memory_fraction", fraction, self.drivers[0].capacity)

    @invariant()
    def state_is_consistent(self):
        check(self.a, self.drivers[0])
        assert self.a.memory_stats() == self.b.memory_stats()
        assert self.drivers[0].calls == self.drivers[1].calls

    def teardown(self):
        for block, other in self.live:
            self.a.free(block)
            self.b.free(other)
        for driver in self.drivers:
            driver.finished.update({s: driver.queued[s] for s in driver.queued})
        self.both("empty_cache")
        for a, driver in ((self.a, self.drivers[0]), (self.b, self.drivers[1])):
            assert reserved(a) == 0 and a.snapshot() == []
            assert driver.used == 0 and driver.pages == set() and driver.reserved == {}


ExpandableMachine.TestCase.settings = hsettings(max_examples=60, stateful_step_count=40, deadline=None,
                                                suppress_health_check=[HealthCheck.too_slow])
TestExpandableMachine = ExpandableMachine.TestCase
