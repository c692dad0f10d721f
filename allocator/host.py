"""Pinned host memory: torch's caching host allocator policy (aten/src/ATen/core/CachingHostAllocator.h), in
pure Python over the driver protocol (host_alloc/host_free, host_register/host_unregister, events).

Policy (docs/allocator.md):
- Requests round up to a power of two; a freed block goes back to the free list of exactly its size and is
  reused last in, first out. Blocks are never split nor merged. Zero bytes gives the null block.
- A non_blocking copy that reads or writes a block records its stream on it (`record_stream`). Freeing the
  block then records one event per such stream, and it is reusable only once all have completed (see
  stream_events.py). Pending events are processed in one queue, oldest first, stopping at the first not
  complete: before each allocation, or with `pinned_use_background_threads:True` by one background thread
  instead (every ~100 us while any pend).
- Memory comes from the driver's `host_alloc` (cuMemHostAlloc), or with `pinned_use_host_register:True` from
  ordinary memory (an anonymous mapping) whose pages are touched first, by `pinned_num_register_threads`
  threads when it is large enough, then `host_register`ed (cuMemHostRegister).
- `empty_cache` processes the events, then gives every cached block back to the driver.

Freeing takes no lock: it runs from a storage's __del__, which the garbage collector may call inside an
allocator call on the same thread. The block joins a queue that the next call under the lock completes, in
order, before it reads or changes anything, so no caller sees the difference.

Statistics (host_stats.py): unlike torch, the active stats go down on every path that makes a block free
again (torch forgets the free of a block no stream was recorded on).
"""
import collections
import ctypes
import mmap
import sys
import threading
import time
import weakref

import numpy as np

from .history import FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SNAPSHOT
from .host_stats import HostStats
from .settings import Settings
from .stats_reset import StatsReset
from .stream_events import StreamEvents

MAX_REGISTER_THREADS = 128  # pinned_num_register_threads' limit
PAGE = 4096  # pages are touched one byte per 4 KiB, as torch does, before cuMemHostRegister
_POLL_S = 1e-4  # how often the background thread looks at pending events


class HostBlock:
    """`size` bytes of pinned host memory at `ptr`."""

    __slots__ = ("ptr", "size", "requested", "mapping", "stream_uses", "events", "event_count", "array")
    stream = 0  # what a memory-history entry names as its stream: a pinned block belongs to none

    def __init__(self, ptr, size, mapping):
        self.ptr = ptr
        self.size = size
        self.requested = 0  # bytes asked for by its last hand-out, as memory-history entries name its size
        self.mapping = mapping  # the ordinary memory behind a registered block; None for host_alloc memory
        self.stream_uses = None  # {(device, stream handle)} recorded by non_blocking copies while handed out
        self.events = None  # [(event, device, stream)] recorded at free, until the allocator queues them
        self.event_count = 0  # events still to complete before the block is free
        self.array = None  # the numpy array a storage views it through, kept for the next storage

    def __repr__(self):
        return f"HostBlock(ptr={self.ptr:#x}, size={self.size})"


class HostCachingAllocator(StatsReset):
    """The process's pinned host memory cache."""

    def __init__(self, driver, settings=None, capture_underway=lambda: False):
        self.driver = driver
        # whether a stream captures now: then no event is queried (CUDA refuses cuEventQuery during a capture)
        # and freed blocks wait for the next allocation after it
        self._capture_underway = capture_underway
        self.stats = HostStats()
        self.null = HostBlock(0, 0, None)
        self._lock = threading.Lock()
        self._bins = {}  # size -> cached blocks, the last freed at the end
        self._freed = collections.deque()  # blocks freed, their frees not yet completed under the lock
        self._events = StreamEvents(driver, self._events_done, per_stream=False)
        self._queued_events = self._events.queues  # empty unless an event pends: tested inline on the hot path
        self._pool = None  # threads that touch the pages of memory to register, started as needed
        self._thread = None  # the background event thread, while pinned_use_background_threads is on
        self._wake = threading.Event()
        self._history = None  # the memory history being recorded (history.py), or None
        self.configure(Settings() if settings is None else settings)

    def configure(self, settings):
        """Apply allocator settings (the pinned_* keys); cached blocks stay as they are."""
        with self._lock:
            self.settings = settings
            if settings.pinned_use_background_threads and self._thread is None:
                self._thread = threading.Thread(target=self._background, daemon=True,
                                                name="minitensor-pinned-events")
                self._thread.start()
            elif not settings.pinned_use_background_threads and self._thread is not None:
                self._thread = None  # it sees this and stops
                self._wake.set()

    # ------------------------------------------------------------------ the interface storages and copies use
    def alloc(self, nbytes):
        """A block of at least `nbytes` bytes (the next power of two); 0 bytes: the null block."""
        if nbytes <= 0:
            if nbytes < 0:
                raise ValueError(f"cannot allocate {nbytes} bytes of pinned memory: expected a size >= 0")
            return self.null
        size = 1 << (nbytes - 1).bit_length()
        lock = self._lock
        lock.acquire()  # not `with`: this is the hot path, and acquire/try/finally costs half as much
        try:
            freed = self._freed
            if freed:
                block = freed[0]
                if len(freed) == 1 and block.size == size and block.events is None and not self._queued_events:
                    # the hot path: the block just freed is the one the cache hands out (last in, first
                    # out); its free and this allocation leave every current value and peak as they were
                    freed.popleft()
                    stats = self.stats
                    stats.active_requests.allocated += 1
                    stats.active_requests.freed += 1
                    stats.active_bytes.allocated += size
                    stats.active_bytes.freed += size
                    block.requested = nbytes
                    if self._history is not None:
                        self._history.alloc(block.ptr, nbytes, block.stream, None)
                    return block
                self._settle()
            if self._queued_events and self._thread is None and not self._capture_underway():
                self._events.poll()
            bin_ = self._bins.get(size)
            if bin_:
                block = bin_.pop()
                self._count_taken(size)
                block.requested = nbytes
                if self._history is not None:
                    self._history.alloc(block.ptr, nbytes, block.stream, None)
                return block
        finally:
            lock.release()
        block, us = self._new_block(size)  # without the lock: the driver takes a millisecond or more
        with self._lock:
            stats = self.stats
            stats.allocations.increase(1)
            stats.allocated_bytes.increase(size)
            stats.num_host_alloc += 1
            stats.host_alloc_time.add(us)
            self._count_taken(size)
            block.requested = nbytes
            if self._history is not None:
                self._history.event(SEGMENT_ALLOC, block.ptr, size, 0, None)
                self._history.alloc(block.ptr, nbytes, block.stream, None)
        return block

    def free(self, block):
        """Give a block back: reusable at once, or once the streams recorded on it reach this point.

        A block whose numpy array is still referenced from outside its storage (a view from t.numpy()) comes
        back only when that array dies, so the memory under a live view is never handed out again."""
        if not block.size:
            return
        array = block.array
        if array is not None and sys.getrefcount(array) > _OWNED_REFS:
            block.array = None
            weakref.finalize(array, self.free, block)
            return
        if block.stream_uses:
            self._events.record(block)
        if self._history is not None:  # completed now, or when its streams' events have (_events_done)
            self._history.free(block.ptr, block.requested, block.stream, None, not block.events)
        self._freed.append(block)  # thread-safe without the lock
        if block.events and self._thread is not None:
            self._wake.set()

    def record_stream(self, block, device, stream):
        """A copy on `stream` (a handle of device `device`) uses the block: its free waits for that work."""
        if not block.size:
            return
        if block.stream_uses is None:
            block.stream_uses = {(device, stream)}
        else:
            block.stream_uses.add((device, stream))

    # ------------------------------------------------------------------ the torch.cuda functions
    def empty_cache(self):
        """Process the pending events, then give every cached block back to the driver."""
        with self._lock:
            self._settle()
            self._events.poll()
            blocks = [block for bin_ in self._bins.values() for block in bin_]
            self._bins.clear()
        for block in blocks:
            start = time.perf_counter()
            self._release(block)
            us = (time.perf_counter() - start) * 1e6
            with self._lock:
                if self._history is not None:
                    self._history.event(SEGMENT_FREE, block.ptr, block.size, 0, None)
                stats = self.stats
                stats.allocations.decrease(1)
                stats.allocated_bytes.decrease(block.size)
                stats.num_host_free += 1
                stats.host_free_time.add(us)

    def memory_stats(self):
        with self._lock:
            self._settle()
            return self.stats.as_dict()

    def record_history(self, history):
        """Start recording into a history.History, or stop with None."""
        with self._lock:
            self._settle()
            self._history = history

    def history_entries(self):
        """The recorded trace as torch's dicts, ending with a "snapshot" entry; [] when not recording."""
        with self._lock:
            if self._history is None:
                return []
            self._history.event(SNAPSHOT, 0, 0, 0, None)
            return self._history.entries({})

    # ------------------------------------------------------------------ under the lock
    def _count_taken(self, size):
        stats = self.stats
        stats.active_requests.increase(1)
        stats.active_bytes.increase(size)

    def _settle(self):
        """Complete the queued frees, in order: cache each block, or queue its events."""
        freed = self._freed
        while freed:
            block = freed.popleft()
            if block.events:
                self._events.queue(block)
            else:
                self._cache(block)

    def _events_done(self, block):
        """A freed block whose streams' events have all completed (stream_events.py): cache it."""
        if self._history is not None:
            self._history.event(FREE_COMPLETED, block.ptr, block.requested, 0, None)
        self._cache(block)

    def _cache(self, block):
        bin_ = self._bins.get(block.size)
        if bin_ is None:
            self._bins[block.size] = [block]
        else:
            bin_.append(block)
        stats = self.stats
        stats.active_requests.decrease(1)
        stats.active_bytes.decrease(block.size)

    def _background(self):
        """pinned_use_background_threads: process events while any are pending, sleep otherwise."""
        me = threading.current_thread()
        try:
            while self._thread is me:
                self._wake.wait()
                self._wake.clear()
                with self._lock:
                    self._settle()
                    if not self._capture_underway():
                        self._events.poll()
                    pending = bool(self._queued_events)
                if pending:
                    self._wake.set()
                    time.sleep(_POLL_S)
        except BaseException:
            self._thread = None  # allocations process the events again, and meet the error themselves
            raise

    # ------------------------------------------------------------------ without the lock
    def _new_block(self, size):
        """A new block from the driver, and how long that took in microseconds."""
        start = time.perf_counter()
        if self.settings.pinned_use_host_register:
            mapping = mmap.mmap(-1, size)
            ptr = ctypes.addressof(ctypes.c_char.from_buffer(mapping))
            self._touch_pages(ptr, size, self.settings.pinned_num_register_threads)
            try:
                self.driver.host_register(ptr, size)
            except BaseException:
                mapping.close()
                raise
        else:
            mapping = None
            ptr = self.driver.host_alloc(size)
        return HostBlock(ptr, size, mapping), (time.perf_counter() - start) * 1e6

    def _touch_pages(self, ptr, size, threads):
        """Fault every page in (one byte per 4 KiB), split across `threads` threads when there are enough
        pages, so that registering it does not fault them under the driver's lock."""
        pages = -(-size // PAGE)
        if threads <= 1 or size < PAGE * threads:
            _touch(ptr, 0, pages)
            return
        if self._pool is None:  # torch keeps a pool too: a new thread costs more than touching its pages
            with self._lock:
                if self._pool is None:
                    from concurrent.futures import ThreadPoolExecutor  # here: importing it slows `import minitensor`
                    self._pool = ThreadPoolExecutor(max_workers=MAX_REGISTER_THREADS,
                                                    thread_name_prefix="minitensor-pin")
        per_thread = -(-pages // threads)
        futures = [self._pool.submit(_touch, ptr, first, min(first + per_thread, pages))
                   for first in range(0, pages, per_thread)]
        for future in futures:
            future.result()

    def _release(self, block):
        block.array = None  # a cached block has no view outside the allocator: this was the last
        if block.mapping is None:
            self.driver.host_free(block.ptr)
        else:
            self.driver.host_unregister(block.ptr)
            block.mapping.close()


def _owned_refs():
    """sys.getrefcount, as `free` takes it, of a block's array that only the block and its storage hold (the
    count differs between Python versions, so it is measured)."""
    block = HostBlock(0, 0, None)
    storage = [np.empty(1)]  # holds the array as a storage does
    block.array = storage[0]
    array = block.array
    return sys.getrefcount(array)


_OWNED_REFS = _owned_refs()


def _touch(ptr, first, last):
    """Write one byte in each page from `first` to `last` (exclusive) of the memory at `ptr`."""
    if last > first:
        pages = np.frombuffer((ctypes.c_uint8 * ((last - first - 1) * PAGE + 1)).from_address(ptr + first * PAGE),
                              np.uint8)
        pages[::PAGE] = 0
