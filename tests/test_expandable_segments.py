"""Expandable segments on the "cuda" device (`expandable_segments:True`, allocator/expandable.py over the driver's
virtual memory calls): tensors in them compute and copy like any other, reserved memory follows the mapped pages
and empty_cache gives them back, record_stream keeps pages until the other stream is done, out-of-memory and the
memory fraction, exports to other libraries of tensors spanning several driver mappings, history entries, a
second device, and the setting changed at run time. The policy itself is test_allocator_expandable.py's."""
import gc

import numpy as np
import pytest

import minitensor as mt
from helpers import run_python
from test_interop import CAIProducer

DEV = "cuda"
MiB = 1 << 20
OFF = "expandable_segments:False"  # a settings string without the key keeps it (torch's rule)
memory = mt.cuda.memory
pytestmark = pytest.mark.usefixtures("clean_cuda_state")


@pytest.fixture(autouse=True)
def expandable():
    """Expandable segments on for the test, the default settings back after it (and no segment of either kind
    left cached)."""
    mt.cuda.set_allocator_settings("expandable_segments:True")
    yield
    mt.cuda.synchronize()
    mt.cuda.set_allocator_settings(OFF)
    mt.cuda.empty_cache()


def expandable_segments():
    return [s for s in mt.cuda.memory_snapshot() if s["is_expandable"]]


def holder(t):
    """The snapshot segment holding tensor t's data."""
    return next(s for s in mt.cuda.memory_snapshot()
                if s["address"] <= t.data_ptr() < s["address"] + s["total_size"])


@pytest.mark.parametrize("dtype", [mt.float32, mt.int64, mt.float16, mt.uint8])
def test_tensors_compute_and_copy(dtype):
    rng = np.random.default_rng(0)
    np_dtype = {mt.float32: np.float32, mt.int64: np.int64, mt.float16: np.float16, mt.uint8: np.uint8}[dtype]
    a = rng.integers(0, 100, size=(3 * MiB // 8 + 13,)).astype(np_dtype)  # past a 2 MiB driver mapping
    b = rng.integers(0, 100, size=a.shape).astype(np_dtype)
    x, y = mt.tensor(a, device=DEV), mt.tensor(b, device=DEV)
    z = x + y
    assert holder(x)["is_expandable"] and holder(z)["is_expandable"]
    np.testing.assert_array_equal((z.cpu()).numpy(), a + b)
    small = mt.tensor(a[:100], device=DEV)  # the small pool's segment
    assert holder(small)["is_expandable"] and holder(small)["segment_type"] == "small"
    np.testing.assert_array_equal(small[::3].cpu().numpy(), a[:100:3])


def test_reserved_follows_pages_and_empty_cache_gives_them_back():
    free_before = mt.cuda.mem_get_info()[0]
    x = mt.empty(30 * MiB, dtype=mt.uint8, device=DEV)
    segments = expandable_segments()
    assert [s["segment_type"] for s in segments] == ["large"]
    assert mt.cuda.memory_reserved() == segments[0]["total_size"] >= 30 * MiB
    assert segments[0]["total_size"] % (20 * MiB) == 0
    assert mt.cuda.mem_get_info()[0] == free_before - mt.cuda.memory_reserved()
    y = mt.empty(30 * MiB, dtype=mt.uint8, device=DEV)
    assert y.data_ptr() == x.data_ptr() + 30 * MiB, "the segment grew right above"
    del x
    mt.cuda.empty_cache()  # x's whole pages go; the page it shares with y stays
    assert 30 * MiB <= mt.cuda.memory_reserved() < 60 * MiB
    del y
    mt.cuda.empty_cache()
    assert mt.cuda.memory_reserved() == 0 and expandable_segments() == []
    assert mt.cuda.mem_get_info()[0] == free_before
    stats = mt.cuda.memory_stats()
    assert stats["num_device_alloc"] >= 2 and stats["num_device_free"] >= 2


def test_record_stream_keeps_pages_until_the_stream_is_done():
    rng = np.random.default_rng(1)
    a = rng.standard_normal(5 * MiB // 4).astype(np.float32)
    x = mt.tensor(a, device=DEV)
    side = mt.cuda.Stream()
    side.wait_stream(mt.cuda.current_stream())
    with mt.cuda.stream(side):
        mt.cuda.testing.sleep(100)
        y = x * 2  # reads x on the side stream, after the sleep
    x.record_stream(side)
    del x
    mt.cuda.empty_cache()  # waits for the side stream before unmapping x's pages
    assert side.query()
    mt.cuda.current_stream().wait_stream(side)
    np.testing.assert_array_equal(y.cpu().numpy(), a * 2)


def test_out_of_memory_names_no_fragmentation_hint_and_keeps_accounting():
    x = mt.empty(3 * MiB, dtype=mt.uint8, device=DEV)
    allocated, reserved = mt.cuda.memory_allocated(), mt.cuda.memory_reserved()
    total = mt.cuda.mem_get_info()[1]
    with pytest.raises(mt.cuda.OutOfMemoryError) as e:
        mt.empty(total, dtype=mt.uint8, device=DEV)
    assert "CUDA out of memory" in str(e.value) and "expandable_segments" not in str(e.value)
    assert (mt.cuda.memory_allocated(), mt.cuda.memory_reserved()) == (allocated, reserved)
    y = mt.ones(1000, device=DEV)
    assert y.sum().item() == 1000
    del x


def test_memory_fraction_bounds_the_pages():
    total = mt.cuda.mem_get_info()[1]
    mt.cuda.set_per_process_memory_fraction(100 * MiB / total)
    try:
        x = mt.empty(90 * MiB, dtype=mt.uint8, device=DEV)
        with pytest.raises(mt.cuda.OutOfMemoryError, match="allowed"):
            mt.empty(20 * MiB, dtype=mt.uint8, device=DEV)
        assert mt.cuda.memory_reserved() <= 100 * MiB
        del x
    finally:
        mt.cuda.set_per_process_memory_fraction(1.0)


def test_exports_of_a_tensor_spanning_driver_mappings_read_back():
    """CUDA reports each physical allocation of an expandable segment as its own range: an import of a tensor
    spanning several must still be accepted (interop/checks.py walks them)."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal(7 * MiB // 4).astype(np.float32)  # 7 MiB: four 2 MiB mappings at least
    x = mt.tensor(a, device=DEV)
    via_cai = mt.as_tensor(CAIProducer(x), device=DEV)
    via_dlpack = mt.from_dlpack(x.__dlpack__())
    for t in (via_cai, via_dlpack):
        assert t.data_ptr() == x.data_ptr()
        np.testing.assert_array_equal(t.cpu().numpy(), a)


def test_history_records_maps_and_unmaps():
    memory._record_memory_history()
    try:
        x = mt.empty(30 * MiB, dtype=mt.uint8, device=DEV)
        del x
        mt.cuda.empty_cache()
        trace = memory._snapshot()["device_traces"][0]
        actions = [e["action"] for e in trace]
        assert actions[:2] == ["segment_map", "alloc"] and "segment_unmap" in actions
        maps = [e for e in trace if e["action"] in ("segment_map", "segment_unmap")]
        assert sum(e["size"] for e in maps if e["action"] == "segment_map") == \
            sum(e["size"] for e in maps if e["action"] == "segment_unmap")
    finally:
        memory._record_memory_history(None)


def test_switching_at_run_time_affects_new_allocations():
    mt.cuda.set_allocator_settings(OFF)
    mt.cuda.empty_cache()
    x = mt.ones(2 * MiB, device=DEV)  # 8 MiB: a 20 MiB segment of the large pool
    assert not holder(x)["is_expandable"]
    mt.cuda.set_allocator_settings("expandable_segments:True")
    y = mt.ones(MiB, device=DEV)  # a cache hit in the rest of that segment
    assert not holder(y)["is_expandable"] and holder(y)["address"] == holder(x)["address"]
    z = mt.ones(5 * MiB, device=DEV)  # a miss: grows an expandable segment
    assert holder(z)["is_expandable"]
    mt.cuda.set_allocator_settings(OFF)
    address = z.data_ptr()
    del z
    w = mt.ones(5 * MiB, device=DEV)  # off: no new allocation goes into an expandable segment (torch's rule)
    assert not holder(w)["is_expandable"] and (x.sum() + y.sum()).item() == 3 * MiB
    mt.cuda.set_allocator_settings("expandable_segments:True")
    v = mt.ones(5 * MiB, device=DEV)  # on again: its free block is used
    assert v.data_ptr() == address


def test_a_second_device_grows_its_own_segment():
    if mt.cuda.backend() != "sim" and mt.cuda.device_count() < 2:
        pytest.skip("one GPU: the second device is tested on the simulator and on two GPUs")
    out = run_python("""
        import minitensor as mt
        mt.cuda.set_allocator_settings("expandable_segments:True")
        x = mt.ones(3 << 20, device="cuda:1")
        y = mt.ones(3 << 20, device="cuda:0")
        segs = [(s["device"], s["is_expandable"]) for s in mt.cuda.memory_snapshot()]
        print(sorted(set(segs)), (x.sum().item(), y.sum().item()))
        del x, y
        mt.cuda.empty_cache()
        print(mt.cuda.memory_reserved(0), mt.cuda.memory_reserved(1))
    """, env={"MINITENSOR_SIM_DEVICES": "2"} if mt.cuda.backend() == "sim" else None)
    lines = out.split("\n")
    assert lines[0] == f"[(0, True), (1, True)] ({float(3 << 20)}, {float(3 << 20)})", out
    assert lines[1] == "0 0", out


def test_a_graph_grows_its_private_pools_own_segments():
    rng = np.random.default_rng(3)
    a = rng.standard_normal(300_000).astype(np.float32)
    x = mt.tensor(a, device=DEV)
    x * 2  # the kernel compiled before the capture
    g = mt.cuda.CUDAGraph()
    with mt.cuda.graph(g):
        y = x * 2  # 1.2 MB: the pool's large segment
        z = y[:100] + 1  # its small one
    assert {(s["is_expandable"], s["segment_pool_id"], s["segment_type"]) for s in (holder(y), holder(z))} == {
        (True, g.pool(), "large"), (True, g.pool(), "small")}
    x.copy_(mt.tensor(a * 3, device=DEV))
    g.replay()
    np.testing.assert_array_equal(y.cpu().numpy(), a * 6)
    np.testing.assert_array_equal(z.cpu().numpy(), a[:100] * 6 + 1)
    del y, z, g
    gc.collect()  # the capture's context and the graph refer to each other
    mt.cuda.synchronize()
    mt.cuda.empty_cache()
    assert not [s for s in expandable_segments() if s["segment_pool_id"] != (0, 0)]
