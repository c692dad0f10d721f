"""The sizes in memory-history entries, as torch records them (c10/cuda/CUDACachingAllocator.cpp `record_trace`):
`alloc`, `free_requested` and `free_completed` carry the bytes the caller asked for (torch's orig_size and
block->requested_size), segment entries the segment's size, and the snapshot's blocks both (`size` rounded,
`requested_size` asked). Every path of the allocator that hands out or takes back a block is taken here: a new
segment, the queued-free victim and its repeat, the exact-fit shortcut, a free completed later by record_stream's
event, a private pool's route, and the pinned host allocator.

Each test starts with an idle device, an empty cache and history off (conftest.py's clean_cuda_state), and turns
history off at its end. No kernel runs: sizes only need allocations.
"""
import pytest

import minitensor as mt
from minitensor.allocator import history

from helpers import fresh_stream

DEV = "cuda"
memory = mt.cuda.memory
NBYTES = 4000  # 1000 float32: a 4096-byte block
BLOCK = 4096
SMALL_SEGMENT = 2 << 20


@pytest.fixture(autouse=True, params=["c_recorder", "python_recorder"])
def _history_off(request, clean_cuda_state, monkeypatch):
    """Each test with each recorder; history off before and after it."""
    history._load_recorder_type()
    if request.param == "python_recorder":
        monkeypatch.setattr(history, "_recorder_type", history.PythonRecorder)
    memory._record_memory_history(None)
    yield
    memory._record_memory_history(None)


def entries_at(snapshot, ptr):
    return [(e["action"], e["size"]) for e in snapshot["device_traces"][0] if e["addr"] == ptr]


def test_alloc_and_free_entries_carry_the_requested_bytes_on_every_path():
    stream = fresh_stream()
    memory._record_memory_history()
    with mt.cuda.stream(stream):
        a = mt.empty(1000, device=DEV)  # a new segment: the general path
        ptr = a.data_ptr()
        del a  # a queued free
        b = mt.empty(1000, device=DEV)  # the queued block handed out again (the victim)
        del b
        c = mt.empty(1000, device=DEV)  # and once more with nothing in between (its repeat)
        assert c.data_ptr() == ptr
        keep = mt.empty(1000, device=DEV)  # c's block stays 4096 bytes once freed
        other = mt.empty(10, device=DEV)
        del c, other  # two queued frees: the next allocation settles them ...
        d = mt.empty(999, device=DEV)  # ... and takes the exact 4096-byte fit for 3996 bytes
        assert d.data_ptr() == ptr
        snap = memory._snapshot()
        block = next(b for s in snap["segments"] for b in s["blocks"] if b["address"] == ptr)
        assert (block["size"], block["requested_size"]) == (BLOCK, 3996)
        del d, keep
    mt.cuda.empty_cache()
    snap = memory._snapshot()
    assert entries_at(snap, ptr) == [
        ("segment_alloc", SMALL_SEGMENT),
        ("alloc", NBYTES), ("free_requested", NBYTES), ("free_completed", NBYTES),
        ("alloc", NBYTES), ("free_requested", NBYTES), ("free_completed", NBYTES),
        ("alloc", NBYTES), ("free_requested", NBYTES), ("free_completed", NBYTES),
        ("alloc", 3996), ("free_requested", 3996), ("free_completed", 3996),
        ("segment_free", SMALL_SEGMENT)]


def test_a_free_completed_by_its_event_carries_the_requested_bytes():
    side = fresh_stream()
    with mt.cuda.stream(side):
        t = mt.empty(1000, device=DEV)
    ptr = t.data_ptr()
    memory._record_memory_history()
    t.record_stream(mt.cuda.current_stream())
    del t  # pending until an event on the default stream completes
    mt.cuda.synchronize()
    mt.cuda.empty_cache()  # waits for the event: the free completes, then the segment goes
    assert entries_at(memory._snapshot(), ptr) == [("free_requested", NBYTES), ("free_completed", NBYTES),
                                                   ("segment_free", SMALL_SEGMENT)]


def test_private_pool_entries_carry_the_requested_bytes():
    pool = mt.cuda.MemPool()
    memory._record_memory_history()
    with mt.cuda.use_mem_pool(pool):
        ptr = mt.cuda.caching_allocator_alloc(NBYTES)
    mt.cuda.caching_allocator_delete(ptr)
    entries = [e for e in memory._snapshot()["device_traces"][0] if e["addr"] == ptr]
    assert [(e["action"], e["size"]) for e in entries] == [
        ("segment_alloc", SMALL_SEGMENT), ("alloc", NBYTES), ("free_requested", NBYTES), ("free_completed", NBYTES)]
    assert all(e["pool_id"] == pool.id for e in entries)
    del pool


def test_pinned_host_entries_carry_the_requested_bytes():
    memory._record_memory_history()
    p = mt.empty(1000, pin_memory=True)  # 4000 bytes: a 4096-byte pinned block
    ptr = p.data_ptr()
    del p
    q = mt.empty(1000, pin_memory=True)  # the same block again, from the cache
    assert q.data_ptr() == ptr
    del q
    host = [(e["action"], e["size"]) for e in memory._snapshot()["host_traces"] if e["addr"] == ptr
            and e["action"] in ("alloc", "free_requested", "free_completed")]
    assert host == [("alloc", NBYTES), ("free_requested", NBYTES), ("free_completed", NBYTES)] * 2
