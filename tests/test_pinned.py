"""Pinned host memory on the "cuda" device's backend (the simulator here, a real GPU on the GPU machine): the
caching host allocator (reuse, event-guarded reuse after non_blocking copies, statistics, register mode,
background thread), pin_memory on tensors and factories, views of pinned memory, host_register.

Most tests launch no kernel: copies between pinned memory and the device are plain transfers.
"""
import gc
import random
import threading

import numpy as np
import pytest

import minitensor as mt
from helpers import run_python


@pytest.fixture(autouse=True)
def _clean_host_allocator():
    """Each test starts with no pinned block cached or waiting on a copy, and default settings."""
    gc.collect()
    mt.cuda.synchronize()
    mt.cuda.host_empty_cache()
    yield
    mt.cuda.memory.set_allocator_settings("")
    mt.cuda.synchronize()
    mt.cuda.host_empty_cache()


def pinned(n, dtype=mt.float32):
    return mt.empty(n, dtype=dtype, pin_memory=True)


# ============================================================================================== reuse
def test_caching_pinned_memory():
    """torch's test_caching_pinned_memory, with a Gate instead of a 1 s sleep: a freed block is reused, but
    not while a non_blocking copy that reads it is queued."""
    value = random.random()
    t = mt.tensor([value]).pin_memory()
    ptr = t.data_ptr()
    del t
    t = mt.tensor([value]).pin_memory()
    assert t.data_ptr() == ptr, "allocation not reused"

    gpu = mt.zeros(1, device="cuda")
    gate = mt.cuda.Gate()
    try:
        gate.wait()  # the copy below waits for the host
        gpu.copy_(t, non_blocking=True)
        del t
        t = mt.tensor([value]).pin_memory()
        assert t.data_ptr() != ptr, "allocation reused too soon"
    finally:
        gate.open()
    assert gpu.cpu().tolist() == [pytest.approx(value)]
    del t
    mt.cuda.synchronize()
    t = mt.tensor([value]).pin_memory()
    assert t.data_ptr() == ptr, "allocation not reused once the copy was done"


def test_no_reuse_while_copy_in_flight_with_sleep():
    """The same with a sleep on the stream, for a copy to the host into a pinned tensor."""
    n = random.randint(1, 50000)
    data = np.random.rand(n).astype(np.float32)
    src = mt.tensor(data, device="cuda")
    mt.cuda.synchronize()
    dst = pinned(n)
    ptr = dst.data_ptr()
    mt.cuda.sleep(200)
    dst.copy_(src, non_blocking=True)
    del dst
    again = pinned(n)
    assert again.data_ptr() != ptr
    mt.cuda.synchronize()
    np.testing.assert_array_equal(again.copy_(src).numpy(), data)
    del again
    assert pinned(n).data_ptr() == ptr  # the copy is done: the first block is free again (last in)


def test_reuse_is_exact_size_and_last_in_first_out():
    a, b = pinned(1000, mt.uint8), pinned(1024, mt.uint8)  # both in the 1024-byte list
    c = pinned(1025, mt.uint8)  # the 2048-byte list
    pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
    del a, b, c
    first, second = pinned(700, mt.uint8), pinned(513, mt.uint8)
    assert (first.data_ptr(), second.data_ptr()) == (pb, pa)  # the last freed first
    third = pinned(2048, mt.uint8)
    assert third.data_ptr() == pc
    other = pinned(512, mt.uint8)  # a smaller size never takes a bigger cached block
    assert other.data_ptr() not in (pa, pb, pc)


def test_escaped_numpy_view_keeps_block():
    """A numpy view that outlives its pinned tensor keeps the block: the memory under it is not handed out
    again until the view dies."""
    n = random.randint(100, 5000)
    t = mt.arange(n, dtype=mt.int32).pin_memory()
    ptr = t.data_ptr()
    view = t.numpy()[1:]
    del t
    other = pinned(n, mt.int32)
    assert other.data_ptr() != ptr
    other.fill_(-1)
    np.testing.assert_array_equal(view, np.arange(1, n, dtype=np.int32))
    del other, view
    gc.collect()
    again = pinned(n, mt.int32)
    assert again.data_ptr() == ptr


def test_zero_bytes():
    before = mt.cuda.host_memory_stats()
    t = mt.empty(0, pin_memory=True)
    assert t.data_ptr() == 0 and not t.is_pinned()
    del t
    assert mt.cuda.host_memory_stats() == before


# ============================================================================================== statistics
STAT_KEYS = [f"{s}.{f}" for s in ("allocations", "allocated_bytes", "active_requests", "active_bytes")
             for f in ("current", "peak", "allocated", "freed")]


def test_host_memory_stats():
    """torch's test_host_memory_stats with random sizes: blocks are powers of two."""
    mt.cuda.reset_peak_host_memory_stats()
    mt.cuda.reset_accumulated_host_memory_stats()
    stats = mt.cuda.host_memory_stats()
    assert set(STAT_KEYS) <= set(stats)
    for name in ("host_alloc_time", "host_free_time"):
        assert {f"{name}.{f}" for f in ("total", "max", "min", "count", "avg")} <= set(stats)
    expected = {k: stats[k] for k in STAT_KEYS}
    expected.update({k: 0 for k in STAT_KEYS if k.endswith((".allocated", ".freed"))})
    expected.update(num_host_alloc=0, num_host_free=0)
    expected["host_alloc_time.count"] = expected["host_free_time.count"] = 0
    assert {k: stats[k] for k in expected} == expected

    def check():
        got = mt.cuda.host_memory_stats()
        assert {k: got[k] for k in expected} == expected

    def grow(prefixes, fields, n):
        for p in prefixes:
            for f in fields:
                expected[f"{p}.{f}"] += n

    tensors = []
    for _ in range(3):
        elements = random.randint(1, 1 << 16)
        tensors.append(mt.ones(elements, pin_memory=True))  # float32
        size = 1 << (elements * 4 - 1).bit_length()
        grow(("allocations", "active_requests"), ("current", "peak", "allocated"), 1)
        grow(("allocated_bytes", "active_bytes"), ("current", "peak", "allocated"), size)
        expected["num_host_alloc"] += 1
        expected["host_alloc_time.count"] += 1
        check()
    mt.cuda.host_empty_cache()  # nothing cached: nothing changes
    check()

    # frees lower the active stats at once (no stream recorded) and the cache keeps the blocks
    sizes = [t.untyped_storage()._block.size for t in tensors]
    del tensors
    grow(("active_requests",), ("current",), -3)
    grow(("active_requests",), ("freed",), 3)
    grow(("active_bytes",), ("current",), -sum(sizes))
    grow(("active_bytes",), ("freed",), sum(sizes))
    check()

    mt.cuda.reset_peak_host_memory_stats()
    mt.cuda.reset_accumulated_host_memory_stats()
    stats = mt.cuda.host_memory_stats()
    for k in STAT_KEYS:
        if k.endswith(".peak"):
            assert stats[k] == stats[k.replace("peak", "current")]
        elif not k.endswith(".current"):
            assert stats[k] == 0
    assert stats["num_host_alloc"] == stats["num_host_free"] == stats["host_alloc_time.count"] == 0


def test_reference_block_size():
    t = mt.ones(10 * 1024, pin_memory=True)
    assert t.untyped_storage()._block.size == 65536


def test_active_stats_wait_for_recorded_streams():
    """A block freed while a copy uses it stays active until the copy is done and events are processed."""
    t = pinned(random.randint(1, 4096))
    size = t.untyped_storage()._block.size
    gpu = mt.empty(t.shape, device="cuda")
    gate = mt.cuda.Gate()
    try:
        gate.wait()
        gpu.copy_(t, non_blocking=True)
        before = mt.cuda.host_memory_stats()
        del t
        after = mt.cuda.host_memory_stats()
        assert after["active_bytes.current"] == before["active_bytes.current"]
        assert after["active_requests.current"] == before["active_requests.current"]
    finally:
        gate.open()
    mt.cuda.synchronize()
    mt.cuda.host_empty_cache()  # processes the events, then frees the block
    final = mt.cuda.host_memory_stats()
    assert final["active_bytes.current"] == before["active_bytes.current"] - size
    assert final["active_requests.current"] == before["active_requests.current"] - 1
    assert final["allocated_bytes.current"] == before["allocated_bytes.current"] - size


def test_freeing_a_pinned_block_a_finished_copy_used_leaves_the_stream_idle():
    """The free records an event on the copy's stream; with nothing pending there it is complete at once, so the
    stream still reports idle, as a GPU's does (the simulator queued the record and said busy until its worker ran
    it)."""
    p = mt.ones(1 << 20, pin_memory=True)
    g = p.to("cuda", non_blocking=True)
    mt.cuda.synchronize()
    x = mt.ones(3).cuda()  # a blocking copy: the stream is idle after it
    del p  # the free records an event on the stream the non_blocking copy ran on
    assert mt.cuda.current_stream().query()
    assert x.cpu().tolist() == [1.0, 1.0, 1.0]
    assert float(g[-1].cpu().item()) == 1.0


# ============================================================================================== settings
def _register_mode():
    """torch's test_pinned_memory_with_cudaregister (sizes cut down for the simulator)."""
    mt.cuda.memory.set_allocator_settings("pinned_use_cuda_host_register:True,pinned_num_register_threads:8")
    t = mt.ones(20)
    assert not t.is_pinned()
    for n in (1 << 18, 1 << 21):
        p = mt.ones(n).pin_memory()
        assert p.is_pinned()
        assert p.untyped_storage()._block.mapping is not None  # registered ordinary memory
        assert float(p.numpy()[-1]) == 1.0


def test_pinned_memory_with_host_register():
    _register_mode()


def test_pinned_memory_with_host_register_multithread():
    errors = []

    def work():
        try:
            _register_mode()
        except BaseException as e:  # reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_host_register_blocks_copy_and_free():
    mt.cuda.memory.set_allocator_settings("pinned_use_host_register:True,pinned_num_register_threads:4")
    data = np.random.rand(1 << 16).astype(np.float32)
    t = mt.tensor(data).pin_memory()
    gpu = mt.empty(t.shape, device="cuda")
    gpu.copy_(t, non_blocking=True)
    np.testing.assert_array_equal(gpu.cpu().numpy(), data)
    mt.cuda.memory.set_allocator_settings("pinned_use_host_register:False")
    del t  # records an event on the stream (the copy used the block), complete once the stream reaches it
    mt.cuda.synchronize()
    before = mt.cuda.host_memory_stats()["num_host_free"]
    mt.cuda.host_empty_cache()  # unregisters and unmaps the block
    assert mt.cuda.host_memory_stats()["num_host_free"] == before + 1


def test_pinned_memory_empty_cache():
    base = mt.cuda.host_memory_stats()["allocated_bytes.current"]
    for setting in (True, False):
        mt.cuda.memory.set_allocator_settings(f"pinned_use_cuda_host_register:{setting}")
        t = mt.ones(1 << 18, pin_memory=True)
        assert t.is_pinned()
        del t
        mt.cuda.host_empty_cache()
        assert mt.cuda.host_memory_stats()["allocated_bytes.current"] == base


def test_register_threads_setting_is_checked():
    with pytest.raises(RuntimeError, match="pinned_num_register_threads"):
        mt.cuda.memory.set_allocator_settings("pinned_num_register_threads:3")
    with pytest.raises(RuntimeError, match="pinned_use_background_threads"):
        mt.cuda.memory.set_allocator_settings("pinned_use_background_threads:yes")


BACKGROUND_SCRIPT = """
    import threading, time
    import minitensor as mt

    t = mt.ones(1 << 18, pin_memory=True)
    print(t.is_pinned())
    names = [th.name for th in threading.enumerate()]
    gpu = mt.empty(t.shape, device="cuda")
    gate = mt.cuda.Gate()
    gate.wait()
    gpu.copy_(t, non_blocking=True)
    del t
    pending = mt.cuda.host_memory_stats()["active_requests.current"]
    gate.open()
    mt.cuda.synchronize()
    deadline = time.monotonic() + 10
    while mt.cuda.host_memory_stats()["active_requests.current"] and time.monotonic() < deadline:
        time.sleep(0.001)  # no allocation: only a background thread can process the event
    print("minitensor-pinned-events" in names, pending, mt.cuda.host_memory_stats()["active_requests.current"])
"""


def test_pinned_memory_use_background_threads():
    """torch's test in a fresh process, and the thread's work: a block freed while a copy reads it becomes
    free without any allocation once the copy is done."""
    out = run_python(BACKGROUND_SCRIPT, {"MINITENSOR_ALLOC_CONF": "pinned_use_background_threads:True"})
    assert out.split() == ["True", "True", "1", "0"]


def test_events_wait_for_an_allocation_without_background_thread():
    base = mt.cuda.host_memory_stats()["active_requests.current"]
    t = pinned(1000)
    gpu = mt.empty(t.shape, device="cuda")
    gpu.copy_(t, non_blocking=True)
    del t
    mt.cuda.synchronize()
    assert mt.cuda.host_memory_stats()["active_requests.current"] == base + 1  # event done, not yet processed
    other = pinned(1 << 20)
    assert mt.cuda.host_memory_stats()["active_requests.current"] == base + 1  # that one; the first is free now
    del other


# ============================================================================================== tensors
@pytest.mark.parametrize("factory", ["empty", "zeros", "ones", "full", "tensor", "rand", "randn", "randint"])
def test_factories_pin_memory(factory):
    n = random.randint(1, 1000)
    make = {
        "empty": lambda: mt.empty(n, pin_memory=True),
        "zeros": lambda: mt.zeros(n, pin_memory=True),
        "ones": lambda: mt.ones(2, n, dtype=mt.int16, pin_memory=True),
        "full": lambda: mt.full((n,), 7.5, pin_memory=True),
        "tensor": lambda: mt.tensor(list(range(n)), pin_memory=True),
        "rand": lambda: mt.rand(n, pin_memory=True),
        "randn": lambda: mt.randn(n, pin_memory=True),
        "randint": lambda: mt.randint(0, 9, (n,), pin_memory=True),
    }[factory]
    t = make()
    assert t.is_pinned() and t.device == mt.device("cpu")
    assert t.cpu() is t
    if factory == "full":
        assert set(t.tolist()) == {7.5}
    if factory == "tensor":
        assert t.tolist() == list(range(n))
    with pytest.raises(RuntimeError, match="Only dense CPU tensors can be pinned"):
        mt.empty(n, device="cuda", pin_memory=True)


def test_pin_memory_noncontiguous():
    """torch's test_noncontiguous_pinned_memory: values and strides survive."""
    x = mt.arange(0, 10).view(2, 5)
    p = x.t().pin_memory()
    assert p.is_pinned() and p.tolist() == x.t().tolist()
    assert p.stride() == x.t().stride()
    e = mt.tensor([1.0, 2.0]).expand(3, 2)
    pe = e.pin_memory()
    assert pe.stride() == (0, 1) and pe.untyped_storage().nbytes() == 8 and pe.tolist() == e.tolist()
    s = mt.arange(20.0)[3:15:4]
    ps = s.pin_memory()
    assert ps.tolist() == s.tolist() and ps.storage_offset() == 0


def test_pin_memory_of_pinned_is_itself_and_cuda_refused():
    p = mt.ones(5).pin_memory()
    assert p.pin_memory() is p
    assert not mt.ones(5).is_pinned()
    with pytest.raises(RuntimeError, match="only dense CPU tensors can be pinned"):
        mt.ones(5, device="cuda").pin_memory()
    assert not mt.ones(5, device="cuda").is_pinned()


def test_pinned_views_with_offset():
    """torch's test_copy_non_blocking case where the pinned data_ptr is not the storage's."""
    n = random.randint(1000, 200000)
    base = mt.zeros(n, dtype=mt.uint8).pin_memory()
    view = base[1:]
    assert view.is_pinned() and base.is_pinned()
    assert view.data_ptr() == base.data_ptr() + 1
    assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    data = np.random.randint(0, 255, n - 1, dtype=np.uint8)
    src = mt.tensor(data, device="cuda")
    event = mt.cuda.Event()
    view.copy_(src, non_blocking=True)
    event.record()
    event.synchronize()
    np.testing.assert_array_equal(view.numpy(), data)
    assert base.numpy()[0] == 0
    back = mt.empty(n - 1, dtype=mt.uint8, device="cuda")
    back.copy_(view, non_blocking=True)
    np.testing.assert_array_equal(back.cpu().numpy(), data)


def test_pinned_tensor_cpu_ops_and_storage():
    data = np.random.rand(7, 3).astype(np.float32)
    p = mt.tensor(data).pin_memory()
    np.testing.assert_allclose((p * 2 + 1).numpy(), data * 2 + 1, rtol=1e-6)
    np.testing.assert_allclose(p.sum(0).numpy(), data.sum(0), rtol=1e-5)
    storage = mt.tensor(data).untyped_storage()
    assert not storage.is_pinned() and storage.pin_memory().is_pinned()
    assert bytes(storage.pin_memory()._array) == data.tobytes()


# ============================================================================================== host_register
def test_host_register_and_unregister():
    """torch's test_cudart_register, through mt.cuda.host_register."""
    t = mt.ones(20)
    assert not t.is_pinned()
    mt.cuda.host_register(t)
    assert t.is_pinned() and t[3:].is_pinned()
    with pytest.raises(RuntimeError, match="already pinned"):
        mt.cuda.host_register(t)
    gpu = mt.zeros(20, device="cuda")
    gpu.copy_(t, non_blocking=True)
    mt.cuda.synchronize()
    assert gpu.cpu().tolist() == [1.0] * 20
    mt.cuda.host_unregister(t)
    assert not t.is_pinned()
    with pytest.raises(RuntimeError, match="not registered"):
        mt.cuda.host_unregister(t)
    with pytest.raises(ValueError, match="CPU memory"):
        mt.cuda.host_register(mt.ones(2, device="cuda"))
    with pytest.raises(ValueError, match="0 bytes"):
        mt.cuda.host_register(mt.ones(0))
