"""Memory history (allocator/history.py, mt.cuda.memory._record_memory_history / _snapshot / _dump_snapshot /
set_oom_snapshot) on the "cuda" device, against torch's formats: the trace's entries and their order for a
scripted sequence, the Python frames of allocations and frees, the snapshot's blocks and their frames for each
`enabled`/`context`, `max_entries` and `clear_history`, argument checks, the snapshot's invariants, a pickle
that torch's MemoryViz.js unpickler and torch.cuda._memory_viz read, the out-of-memory entry and snapshot, and
the uncached allocator.

Each test starts with an idle device, an empty cache and history off, and turns history off at its end.
Tensors are small and no kernel runs but a few tiny ones: on the simulator every kernel runs in Triton's
interpreter. Out-of-memory sizes are far beyond any device (2**45 bytes) or come from the device's total memory.
"""
import gc
import inspect
import json
import os
import pickle
import pickletools
import random
import re
import subprocess
import sys
import threading

import pytest

import minitensor as mt
import minitensor.allocator
from minitensor.allocator import history
from helpers import fresh_stream, run_python

DEV = "cuda"
memory = mt.cuda.memory
ALLOCATOR_DIR = os.path.dirname(os.path.abspath(minitensor.allocator.__file__))
HUGE = 2**45  # bytes: more than any device has (the simulator's default is 4 GiB)
SMALL_SEGMENT = 2 << 20  # torch's segment for requests up to 1 MiB
KEYS = {"action", "addr", "size", "stream", "time_us", "frames"}
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot"}
STATES = {"active_allocated", "active_pending_free", "inactive"}
PLAIN = (dict, list, tuple, str, int, float, bool, type(None))
# The opcodes `unpickle` in torch/utils/viz/MemoryViz.js handles (pytorch main): any other throws "UNKNOWN OPCODE".
MEMORYVIZ_OPCODES = {
    "PROTO", "FRAME", "STOP", "MARK", "APPEND", "APPENDS", "LIST", "TUPLE", "EMPTY_TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "EMPTY_LIST", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS", "NEWFALSE", "NEWTRUE", "NONE", "BINGET",
    "LONG_BINGET", "BINPUT", "LONG_BINPUT", "MEMOIZE", "BININT", "BININT1", "BININT2", "LONG1",
    "SHORT_BINUNICODE", "BINUNICODE", "BINFLOAT",
}


@pytest.fixture(autouse=True, params=["c_recorder", "python_recorder"])
def _history_off(request, clean_cuda_state, monkeypatch):
    """Each test once with each recorder (_recorder.c's, and history.PythonRecorder for machines without a C
    compiler). History off before and after each test, whatever the test did; no out-of-memory snapshot during
    the test (the one MINITENSOR_OOM_SNAPSHOT set, if any, back after it); the memory fraction back to 1."""
    history._load_recorder_type()
    if request.param == "python_recorder":
        monkeypatch.setattr(history, "_recorder_type", history.PythonRecorder)
    saved = memory._oom_snapshot
    memory._record_memory_history(None)
    memory.set_oom_snapshot(None)
    yield
    memory._record_memory_history(None)
    memory.set_oom_snapshot(saved)
    mt.cuda.set_per_process_memory_fraction(1.0)


# ============================================================================================== helpers
def empty(n, dtype=mt.float32):
    return mt.empty(n, dtype=dtype, device=DEV)


def trace(snapshot=None):
    """Device 0's trace, from `snapshot` or a new _snapshot() (whose last entry is its "snapshot" entry)."""
    return (snapshot if snapshot is not None else memory._snapshot())["device_traces"][0]


def steps(entries):
    return [(e["action"], e["addr"], e["size"]) for e in entries]


def blocks(snapshot):
    """address -> block dict, over every segment of `snapshot`."""
    return {b["address"]: b for s in snapshot["segments"] for b in s["blocks"]}


def names(frames):
    return [f["name"] for f in frames]


def here():
    """The caller's line number."""
    return inspect.currentframe().f_back.f_lineno


def same_file(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


def check_frames(frames, function, line=None):
    """`frames` (innermost first) hold `function` of this file (at `line` if given), above pytest's frames, and
    no frame of the allocator's own modules."""
    assert frames, "no frames"
    for f in frames:
        assert set(f) == {"filename", "line", "name"}, f
        assert type(f["filename"]) is str and type(f["name"]) is str and type(f["line"]) is int, f
        assert os.path.dirname(os.path.abspath(f["filename"])) != ALLOCATOR_DIR, f
    mine = [i for i, f in enumerate(frames) if f["name"] == function and same_file(f["filename"], __file__)]
    assert mine, f"{function} not in {names(frames)}"
    if line is not None:
        got = [frames[i]["line"] for i in mine]
        assert line in got, f"{function}'s frame is at line(s) {got}, the call is at line {line}"
    runner = [i for i, f in enumerate(frames) if "_pytest" in f["filename"] or "pluggy" in f["filename"]]
    assert runner and mine[0] < runner[0], "frames are not innermost first"


def walk_plain(value, path="snapshot"):
    """Every object in `value` is a plain dict/list/tuple/str/int/float/bool/None, dict keys str."""
    assert type(value) in PLAIN, f"{path}: {type(value).__name__}"
    if type(value) is dict:
        for k, v in value.items():
            assert type(k) is str, f"{path}: key {k!r}"
            walk_plain(v, f"{path}[{k!r}]")
    elif type(value) in (list, tuple):
        for i, v in enumerate(value):
            walk_plain(v, f"{path}[{i}]")


def check_invariants(snapshot, times=True):
    walk_plain(snapshot)
    assert set(snapshot) >= {"segments", "device_traces", "allocator_settings"}
    assert isinstance(snapshot["device_traces"], list)
    assert len(snapshot["device_traces"]) == mt.cuda.device_count()
    addresses = [s["address"] for s in snapshot["segments"]]
    for seg in snapshot["segments"]:
        assert "device" in seg and type(seg["device"]) is int, seg.keys()
        addr = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == addr, f"blocks of segment {seg['address']:#x} are not contiguous at {addr:#x}"
            assert b["state"] in STATES, b["state"]
            assert b["size"] > 0
            if b["state"] == "inactive":
                assert b["frames"] == []
            addr += b["size"]
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert addr == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    for device_trace in snapshot["device_traces"]:
        stamps = [e["time_us"] for e in device_trace]
        assert not times or stamps == sorted(stamps), "trace times go back"
        for e in device_trace:
            assert e["action"] in ACTIONS, e
            assert KEYS <= set(e) <= KEYS | {"pool_id", "device_free"}, e
            assert ("device_free" in e) == (e["action"] == "oom"), e
    assert len(set(addresses)) == len(addresses)


def replay_like_memoryviz(snapshot, device=0):
    """Walk the trace backwards from the snapshot's state, as MemoryViz.js's segment view does
    (simulate_memory): undoing each entry must find what it needs (an alloc's block, a free_requested's block,
    a segment_alloc's segment), and every live block must lie inside a live segment at every step."""
    segments = {s["address"]: s["total_size"] for s in snapshot["segments"] if s["device"] == device}
    live = {b["address"]: b["size"] for s in snapshot["segments"] if s["device"] == device for b in s["blocks"]
            if b["state"] in ("active_allocated", "active_pending_free")}

    def inside(addr, size):
        return any(a <= addr and addr + size <= a + n for a, n in segments.items())

    check_pairs(snapshot["device_traces"][device])
    for i in range(len(snapshot["device_traces"][device]) - 1, -1, -1):
        e = snapshot["device_traces"][device][i]
        where = f"entry {i} {e['action']} {e['addr']:#x}"
        if e["action"] == "alloc":
            assert live.pop(e["addr"], None) is not None, f"{where}: allocated block not live after it"
        elif e["action"] == "free_requested":
            assert e["addr"] in live, f"{where}: freed block not live"
        elif e["action"] == "free_completed":
            assert e["addr"] not in live, f"{where}: block live after its free completed"
            live[e["addr"]] = e["size"]
        elif e["action"] == "segment_alloc":
            assert segments.pop(e["addr"], None) == e["size"], f"{where}: no such segment after it"
        elif e["action"] == "segment_free":
            assert e["addr"] not in segments, f"{where}: segment still there after its free"
            segments[e["addr"]] = e["size"]
        for addr, size in live.items():
            assert inside(addr, size), f"before {where}: block {addr:#x} outside every segment"


def check_pairs(entries):
    """Per address, in trace order: alloc, free_requested, free_completed, alloc, ... (an address first seen
    freeing was allocated before recording began); segment_alloc and segment_free alternate likewise."""
    blocks_, segments = {}, {}
    follows = {"alloc": "free_completed", "free_requested": "alloc", "free_completed": "free_requested"}
    for i, e in enumerate(entries):
        action, addr = e["action"], e["addr"]
        if action in follows:
            last = blocks_.get(addr)
            assert last is None or last == follows[action], f"entry {i}: {action} at {addr:#x} after {last}"
            blocks_[addr] = action
        elif action in ("segment_alloc", "segment_free"):
            last = segments.get(addr)
            assert last != action, f"entry {i}: {action} at {addr:#x} twice"
            segments[addr] = action


def workload(rng, n=120):
    """A mixed sequence of allocations and frees, two streams, a record_stream and an empty_cache; returns
    what is left alive."""
    side = mt.cuda.Stream()
    live = []
    for i in range(n):
        if live and rng.random() < 0.45:
            live.pop(rng.randrange(len(live)))
        else:
            nbytes = rng.choice([1, 100, 512, 4096, 70_000, 600_000, 1_500_000, 5_000_000])
            if rng.random() < 0.3:
                with mt.cuda.stream(side):
                    t = empty(nbytes, mt.int8)
            else:
                t = empty(nbytes, mt.int8)
            if rng.random() < 0.1:
                t.record_stream(side)
            live.append(t)
        if i == n // 2:
            mt.cuda.synchronize()
            mt.cuda.empty_cache()
    mt.cuda.synchronize()
    return live


# ============================================================================================== the trace
def test_trace_of_a_scripted_sequence():
    stream = fresh_stream()
    memory._record_memory_history()
    with mt.cuda.stream(stream):
        a = empty(1000)  # 4000 bytes: a 4096-byte block of a new 2 MiB segment
        ptr = a.data_ptr()
        del a
        b = empty(1000)  # the same block again, from the cache
        assert b.data_ptr() == ptr
        del b
    mt.cuda.empty_cache()
    snap = memory._snapshot()
    entries = trace(snap)
    # torch's sizes: the bytes requested for alloc and frees, the segment's for segment entries
    assert steps(entries) == [("segment_alloc", ptr, SMALL_SEGMENT), ("alloc", ptr, 4000),
                              ("free_requested", ptr, 4000), ("free_completed", ptr, 4000),
                              ("alloc", ptr, 4000), ("free_requested", ptr, 4000), ("free_completed", ptr, 4000),
                              ("segment_free", ptr, SMALL_SEGMENT), ("snapshot", 0, 0)]
    for e in entries:
        assert set(e) == KEYS, e  # general cache: no pool_id; no device_free but for an oom
        assert type(e["time_us"]) is int and type(e["addr"]) is int and type(e["size"]) is int
        assert type(e["stream"]) is int and type(e["frames"]) is list
    assert all(e["stream"] == stream.cuda_stream for e in entries[:-1])
    times = [e["time_us"] for e in entries]
    assert times == sorted(times)
    check_invariants(snap)


def test_snapshot_entry_is_last_and_each_snapshot_adds_one():
    stream = fresh_stream()
    memory._record_memory_history()
    first = trace()
    with mt.cuda.stream(stream):
        t = empty(10)
    second = trace()
    assert first[-1]["action"] == "snapshot" and second[-1]["action"] == "snapshot"
    assert second[:len(first)] == first
    assert [e["action"] for e in second[len(first):]] == ["segment_alloc", "alloc", "snapshot"]
    assert second[-2]["addr"] == t.data_ptr()


def test_record_stream_free_completes_after_the_other_streams_work_and_a_poll():
    side = fresh_stream()
    with mt.cuda.stream(side):
        tmp = empty(1000)
    ptr = tmp.data_ptr()
    memory._record_memory_history()
    gate = mt.cuda.Gate()
    try:
        gate.wait()  # the default stream waits for the host
        tmp.record_stream(mt.cuda.current_stream())
        del tmp
        assert [s[0] for s in steps(trace()) if s[1] == ptr] == ["free_requested"]
        with mt.cuda.stream(side):
            other = empty(1000)  # polls the event: not done, so a new block
        assert other.data_ptr() != ptr
        assert "free_completed" not in [s[0] for s in steps(trace()) if s[1] == ptr]
        snap = memory._snapshot()
        assert blocks(snap)[ptr]["state"] == "active_pending_free"
    finally:
        gate.open()
    mt.cuda.synchronize()
    assert "free_completed" not in [s[0] for s in steps(trace()) if s[1] == ptr], \
        "free_completed before an allocation polled the event"
    with mt.cuda.stream(side):
        again = empty(1000)  # polls: the event is done, the block cached, then handed out
    assert again.data_ptr() == ptr
    entries = [e for e in trace() if e["action"] != "snapshot"]
    tail = steps(entries)[-2:]
    assert tail == [("free_completed", ptr, 4000), ("alloc", ptr, 4000)]
    assert entries[-2]["stream"] == side.cuda_stream  # the block's own stream, as torch records it
    del other, again


def test_private_pool_entries_carry_the_pool_id():
    x = empty(256)
    x.fill_(1.0)
    x * 2  # the kernel compiled and loaded before the capture
    mt.cuda.synchronize()
    memory._record_memory_history()
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        y = x * 2
    pool = g.pool()
    ptr = y.data_ptr()
    during = steps(trace())
    assert ("alloc", ptr, 1024) in during
    for e in trace():
        if e["action"] in ("alloc", "segment_alloc") and e["addr"] == ptr:
            assert e["pool_id"] == pool, e
        elif e["action"] != "snapshot" and "pool_id" in e:
            assert e["pool_id"] == pool, e
    del y  # freed after the capture: still a block of the graph's pool
    frees = [e for e in trace() if e["addr"] == ptr and e["action"].startswith("free")]
    assert [e["action"] for e in frees] == ["free_requested", "free_completed"]
    for e in frees:
        assert e.get("pool_id") == pool, f"{e['action']} of a block of pool {pool} has pool_id {e.get('pool_id')}"
    g.reset()
    del g
    gc.collect()
    mt.cuda.empty_cache()
    seg_frees = [e for e in trace() if e["action"] == "segment_free" and e["addr"] == ptr]
    assert seg_frees and seg_frees[0]["pool_id"] == pool
    general = [e for e in trace() if e["action"] in ("alloc", "free_requested") and e["addr"] == x.data_ptr()]
    assert all("pool_id" not in e for e in general)


# ============================================================================================== frames
def test_alloc_and_free_frames_point_at_this_test():
    memory._record_memory_history()
    line = here() + 1
    t = empty(1000)
    ptr = t.data_ptr()
    snap = memory._snapshot()
    alloc = [e for e in trace(snap) if e["action"] == "alloc" and e["addr"] == ptr]
    assert len(alloc) == 1
    check_frames(alloc[0]["frames"], "test_alloc_and_free_frames_point_at_this_test", line)
    assert blocks(snap)[ptr]["frames"] == alloc[0]["frames"]
    line = here() + 1
    del t
    free = [e for e in trace() if e["action"] == "free_requested" and e["addr"] == ptr]
    assert len(free) == 1
    check_frames(free[0]["frames"], "test_alloc_and_free_frames_point_at_this_test", line)


def _allocate_here():
    return empty(100), here()  # (tensor, the line that allocated it)


def test_frames_are_innermost_first_through_a_helper():
    memory._record_memory_history()
    outer = here() + 1
    t, inner = _allocate_here()
    frames = blocks(memory._snapshot())[t.data_ptr()]["frames"]
    check_frames(frames, "_allocate_here", inner)
    check_frames(frames, "test_frames_are_innermost_first_through_a_helper", outer)
    order = names(frames)
    assert order.index("_allocate_here") < order.index("test_frames_are_innermost_first_through_a_helper")
    assert order.index("_allocate_here") > 0  # minitensor's own empty() is inside it


def test_python_recorder_gives_the_same_frames(monkeypatch):
    """history.PythonRecorder, used where _recorder.c cannot be built, walks the same frames as the C one."""
    monkeypatch.setattr(history, "_recorder_type", None)
    history._load_recorder_type()
    assert history._recorder_type is not history.PythonRecorder, "this machine has a C compiler: the C recorder"
    memory._record_memory_history()
    a, line_a = _allocate_here()
    monkeypatch.setattr(history, "_recorder_type", history.PythonRecorder)
    memory._record_memory_history()  # a new history, with the Python recorder
    b, line_b = _allocate_here()
    found = blocks(memory._snapshot())
    fa, fb = found[a.data_ptr()]["frames"], found[b.data_ptr()]["frames"]
    check_frames(fb, "_allocate_here", line_b)
    assert names(fa) == names(fb)
    assert [f["filename"] for f in fa] == [f["filename"] for f in fb]
    assert [f["line"] for f in fa][:2] == [f["line"] for f in fb][:2]  # same calls in minitensor and here


# ============================================================================================== options
@pytest.mark.parametrize("context", ["state", "alloc", "all"])
def test_blocks_carry_their_allocation_frames(context):
    memory._record_memory_history(context=context)
    t = empty(300)
    u = empty(300_000)  # the large pool
    snap = memory._snapshot()
    for x in (t, u):
        check_frames(blocks(snap)[x.data_ptr()]["frames"], "test_blocks_carry_their_allocation_frames")
    entries = trace(snap)
    allocs = [e for e in entries if e["action"] == "alloc"]
    others = [e for e in entries if e["action"] != "alloc"]
    if context == "state":
        assert all(e["frames"] == [] for e in allocs)  # the trace keeps no stacks
    else:
        for e in allocs:
            check_frames(e["frames"], "test_blocks_carry_their_allocation_frames")
    assert all(e["frames"] == [] for e in others)
    del t
    free = [e for e in trace() if e["action"] == "free_requested"]
    assert len(free) == 1
    if context == "all":
        check_frames(free[0]["frames"], "test_blocks_carry_their_allocation_frames")
    else:
        assert free[0]["frames"] == []  # context="alloc": frees have no frames
    check_invariants(memory._snapshot())
    del u


def test_context_none_records_no_frames():
    stream = fresh_stream()
    memory._record_memory_history(context=None)
    with mt.cuda.stream(stream):
        t = empty(300)
        del t
        u = empty(300)
    snap = memory._snapshot()
    assert blocks(snap)[u.data_ptr()]["frames"] == []
    entries = trace(snap)
    assert [e["action"] for e in entries] == ["segment_alloc", "alloc", "free_requested", "free_completed",
                                             "alloc", "snapshot"]
    assert all(e["frames"] == [] for e in entries)


def test_enabled_state_keeps_block_frames_but_no_trace():
    memory._record_memory_history(enabled="state")
    t = empty(300)
    empty(20).data_ptr()  # allocated and freed
    snap = memory._snapshot()
    assert snap["device_traces"] == [[] for _ in range(mt.cuda.device_count())]
    check_frames(blocks(snap)[t.data_ptr()]["frames"], "test_enabled_state_keeps_block_frames_but_no_trace")
    check_invariants(snap)


def test_max_entries_keeps_the_last_entries():
    memory._record_memory_history(max_entries=5)
    keep = [empty(128 * k) for k in range(1, 21)]  # 512 * k bytes each, all in the first small segment
    entries = trace()
    assert [(e["action"], e["size"]) for e in entries] == [("alloc", 512 * k) for k in (17, 18, 19, 20)] + [
        ("snapshot", 0)]
    assert [e["addr"] for e in entries[:-1]] == [t.data_ptr() for t in keep[-4:]]
    memory._record_memory_history(max_entries=1000)  # a larger ring keeps what the small one held
    assert [e["action"] for e in trace()][:5] == [e["action"] for e in entries]


def test_second_call_keeps_the_trace_unless_cleared():
    stream = fresh_stream()
    memory._record_memory_history()
    with mt.cuda.stream(stream):
        a = empty(10)
        memory._record_memory_history()
        b = empty(10)
        assert [s[0] for s in steps(trace())] == ["segment_alloc", "alloc", "alloc", "snapshot"]
        assert [s[1] for s in steps(trace())[1:3]] == [a.data_ptr(), b.data_ptr()]
        memory._record_memory_history(clear_history=True)
        c = empty(10)
    assert steps(trace()) == [("alloc", c.data_ptr(), 40), ("snapshot", 0, 0)]


def test_clear_history_keeps_the_frames_of_live_blocks():
    """torch's clear_history empties the trace only: a block keeps the context it was allocated with
    (c10's Block::context_when_allocated), so the snapshot still shows where live blocks came from."""
    memory._record_memory_history()
    a = empty(10)
    memory._record_memory_history(clear_history=True)
    frames = blocks(memory._snapshot())[a.data_ptr()]["frames"]
    check_frames(frames, "test_clear_history_keeps_the_frames_of_live_blocks")


def test_enabled_none_stops_recording_and_the_allocator_works():
    memory._record_memory_history()
    a = empty(10)
    memory._record_memory_history(enabled=None)
    base = mt.cuda.memory_allocated()
    b = empty(1000)
    assert mt.cuda.memory_allocated() == base + 4096
    del b
    assert mt.cuda.memory_allocated() == base
    snap = memory._snapshot()
    assert snap["device_traces"] == [[] for _ in range(mt.cuda.device_count())]
    assert all(blk["frames"] == [] for blk in blocks(snap).values())
    c = empty(10)
    assert trace() == []
    c.fill_(2.0)
    assert float(c.cpu().numpy()[0]) == 2.0
    check_invariants(memory._snapshot())
    del a


@pytest.mark.parametrize("kwargs, argument", [
    ({"enabled": "everything"}, "enabled"),
    ({"enabled": "ALL"}, "enabled"),
    ({"context": "python"}, "context"),
    ({"context": "stack"}, "context"),
    ({"stacks": "cpp"}, "stacks"),
    ({"stacks": None}, "stacks"),
    ({"max_entries": 0}, "max_entries"),
    ({"max_entries": -3}, "max_entries"),
    ({"max_entries": 2.5}, "max_entries"),
    ({"max_entries": "100"}, "max_entries"),
])
def test_bad_arguments_raise_and_change_nothing(kwargs, argument):
    stream = fresh_stream()
    memory._record_memory_history(max_entries=100)
    with mt.cuda.stream(stream):
        a = empty(10)
    before = trace()[:-1]
    with pytest.raises(ValueError, match=argument):
        memory._record_memory_history(**kwargs)
    with mt.cuda.stream(stream):
        b = empty(10)  # from a's segment
    after = [e for e in trace() if e["action"] != "snapshot"]
    assert after[:len(before)] == before, "the trace changed"
    assert steps(after[len(before):]) == [("alloc", b.data_ptr(), 40)], "recording stopped or changed"
    check_frames(after[-1]["frames"], "test_bad_arguments_raise_and_change_nothing")  # still context="all"
    memory._record_memory_history(None)
    with pytest.raises(ValueError, match=argument):
        memory._record_memory_history(**kwargs)
    c = empty(10)
    assert trace() == [], "a bad call turned history on"
    del a, b, c


def test_record_memory_history_alias_and_exports():
    assert memory.record_memory_history is memory._record_memory_history
    for name in ("record_memory_history", "set_oom_snapshot"):
        assert name in memory.__all__
    out = run_python("""
        from minitensor.cuda import *
        import minitensor as mt
        print(mt.cuda.set_oom_snapshot is mt.cuda.memory.set_oom_snapshot,
              mt.cuda.record_memory_history is mt.cuda.memory._record_memory_history)
        """)
    assert out.split() == ["True", "True"]


# ============================================================================================== snapshot
def test_snapshot_invariants_on_a_busy_allocator():
    rng = random.Random(7)
    side = mt.cuda.Stream()
    memory._record_memory_history()
    live = workload(rng)
    gate = mt.cuda.Gate()
    try:
        with mt.cuda.stream(side):
            pending = empty(5000)
        ptr = pending.data_ptr()
        gate.wait()
        pending.record_stream(mt.cuda.current_stream())
        del pending
        snap = memory._snapshot()
    finally:
        gate.open()
    mt.cuda.synchronize()
    assert blocks(snap)[ptr]["state"] == "active_pending_free"
    check_invariants(snap)
    states = {b["state"] for b in blocks(snap).values()}
    assert states == STATES
    by_addr = blocks(snap)
    for t in live:
        if t.numel():
            assert by_addr[t.data_ptr()]["state"] == "active_allocated"
            check_frames(by_addr[t.data_ptr()]["frames"], "workload")
    replay_like_memoryviz(snap)
    check_invariants(memory._snapshot())
    replay_like_memoryviz(memory._snapshot())


def test_snapshot_of_one_device_and_without_history():
    t = empty(10)
    snap = memory._snapshot()
    assert snap["device_traces"] == [[] for _ in range(mt.cuda.device_count())]
    assert blocks(snap)[t.data_ptr()]["frames"] == []
    check_invariants(snap)
    assert memory._snapshot(0)["segments"] == snap["segments"]
    assert memory._snapshot("cuda:0")["segments"] == snap["segments"]
    assert snap["segments"] == mt.cuda.memory_snapshot()


def test_dump_snapshot_is_a_protocol_4_pickle_memoryviz_reads(tmp_path):
    rng = random.Random(3)
    memory._record_memory_history()
    live = workload(rng, 60)
    path = tmp_path / "snap.pickle"
    memory._dump_snapshot(str(path))
    data = path.read_bytes()
    ops = list(pickletools.genops(data))
    assert ops[0][0].name == "PROTO" and 2 <= ops[0][1] <= 4, ops[0]
    used = {op.name for op, _, _ in ops}
    assert used <= MEMORYVIZ_OPCODES, f"opcodes MemoryViz.js cannot read: {sorted(used - MEMORYVIZ_OPCODES)}"
    loaded = pickle.loads(data)
    now = memory._snapshot()
    assert loaded["segments"] == now["segments"]
    assert loaded["allocator_settings"] == now["allocator_settings"]
    assert loaded["device_traces"][0] == now["device_traces"][0][:-1]  # less the newer snapshot entry
    assert loaded["device_traces"][0][-1]["action"] == "snapshot"
    check_invariants(loaded)
    replay_like_memoryviz(loaded)
    assert not [p for p in os.listdir(tmp_path) if p != "snap.pickle"], "temporary file left"
    del live


def test_dump_snapshot_default_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    memory._record_memory_history()
    t = empty(10)
    memory._dump_snapshot()
    with open(tmp_path / "dump_snapshot.pickle", "rb") as f:
        assert t.data_ptr() in blocks(pickle.load(f))


# ============================================================================================== torch's viewer
def _torch_viz(args, cwd):
    p = subprocess.run([sys.executable, "-m", "torch.cuda._memory_viz", *args], cwd=cwd, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, f"_memory_viz {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def _embedded_snapshot(html):
    """The snapshot a _memory_viz HTML page embeds (base64 of a pickle, padded with zero bytes)."""
    import base64
    match = re.search(r"const local_files = (\[.*?\])\n", html)
    assert match, "no embedded snapshot"
    files = json.loads(match.group(1))
    return pickle.loads(base64.b64decode(files[0]["base64"]))


def test_torch_memory_viz_reads_our_dump(tmp_path):
    pytest.importorskip("torch")
    rng = random.Random(11)
    memory._record_memory_history()
    live = workload(rng, 150)
    keep = empty(1000)
    with pytest.raises(mt.cuda.OutOfMemoryError):
        empty(HUGE, mt.int8)  # an "oom" entry, which trace() formats with its device_free
    path = tmp_path / "snap.pickle"
    memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        ours = pickle.load(f)
    assert len(ours["device_traces"][0]) >= 200
    for plot in ("trace_plot", "segment_plot"):
        out = tmp_path / f"{plot}.html"
        _torch_viz([plot, str(path), "-o", str(out)], tmp_path)
        html = out.read_text()
        assert '"base64"' in html and "MemoryViz.js" in html
        assert _embedded_snapshot(html) == ours
    out = tmp_path / "trace_plot_segments.html"
    _torch_viz(["trace_plot", "-s", str(path), "-o", str(out)], tmp_path)
    assert _embedded_snapshot(out.read_text()) == ours
    stats = _torch_viz(["stats", str(path)], tmp_path)
    assert f"segments: {len(ours['segments'])}" in stats
    printed = _torch_viz(["trace", str(path)], tmp_path)
    assert f"{len(ours['device_traces'][0])} entries" in printed and "raise OutOfMemoryError" in printed
    # segments/memory draw flamegraphs with flamegraph.pl (a download): their input lines, without it
    p = subprocess.run([sys.executable, "-c", f"""
import pickle
from torch.cuda import _memory_viz as v
with open({str(path)!r}, "rb") as f:
    data = pickle.load(f)
lines = v.segments(data, format_flamegraph=str) + v.memory(data, format_flamegraph=str)
print(len(lines.splitlines()))
"""], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.split()[-1]) >= len(ours["segments"])
    del live, keep


# ============================================================================================== out of memory
def _oom_entries():
    return [e for e in trace() if e["action"] == "oom"]


def test_out_of_memory_entry_and_accounting():
    keep = empty(1000)
    memory._record_memory_history()
    allocated = mt.cuda.memory_allocated()
    ooms = mt.cuda.memory_stats()["num_ooms"]
    with pytest.raises(mt.cuda.OutOfMemoryError):
        empty(HUGE, mt.int8)
    found = _oom_entries()
    assert len(found) == 1
    e = found[0]
    assert set(e) == KEYS | {"device_free"}, e
    assert e["size"] >= HUGE and type(e["device_free"]) is int
    assert 0 <= e["device_free"] <= mt.cuda.get_device_properties().total_memory
    assert e["stream"] == mt.cuda.current_stream().cuda_stream
    assert mt.cuda.memory_allocated() == allocated
    assert mt.cuda.memory_stats()["num_ooms"] == ooms + 1
    again = empty(1000)
    again.fill_(3.0)
    assert float(again.cpu().numpy()[0]) == 3.0
    assert mt.cuda.memory_allocated() == allocated + 4096
    check_invariants(memory._snapshot())
    del keep


def test_out_of_memory_snapshot_file(tmp_path):
    path = tmp_path / "oom.pickle"
    memory.set_oom_snapshot(str(path))
    memory._record_memory_history()
    line = here() + 1
    keep = empty(1000)
    with pytest.raises(mt.cuda.OutOfMemoryError):
        empty(HUGE, mt.int8)
    assert path.exists()
    with open(path, "rb") as f:
        dumped = pickle.load(f)
    now = memory._snapshot()
    assert dumped["segments"] == now["segments"]  # nothing changed since the error
    check_frames(blocks(dumped)[keep.data_ptr()]["frames"], "test_out_of_memory_snapshot_file", line)
    assert dumped["device_traces"][0][-1]["action"] == "oom"
    assert dumped["device_traces"][0] == now["device_traces"][0][:-1]
    check_invariants(dumped)
    ops = {op.name for op, _, _ in pickletools.genops(path.read_bytes())}
    assert ops <= MEMORYVIZ_OPCODES
    assert os.listdir(tmp_path) == ["oom.pickle"]


def test_out_of_memory_under_a_memory_fraction(tmp_path):
    path = tmp_path / "oom.pickle"
    memory.set_oom_snapshot(path)  # a path-like object
    memory._record_memory_history()
    keep = empty(1000)
    total = mt.cuda.get_device_properties().total_memory
    mt.cuda.set_per_process_memory_fraction(0.02)
    allocated = mt.cuda.memory_allocated()
    with pytest.raises(mt.cuda.OutOfMemoryError, match="allowed"):
        empty(int(total * 0.04), mt.int8)
    assert len(_oom_entries()) == 1
    assert mt.cuda.memory_allocated() == allocated
    with open(path, "rb") as f:
        assert blocks(pickle.load(f))[keep.data_ptr()]["state"] == "active_allocated"
    mt.cuda.set_per_process_memory_fraction(1.0)
    b = empty(1000)
    del b, keep


def test_out_of_memory_snapshot_without_history(tmp_path):
    path = tmp_path / "oom.pickle"
    memory.set_oom_snapshot(str(path))
    keep = empty(1000)
    with pytest.raises(mt.cuda.OutOfMemoryError):
        empty(HUGE, mt.int8)
    with open(path, "rb") as f:
        dumped = pickle.load(f)
    assert dumped["device_traces"] == [[] for _ in range(mt.cuda.device_count())]
    assert blocks(dumped)[keep.data_ptr()]["state"] == "active_allocated"
    memory.set_oom_snapshot(None)
    os.remove(path)
    with pytest.raises(mt.cuda.OutOfMemoryError):
        empty(HUGE, mt.int8)
    assert not path.exists()


def test_unwritable_out_of_memory_snapshot_warns_and_still_raises(tmp_path):
    path = tmp_path / "missing" / "oom.pickle"
    memory.set_oom_snapshot(str(path))
    memory._record_memory_history()
    keep = empty(1000)
    allocated = mt.cuda.memory_allocated()
    with pytest.warns(RuntimeWarning, match="out-of-memory snapshot"):
        with pytest.raises(mt.cuda.OutOfMemoryError):
            empty(HUGE, mt.int8)
    assert not path.exists()
    assert mt.cuda.memory_allocated() == allocated
    assert len(_oom_entries()) == 1
    b = empty(1000)
    assert mt.cuda.memory_allocated() == allocated + 4096
    del b, keep


def test_out_of_memory_snapshot_from_the_environment(tmp_path):
    path = tmp_path / "env_oom.pickle"
    out = run_python("""
        import minitensor as mt
        mt.cuda.memory._record_memory_history()
        keep = mt.empty(1000, device="cuda")
        before = mt.cuda.memory_allocated()
        try:
            mt.empty(2**45, dtype=mt.int8, device="cuda")
        except mt.cuda.OutOfMemoryError:
            print("oom")
        after = mt.cuda.memory_allocated()
        more = mt.empty(1000, device="cuda")
        print(keep.data_ptr(), before == after, mt.cuda.memory_allocated() == before + 4096)
        """, {"MINITENSOR_OOM_SNAPSHOT": str(path)})
    word, ptr, same, more = out.split()
    assert word == "oom" and same == "True" and more == "True"
    with open(path, "rb") as f:
        dumped = pickle.load(f)
    check_invariants(dumped)
    block = blocks(dumped)[int(ptr)]
    assert block["state"] == "active_allocated"
    assert "<module>" in names(block["frames"])
    assert [e["action"] for e in trace(dumped)][-1] == "oom"


# ============================================================================================== uncached
def test_uncached_allocator_records_its_history():
    out = run_python("""
        import json
        import minitensor as mt
        mt.cuda.memory._record_memory_history()
        a = mt.empty(1000, device="cuda")
        ptr = a.data_ptr()
        del a
        s = mt.cuda.memory._snapshot()
        print(json.dumps([ptr, [[e["action"], e["addr"], e["size"], len(e["frames"])]
                                for e in s["device_traces"][0]]]))
        """, {"MINITENSOR_NO_CACHING": "1"})
    ptr, entries = json.loads(out)
    assert [e[:3] for e in entries] == [["segment_alloc", ptr, 4000], ["alloc", ptr, 4000],
                                        ["free_requested", ptr, 4000], ["free_completed", ptr, 4000],
                                        ["segment_free", ptr, 4000], ["snapshot", 0, 0]]
    assert entries[1][3] > 0 and entries[2][3] > 0  # alloc and free frames (context="all")


def test_uncached_allocator_out_of_memory_entry_and_snapshot(tmp_path):
    path = tmp_path / "oom.pickle"
    out = run_python("""
        import minitensor as mt
        mt.cuda.memory._record_memory_history()
        keep = mt.empty(1000, device="cuda")
        try:
            mt.empty(2**45, dtype=mt.int8, device="cuda")
        except mt.cuda.OutOfMemoryError:
            pass
        print(keep.data_ptr(), [e["action"] for e in mt.cuda.memory._snapshot()["device_traces"][0]].count("oom"))
        """, {"MINITENSOR_NO_CACHING": "1", "MINITENSOR_OOM_SNAPSHOT": str(path)})
    ptr, ooms = map(int, out.split())
    assert ooms == 1, "no oom entry in the uncached allocator's trace"
    assert path.exists(), "MINITENSOR_OOM_SNAPSHOT not written by the uncached allocator"
    with open(path, "rb") as f:
        assert blocks(pickle.load(f))[ptr]["state"] == "active_allocated"


# ============================================================================================== threads
def test_threads_allocating_with_history_keep_a_consistent_trace():
    n_threads, rounds = 4, 80
    memory._record_memory_history()
    barrier = threading.Barrier(n_threads)
    errors = []

    def work(i):
        rng = random.Random(i)
        live = []
        try:
            barrier.wait()
            for _ in range(rounds):
                if live and rng.random() < 0.5:
                    live.pop(rng.randrange(len(live)))
                else:
                    live.append(empty(rng.choice([10, 1000, 70_000])))
            live.clear()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    snap = memory._snapshot()
    check_invariants(snap, times=False)  # a free's time is taken before it is appended, without the lock
    replay_like_memoryviz(snap)
    allocs = [e["addr"] for e in trace(snap) if e["action"] == "alloc"]
    assert all(e["addr"] in allocs for e in trace(snap) if e["action"] == "free_requested")
    assert sum(1 for e in trace(snap) if e["action"] == "alloc") == sum(
        1 for e in trace(snap) if e["action"] == "free_completed")


def test_example_script_writes_a_snapshot_and_a_page(tmp_path):
    """examples/memory_history.py, the sample the docs point to: its pickle holds the workload's trace and its
    page carries the data inline."""
    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                          "memory_history.py")
    subprocess.run([sys.executable, script, str(tmp_path)], check=True, capture_output=True, timeout=600)
    with open(tmp_path / "snapshot.pickle", "rb") as f:
        snapshot = pickle.load(f)
    actions = {e["action"] for e in snapshot["device_traces"][0]}
    assert {"alloc", "free_requested", "free_completed", "segment_alloc"} <= actions
    page = (tmp_path / "memory.html").read_text()
    assert "<script" in page and "http://" not in page and "https://" not in page
