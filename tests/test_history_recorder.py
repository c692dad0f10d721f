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
    trace, live, stacks = [] if trace else None, {} if live else None, {}
    keep = FIELDS * min(max_entries, sys.maxsize // (2 * FIELDS))
    r = recorder_type(trace, live, stacks, history._OWN, alloc_stacks, free_stacks, keep, max_interned)
    return r, trace, live, stacks


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
    r, trace, live, _ = make(recorder_type)
    line, caller = allocate_at_one_line(r, 0x1000), here()
    r.free(0x1000, 512, 7, (0, 3), True)
    r.alloc(0x2000, 1024, 7, (0, 3))
    r.free(0x2000, 1024, 7, (0, 3), False)  # used on other streams: completed later
    got = entries(trace)
    assert [e[:4] for e in got] == [("alloc", 0x1000, 512, 7), ("free_requested", 0x1000, 512, 7),
                                    ("free_completed", 0x1000, 512, 7), ("alloc", 0x2000, 1024, 7),
                                    ("free_requested", 0x2000, 1024, 7)]
    assert [e[6:] for e in got] == [(None, None), ((0, 3), None), ((0, 3), None), ((0, 3), None), ((0, 3), None)]
    times = [e[4] for e in got]
    assert all(type(t) is int for t in times) and times == sorted(times)
    assert got[1][4] == got[2][4], "a free completed at once shares its request's time"
    assert lines(got[0][5])[:2] == [("allocate_at_one_line", line), ("test_entries_hold_their_slots", caller)]
    assert lines(got[1][5])[0] == ("test_entries_hold_their_slots", caller + 1)
    assert got[2][5] == (), "a completion has no stack"
    assert live == {}, "both blocks were freed"


@pytest.mark.parametrize("alloc_stacks,free_stacks,with_live", [(True, True, True), (True, False, True),
                                                                 (False, False, True), (False, False, False)])
def test_contexts_take_the_stacks_they_name(recorder_type, alloc_stacks, free_stacks, with_live):
    r, trace, live, _ = make(recorder_type, alloc_stacks, free_stacks, live=with_live)
    r.alloc(0x1000, 512, 0, None)
    if with_live:
        assert list(live) == [0x1000] and lines(live[0x1000])[0][0] == "test_contexts_take_the_stacks_they_name"
    r.free(0x1000, 512, 0, None, True)
    alloc, requested, _ = entries(trace)
    assert bool(alloc[5]) == alloc_stacks and bool(requested[5]) == free_stacks
    if alloc_stacks and with_live:
        assert alloc[5] is not None


def test_state_only_keeps_live_stacks(recorder_type):
    r, trace, live, _ = make(recorder_type, False, False, trace=False)
    r.alloc(0x1000, 512, 0, None)
    r.alloc(0x2000, 512, 0, None)
    r.free(0x1000, 512, 0, None, True)
    r.free(0x3000, 512, 0, None, True)  # allocated before recording began: nothing to drop
    assert list(live) == [0x2000]


def test_same_call_site_gives_one_stack_object(recorder_type):
    """One object per call site, not per call (3.11's specializing interpreter may move a call's instruction
    offset once, when it specializes the call: one more object, same lines)."""
    r, _, live, stacks = make(recorder_type)
    for ptr in range(100):
        allocate_at_one_line(r, ptr)
    r.alloc(1000, 512, 7, None)  # another line
    assert len({id(live[ptr]) for ptr in range(100)}) <= 2
    assert len({tuple(lines(live[ptr])) for ptr in range(100)}) == 1
    assert lines(live[1000])[0][1] != lines(live[0])[0][1]
    assert len(stacks) <= 3


def test_a_stack_found_under_its_hash_is_checked_frame_by_frame(recorder_type):
    """Every key of the table is made to hold another site's stack, as a hash collision would: the recorder
    must see that the frames differ and record its own."""
    r, _, live, stacks = make(recorder_type)
    line = allocate_at_one_line(r, 1)
    r.alloc(2, 512, 7, None)
    other = live[2]
    for key in stacks:
        stacks[key] = other
    allocate_at_one_line(r, 3)
    assert live[3] is not other and lines(live[3])[0] == ("allocate_at_one_line", line)


def test_intern_table_starts_over_past_its_cap(recorder_type):
    cap = 50
    r, _, live, stacks = make(recorder_type, trace=False, max_interned=cap)
    calls = "\n".join(f"r.alloc({i}, 512, 0, None)" for i in range(cap + 10))
    exec(compile(calls, "<many call sites>", "exec"), {"r": r})
    assert len(stacks) == 10, "cleared once, when the cap was reached, then 10 more sites"
    for i in (0, cap - 1, cap + 9):  # stacks from before the clear stay valid
        assert lines(live[i])[0] == ("<module>", i + 1)


def test_ring_keeps_the_last_entries_and_trims_rarely(recorder_type):
    r, trace, _, _ = make(recorder_type, max_entries=4)
    for ptr in range(9):
        r.alloc(ptr, 512, 0, None)
        assert len(trace) <= 2 * 4 * FIELDS
    assert [e[1] for e in entries(trace)] == [5, 6, 7, 8]  # the 9th entry passed twice 4: trimmed to 4
    for ptr in range(9, 12):
        r.alloc(ptr, 512, 0, None)
    assert [e[1] for e in entries(trace)] == list(range(5, 12))  # no trim until it passes 8 again


def test_threads_never_interleave_entries(recorder_type):
    r, trace, _, _ = make(recorder_type, max_entries=50)
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
        assert action in ("alloc", "free_requested", "free_completed") and size == 512 and ptr >> 32 == stream
