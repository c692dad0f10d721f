"""The caching allocator end to end on the "cuda" device (the simulator here, a real GPU on the GPU machine):
reuse per stream, record_stream (with sleep and Gate), statistics, snapshots, out-of-memory messages and
retries, the memory fraction, settings, and threads.

Sizes for out-of-memory cases come from the device's total memory, so the tests hold on any device. Kernel
launches are few and small: on the simulator each one runs in Triton's interpreter.
"""
import gc
import os
import random
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

import minitensor as mt
from helpers import REPO, run_python

DEV = "cuda"


@pytest.fixture(autouse=True)
def _clean_allocator():
    """Each test starts with an idle device and an empty cache, and leaves the allocator's settings,
    fraction and current stream as it found them."""
    gc.collect()  # tensors of earlier tests caught in reference cycles
    mt.cuda.synchronize()
    mt.cuda.empty_cache()
    yield
    try:
        mt.cuda.set_stream(mt.cuda.default_stream())
        mt.cuda.set_per_process_memory_fraction(1.0)
        mt.cuda.memory.set_allocator_settings("")
    finally:
        mt.cuda.synchronize()
        mt.cuda.empty_cache()


def total_memory():
    return mt.cuda.get_device_properties().total_memory


def empty(n, dtype=mt.float32):
    return mt.empty(n, dtype=dtype, device=DEV)


# ============================================================================================== reuse
def test_freed_block_is_reused_on_its_stream():
    n = random.randint(1, 4096)
    a = empty(n)
    ptr = a.data_ptr()
    del a
    b = empty(n)
    assert b.data_ptr() == ptr
    del b
    side = mt.cuda.Stream()
    with mt.cuda.stream(side):
        c = empty(n)  # the default stream's cached block is not for another stream
    assert c.data_ptr() != ptr
    d = empty(n)
    assert d.data_ptr() == ptr


def test_caching_allocator_alloc_and_delete():
    prev = mt.cuda.memory_allocated()
    size = random.randint(1, 10000)
    ptr = mt.cuda.caching_allocator_alloc(size)
    assert mt.cuda.memory_allocated() == prev + (size + 511) // 512 * 512
    mt.cuda.caching_allocator_delete(ptr)
    assert mt.cuda.memory_allocated() == prev
    side = mt.cuda.Stream()
    p1 = mt.cuda.caching_allocator_alloc(4096, device=0, stream=side)
    p2 = mt.cuda.caching_allocator_alloc(4096, device="cuda:0", stream=side.cuda_stream)
    assert p1 != p2
    for p in (p1, p2):
        mt.cuda.caching_allocator_delete(p)
    assert mt.cuda.caching_allocator_alloc(0) == 0
    mt.cuda.caching_allocator_delete(0)
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        mt.cuda.caching_allocator_delete(p1)
    with pytest.raises(TypeError, match="Invalid type for stream argument"):
        mt.cuda.caching_allocator_alloc(16, stream="s")


# ============================================================================================== record_stream
def test_record_stream_with_sleep():
    """torch's test_record_stream: a block used by the default stream, freed while that stream sleeps, is
    not reused by its own stream until the sleep is over."""
    data = np.random.rand(4).astype(np.float32)
    result = empty(4)
    empty(4).copy_(result)  # loads the copy kernel now: loading one waits for the sleep below to end
    stream = mt.cuda.Stream()
    with mt.cuda.stream(stream):
        tmp = mt.tensor(data, device=DEV)
        ptr = tmp.data_ptr()
    mt.cuda.current_stream().wait_stream(stream)
    tmp.record_stream(mt.cuda.current_stream())
    mt.cuda.sleep(300)  # delay the copy below
    result.copy_(tmp)
    del tmp
    with mt.cuda.stream(stream):
        tmp2 = empty(4)
        assert tmp2.data_ptr() != ptr, "allocation reused too soon"
    np.testing.assert_array_equal(result.cpu().numpy(), data)
    mt.cuda.current_stream().synchronize()
    with mt.cuda.stream(stream):
        tmp3 = empty(4)
        assert tmp3.data_ptr() == ptr, "allocation not reused"


def test_record_stream_with_gate_and_pending_stats():
    stream = mt.cuda.Stream()
    with mt.cuda.stream(stream):
        tmp = empty(1000)
    ptr = tmp.data_ptr()
    gate = mt.cuda.Gate()
    try:
        gate.wait()  # the default stream waits for the host
        tmp.record_stream(mt.cuda.current_stream())
        stats = mt.cuda.memory_stats()
        del tmp
        after = mt.cuda.memory_stats()
        assert after["allocated_bytes.all.current"] == stats["allocated_bytes.all.current"] - 4096
        assert after["active_bytes.all.current"] == stats["active_bytes.all.current"]
        states = [b["state"] for s in mt.cuda.memory_snapshot() for b in s["blocks"] if b["address"] == ptr]
        assert states == ["active_pending_free"]
        with mt.cuda.stream(stream):
            again = empty(1000)
        assert again.data_ptr() != ptr
    finally:
        gate.open()
    mt.cuda.synchronize()
    with mt.cuda.stream(stream):
        third = empty(1000)
    assert third.data_ptr() == ptr
    del again, third


def test_record_stream_on_shifted_view():
    """torch's test_record_stream_on_shifted_view: recording on a view with an offset protects the whole
    block, not an address inside it."""
    stream_alloc = mt.cuda.Stream()
    with mt.cuda.stream(stream_alloc):
        base = empty(100)
    view = base[5:]
    assert view.storage_offset() > 0
    stream_record = mt.cuda.Stream()
    gate = mt.cuda.Gate()
    try:
        with mt.cuda.stream(stream_record):
            gate.wait()
        view.record_stream(stream_record)
        data_ptr = base.data_ptr()
        del base, view
        stream_alloc.synchronize()
        with mt.cuda.stream(stream_alloc):
            try_realloc = empty(100)
    finally:
        gate.open()
    assert try_realloc.data_ptr() != data_ptr


def test_record_stream_on_own_stream_changes_nothing():
    a = empty(256)
    ptr = a.data_ptr()
    a.record_stream(mt.cuda.current_stream())
    del a
    assert empty(256).data_ptr() == ptr


# ============================================================================================== statistics
def test_stats_after_alloc_and_free():
    before = mt.cuda.memory_stats()
    sizes = [random.randint(1, 300_000) for _ in range(5)] + [random.randint(2 << 20, 3 << 20)]
    tensors = [empty(n, mt.int8) for n in sizes]
    rounded = sum((n + 511) // 512 * 512 for n in sizes)
    small = sum((n + 511) // 512 * 512 for n in sizes if n <= 1 << 20)
    s = mt.cuda.memory_stats()
    assert s["allocated_bytes.all.current"] - before["allocated_bytes.all.current"] == rounded
    assert s["allocated_bytes.small_pool.current"] - before["allocated_bytes.small_pool.current"] == small
    assert s["requested_bytes.all.current"] - before["requested_bytes.all.current"] == sum(sizes)
    assert s["allocation.all.current"] - before["allocation.all.current"] == len(sizes)
    assert s["allocated_bytes.all.peak"] >= s["allocated_bytes.all.current"]
    assert mt.cuda.memory_allocated() == s["allocated_bytes.all.current"]
    assert mt.cuda.memory_reserved() == s["reserved_bytes.all.current"] >= rounded
    del tensors
    s2 = mt.cuda.memory_stats()
    assert s2["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]
    assert s2["allocated_bytes.all.freed"] - s["allocated_bytes.all.freed"] == rounded
    assert s2["allocated_bytes.all.peak"] == s["allocated_bytes.all.peak"]
    mt.cuda.reset_peak_memory_stats()
    assert mt.cuda.max_memory_allocated() == mt.cuda.memory_allocated()
    mt.cuda.reset_accumulated_memory_stats()
    s3 = mt.cuda.memory_stats()
    assert s3["allocated_bytes.all.allocated"] == s3["allocated_bytes.all.freed"] == 0
    assert s3["num_device_alloc"] == 0


def test_memory_snapshot():
    t = empty(1000)
    ptr = t.data_ptr()
    (seg,) = [s for s in mt.cuda.memory_snapshot() if s["address"] <= ptr < s["address"] + s["total_size"]]
    assert seg["device"] == 0 and seg["segment_type"] == "small" and seg["segment_pool_id"] == (0, 0)
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
    (block,) = [b for b in seg["blocks"] if b["address"] == ptr]
    assert block == {"address": ptr, "size": 4096, "requested_size": 4000, "state": "active_allocated",
                     "frames": []}
    assert seg["stream"] == mt.cuda.current_stream().cuda_stream
    addresses = [s["address"] for s in mt.cuda.memory_snapshot()]
    assert addresses == sorted(addresses)


def test_empty_cache_returns_memory():
    reserved = mt.cuda.memory_reserved()
    t = empty(3 << 20, mt.int8)  # a 20 MiB segment of its own
    assert mt.cuda.memory_reserved() == reserved + (20 << 20)
    del t
    assert mt.cuda.memory_reserved() == reserved + (20 << 20)  # cached
    mt.cuda.empty_cache()
    assert mt.cuda.memory_reserved() == reserved


# ============================================================================================== op caches
def _random_ops(n):
    yield mt.randint(0, 10, (n,), device=DEV)
    yield mt.rand(n, device=DEV)
    yield mt.randn(n, 2, device=DEV)
    t = empty(n)
    yield t.random_(0, 5)
    yield t.uniform_()
    yield t.normal_()
    yield t.bernoulli_(0.5)
    yield mt.bernoulli(mt.full((n,), 0.5, device=DEV))
    yield empty(2 * n)[::2].random_(0, 5)


def _other_ops(n):
    a = empty(n).fill_(1.0)
    yield a + 1
    yield a.sum()
    yield a.reshape(n, 1).sum(0)
    yield mt.gather(a, 0, mt.zeros(n, dtype=mt.int64, device=DEV))
    yield mt.index_select(a, 0, mt.zeros(3, dtype=mt.int64, device=DEV))
    yield mt.zeros(n, device=DEV)
    yield mt.empty(n, dtype=mt.int16, device=DEV)


@pytest.mark.parametrize("ops", [_random_ops, _other_ops], ids=["random", "pointwise-reduction-index-creation"])
def test_op_caches_hold_no_device_memory(ops):
    """Every op keeps a checked-once closure per signature; none of them may keep a tensor of its first call
    alive (randint used to keep its template, random_ and bernoulli(p) the first tensor of every shape)."""
    base, reserved = mt.cuda.memory_allocated(), mt.cuda.memory_reserved()
    for n in range(1, 31):
        for result in ops(n * 4099):  # 30 distinct sizes, each a new signature
            del result
    gc.collect()
    mt.cuda.synchronize()
    assert mt.cuda.memory_allocated() == base
    mt.cuda.empty_cache()
    assert mt.cuda.memory_reserved() == reserved


# ============================================================================================== out of memory
def test_out_of_memory_message_and_recovery():
    tensor = mt.zeros(1024, device=DEV)
    with pytest.raises(mt.cuda.OutOfMemoryError) as e:
        mt.empty(1024 * 1024 * 1024 * 800000000, dtype=mt.int8, device=DEV)
    message = str(e.value)
    size = r"(?:\d+\.\d\d [KMG]iB|\d+ bytes)"
    assert re.fullmatch(rf"CUDA out of memory\. Tried to allocate 800000000\.00 GiB\. GPU 0 has a total capacity of "
                        rf"{size} of which {size} is free\. Of the allocated memory {size} is allocated by "
                        rf"minitensor, and {size} is reserved by minitensor but unallocated\. If reserved but "
                        rf"unallocated memory is large try setting MINITENSOR_ALLOC_CONF=expandable_segments:True to "
                        rf"avoid fragmentation\.", message), message
    assert isinstance(e.value, RuntimeError)
    with pytest.raises(RuntimeError, match="Tried to allocate more than 1EB memory"):
        mt.empty(1024 * 1024 * 1024 * 8000000000, dtype=mt.int8, device=DEV)
    stats = mt.cuda.memory_stats()
    assert stats["num_ooms"] >= 1
    tensor.fill_(1)  # the failure does not disturb later work
    assert np.all(tensor.cpu().numpy() == 1)


def test_out_of_memory_retry_after_freeing_the_cache():
    """torch's test_out_of_memory_retry, with a second step: a request the cached block cannot serve
    succeeds after the allocator gives its cache back and retries."""
    total = total_memory()
    size = int(total * 0.6)
    a = empty(size, mt.int8)
    with pytest.raises(mt.cuda.OutOfMemoryError, match="Tried to allocate"):
        empty(size, mt.int8)
    del a
    retries = mt.cuda.memory_stats()["num_alloc_retries"]
    b = empty(int(total * 0.65), mt.int8)  # bigger than the cached block: needs its memory back
    assert mt.cuda.memory_stats()["num_alloc_retries"] == retries + 1
    del b
    mt.cuda.empty_cache()
    mt.cuda.reset_peak_memory_stats()


def test_set_per_process_memory_fraction():
    """torch's test_set_per_process_memory_fraction."""
    assert mt.cuda.get_per_process_memory_fraction() == 1.0
    with pytest.raises(TypeError, match="Invalid type for fraction argument, must be `float`"):
        mt.cuda.set_per_process_memory_fraction(1)
    with pytest.raises(ValueError, match=r"Invalid fraction value: -0\.1\. Allowed range: 0~1"):
        mt.cuda.set_per_process_memory_fraction(-0.1)
    with pytest.raises(ValueError, match="Invalid fraction value"):
        mt.cuda.set_per_process_memory_fraction(2.0)
    tensor = mt.zeros(1024, device=DEV)
    mt.cuda.empty_cache()
    total = total_memory()
    mt.cuda.set_per_process_memory_fraction(0.5, 0)
    application = int(total * 0.499) - mt.cuda.max_memory_reserved()
    tmp = empty(application, mt.int8)  # 0.499 of the device is fine
    del tmp
    mt.cuda.empty_cache()
    with pytest.raises(mt.cuda.OutOfMemoryError, match=r"out of memory.* allowed; Of the allocated memory"):
        empty(int(total * 0.5), mt.int8)
    tensor.fill_(1)
    assert np.all(tensor.cpu().numpy() == 1)


def test_get_per_process_memory_fraction():
    for value in [1.0, 0.0] + [random.random() for _ in range(3)]:
        mt.cuda.set_per_process_memory_fraction(value)
        assert mt.cuda.get_per_process_memory_fraction() == value
    mt.cuda.set_per_process_memory_fraction(1.0)


# ============================================================================================== settings
def test_set_allocator_settings():
    mt.cuda.memory.set_allocator_settings("max_split_size_mb:64")
    assert mt.cuda.memory_stats()["max_split_size"] == 64 << 20
    with pytest.raises(RuntimeError, match="Unrecognized key 'nope'"):
        mt.cuda.memory.set_allocator_settings("nope:1")
    mt.cuda.memory.set_allocator_settings("roundup_power2_divisions:4")
    t = empty((5 << 20) // 4 + 1)  # 5 MiB + 4 bytes: four steps between 4 and 8 MiB
    assert mt.cuda.memory_stats()["allocated_bytes.large_pool.current"] >= 6 << 20
    del t
    mt.cuda.memory.set_allocator_settings("")
    assert mt.cuda.memory_stats()["max_split_size"] == -1


def test_settings_from_the_environment_and_no_caching():
    out = run_python("""
        import minitensor as mt
        t = mt.empty(1000, device="cuda")
        s = mt.cuda.memory_stats()
        print(s["max_split_size"], mt.cuda.memory_reserved())
        """, {"MINITENSOR_ALLOC_CONF": "max_split_size_mb:100"})
    assert out.split() == [str(100 << 20), str(2 << 20)]
    out = run_python("""
        import minitensor as mt
        a = mt.empty(1000, device="cuda")
        b = mt.empty(1000, device="cuda")
        print(mt.cuda.memory_reserved(), mt.cuda.memory_allocated())
        del a, b
        print(mt.cuda.memory_reserved())
        """, {"MINITENSOR_NO_CACHING": "1"})
    assert out.split() == ["8000", "8000", "0"]
    p = subprocess.run([sys.executable, "-c", "import minitensor as mt; mt.empty(1, device='cuda')"], cwd=REPO,
                       env=dict(os.environ, MINITENSOR_ALLOC_CONF="max_split_size_mb:5",
                                MINITENSOR_BACKEND=mt.cuda.backend()), capture_output=True, text=True, timeout=300)
    assert p.returncode != 0 and "MINITENSOR_ALLOC_CONF: Allocator settings: max_split_size_mb must be > 20" in p.stderr


# ============================================================================================== threads
def test_four_threads_allocating_and_freeing():
    n_threads, rounds = 4, 60
    barrier = threading.Barrier(n_threads + 1)
    live = [[] for _ in range(n_threads)]
    errors = []
    base = mt.cuda.memory_allocated()

    def work(i):
        rng = random.Random(i)
        try:
            stream = mt.cuda.Stream() if i % 2 else mt.cuda.default_stream()
            with mt.cuda.stream(stream):
                mine = []
                for _ in range(rounds):
                    if mine and rng.random() < 0.4:
                        mine.pop(rng.randrange(len(mine)))
                    else:
                        mine.append(empty(rng.choice([1, 100, 1000, 70_000, 300_000]), mt.int8))
                live[i] = [(t.data_ptr(), t.untyped_storage().nbytes()) for t in mine]
                barrier.wait(timeout=60)  # the main thread checks the live blocks
                barrier.wait(timeout=60)
                mine.clear()
        except Exception as e:  # reported by the main thread
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    try:
        barrier.wait(timeout=120)
        spans = sorted(span for spans in live for span in spans)
        assert all(p + n <= q for (p, n), (q, _) in zip(spans, spans[1:])), "live allocations overlap"
        assert mt.cuda.memory_allocated() >= base + sum(n for _, n in spans)
        barrier.wait(timeout=60)
    finally:
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert mt.cuda.memory_allocated() == base
