"""The device caching allocator's policy, against a fake driver (no device needed, nothing simulated).

Unit tests check each rule of reference/allocator.md with literal numbers. A hypothesis state machine runs
random alloc/free/record_stream/stream-progress/empty_cache/settings sequences through the allocator and
through `Model`, torch's policy written plainly (scans, eager merges, no shortcuts), and checks after every
step: the same addresses, the same memory_stats() dict, and the invariants (no overlap, every segment byte in
exactly one block, stats equal a recomputation from the snapshot, reserved equals the driver's bytes).
"""
import collections
import itertools
import random
import threading

import pytest
from hypothesis import HealthCheck, settings as hsettings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minitensor.allocator import DeviceCachingAllocator, UncachedAllocator
from minitensor.allocator import settings as alloc_settings
from minitensor.allocator.sizes import format_size, round_size, segment_size
from minitensor.base.errors import OutOfMemoryError

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
S1, S2 = 0x1000, 0x2000  # two side streams; 0 is the default stream


class FakeDriver:
    """Segments from a bump pointer with gaps (no two segments touch), a capacity to run out of, and streams
    whose queued work finishes only when the test says so: an event completes once its stream has finished
    the work queued before it was recorded."""

    def __init__(self, capacity=1 << 40):
        self.capacity = capacity
        self.used = 0
        self.live = {}
        self.next_ptr = 1 << 40
        self.calls = []
        self.queued = collections.Counter()
        self.finished = collections.Counter()
        self.events = {}
        self.event_ids = itertools.count(1)
        self.device = 0

    def malloc(self, device, nbytes):
        self.calls.append(("malloc", nbytes))
        if self.used + nbytes > self.capacity:
            raise OutOfMemoryError("fake device full")
        ptr = self.next_ptr
        self.next_ptr += nbytes + 64 * MiB
        self.live[ptr] = nbytes
        self.used += nbytes
        return ptr

    def free(self, device, ptr):
        self.calls.append(("free", self.live[ptr]))
        self.used -= self.live.pop(ptr)

    def mem_get_info(self, device):
        return self.capacity - self.used, self.capacity

    def current_device(self):
        return self.device

    def set_device(self, device):
        self.device = device

    def event_create(self, device, enable_timing, blocking):
        event = next(self.event_ids)
        self.events[event] = None
        return event

    def event_record(self, event, stream):
        self.events[event] = (stream, self.queued[stream])

    def event_query(self, event):
        mark = self.events[event]
        return mark is None or self.finished[mark[0]] >= mark[1]

    def event_synchronize(self, event):
        mark = self.events[event]
        if mark is not None:
            self.finished[mark[0]] = max(self.finished[mark[0]], mark[1])

    def event_destroy(self, event):
        del self.events[event]

    # the test's hands on the streams
    def busy(self, stream):
        self.queued[stream] += 1

    def finish(self, stream):
        self.finished[stream] = self.queued[stream]


def make(capacity=1 << 40, conf=""):
    driver = FakeDriver(capacity)
    return driver, DeviceCachingAllocator(driver, 0, alloc_settings.parse(conf))


def blocks_of(a):
    """[(segment address, [(ptr, size, state)])] from the snapshot."""
    return [(s["address"], [(b["address"], b["size"], b["state"]) for b in s["blocks"]]) for s in a.snapshot()]


# ============================================================================================== sizes
def test_rounding():
    assert [round_size(n) for n in (1, 511, 512, 513, 1024, 1025)] == [512, 512, 512, 1024, 1024, 1536]
    four = (4,) * 16
    # torch rounds by divisions only above 512 * divisions bytes: 1200 stays on the 512 grid ...
    assert round_size(1200, four) == 1536
    # ... and from there on takes the next of N steps between powers of two
    assert round_size(5 * MiB + 1, four) == 6 * MiB
    assert round_size(4 * MiB, four) == 4 * MiB
    assert round_size(4 * MiB + 1, (8,) * 16) == 4 * MiB + 512 * KiB
    from minitensor.allocator.sizes import _roundup_power2_division
    assert _roundup_power2_division(1200, 4) == 1280


def test_segment_sizes():
    assert segment_size(512) == segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 512) == segment_size(10 * MiB - 512) == 20 * MiB
    assert segment_size(10 * MiB) == 10 * MiB
    assert segment_size(11 * MiB + 1) == 12 * MiB


def test_format_size():
    assert [format_size(n) for n in (0, 1024, 1025, MiB, MiB + 1, 2 * MiB, GiB, 80 * GiB + GiB // 4)] == \
        ["0 bytes", "1024 bytes", "1.00 KiB", "1024.00 KiB", "1.00 MiB", "2.00 MiB", "1024.00 MiB", "80.25 GiB"]
    assert format_size(800000000 * GiB) == "800000000.00 GiB"


# ============================================================================================== pools, reuse
def test_pools_and_segments():
    driver, a = make()
    small = a.alloc(1000, 0)
    assert small.size == 1024 and driver.calls == [("malloc", 2 * MiB)]
    large = a.alloc(MiB + 1, 0)
    assert large.size == MiB + 512 and driver.calls[-1] == ("malloc", 20 * MiB)
    huge = a.alloc(31 * MiB + 5, 0)
    assert driver.calls[-1] == ("malloc", 32 * MiB) and huge.size == 32 * MiB  # a rest under 1 MiB stays on it
    segs = {s["address"]: s["segment_type"] for s in a.snapshot()}
    assert sorted(segs.values()) == ["large", "large", "small"]


def test_best_fit_same_stream_lowest_address():
    driver, a = make()
    x = [a.alloc(4 * KiB, 0) for _ in range(6)]
    for i in (1, 3, 4):  # holes of 4K at 1 and 8K at 3-4
        a.free(x[i])
    a.empty_cache()  # settles everything; nothing unsplit to release
    assert a.alloc(4 * KiB, 0).ptr == x[1].ptr  # smallest hole that fits
    y = a.alloc(2 * KiB, 0)
    assert y.ptr == x[3].ptr  # the 8K hole, its low end
    other = a.alloc(2 * KiB, S1)  # another stream never sees stream 0's cache
    assert len(driver.calls) == 2 and driver.calls[-1] == ("malloc", 2 * MiB)
    assert not x[0].ptr <= other.ptr < x[0].ptr + 2 * MiB


def test_equal_sizes_lowest_address_first():
    driver, a = make()
    x = [a.alloc(4 * KiB, 0) for _ in range(5)]
    a.free(x[3])
    a.free(x[1])
    a.memory_stats()  # settle
    assert a.alloc(4 * KiB, 0).ptr == x[1].ptr
    assert a.alloc(4 * KiB, 0).ptr == x[3].ptr


def test_split_rules():
    driver, a = make()
    b = a.alloc(MiB, 0)  # small pool: 1 MiB of the 2 MiB segment, the rest cached
    assert [s for _, s, _ in blocks_of(a)[0][1]] == [MiB, MiB]
    a.free(b)
    c = a.alloc(MiB + 512, 0)  # large segment of 20 MiB: split, more than 1 MiB remains
    assert [s for _, s, _ in blocks_of(a)[1][1]] == [MiB + 512, 19 * MiB - 512]
    a.free(c)
    d = a.alloc(19 * MiB + 512, 0)  # from the 20 MiB block: 512 KiB would remain, not split
    assert d.size == 20 * MiB and d.ptr == c.ptr
    assert len(driver.calls) == 2


def test_free_merges_neighbours():
    driver, a = make()
    x = [a.alloc(8 * KiB, 0) for _ in range(3)]
    for b in (x[0], x[2], x[1]):
        a.free(b)
    assert blocks_of(a)[0][1] == [(x[0].ptr, 2 * MiB, "inactive")]
    a.empty_cache()
    assert a.snapshot() == [] and driver.live == {}


def test_max_split_size_oversize_blocks():
    driver, a = make(conf="max_split_size_mb:40")
    big = a.alloc(100 * MiB, 0)
    a.free(big)
    small = a.alloc(30 * MiB, 0)  # under max_split: an oversize block is never split for it
    assert small.ptr != big.ptr and driver.calls[-1] == ("malloc", 30 * MiB)
    a.free(small)
    near = a.alloc(90 * MiB, 0)  # oversize request within 20 MiB of the block: uses it whole
    assert near.ptr == big.ptr and near.size == 100 * MiB
    a.free(near)
    far = a.alloc(70 * MiB, 0)  # 30 MiB smaller: not used
    assert far.ptr != big.ptr
    stats = a.memory_stats()
    assert stats["max_split_size"] == 40 * MiB
    assert stats["oversize_segments.current"] == 2 and stats["oversize_allocations.current"] == 1
    assert make()[1].memory_stats()["max_split_size"] == -1


# ============================================================================================== record_stream
def test_record_stream_defers_reuse_until_events_complete():
    driver, a = make()
    b = a.alloc(4 * KiB, 0)
    driver.busy(S1)
    a.record_stream(b, S1)
    a.record_stream(b, 0)  # its own stream: nothing to wait for
    a.free(b)
    stats = a.memory_stats()
    assert stats["allocated_bytes.all.current"] == 0 and stats["active_bytes.all.current"] == 4 * KiB
    assert blocks_of(a)[0][1][0][2] == "active_pending_free"
    again = a.alloc(4 * KiB, 0)
    assert again.ptr != b.ptr
    driver.finish(S1)
    third = a.alloc(4 * KiB, 0)  # events are polled at the start of each allocation
    assert third.ptr == b.ptr
    assert a.memory_stats()["active_bytes.all.current"] == 8 * KiB


def test_events_polled_oldest_first_per_stream():
    driver, a = make()
    x = [a.alloc(4 * KiB, 0) for _ in range(3)]
    driver.busy(S1)
    a.record_stream(x[0], S1)
    a.free(x[0])
    driver.busy(S1)
    a.record_stream(x[1], S1)
    a.free(x[1])
    a.record_stream(x[2], S2)  # S2 has no queued work: complete at once, independent of S1
    a.free(x[2])
    assert a.alloc(64 * KiB, 0).ptr == x[2].ptr  # x[2] was cached (and merged) at this allocation
    states = [s for _, _, s in blocks_of(a)[0][1]]
    assert states[:2] == ["active_pending_free", "active_pending_free"]
    driver.finished[S1] = 1  # only the first S1 event is complete
    a.alloc(64 * KiB, 0)
    states = [s for _, _, s in blocks_of(a)[0][1]]
    assert states[:2] == ["inactive", "active_pending_free"]


def test_empty_cache_waits_for_pending_blocks():
    driver, a = make()
    b = a.alloc(4 * KiB, 0)
    driver.busy(S1)
    a.record_stream(b, S1)
    a.free(b)
    a.empty_cache()
    assert driver.finished[S1] == 1  # it synchronized the event
    assert a.snapshot() == [] and driver.live == {} and not driver.events
    assert a.memory_stats()["num_sync_all_streams"] == 1


def test_record_stream_events_on_the_allocator_device():
    driver, a = make()
    a.device = 1
    b = a.alloc(4 * KiB, 0)
    a.record_stream(b, S1)
    seen = []
    record = driver.event_record
    driver.event_record = lambda e, s: (seen.append(driver.device), record(e, s))
    a.free(b)
    assert seen == [1] and driver.device == 0


# ============================================================================================== out of memory
def test_oom_message_and_counters():
    driver, a = make(capacity=64 * MiB)
    keep = a.alloc(50 * MiB, 0)
    with pytest.raises(OutOfMemoryError) as e:
        a.alloc(20 * MiB, 0)
    assert str(e.value) == (
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which "
        "14.00 MiB is free. Of the allocated memory 50.00 MiB is allocated by minitensor, and 0 bytes is "
        "reserved by minitensor but unallocated. If reserved but unallocated memory is large try setting "
        "MINITENSOR_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")
    assert isinstance(e.value, RuntimeError)
    stats = a.memory_stats()
    assert stats["num_ooms"] == 1 and stats["num_alloc_retries"] == 1
    a.free(keep)
    assert a.alloc(20 * MiB, 0).size == 20 * MiB  # recovers: the cached 50 MiB is released on retry


def test_oom_retry_releases_cache_then_succeeds():
    driver, a = make(capacity=100 * MiB)
    x = a.alloc(60 * MiB, 0)
    a.free(x)
    y = a.alloc(70 * MiB, 0)  # 60 MiB cached + 70 > 100: release all unsplit cached blocks, retry
    assert driver.calls == [("malloc", 60 * MiB), ("malloc", 70 * MiB), ("free", 60 * MiB), ("malloc", 70 * MiB)]
    stats = a.memory_stats()
    assert stats["num_alloc_retries"] == 1 and stats["num_ooms"] == 0 and stats["num_device_free"] == 1
    assert y.size == 70 * MiB


def test_oom_retry_order_with_max_split():
    driver, a = make(capacity=200 * MiB, conf="max_split_size_mb:30")
    big = [a.alloc(n * MiB, 0) for n in (40, 50, 60)]
    small = a.alloc(MiB + 512, 0)  # a split 20 MiB segment: never released
    for b in big:
        a.free(b)
    a.alloc(45 * MiB, 0)  # the 50 MiB block fits within 20 MiB: reused, no driver call
    assert driver.calls[-1] == ("malloc", 20 * MiB)
    n = len(driver.calls)
    a.alloc(100 * MiB, 0)  # 200 - 170 reserved: release oversize blocks, largest first, until 100 MiB is covered
    assert driver.calls[n:] == [("malloc", 100 * MiB), ("free", 60 * MiB), ("free", 40 * MiB),
                                ("malloc", 100 * MiB)]
    assert a.memory_stats()["num_alloc_retries"] == 0
    assert small.size == MiB + 512


def test_1eb_guard_and_zero_bytes():
    driver, a = make()
    with pytest.raises(OutOfMemoryError, match=r"^CUDA out of memory\. Tried to allocate more than 1EB memory\.$"):
        a.alloc(1 << 60, 0)
    null = a.alloc(0, 0)
    assert null.ptr == 0 and null.size == 0
    a.free(null)
    a.record_stream(null, S1)
    assert driver.calls == [] and a.memory_stats()["num_ooms"] == 0
    with pytest.raises(ValueError, match="expected a size >= 0"):
        a.alloc(-1, 0)


def test_huge_request_reports_gib():
    driver, a = make(capacity=80 * GiB)
    with pytest.raises(OutOfMemoryError, match=r"Tried to allocate 800000000\.00 GiB\. GPU 0 has a total capacity "
                                               r"of 80\.00 GiB of which 80\.00 GiB is free\."):
        a.alloc(1024 * 1024 * 1024 * 800000000, 0)


def test_memory_fraction_checked_before_the_driver():
    driver, a = make(capacity=GiB)
    a.set_memory_fraction(0.5, GiB)
    x = a.alloc(400 * MiB, 0)
    n = len(driver.calls)
    with pytest.raises(OutOfMemoryError, match=r"512\.00 MiB allowed; Of the allocated memory 400\.00 MiB"):
        a.alloc(200 * MiB, 0)
    assert all(c[0] == "free" for c in driver.calls[n:])  # the driver was never asked for the 200 MiB
    a.free(x)
    a.alloc(500 * MiB, 0)  # frees the cached 400 MiB first, then fits under the limit
    assert a.memory_fraction() == 0.5
    a.set_memory_fraction(1.0, GiB)
    assert a.memory_fraction() == 1.0


def test_garbage_collection_frees_old_blocks_first():
    conf = "garbage_collection_threshold:0.5,max_split_size_mb:40"
    driver, a = make(capacity=GiB, conf=conf)
    a.set_memory_fraction(0.5, GiB)  # collect above 256 MiB reserved
    old, young = a.alloc(100 * MiB, 0), a.alloc(150 * MiB, 0)
    a.free(old)
    for _ in range(5):  # large-pool lookups are the clock; the oversize `old` never serves 30 MiB
        a.free(a.alloc(30 * MiB, 0))
    a.free(young)
    n = len(driver.calls)
    a.alloc(200 * MiB, 0)  # 280 MiB reserved: blocks at least as old as the average go first
    assert driver.calls[n:] == [("free", 100 * MiB), ("malloc", 200 * MiB)]


# ============================================================================================== stats, snapshot
def test_stats_scenario():
    driver, a = make()
    b = a.alloc(1000, 0)
    s = a.memory_stats()
    assert s["allocated_bytes.all.current"] == 1024 and s["requested_bytes.all.current"] == 1000
    assert s["allocated_bytes.small_pool.current"] == 1024 and s["allocated_bytes.large_pool.current"] == 0
    assert s["reserved_bytes.all.current"] == 2 * MiB and s["segment.small_pool.current"] == 1
    assert s["inactive_split.all.current"] == 1 and s["inactive_split_bytes.all.current"] == 2 * MiB - 1024
    assert s["num_device_alloc"] == 1
    a.free(b)
    s = a.memory_stats()
    assert s["allocated_bytes.all.current"] == 0 and s["allocated_bytes.all.freed"] == 1024
    assert s["allocated_bytes.all.peak"] == 1024 and s["active_bytes.all.freed"] == 1024
    assert s["inactive_split.all.current"] == 0 and s["inactive_split.all.freed"] == 1
    a.reset_peak_stats()
    assert a.memory_stats()["allocated_bytes.all.peak"] == 0
    assert a.memory_stats()["reserved_bytes.all.peak"] == 2 * MiB
    a.reset_accumulated_stats()
    s = a.memory_stats()
    assert s["allocated_bytes.all.allocated"] == 0 and s["allocated_bytes.all.freed"] == 0
    assert s["num_device_alloc"] == 0 and s["reserved_bytes.all.current"] == 2 * MiB
    keys = {k.rsplit(".", 2)[0] for k in s if k.count(".") == 2}
    assert keys == {"allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
                    "active_bytes", "inactive_split_bytes", "requested_bytes"}
    assert {k for k in s if "." not in k} == {"num_alloc_retries", "num_ooms", "num_sync_all_streams",
                                              "num_device_alloc", "num_device_free", "max_split_size"}
    assert len(s) == 9 * 3 * 4 + 6 + 8


def test_snapshot_format():
    driver, a = make()
    b = a.alloc(1000, S1)
    (seg,) = a.snapshot()
    assert seg == {
        "device": 0, "address": b.ptr, "total_size": 2 * MiB, "allocated_size": 1024, "active_size": 1024,
        "requested_size": 1000, "stream": S1, "segment_type": "small", "segment_pool_id": (0, 0),
        "is_expandable": False, "frames": [],
        "blocks": [{"address": b.ptr, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": []},
                   {"address": b.ptr + 1024, "size": 2 * MiB - 1024, "requested_size": 0, "state": "inactive",
                    "frames": []}]}


def test_snapshot_while_another_thread_frees():
    """A free takes no lock, so it can land while snapshot() walks the segments (another thread's tensor dying
    then): the snapshot shows the allocator as it was when it took the lock, that block still allocated, and
    agrees with memory_stats() taken at the same point."""
    driver, a = make()
    blocks = [a.alloc(1000 * (i + 1), 0) for i in range(4)]
    settle = a._settle
    stats = []

    def settle_then_free():  # what the lock holder sees when another thread frees right after its settle
        settle()
        stats.append(a.stats.as_dict(None))
        if blocks:
            a.free(blocks.pop())
    a._settle = settle_then_free
    snapshot = a.snapshot()
    del a._settle
    allocated = [b for seg in snapshot for b in seg["blocks"] if b["state"] == "active_allocated"]
    assert len(allocated) == 4 and sum(b["size"] for b in allocated) == stats[0]["allocated_bytes.all.current"]
    assert sum(seg["allocated_size"] for seg in snapshot) == stats[0]["allocated_bytes.all.current"]
    assert len([b for seg in a.snapshot() for b in seg["blocks"] if b["state"] == "active_allocated"]) == 3


def test_free_queued_across_a_settings_change():
    """A free reads whether frees may be queued before it takes its step, without the lock, so another thread's
    set_allocator_settings can land in between: the block queued under plain rounding must then be completed
    under the new rounding, not handed out again as the plain policy's victim."""
    from minitensor.allocator.block import QUEUED
    driver, a = make()
    b = a.alloc(9000, 0)  # 9216 bytes under plain rounding
    a.configure(alloc_settings.parse("roundup_power2_divisions:4"))
    b.state = QUEUED  # the free's two lock-free steps, after its test of the rounding
    a._freed.append(b)
    c = a.alloc(9000, 0)
    assert (c.ptr, c.size) == (b.ptr, 10240)  # torch's policy: the free merges, 9000 rounds to 10240
    assert a.memory_stats()["allocated_bytes.all.current"] == 10240


def test_double_free_is_refused():
    driver, a = make()
    b = a.alloc(4096, 0)
    a.free(b)
    with pytest.raises(RuntimeError, match="freed twice"):
        a.free(b)


def test_uncached_allocator_goes_to_the_driver():
    driver = FakeDriver()
    a = UncachedAllocator(driver, 0)
    b = a.alloc(1000, 0)
    assert driver.calls == [("malloc", 1000)] and a.memory_stats()["reserved_bytes.all.current"] == 1000
    a.record_stream(b, S1)
    a.free(b)
    assert driver.calls[-1] == ("free", 1000) and driver.live == {}
    s = a.memory_stats()
    assert s["allocated_bytes.all.current"] == s["reserved_bytes.all.current"] == 0


def test_threads_share_one_allocator():
    """4 threads allocate and free at random (frees go through the lock-free queue) while a fifth reads the
    statistics; afterwards the state is whole and everything goes back to the driver."""
    driver, a = make()
    errors = []
    done = threading.Event()

    def work(seed):
        rng = random.Random(seed)
        live = []
        try:
            for _ in range(400):
                if live and rng.random() < 0.5:
                    a.free(live.pop(rng.randrange(len(live))))
                else:
                    live.append(a.alloc(rng.choice([512, 4096, 4096, 100 * KiB, 3 * MiB]), rng.choice([0, S1])))
            for b in live:
                a.free(b)
        except Exception as e:  # reported by the main thread
            errors.append(e)

    def read():
        while not done.is_set():
            a.memory_stats()
            a.snapshot()

    reader = threading.Thread(target=read)
    reader.start()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert not errors
    for seg in a.snapshot():
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert all(b["state"] == "inactive" for b in seg["blocks"]) and len(seg["blocks"]) == 1
    assert a.memory_stats()["allocated_bytes.all.current"] == 0
    a.empty_cache()
    assert a.snapshot() == [] and driver.used == 0


# ============================================================================================== settings
def test_settings_parse():
    s = alloc_settings.parse("max_split_size_mb:64, garbage_collection_threshold:0.6,expandable_segments:True")
    assert (s.max_split_size, s.garbage_collection_threshold, s.expandable_segments) == (64 * MiB, 0.6, True)
    s = alloc_settings.parse("roundup_power2_divisions:[256:1,512:2,>:8]")
    assert s.roundup_power2_divisions == (1,) * 9 + (2,) + (8,) * 6
    s = alloc_settings.parse("roundup_power2_divisions:4")
    assert s.roundup_power2_divisions == (4,) * 16
    s = alloc_settings.parse("pinned_use_host_register:True,pinned_num_register_threads:8,"
                             "pinned_use_background_threads:True")
    assert (s.pinned_use_host_register, s.pinned_num_register_threads, s.pinned_use_background_threads) == \
        (True, 8, True)
    assert alloc_settings.parse("pinned_use_cuda_host_register:True").pinned_use_host_register  # torch's name
    assert alloc_settings.parse("") == alloc_settings.Settings()


def test_settings_reset_unspecified_device_options():
    first = alloc_settings.parse("max_split_size_mb:64,expandable_segments:True,pinned_num_register_threads:4")
    second = alloc_settings.parse("garbage_collection_threshold:0.5", first)
    assert second.max_split_size is None and second.garbage_collection_threshold == 0.5
    assert second.expandable_segments and second.pinned_num_register_threads == 4


@pytest.mark.parametrize("text, message", [
    ("foo:1", r"Unrecognized key 'foo'"),
    ("max_split_size_mb:20", r"max_split_size_mb must be > 20, got 20"),
    ("max_split_size_mb:big", r"max_split_size_mb expects an integer, got 'big'"),
    ("garbage_collection_threshold:1.0", r"garbage_collection_threshold must be in \(0, 1\), got 1.0"),
    ("garbage_collection_threshold:0", r"must be in \(0, 1\)"),
    ("roundup_power2_divisions:3", r"roundup_power2_divisions must be a power of two, got 3"),
    ("roundup_power2_divisions:[256:3]", r"divisions must be a power of two or 0, got 3"),
    ("roundup_power2_divisions:[100:2]", r"interval bounds must be powers of two \(MiB\), got 100"),
    ("roundup_power2_divisions:[256:2", r"missing its closing"),
    ("expandable_segments:true", r"expandable_segments expects True or False, got 'true'"),
    ("pinned_num_register_threads:256", r"pinned_num_register_threads must be a power of two <= 128, got 256"),
    ("pinned_num_register_threads:3", r"power of two <= 128, got 3"),
    ("max_split_size_mb", r"expected ':' after 'max_split_size_mb'"),
    ("max_split_size_mb:64:1", r"expected ',' after 'max_split_size_mb', found ':'"),
])
def test_settings_errors_name_the_problem(text, message):
    with pytest.raises(RuntimeError, match=message):
        alloc_settings.parse(text)


def test_configure_changes_rounding():
    driver, a = make(conf="roundup_power2_divisions:4")
    assert a.alloc(5 * MiB + 1, 0).size == 6 * MiB
    a.configure(alloc_settings.parse(""))
    assert a.alloc(5 * MiB + 1, 0).size == 5 * MiB + 512


# ============================================================================================== the model
class _Stat:
    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def up(self, n):
        self.current += n
        self.allocated += n
        self.peak = max(self.peak, self.current)

    def down(self, n):
        self.current -= n
        self.freed += n


class _B:
    def __init__(self, ptr, size, seg):
        self.ptr, self.size, self.seg = ptr, size, seg
        self.state, self.requested, self.uses, self.events = "inactive", 0, set(), 0


class Model:
    """torch's DeviceCachingAllocator, plainly: segments as address-ordered lists, best fit by scanning,
    merge at free, every statistic moved as torch moves it."""

    NAMES = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
             "active_bytes", "inactive_split_bytes", "requested_bytes")

    def __init__(self, driver, conf=""):
        self.driver = driver
        self.segments = {}  # ptr -> {"stream", "small", "blocks": [_B]}
        self.pending = collections.defaultdict(list)  # stream -> [(event, block)]
        self.stats = {(n, p): _Stat() for n in self.NAMES for p in ("all", "small_pool", "large_pool")}
        self.counters = dict.fromkeys(("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
                                       "num_device_free"), 0)
        self.oversize = {"oversize_allocations": _Stat(), "oversize_segments": _Stat()}
        self.limit = None
        self.configure(alloc_settings.parse(conf))

    def configure(self, s):
        self.max_split = s.max_split_size or 1 << 64
        self.divisions = s.roundup_power2_divisions
        self.max_split_setting = s.max_split_size

    def _move(self, name, small, n):
        for pool in ("all", "small_pool" if small else "large_pool"):
            (self.stats[name, pool].up if n > 0 else self.stats[name, pool].down)(abs(n))

    # ------------------------------------------------------------------ operations
    def alloc(self, nbytes, stream):
        if nbytes == 0:
            return 0
        self._process_events()
        size = round_size(nbytes, self.divisions)
        small = size <= MiB
        fits = [b for s in self.segments.values() if s["stream"] == stream and s["small"] == small
                for b in s["blocks"] if b.state == "inactive" and b.size >= size]
        block = min(fits, key=lambda b: (b.size, b.ptr)) if fits else None
        if block is not None and (size < self.max_split <= block.size or
                                  (size >= self.max_split and block.size >= size + 20 * MiB)):
            block = None
        if block is None:
            block = self._grow(segment_size(size), stream, small, size)
        blocks = block.seg["blocks"]
        already_split = len(blocks) > 1
        remaining = block.size - size
        if (remaining >= 512) if small else (size < self.max_split and remaining > MiB):
            rest = _B(block.ptr + size, remaining, block.seg)
            blocks.insert(blocks.index(block) + 1, rest)
            block.size = size
            if already_split:
                self._move("inactive_split_bytes", small, -size)
            else:
                self._move("inactive_split", small, 1)
                self._move("inactive_split_bytes", small, remaining)
        elif already_split:
            self._move("inactive_split", small, -1)
            self._move("inactive_split_bytes", small, -block.size)
        block.state, block.requested = "active_allocated", nbytes
        for name, n in (("allocation", 1), ("allocated_bytes", block.size), ("active", 1),
                        ("active_bytes", block.size), ("requested_bytes", nbytes)):
            self._move(name, small, n)
        if block.size >= self.max_split:
            self.oversize["oversize_allocations"].up(1)
        return block.ptr

    def _grow(self, alloc_size, stream, small, size):
        block = self._segment(alloc_size, stream, small)
        if block is None and self._release_oversize(stream, small, size):
            block = self._segment(alloc_size, stream, small)
        if block is None:
            self._release_all()
            self.counters["num_alloc_retries"] += 1
            block = self._segment(alloc_size, stream, small)
        if block is None:
            self.counters["num_ooms"] += 1
            raise OutOfMemoryError("model: out of memory")
        return block

    def _segment(self, alloc_size, stream, small):
        if self.limit is not None and self.stats["reserved_bytes", "all"].current + alloc_size > self.limit:
            return None
        try:
            ptr = self.driver.malloc(0, alloc_size)
        except OutOfMemoryError:
            return None
        seg = self.segments[ptr] = {"stream": stream, "small": small, "blocks": []}
        seg["blocks"].append(_B(ptr, alloc_size, seg))
        self._move("segment", small, 1)
        self._move("reserved_bytes", small, alloc_size)
        self.counters["num_device_alloc"] += 1
        if alloc_size >= self.max_split:
            self.oversize["oversize_segments"].up(1)
        return seg["blocks"][0]

    def _cached_whole(self, stream=None, small=None):
        return [s["blocks"][0] for s in self.segments.values() if len(s["blocks"]) == 1
                and s["blocks"][0].state == "inactive" and (stream is None or s["stream"] == stream)
                and (small is None or s["small"] == small)]

    def _release_oversize(self, stream, small, size):
        if self.max_split_setting is None:
            return False
        want = max(size, self.max_split)
        free = sorted((b for s in self.segments.values() if s["stream"] == stream and s["small"] == small
                       for b in s["blocks"] if b.state == "inactive"), key=lambda b: (b.size, b.ptr))
        fit = [b for b in free if b.size >= want]
        if fit and len(fit[0].seg["blocks"]) == 1:
            self._release(fit[0])
            return True
        released = 0
        for b in reversed(free):
            if released >= want or b.size < self.max_split:
                break
            if len(b.seg["blocks"]) == 1:
                released += b.size
                self._release(b)
        return released >= want

    def _release(self, block):
        seg = block.seg
        del self.segments[block.ptr]
        self.driver.free(0, block.ptr)
        self._move("segment", seg["small"], -1)
        self._move("reserved_bytes", seg["small"], -block.size)
        self.counters["num_device_free"] += 1
        if block.size >= self.max_split:
            self.oversize["oversize_segments"].down(1)

    def _release_all(self):
        self.counters["num_sync_all_streams"] += 1
        for stream in list(self.pending):
            for event, block in self.pending.pop(stream):
                self.driver.event_synchronize(event)
                self._event_done(block)
        for small in (False, True):
            for block in sorted(self._cached_whole(small=small), key=lambda b: (b.seg["stream"], b.size, b.ptr)):
                self._release(block)

    def free(self, ptr):
        block = self._find(ptr)
        small = block.seg["small"]
        self._move("allocation", small, -1)
        self._move("allocated_bytes", small, -block.size)
        if block.size >= self.max_split:
            self.oversize["oversize_allocations"].down(1)
        if block.uses:
            block.state = "active_pending_free"
            for stream in sorted(block.uses):
                event = self.driver.event_create(0, False, False)
                self.driver.event_record(event, stream)
                self.pending[stream].append((event, block))
                block.events += 1
            block.uses = set()
        else:
            self._cache(block)

    def _cache(self, block):
        blocks, small = block.seg["blocks"], block.seg["small"]
        size0, requested = block.size, block.requested
        n = b = 0
        i = blocks.index(block)
        for j in (i + 1, i - 1):
            if 0 <= j < len(blocks) and blocks[j].state == "inactive":
                other = blocks[j]
                n -= 1
                b -= other.size
                block.size += other.size
                block.ptr = min(block.ptr, other.ptr)
                blocks.remove(other)
        if len(blocks) > 1:
            n += 1
            b += block.size
        block.state, block.requested = "inactive", 0
        for name, d in (("inactive_split", n), ("inactive_split_bytes", b)):
            if d:
                self._move(name, small, d)
        self._move("active", small, -1)
        self._move("active_bytes", small, -size0)
        self._move("requested_bytes", small, -requested)

    def _event_done(self, block):
        block.events -= 1
        if block.events == 0:
            self._cache(block)

    def _process_events(self):
        for stream in list(self.pending):
            queue = self.pending[stream]
            while queue and self.driver.event_query(queue[0][0]):
                self._event_done(queue.pop(0)[1])
            if not queue:
                del self.pending[stream]

    def record_stream(self, ptr, stream):
        block = self._find(ptr)
        if stream != block.seg["stream"]:
            block.uses.add(stream)

    def empty_cache(self):
        self._release_all()

    def _find(self, ptr):
        for s in self.segments.values():
            for b in s["blocks"]:
                if b.ptr == ptr and b.state == "active_allocated":
                    return b
        raise KeyError(ptr)

    def memory_stats(self):
        out = {}
        for (name, pool), s in self.stats.items():
            for field in _Stat.__slots__:
                out[f"{name}.{pool}.{field}"] = getattr(s, field)
        out.update(self.counters)
        out["max_split_size"] = -1 if self.max_split_setting is None else self.max_split_setting
        for name, s in self.oversize.items():
            for field in _Stat.__slots__:
                out[f"{name}.{field}"] = getattr(s, field)
        return out

    def reset_peaks(self):
        for s in [*self.stats.values(), *self.oversize.values()]:
            s.peak = s.current

    def reset_accumulated(self):
        for s in [*self.stats.values(), *self.oversize.values()]:
            s.allocated = s.freed = 0
        self.counters = dict.fromkeys(self.counters, 0)


SIZES = st.one_of(st.integers(1, 4 * KiB), st.sampled_from([512, 4 * KiB, 8 * KiB, 64 * KiB, MiB, MiB + 1]),
                  st.integers(MiB + 1, 24 * MiB), st.sampled_from([20 * MiB, 32 * MiB, 60 * MiB]))
STREAMS = st.sampled_from([0, 0, S1, S2])
CONFS = st.sampled_from(["", "max_split_size_mb:40", "roundup_power2_divisions:[1:2,>:4]",
                         "max_split_size_mb:24,roundup_power2_divisions:8"])


class AllocatorMachine(RuleBasedStateMachine):
    """Random sequences through the allocator and the model, compared after every step."""

    def __init__(self):
        super().__init__()
        self.driver = FakeDriver(capacity=300 * MiB)
        self.model_driver = FakeDriver(capacity=300 * MiB)
        self.a = DeviceCachingAllocator(self.driver, 0)
        self.m = Model(self.model_driver)
        self.live = []  # [(block, nbytes)]

    def _alloc(self, nbytes, stream):
        try:
            expected = self.m.alloc(nbytes, stream)
        except OutOfMemoryError:
            with pytest.raises(OutOfMemoryError, match="CUDA out of memory"):
                self.a.alloc(nbytes, stream)
            return
        block = self.a.alloc(nbytes, stream)
        assert block.ptr == expected
        self.live.append((block, nbytes, stream))

    def _free(self, i):
        block, nbytes, stream = self.live.pop(i % len(self.live))
        self.m.free(block.ptr)
        self.a.free(block)
        return nbytes, stream

    @rule(nbytes=SIZES, stream=STREAMS)
    def alloc(self, nbytes, stream):
        self._alloc(nbytes, stream)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1 << 20))
    def free(self, i):
        self._free(i)

    @rule(ops=st.lists(st.tuples(st.sampled_from(["alloc", "free", "free_alloc", "free_alloc_other"]), SIZES, STREAMS,
                                 st.integers(0, 1 << 20)), max_size=12))
    def burst(self, ops):
        """Several calls with no check in between, so the shortcuts (a victim reused, exact-size bins) run."""
        for kind, nbytes, stream, i in ops:
            if kind == "alloc" or not self.live:
                self._alloc(nbytes, stream)
                continue
            freed_nbytes, freed_stream = self._free(i)
            if kind == "free_alloc":
                self._alloc(freed_nbytes, freed_stream)
            elif kind == "free_alloc_other":
                self._alloc(nbytes, freed_stream)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 1 << 20), times=st.integers(2, 6))
    def free_alloc_repeatedly(self, i, times):
        """Every op's hot loop: one block freed and allocated again several times, nothing in between (the
        allocator counts the repeats' statistics only when something reads them)."""
        for _ in range(times):
            self._alloc(*self._free(i))
            i = -1  # the block just allocated again: _alloc appends it

    @precondition(lambda self: self.live)
    @rule(data=st.data(), stream=STREAMS)
    def record_stream(self, data, stream):
        block = self.live[data.draw(st.integers(0, len(self.live) - 1))][0]
        self.m.record_stream(block.ptr, stream)
        self.a.record_stream(block, stream)

    @rule(stream=STREAMS)
    def stream_gets_busy(self, stream):
        self.driver.busy(stream)
        self.model_driver.busy(stream)

    @rule(stream=STREAMS)
    def stream_finishes(self, stream):
        self.driver.finish(stream)
        self.model_driver.finish(stream)

    @rule()
    def empty_cache(self):
        self.m.empty_cache()
        self.a.empty_cache()

    @rule(conf=CONFS)
    def configure(self, conf):
        s = alloc_settings.parse(conf)
        self.m.configure(s)
        self.a.configure(s)

    @rule(fraction=st.sampled_from([0.3, 0.6, 1.0]))
    def memory_fraction(self, fraction):
        self.m.limit = None if fraction >= 1.0 else round(fraction * self.driver.capacity)
        self.a.set_memory_fraction(fraction, self.driver.capacity)

    @rule(which=st.sampled_from(["peaks", "accumulated"]))
    def reset(self, which):
        if which == "peaks":
            self.m.reset_peaks()
            self.a.reset_peak_stats()
        else:
            self.m.reset_accumulated()
            self.a.reset_accumulated_stats()

    @invariant()
    def same_as_model(self):
        assert self.a.memory_stats() == dict(sorted(self.m.memory_stats().items()))
        assert self.driver.calls == self.model_driver.calls

    @invariant()
    def state_is_consistent(self):
        snapshot = self.a.snapshot()
        spans = []
        recount = collections.Counter()
        for seg in snapshot:
            pool = "small_pool" if seg["segment_type"] == "small" else "large_pool"
            assert self.driver.live[seg["address"]] == seg["total_size"]
            at = seg["address"]
            for b in seg["blocks"]:  # every byte in exactly one block
                assert b["address"] == at
                at += b["size"]
                if b["state"] != "inactive":
                    spans.append((b["address"], b["size"]))
                for key, n in _recount(b, len(seg["blocks"]) > 1):
                    recount[key, pool] += n
            assert at == seg["address"] + seg["total_size"]
            recount["segment", pool] += 1
            recount["reserved_bytes", pool] += seg["total_size"]
        assert len(snapshot) == len(self.driver.live)
        spans.sort()
        assert all(p + n <= q for (p, n), (q, _) in zip(spans, spans[1:]))  # live blocks never overlap
        stats = self.a.memory_stats()
        for name in Model.NAMES:
            for pool in ("small_pool", "large_pool"):
                assert stats[f"{name}.{pool}.current"] == recount[name, pool], (name, pool)
            assert stats[f"{name}.all.current"] == recount[name, "small_pool"] + recount[name, "large_pool"]
        assert stats["reserved_bytes.all.current"] == self.driver.used

    def teardown(self):
        for block, _, _ in self.live:
            self.a.free(block)
        self.driver.finished.update({s: self.driver.queued[s] for s in self.driver.queued})
        self.a.empty_cache()
        assert self.a.memory_stats()["reserved_bytes.all.current"] == 0
        assert self.a.snapshot() == [] and self.driver.used == 0


def _recount(block, split):
    state, size = block["state"], block["size"]
    if state == "active_allocated":
        yield from (("allocation", 1), ("allocated_bytes", size))
    if state != "inactive":
        yield from (("active", 1), ("active_bytes", size), ("requested_bytes", block["requested_size"]))
    elif split:
        yield from (("inactive_split", 1), ("inactive_split_bytes", size))


AllocatorMachine.TestCase.settings = hsettings(max_examples=60, stateful_step_count=40, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])
TestAllocatorMachine = AllocatorMachine.TestCase
