"""Transfers through pinned chunks, for memory a copy engine cannot use in place: pageable host memory (both
directions), and another device's memory when the two devices are not peers.

Up to NUM_CHUNKS chunks of pinned memory from the host caching allocator are used in rotation, each with an
event, so that the host copy of one chunk (pageable <-> pinned) overlaps the device's transfer of the
previous ones. The host copies are split across a few threads (ctypes.memmove releases the GIL): one thread
copying pageable memory is slower than the PCIe link. At the end the chunks go back to the host allocator
with the stream recorded, so the next transfer reuses them once this one is done.

Callers make the cuda device of `stream` current.
"""
import ctypes
import os
import threading

from ..backends import active_driver
from . import host_memory

THRESHOLD = 4 << 20  # pageable copies smaller than this go straight to the driver, which stages them itself
NUM_CHUNKS = 4
MIN_CHUNK, MAX_CHUNK = 1 << 20, 16 << 20
HOST_THREADS = max(1, min(4, os.cpu_count() or 1))
_MIN_PART = 1 << 20  # a host copy is split in parts no smaller than this

_pool = None
_pool_lock = threading.Lock()


def chunk_size(nbytes):
    """A power of two (a size the host allocator caches exactly): a quarter of the transfer, within
    [MIN_CHUNK, MAX_CHUNK]."""
    quarter = -(-nbytes // NUM_CHUNKS)
    return min(MAX_CHUNK, max(MIN_CHUNK, 1 << (quarter - 1).bit_length()))


def host_to_device(dst, src, nbytes, device, stream):
    """Pageable host memory at `src` to device memory at `dst`; returns once `src` has been read."""
    driver = active_driver()
    size, chunks, events = _start(nbytes, [device])
    try:
        for k, offset in enumerate(range(0, nbytes, size)):
            i, n = k % len(chunks), min(size, nbytes - offset)
            if k >= len(chunks):
                driver.event_synchronize(events[i])  # the chunk's previous transfer is done: refill it
            host_copy(chunks[i].ptr, src + offset, n)
            driver.memcpy_async(dst + offset, chunks[i].ptr, n, stream)
            driver.event_record(events[i], stream)
    finally:
        _finish(chunks, events, device, stream)


def device_to_host(dst, src, nbytes, device, stream):
    """Device memory at `src` to pageable host memory at `dst`, after the stream's work; complete on return."""
    device_to_consumer(src, nbytes, device, stream, lambda offset, chunk, n: host_copy(dst + offset, chunk, n))


def device_to_consumer(src, nbytes, device, stream, consume):
    """Device memory at `src`, after the stream's work, handed piece by piece to `consume(offset, chunk, n)`
    (`n` bytes at host address `chunk`, valid during the call) in order; the device fills the next chunks
    meanwhile. Complete on return. Saving a cuda tensor writes each piece to the file this way."""
    driver = active_driver()
    size, chunks, events = _start(nbytes, [device])
    pieces = [(offset, min(size, nbytes - offset)) for offset in range(0, nbytes, size)]

    def drain(k):  # piece k out of its chunk, once its transfer is done
        offset, n = pieces[k]
        i = k % len(chunks)
        driver.event_synchronize(events[i])
        consume(offset, chunks[i].ptr, n)

    try:
        for k, (offset, n) in enumerate(pieces):
            if k >= len(chunks):
                drain(k - len(chunks))
            i = k % len(chunks)
            driver.memcpy_async(chunks[i].ptr, src + offset, n, stream)
            driver.event_record(events[i], stream)
        for k in range(max(0, len(pieces) - len(chunks)), len(pieces)):
            drain(k)
    finally:
        _finish(chunks, events, device, stream)


def device_to_device(dst, dst_device, dst_stream, src, src_device, src_stream, nbytes):
    """Device memory to another device's through pinned chunks, without the host waiting: each chunk is
    filled on the source's stream and emptied on the destination's, ordered by events both ways."""
    driver = active_driver()
    size, chunks, events = _start(nbytes, [src_device, dst_device])
    filled, emptied = events[:len(chunks)], events[len(chunks):]
    try:
        for k, offset in enumerate(range(0, nbytes, size)):
            i, n = k % len(chunks), min(size, nbytes - offset)
            driver.set_device(src_device)
            if k >= len(chunks):
                driver.stream_wait_event(src_stream, emptied[i])
            driver.memcpy_async(chunks[i].ptr, src + offset, n, src_stream)
            driver.event_record(filled[i], src_stream)
            driver.set_device(dst_device)
            driver.stream_wait_event(dst_stream, filled[i])
            driver.memcpy_async(dst + offset, chunks[i].ptr, n, dst_stream)
            driver.event_record(emptied[i], dst_stream)
    finally:
        driver.set_device(dst_device)
        _finish(chunks, events, dst_device, dst_stream)


def host_copy(dst, src, nbytes):
    """memmove, split across HOST_THREADS threads when it is large."""
    parts = min(HOST_THREADS, nbytes // _MIN_PART)
    if parts <= 1:
        ctypes.memmove(dst, src, nbytes)
        return
    step = -(-nbytes // parts)
    futures = [_threads().submit(ctypes.memmove, dst + offset, src + offset, min(step, nbytes - offset))
               for offset in range(step, nbytes, step)]
    ctypes.memmove(dst, src, step)
    for future in futures:
        future.result()


def _threads():
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                from concurrent.futures import ThreadPoolExecutor  # here: importing it slows `import minitensor`
                _pool = ThreadPoolExecutor(max_workers=HOST_THREADS - 1, thread_name_prefix="minitensor-staging")
    return _pool


def _start(nbytes, devices):
    """The chunk size, the chunks, and one event per chunk on each of `devices`."""
    driver = active_driver()
    size = chunk_size(nbytes)
    host = host_memory.allocator()
    chunks = [host.alloc(size) for _ in range(min(NUM_CHUNKS, -(-nbytes // size)))]
    events = [driver.event_create(device, False, False) for device in devices for _ in chunks]
    return size, chunks, events


def _finish(chunks, events, device, stream):
    """Give the chunks back, reusable once `stream` (their last user) is done with them."""
    host = host_memory.allocator()
    for chunk in chunks:
        host.record_stream(chunk, device, stream)
        host.free(chunk)
    driver = active_driver()
    for event in events:
        driver.event_destroy(event)
