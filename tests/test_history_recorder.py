"""The memory history's recorders on their own (allocator/_recorder.c's Recorder and history.PythonRecorder, the
same in Python): the slots of each entry, the ring's trim, stacks interned per call site and checked frame by frame
when found, the intern table's cap, and entries from concurrent threads never interleaved. The allocator's use of
them, and the snapshot they make, are test_memory_history.py's."""
import sys
import threading

import pytest

from minitensor.allocator import history

FIELDS = history.FIELDS


@pytest.fixture(params=["c_recorder", "python_recorder"])
def recorder_type(request):
    if request.param == "python_recorder":
        return history.PythonRecorder
    history._load_recorder_type()
    assert history._recorder_type is not history.PythonRecorder, "this machine has a C compiler: the C recorder"
    return history._recorder_type


def make(recorder_type, alloc_stacks=True, free_stacks=True, max_entries=sys.maxsize, trace=True, live=True,
         max_interned=history.MAX_INTERNED):
    trace, live = [] if trace else None, {} if live else None
    keep = FIELDS * min(max_entries, sys.maxsize // (2 * FIELDS))
    return recorder_type(trace, live, history._OWN, alloc_stacks, free_stacks, keep, max_interned), trace, live


def entries(trace):
    assert len(trace) % FIELDS == 0, "a trace holds whole entries"
    return [tuple(trace[i:i + FIELDS]) for i in range(0, len(trace), FIELDS)]


def lines(stack):
    """The stack's (function name, line) pairs, innermost first."""
    codes, positions = stack
    return [(code.co_name, history._line(code, position))
            for code, position in zip(codes, memoryview(positions).cast("i"))]


def here():
    """The caller's line number."""
    return sys._getframe(1).f_lineno


def allocate_at_one_line(r, ptr):
    r.alloc(ptr, 512, 7, None)
    return here() - 1


def test_entries_hold_their_slots(recorder_type):
    r, trace, live = make(recorder_type)
    line, caller = allocate_at_one_line(r, 0x1000), here()
    r.free(0x1000, 512, 7, (0, 3), True)
    r.alloc(0x2000, 1024, 7, (0, 3))
    r.free(0x2000, 1024, 7, (0, 3), False)  # used on other streams: completed later
    got = entries(trace)
    assert [e[:4] for e in got] == [("alloc", 0x1000, 512, 7), ("free", 0x1000, 512, 7),  # completed at once
                                    ("alloc", 0x2000, 1024, 7), ("free_requested", 0x2000, 1024, 7)]
    assert [e[6:] for e in got] == [(None, None), ((0, 3), None), ((0, 3), None), ((0, 3), None)]
    times = [e[4] for e in got]
    assert all(type(t) is int for t in times) and times == sorted(times)
    assert lines(got[0][5])[:2] == [("allocate_at_one_line", line), ("test_entries_hold_their_slots", caller)]
    assert lines(got[1][5])[0] == ("test_entries_hold_their_slots", caller + 1)
    assert live == {}, "both blocks were freed"


def test_a_free_completed_at_once_reads_back_as_torchs_two_entries(recorder_type, monkeypatch):
    monkeypatch.setattr(history, "_recorder_type", recorder_type)
    h = history.History(max_entries=3)
    h.alloc(0x1000, 512, 7, None)
    h.free(0x1000, 512, 7, (0, 3), True)
    h.event(history.SEGMENT_FREE, 0x1000, 2 << 20, 7, None)
    got = h.entries({})
    assert [(e["action"], e["addr"], e.get("pool_id")) for e in got] == [
        ("free_requested", 0x1000, (0, 3)), ("free_completed", 0x1000, (0, 3)), ("segment_free", 0x1000, None)]
    assert got[0]["time_us"] == got[1]["time_us"] and got[0]["frames"] and got[1]["frames"] == []
    assert got[0]["frames"][0]["name"] == "test_a_free_completed_at_once_reads_back_as_torchs_two_entries"


@pytest.mark.parametrize("alloc_stacks,free_stacks,with_live", [(True, True, True), (True, False, True),
                                                                 (False, False, True), (False, False, False)])
def test_contexts_take_the_stacks_they_name(recorder_type, alloc_stacks, free_stacks, with_live):
    r, trace, live = make(recorder_type, alloc_stacks, free_stacks, live=with_live)
    r.alloc(0x1000, 512, 0, None)
    if with_live:
        assert list(live) == [0x1000] and lines(live[0x1000])[0][0] == "test_contexts_take_the_stacks_they_name"
    r.free(0x1000, 512, 0, None, True)
    alloc, freed = entries(trace)
    assert bool(alloc[5]) == alloc_stacks and bool(freed[5]) == free_stacks
    if alloc_stacks and with_live:
        assert alloc[5] is not None


def test_state_only_keeps_live_stacks(recorder_type):
    r, trace, live = make(recorder_type, False, False, trace=False)
    r.alloc(0x1000, 512, 0, None)
    r.alloc(0x2000, 512, 0, None)
    r.free(0x1000, 512, 0, None, True)
    r.free(0x3000, 512, 0, None, True)  # allocated before recording began: nothing to drop
    assert list(live) == [0x2000]


def test_same_call_site_gives_one_stack_object(recorder_type):
    """One object per call site, not per call (3.11's specializing interpreter may move a call's instruction
    offset once, when it specializes the call: one more object, same lines)."""
    r, _, live = make(recorder_type)
    for ptr in range(100):
        allocate_at_one_line(r, ptr)
    r.alloc(1000, 512, 7, None)  # another line
    assert len({id(live[ptr]) for ptr in range(100)}) <= 2
    assert len({tuple(lines(live[ptr])) for ptr in range(100)}) == 1
    assert lines(live[1000])[0][1] != lines(live[0])[0][1]
    assert r.interned() <= 3


def test_a_stack_found_in_the_table_is_checked_frame_by_frame(recorder_type):
    """A table of one stack: every stack meets the one of the other call site there, as stacks whose hashes
    collide do, and the recorder must see that the frames differ."""
    r, _, live = make(recorder_type, max_interned=1)
    line = allocate_at_one_line(r, 1)
    for ptr in (2, 4):
        r.alloc(ptr, 512, 7, None)
        allocate_at_one_line(r, ptr + 1)
    assert r.interned() == 1
    assert [lines(live[ptr])[0] for ptr in (1, 3, 5)] == [("allocate_at_one_line", line)] * 3
    assert lines(live[2]) == lines(live[4]) and lines(live[2])[0] != ("allocate_at_one_line", line)


def test_intern_table_holds_at_most_its_cap(recorder_type):
    cap = 50
    r, _, live = make(recorder_type, trace=False, max_interned=cap)
    calls = "\n".join(f"r.alloc({i}, 512, 0, None)" for i in range(3 * cap))
    exec(compile(calls, "<many call sites>", "exec"), {"r": r})
    assert 0 < r.interned() <= cap
    for i in (0, cap - 1, 3 * cap - 1):  # stacks no longer in the table stay valid
        assert lines(live[i])[0] == ("<module>", i + 1)


def test_ring_keeps_the_last_entries_and_trims_rarely(recorder_type):
    r, trace, _ = make(recorder_type, max_entries=4)
    for ptr in range(9):
        r.alloc(ptr, 512, 0, None)
        assert len(trace) <= 2 * 4 * FIELDS
    assert [e[1] for e in entries(trace)] == [5, 6, 7, 8]  # the 9th entry passed twice 4: trimmed to 4
    for ptr in range(9, 12):
        r.alloc(ptr, 512, 0, None)
    assert [e[1] for e in entries(trace)] == list(range(5, 12))  # no trim until it passes 8 again


def test_threads_never_interleave_entries(recorder_type):
    r, trace, _ = make(recorder_type, max_entries=50)
    n_threads, rounds = 4, 2000
    barrier = threading.Barrier(n_threads)

    def work(t):
        barrier.wait()
        for i in range(rounds):
            ptr = (t << 32) | i
            r.alloc(ptr, 512, t, None)
            r.free(ptr, 512, t, None, i % 2 == 0)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    got = entries(trace)
    assert 50 <= len(got) <= 100
    for action, ptr, size, stream, time_ns, stack, pool_id, device_free in got:
        assert action in ("alloc", "free_requested", "free") and size == 512 and ptr >> 32 == stream
