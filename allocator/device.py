"""Device memory for tensors: a small per-stream caching allocator.

Invariants:
- a cached block is reused only by the stream it was allocated on, so stream order alone makes reuse safe;
- a block that other streams used (`record_stream`) goes back to the cache only once an event recorded on
  each of those streams at free time has completed; pending blocks are polled, oldest first, at the start
  of every allocation, and `empty_cache` waits for them;
- `reserved` is the sum of the driver allocations held, `allocated` the part handed out.

Sizes are rounded up to 512 bytes and cached blocks are matched by exact size. Splitting, pools, statistics
by pool and snapshots are the business of the full caching allocator that replaces this one.
"""
import collections
import threading

from minitensor.errors import OutOfMemoryError

_ROUND = 512


class Block:
    """One allocation: `ptr` on `device`, `size` bytes (rounded), allocated on `stream`."""

    __slots__ = ("ptr", "size", "requested", "stream", "stream_uses")

    def __init__(self, ptr, size, requested, stream):
        self.ptr = ptr
        self.size = size
        self.requested = requested
        self.stream = stream
        self.stream_uses = None  # streams other than `stream` that used the block (record_stream)


class DeviceCachingAllocator:
    """One per device. `driver` needs malloc/free, event_create/record/query/synchronize/destroy and
    mem_get_info: the real drivers, or a fake one in tests."""

    def __init__(self, driver, device):
        self.driver = driver
        self.device = device
        self._lock = threading.Lock()
        self._cache = collections.defaultdict(list)  # (stream, size) -> [ptr], reused last-in first-out
        self._pending = collections.deque()  # (block, [event]) waiting for other streams
        self.allocated = self.peak_allocated = 0
        self.reserved = self.peak_reserved = 0

    def alloc(self, nbytes, stream):
        if nbytes == 0:
            return Block(0, 0, 0, stream)
        size = -(-nbytes // _ROUND) * _ROUND
        with self._lock:
            if self._pending:
                self._process_pending()
            cached = self._cache.get((stream, size))
            if cached:
                ptr = cached.pop()
            else:
                ptr = self._malloc(size)
            self.allocated += size
            if self.allocated > self.peak_allocated:
                self.peak_allocated = self.allocated
        return Block(ptr, size, nbytes, stream)

    def free(self, block):
        if block.size == 0:
            return
        with self._lock:
            self.allocated -= block.size
            if block.stream_uses:
                events = []
                for stream in block.stream_uses:
                    event = self.driver.event_create(self.device, False, False)
                    self.driver.event_record(event, stream)
                    events.append(event)
                self._pending.append((block, events))
            else:
                self._cache[(block.stream, block.size)].append(block.ptr)

    def record_stream(self, block, stream):
        if stream != block.stream and block.size:
            with self._lock:
                if block.stream_uses is None:
                    block.stream_uses = set()
                block.stream_uses.add(stream)

    def empty_cache(self):
        """Wait for blocks still used by other streams, then give every cached block back to the driver."""
        with self._lock:
            while self._pending:
                block, events = self._pending.popleft()
                for event in events:
                    self.driver.event_synchronize(event)
                    self.driver.event_destroy(event)
                self._cache[(block.stream, block.size)].append(block.ptr)
            self._release_cache()

    def stats(self):
        return {"allocated_bytes": self.allocated, "peak_allocated_bytes": self.peak_allocated,
                "reserved_bytes": self.reserved, "peak_reserved_bytes": self.peak_reserved}

    # -- internals, called with the lock held
    def _malloc(self, size):
        try:
            ptr = self.driver.malloc(self.device, size)
        except OutOfMemoryError:
            self._release_cache()
            try:
                ptr = self.driver.malloc(self.device, size)
            except OutOfMemoryError:
                free, total = self.driver.mem_get_info(self.device)
                raise OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {_format_size(size)}. GPU {self.device} has a total "
                    f"capacity of {_format_size(total)} of which {_format_size(free)} is free. Of the allocated "
                    f"memory {_format_size(self.allocated)} is allocated by minitensor, and "
                    f"{_format_size(self.reserved - self.allocated)} is reserved by minitensor but unallocated."
                ) from None
        self.reserved += size
        if self.reserved > self.peak_reserved:
            self.peak_reserved = self.reserved
        return ptr

    def _release_cache(self):
        for (_, size), ptrs in self._cache.items():
            for ptr in ptrs:
                self.driver.free(self.device, ptr)
                self.reserved -= size
        self._cache.clear()

    def _process_pending(self):
        while self._pending:
            block, events = self._pending[0]
            if not all(self.driver.event_query(e) for e in events):
                return
            self._pending.popleft()
            for event in events:
                self.driver.event_destroy(event)
            self._cache[(block.stream, block.size)].append(block.ptr)


def _format_size(nbytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes} bytes"
