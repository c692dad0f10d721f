"""Threads: device-side errors reach the thread whose kernel found them, and a stress test of everything at once
(ops checked against numpy per thread, allocations, copies, pinned memory, side streams, readers of the
allocator's state, errors), with the allocator's invariants checked at the end.

MINITENSOR_STRESS_ROUNDS sets the stress test's rounds per thread (default 2: a few seconds on the simulator);
MINITENSOR_STRESS_THREADS its threads (default 8).
"""
import ctypes
import gc
import os
import sys
import threading
import warnings

import numpy as np

import minitensor as mt
from minitensor.cuda import device_errors

DEV = "cuda"


def _write_record(value, info):
    """What a gather kernel does on a bad index: write it and its info word into the calling thread's record."""
    record = (ctypes.c_int64 * 2).from_address(device_errors.record_address(0))
    record[0], record[1] = value, info


def test_device_error_is_raised_in_the_launching_thread_only():
    """A kernel writes the error record its op was given: the launching thread's. Another thread's
    synchronising calls never raise it; the launching thread's next one does, once."""
    info = device_errors.info_word(device_errors.GATHER, 0, 10)
    written, checked = threading.Event(), threading.Event()
    seen = []

    def launcher():
        _write_record(50, info)
        written.set()
        checked.wait(60)
        try:
            mt.cuda.synchronize()
        except IndexError as e:
            seen.append(str(e))
        mt.cuda.synchronize()  # raised once, then cleared

    t = threading.Thread(target=launcher)
    t.start()
    assert written.wait(60)
    try:
        mt.cuda.synchronize()  # this thread's records are clean: another thread's error is not ours
        mt.cuda.current_stream().synchronize()
        mt.cuda.current_stream().record_event().synchronize()
        (mt.ones(3, device=DEV) + 1).cpu()
    finally:
        checked.set()
        t.join(60)
    assert seen == ["index 50 is out of bounds for dimension 0 with size 10 (found by the gather kernel on cuda:0)"]


def test_error_of_a_thread_that_ends_unraised_is_reported():
    """A thread that ends before a synchronising call raised its kernel's error: the error is not lost (a
    RuntimeWarning says what it was) and its record, given to a later thread, starts clean."""
    info = device_errors.info_word(device_errors.INDEX_SELECT, 1, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = threading.Thread(target=_write_record, args=(-3, info), name="ends-early")
        t.start()
        t.join(60)
        gc.collect()
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert any("index out of range in self: index -3 is out of bounds for dimension 1 with size 4" in m
               and "ends-early" in m for m in messages), messages
    clean = []
    t = threading.Thread(target=lambda: clean.append(mt.cuda.synchronize()))
    t.start()
    t.join(60)
    assert clean == [None]


def test_gathers_in_threads_raise_only_their_own_errors():
    """Threads sharing the default stream, some gathering with bad indices: each bad gather raises in its own
    thread, and no good one raises."""
    x = mt.tensor(np.arange(10, dtype=np.float32), device=DEV)
    good, bad = mt.tensor([0, 9, 3], device=DEV), mt.tensor([0, 10, 3], device=DEV)
    barrier = threading.Barrier(4)
    wrong = []

    def work(i):
        expect_error = i == 0
        barrier.wait(60)
        for _ in range(40):
            try:
                out = mt.gather(x, 0, bad if expect_error else good)
                values = out.cpu().numpy()
                if expect_error:
                    wrong.append(f"thread {i}: bad gather did not raise")
                elif values.tolist() != [0.0, 9.0, 3.0]:
                    wrong.append(f"thread {i}: {values}")
            except IndexError as e:
                if not expect_error:
                    wrong.append(f"thread {i}: another thread's error: {e}")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so the races happen
    try:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    finally:
        sys.setswitchinterval(switch)
    assert not wrong, wrong[:5]


# ============================================================================================== stress
ROUNDS = int(os.environ.get("MINITENSOR_STRESS_ROUNDS", "2"))
THREADS = int(os.environ.get("MINITENSOR_STRESS_THREADS", "8"))


def _allocated_blocks():
    return sorted((b["address"], b["size"]) for seg in mt.cuda.memory_snapshot() for b in seg["blocks"]
                  if b["state"] != "inactive")


def _check_snapshot(snapshot):
    """A snapshot describes whole segments: its blocks tile each one, and the segment's sums are its blocks'."""
    for seg in snapshot:
        at = seg["address"]
        for b in seg["blocks"]:
            assert b["address"] == at and b["state"] in ("active_allocated", "active_pending_free", "inactive")
            at += b["size"]
        assert at == seg["address"] + seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")


def _check_stats_match_snapshot():
    stats, snapshot = mt.cuda.memory_stats(), mt.cuda.memory_snapshot()
    _check_snapshot(snapshot)
    blocks = [b for seg in snapshot for b in seg["blocks"]]
    assert stats["allocated_bytes.all.current"] == sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    assert stats["active_bytes.all.current"] == sum(b["size"] for b in blocks if b["state"] != "inactive")
    assert stats["reserved_bytes.all.current"] == sum(seg["total_size"] for seg in snapshot)
    assert stats["segment.all.current"] == len(snapshot)
    assert stats["allocation.all.current"] == sum(b["state"] == "active_allocated" for b in blocks)


def _round(i, r, rng, side, errors):
    """One round of thread i: every kind of work, each result checked against numpy."""
    n = int(rng.integers(1, 3000))
    a_np = rng.standard_normal(n).astype(np.float32)
    b_np = rng.standard_normal(n).astype(np.float32)
    a = mt.tensor(a_np, device=DEV)                                     # pageable host -> device
    pinned = mt.empty(n, pin_memory=True)
    pinned.numpy()[:] = b_np
    b = pinned.to(DEV, non_blocking=True)                                 # pinned host -> device, asynchronous
    c = a * b + 1.5                                                       # elementwise
    np.testing.assert_allclose(c.cpu().numpy(), a_np * b_np + np.float32(1.5), rtol=1e-6, atol=1e-6)
    m = c.reshape(1, n).sum(1)                                            # reduction
    np.testing.assert_allclose(m.cpu().numpy(), [np.sum(a_np * b_np + np.float32(1.5), dtype=np.float64)],
                               rtol=1e-4, atol=1e-3)
    assert abs(a.max().item() - a_np.max()) == 0

    idx = rng.integers(0, n, size=int(rng.integers(1, 50)))
    g = mt.gather(a, 0, mt.tensor(idx, device=DEV))                        # gather
    np.testing.assert_array_equal(g.cpu().numpy(), a_np[idx])
    if r % 2 == i % 2:                                                    # a bad index, caught by this thread
        bad = idx.copy()
        bad[-1] = n + i
        try:
            mt.index_select(a, 0, mt.tensor(bad, device=DEV)).cpu()
        except IndexError as e:
            assert f"index {n + i} is out of bounds for dimension 0 with size {n}" in str(e), str(e)
        else:
            errors.append(f"thread {i}: a bad index_select raised nothing")

    k = mt.randint(-5, 5, (n,), device=DEV).cpu().numpy()                  # random
    assert k.min() >= -5 and k.max() < 5
    u = mt.empty(n, device=DEV).uniform_(2.0, 3.0).cpu().numpy()
    assert u.min() >= 2.0 and u.max() < 3.0
    p = mt.bernoulli(mt.full((n,), 0.5, device=DEV)).cpu().numpy()
    assert set(np.unique(p)) <= {0.0, 1.0}

    default = mt.cuda.current_stream()                                    # a side stream, record_stream
    side.wait_stream(default)
    with mt.cuda.stream(side):
        if r == 0:
            mt.cuda.sleep(5)
        d = a + c
    a.record_stream(side)
    del a                                                                 # freed: pending on the side stream
    default.wait_stream(side)
    out = d.to("cpu", non_blocking=True)                                  # device -> pinned host, asynchronous
    d.record_stream(default)
    default.synchronize()
    np.testing.assert_allclose(out.numpy(), a_np + (a_np * b_np + np.float32(1.5)), rtol=1e-6, atol=1e-6)

    scratch = [mt.empty(int(rng.integers(1, 300_000)), dtype=mt.int8, device=DEV) for _ in range(5)]
    ptr = mt.cuda.caching_allocator_alloc(int(rng.integers(1, 10_000)))
    del scratch[::2]
    mt.cuda.caching_allocator_delete(ptr)
    if r == ROUNDS - 1:                                                   # out of memory, in this thread only
        try:
            mt.empty(2 * mt.cuda.get_device_properties().total_memory, dtype=mt.int8, device=DEV)
        except mt.cuda.OutOfMemoryError:
            pass
        else:
            errors.append(f"thread {i}: an impossible allocation succeeded")


def test_threads_stress():
    """THREADS threads, each running ROUNDS rounds of every kind of work (see _round), while a reader thread
    takes snapshots and statistics; then the allocator is where it started and agrees with itself."""
    gc.collect()
    mt.cuda.synchronize()
    mt.cuda.empty_cache()
    mt.cuda.host_empty_cache()
    base_blocks = _allocated_blocks()
    base_allocated = mt.cuda.memory_allocated()
    base_pinned = mt.cuda.host_memory_stats()["active_requests.current"]
    errors = []
    done = threading.Event()

    def work(i):
        rng = np.random.default_rng(1000 + i)
        side = mt.cuda.Stream()
        try:
            for r in range(ROUNDS):
                _round(i, r, rng, side, errors)
            side.synchronize()
            mt.cuda.synchronize()
        except Exception as e:  # reported by the main thread
            errors.append(f"thread {i}: {type(e).__name__}: {e}")

    def read():
        try:
            while not done.is_set():
                _check_snapshot(mt.cuda.memory_snapshot())
                stats = mt.cuda.memory_stats()
                assert stats["allocated_bytes.all.current"] <= stats["reserved_bytes.all.current"]
                assert mt.cuda.memory_allocated() >= 0
                mt.cuda.host_memory_stats()
        except Exception as e:
            errors.append(f"reader: {type(e).__name__}: {e}")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # switch threads often, so the races happen
    try:
        reader = threading.Thread(target=read)
        reader.start()
        threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(600)
        done.set()
        reader.join(60)
    finally:
        sys.setswitchinterval(switch)
    assert not errors, "\n".join(errors[:10])
    assert not any(t.is_alive() for t in threads)

    gc.collect()
    mt.cuda.synchronize()
    assert mt.cuda.memory_allocated() == base_allocated
    _check_stats_match_snapshot()
    mt.cuda.empty_cache()
    assert _allocated_blocks() == base_blocks, "a block leaked"
    _check_stats_match_snapshot()
    mt.cuda.host_empty_cache()
    assert mt.cuda.host_memory_stats()["active_requests.current"] == base_pinned, "a pinned block leaked"
