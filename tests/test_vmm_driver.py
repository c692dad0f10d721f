"""The driver's expandable-segment calls (Driver.vmm_*), which the caching allocator's expandable segments stand on:
pages mapped into a reserved range hold data across page boundaries, are reported as one run of memory (so the
interop checks take a tensor spanning them), count as device memory, and are refused unless the range is whole
pages of one reservation.

Data, page ranges and interop hold on any backend; the accounting (mem_get_info, malloc, out of memory), the
error codes and queued copies are the simulator's model of a GPU, tested where "cuda" is the simulator.
"""
import ctypes
import gc

import numpy as np
import pytest

import minitensor as mt
from minitensor.backends import active_driver
from minitensor.backends.sim_vmm import ADDRESS_LIMIT
from minitensor.base.errors import CudaError, OutOfMemoryError
from minitensor.interop import checks

sim_only = pytest.mark.skipif(mt.cuda.backend() != "sim", reason="the simulator's model of device memory")


class Segments:
    """Reservations made through the driver, each given back at the end with the pages mapped through `map`
    that are still mapped (memory_range tells) unmapped first, so a test that went wrong leaves nothing behind."""

    def __init__(self):
        self.driver, self.device = active_driver(), mt.cuda.current_device()
        self.page = self.driver.vmm_granularity(self.device)
        self.reserved = []
        self.mapped = []  # (address, bytes) of each page mapped

    def reserve(self, pages):
        base = self.driver.vmm_reserve(self.device, pages * self.page)
        self.reserved.append((base, pages * self.page))
        return base

    def map(self, ptr, pages, granules=1):
        """Map `pages` pages of `granules` granules each."""
        size = granules * self.page
        self.driver.vmm_map(self.device, ptr, pages * size, size)
        self.mapped += [(at, size) for at in range(ptr, ptr + pages * size, size)]

    def unmap(self, ptr, pages):
        self.driver.vmm_unmap(self.device, ptr, pages * self.page)

    def free(self):
        return self.driver.mem_get_info(self.device)[0]

    def close(self):
        for at, size in self.mapped:
            if self.driver.memory_range(at) is not None:
                self.driver.vmm_unmap(self.device, at, size)
        for base, nbytes in self.reserved:
            self.driver.vmm_release(self.device, base, nbytes)


@pytest.fixture
def seg():
    gc.collect()
    mt.cuda.synchronize()
    mt.cuda.empty_cache()  # the cached segments' memory is the device's again
    segments = Segments()
    yield segments
    gc.collect()  # a tensor over the pages must go before they do
    segments.close()


def invalid(call, *args):
    with pytest.raises(CudaError) as caught:
        call(*args)
    assert caught.value.code == 1, caught.value


# ============================================================================================== data and ranges
def test_mapped_pages_hold_data_across_page_boundaries(seg):
    driver, page = seg.driver, seg.page
    base = seg.reserve(4)
    assert base % page == 0
    seg.map(base, 1)
    seg.map(base + page, 3)  # mapped by two calls, used as one range
    data = np.random.randint(0, 256, page + 200, dtype=np.uint8)
    at, copy = base + page - 100, base + 2 * page + 4096  # pages 0 to 2, and 2 to 3
    driver.memcpy_async(at, data.ctypes.data, data.nbytes, 0)  # pageable host memory: synchronous
    driver.memcpy_async(copy, at, data.nbytes, 0)  # device to device
    pinned = driver.host_alloc(data.nbytes)
    try:
        driver.memcpy_async(pinned, copy, data.nbytes, 0)
        driver.synchronize(seg.device)
        assert ctypes.string_at(pinned, data.nbytes) == data.tobytes()
    finally:
        driver.host_free(pinned)
    back = np.zeros_like(data)
    driver.memcpy_async(back.ctypes.data, at, data.nbytes, 0)
    np.testing.assert_array_equal(back, data)


def test_memory_range_is_the_run_of_mapped_pages(seg):
    """The whole run, whatever page holds the address (where CUDA itself would report the reserved range)."""
    driver, page, device = seg.driver, seg.page, seg.device
    base = seg.reserve(4)
    assert driver.memory_range(base) is None  # reserved, not mapped
    seg.map(base, 1)
    seg.map(base + page, 1, granules=2)  # a page of two granules
    assert driver.memory_range(base + 5) == (device, base, 3 * page)
    assert driver.memory_range(base + 3 * page - 1) == (device, base, 3 * page)
    assert driver.memory_range(base + 3 * page) is None
    seg.unmap(base, 1)
    assert driver.memory_range(base) is None
    assert driver.memory_range(base + 2 * page) == (device, base + page, 2 * page)


def test_interop_follows_the_pages_of_a_segment(seg):
    page, device = seg.page, seg.device
    base = seg.reserve(3)
    seg.map(base, 2)
    assert checks.device_of_memory(base + page - 8, 16, "x") == device  # across the page boundary
    assert checks.device_of_memory(base, 2 * page, "x") == device
    with pytest.raises(BufferError, match=f"x: {page + 8} bytes at {base + page:#x} reach beyond the allocation"):
        checks.device_of_memory(base + page, page + 8, "x")  # into the unmapped third page
    with pytest.raises(BufferError, match=f"x: {2 * page + 1} bytes at {base:#x} reach beyond the allocation "
                                          f"that holds them \\({2 * page} bytes at {base:#x}\\)"):
        checks.device_of_memory(base, 2 * page + 1, "x")
    with pytest.raises(BufferError, match=f"memory at {base + 2 * page:#x} is in no allocation"):
        checks.device_of_memory(base + 2 * page, 4, "x")


def test_cai_import_spanning_pages(seg):
    """End to end: a foreign array over two mapped pages becomes a tensor; one running on into an unmapped page
    is refused."""
    page = seg.page
    base = seg.reserve(3)
    seg.map(base, 2)
    values = np.arange(64, dtype=np.float32)
    at = base + page - 128  # 32 floats in each page
    seg.driver.memcpy_async(at, values.ctypes.data, values.nbytes, 0)

    class Producer:
        def __init__(self, ptr, n):
            self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}
    t = mt.as_tensor(Producer(at, 64))
    np.testing.assert_array_equal(t.cpu().numpy(), values)
    with pytest.raises(BufferError, match="reach beyond the allocation"):
        mt.as_tensor(Producer(base + 2 * page - 128, 64))


# ============================================================================================== the simulator's model
@sim_only
def test_copies_with_mapped_pages_are_queued(seg):
    """Mapped pages are device memory: a copy from pinned memory into them is queued, not run at once as a copy
    with pageable memory is (which would wait for the sleep first)."""
    driver = seg.driver
    base = seg.reserve(1)
    seg.map(base, 1)
    pinned = driver.host_alloc(64)
    try:
        stream = driver.stream_create(seg.device, 0)
        driver.sleep(stream, 500)
        driver.memcpy_async(base, pinned, 64, stream)
        assert not driver.stream_query(stream)
        driver.stream_synchronize(stream)
    finally:
        driver.host_free(pinned)


@sim_only
def test_unmap_waits_for_the_work_queued_before_it(seg):
    """As free does: that work may still use the pages (here a marker queued behind a sleep stands for it)."""
    driver = seg.driver
    base = seg.reserve(1)
    seg.map(base, 1)
    stream, done = driver.stream_create(seg.device, 0), []
    driver.sleep(stream, 300)
    driver.enqueue(stream, lambda: done.append(True))
    seg.unmap(base, 1)
    assert done


@sim_only
def test_mapped_pages_count_as_device_memory(seg):
    page = seg.page
    free = seg.free()
    base = seg.reserve(4)
    assert seg.free() == free  # address space only
    seg.map(base, 3)
    assert seg.free() == free - 3 * page
    seg.unmap(base + page, 1)
    assert seg.free() == free - 2 * page
    seg.unmap(base, 1)
    seg.unmap(base + 2 * page, 1)
    assert seg.free() == free


@sim_only
def test_map_past_the_device_memory_maps_nothing(seg):
    driver, page = seg.driver, seg.page
    free = seg.free()
    pages = free // page + 1  # never touched: the reservation holds no host memory
    base = seg.reserve(pages)
    with pytest.raises(OutOfMemoryError, match=f"out of memory \\(simulated device {seg.device} has "):
        seg.map(base, pages)
    assert seg.free() == free
    assert driver.memory_range(base) is None and driver.memory_range(base + (pages - 1) * page) is None
    seg.map(base, pages - 1)  # none of them was left mapped
    assert seg.free() == free - (pages - 1) * page


@sim_only
def test_malloc_is_refused_the_memory_pages_hold(seg):
    driver, page, device = seg.driver, seg.page, seg.device
    pages = seg.free() // page
    driver.free(device, driver.malloc(device, page))  # there is room before the pages take it
    base = seg.reserve(pages)
    seg.map(base, pages)
    with pytest.raises(OutOfMemoryError, match="out of memory"):
        driver.malloc(device, page)
    seg.unmap(base, 1)
    driver.free(device, driver.malloc(device, page))


@sim_only
def test_reserve_refuses_sizes_not_whole_pages(seg):
    driver, page, device = seg.driver, seg.page, seg.device
    for nbytes in (0, -page, page + 512, 512):
        invalid(driver.vmm_reserve, device, nbytes)
    with pytest.raises(CudaError, match="invalid device ordinal"):
        driver.vmm_reserve(driver.device_count(), page)


@sim_only
def test_reserve_refuses_past_the_address_space(seg):
    base = seg.reserve(1)
    with pytest.raises(CudaError, match="out of memory .* address space") as caught:
        seg.driver.vmm_reserve(seg.device, ADDRESS_LIMIT)  # with the page already reserved: one page too many
    assert caught.value.code == 2
    seg.map(base, 1)  # the reservation already made is untouched


@sim_only
def test_map_refuses_ranges_not_whole_unmapped_pages_of_one_reservation(seg):
    driver, page, device = seg.driver, seg.page, seg.device
    base = seg.reserve(4)
    other = seg.reserve(1)
    free = seg.free()
    invalid(driver.vmm_map, device, base + 512, page, page)  # unaligned address
    invalid(driver.vmm_map, device, base, page + 512, page)  # not whole pages
    invalid(driver.vmm_map, device, base, 0, page)
    invalid(driver.vmm_map, device, base, 3 * page, 2 * page)  # not whole pages of the size asked
    invalid(driver.vmm_map, device, base, page + 512, page + 512)  # a page not whole granules
    invalid(driver.vmm_map, device, base + 3 * page, 2 * page, page)  # past the reservation's end
    invalid(driver.vmm_map, device, other - page, 2 * page, page)  # not inside one reservation
    heap = driver.malloc(device, page)  # device memory, but no reservation's
    try:
        invalid(driver.vmm_map, device, heap - heap % page, page, page)
    finally:
        driver.free(device, heap)
    seg.map(base + page, 1)
    invalid(driver.vmm_map, device, base, 2 * page, page)  # its second page is mapped already
    assert driver.memory_range(base) is None
    assert seg.free() == free - page


@sim_only
def test_unmap_and_release_refuse_what_is_not_theirs(seg):
    driver, page, device = seg.driver, seg.page, seg.device
    base = seg.reserve(3)
    seg.map(base, 1)
    invalid(driver.vmm_unmap, device, base + page, page)  # never mapped
    invalid(driver.vmm_unmap, device, base, 2 * page)  # partly mapped
    invalid(driver.vmm_unmap, device, base + 512, page)
    invalid(driver.vmm_release, device, base, 3 * page)  # a page is mapped
    assert driver.memory_range(base) == (device, base, page)
    seg.unmap(base, 1)
    invalid(driver.vmm_unmap, device, base, page)  # unmapped twice
    invalid(driver.vmm_release, device, base, 2 * page)  # not the whole reservation
    invalid(driver.vmm_release, device, base + page, 2 * page)
    driver.vmm_release(device, base, 3 * page)
    seg.reserved.remove((base, 3 * page))
    invalid(driver.vmm_release, device, base, 3 * page)  # released twice
    invalid(driver.vmm_map, device, base, page, page)  # its address space is gone


@sim_only
def test_a_page_of_several_granules_is_unmapped_whole(seg):
    driver, page, device = seg.driver, seg.page, seg.device
    base = seg.reserve(4)
    seg.map(base, 2, granules=2)
    invalid(driver.vmm_unmap, device, base, page)  # half of a page
    invalid(driver.vmm_unmap, device, base + page, 2 * page)  # halves of two
    free = seg.free()
    seg.unmap(base + 2 * page, 2)
    assert seg.free() == free + 2 * page and driver.memory_range(base) == (device, base, 2 * page)
