"""Device memory for tensors: torch's caching allocator policy, in pure Python over the driver protocol.

The driver (minitensor.backends.base.Driver, or a fake in tests) gives malloc/free of segments, events
(create/record/query/synchronize/destroy), mem_get_info, and current_device/set_device. One allocator per
device; every public method but `free` takes the lock once.

Policy (docs/allocator.md, torch's c10/cuda/CUDACachingAllocator.cpp):
- Requests round up to 512 bytes (or roundup_power2_divisions); up to 1 MiB they come from the small pool,
  else from the large one. A miss asks the driver for a segment (segments.py): 2 MiB (small), 20 MiB (under
  10 MiB), or the request rounded up to 2 MiB, after the out-of-memory ladder when the device is full. With
  expandable_segments, the miss maps pages into the free list's one expandable segment instead (expandable.py).
- Free blocks are cached per (stream, pool) and only reused by their stream: the smallest that fits, lowest
  address first. A request takes the low end of a block and the rest stays cached (small pool and expandable
  segments: when at least 512 bytes remain; large: when the request is under max_split_size and more than
  1 MiB remains).
  Blocks of max_split_size or more are never split nor used for a request 20 MiB smaller. A freed block
  merges with its free neighbours.
- A block used by other streams (record_stream) is cached only once an event recorded on each of them at
  free time has completed (stream_events.py); pending events are polled, oldest first per stream, at each
  allocation.

Speed: allocating and freeing is the hot path of every op, so two shortcuts give torch's results without
its search and merge: a cached block of exactly the rounded size is the best fit, taken straight from its
size's bin; and a freed block is queued, to be handed out again by the next allocation when torch would
(reuse.py). Both run inline in `alloc` and `free`, where a call would cost as much as the step.
"""
import collections
import threading

from minitensor.base.errors import OutOfMemoryError

from .block import ALLOCATED, FREE, NULL, PENDING, QUEUED, Block, FreeList
from .expandable import ExpandableSegments
from .history import FREE_COMPLETED
from .private_pools import PrivatePools
from .reuse import QueuedFrees
from .segments import Segments
from .settings import Settings
from .sizes import MIN_BLOCK, ONE_EB, OVERSIZE_SLACK, SMALL_SIZE, round_size
from .snapshot import Snapshots
from .stats import DeviceStats
from .stats_reset import StatsReset
from .stream_events import StreamEvents

_UNLIMITED = 1 << 64  # max_split_size when none is set: no block reaches it


class DeviceCachingAllocator(QueuedFrees, Segments, ExpandableSegments, PrivatePools, Snapshots, StatsReset):
    """The caching allocator of one device. Its queued frees (reuse.py), its segments (segments.py,
    expandable.py), its private pools (private_pools.py) and its snapshots and history (snapshot.py) are mixins
    rather than objects of their own: they share its state, and the hot path reads it inline."""

    def __init__(self, driver, device, settings=None):
        self.driver = driver
        self.device = device
        self._lock = threading.Lock()
        self._small = {}  # stream, or (private pool id, stream) -> FreeList of the small pool
        self._large = {}  # the same for the large pool
        self._pools = {}  # private pool id -> PrivatePool (private_pools.py)
        self._routes = []  # open routes of allocations to private pools: [pool, matches(stream), is_capture]
        self._capturing = 0  # how many of them are captures
        self._deferred = []  # blocks freed during a capture, their record_stream events not yet recorded
        self._history = None  # the memory history being recorded (history.py), or None
        # called as oom_observer(segments, trace entries), lock held, before an OutOfMemoryError is raised
        self.oom_observer = None
        self._segments = {}  # segment address -> its first block
        self._events = StreamEvents(driver, self._events_done, per_stream=True)
        self._queued_events = self._events.queues  # empty unless an event pends: tested inline on the hot path
        self._freed = collections.deque()  # blocks freed, their frees not yet completed (see reuse.py)
        self._repeat_victim = None  # the victim last handed out again, while nothing else happened since
        self._repeats = 0  # its hand-outs since then, their statistics not yet added (_end_repeats)
        self._repeat_increments = None
        self.stats = DeviceStats()
        self._limit = None  # bytes the segments may total (memory fraction); None: the whole device
        self._fraction = 1.0
        self._gc_lookups = 0  # large-pool lookups, the clock of garbage_collection_threshold
        self.null = Block(0, 0, 0, None)  # what a zero-byte request gets
        self.null.state = NULL
        self.configure(Settings() if settings is None else settings)

    def configure(self, settings):
        """Apply allocator settings (see settings.py); cached blocks stay as they are."""
        with self._lock:
            self._settle()
            self.settings = settings
            self._max_split = settings.max_split_size or _UNLIMITED
            self._divisions = settings.roundup_power2_divisions
            self._gc_threshold = settings.garbage_collection_threshold
            self._expandable_on = settings.expandable_segments
            self._set_plain()

    def _set_plain(self):
        """The shortcuts assume plain 512-byte rounding, no garbage-collection clock to advance and no
        allocation routed to a private pool (lock held)."""
        self._plain = self._divisions is None and not self._gc_threshold and not self._routes
        for free_list in [*self._small.values(), *self._large.values()]:
            free_list.version += 1  # a victim's reuse depends on these and on max_split_size

    # ------------------------------------------------------------------ the interface storages use
    def alloc(self, nbytes, stream):
        """A block of at least `nbytes` bytes for use on `stream` (a stream handle); 0 bytes: the null block."""
        if nbytes <= MIN_BLOCK:
            if nbytes <= 0:
                return self._alloc_nothing(nbytes)
            size = MIN_BLOCK
        else:
            size = (nbytes + MIN_BLOCK - 1) & -MIN_BLOCK
        lock = self._lock
        lock.acquire()
        try:
            if self._queued_events and not self._capturing:  # no event query while a stream captures
                self._settle()
                self._events.poll()
            freed = self._freed
            if freed:
                victim = freed[0]
                if len(freed) == 1 and victim.size == size and victim.stream == stream:
                    if victim is self._repeat_victim and nbytes == victim.requested:
                        # nothing happened since the last call handed out this block but its free: this call
                        # repeats that one, statistics included (_end_repeats adds them up)
                        freed.popleft()
                        self._repeats += 1
                        victim.state = ALLOCATED
                        if self._history is not None:
                            self._history.alloc(victim.ptr, nbytes, victim.stream, None)
                        return victim
                    if self._take_victim(victim, size, nbytes):
                        if self._history is not None:
                            self._history.alloc(victim.ptr, nbytes, victim.stream, None)
                        return victim
                self._settle()
            elif self._repeat_victim is not None:
                self._end_repeats()
            if self._plain:
                free_list = (self._small if size <= SMALL_SIZE else self._large).get(stream)
                if free_list is not None:
                    bin_ = free_list.bins.get(size)
                    # an exact fit is the best fit, taken whole (in an expandable segment, see _takes_exact)
                    if bin_ and (bin_[-1].expandable is None or self._takes_exact(free_list, bin_)):
                        free_list.version += 1
                        block = bin_.pop()
                        if (block.prev is not None or block.next is not None) and block.expandable is None:
                            p = free_list.stats
                            p.inactive_split -= 1
                            p.inactive_split_bytes -= size
                        self._count_taken(block, nbytes)
                        if self._history is not None:
                            self._history.alloc(block.ptr, nbytes, block.stream, None)
                        return block
            return self._alloc(nbytes, stream)
        finally:
            lock.release()

    def free(self, block):
        """Give a block back: cached at once, or once the streams it was recorded on are done with it."""
        if block.state == ALLOCATED and block.stream_uses is None and self._plain:
            block.state = QUEUED  # not FREE: no other block merges with it before its free completes
            if self._history is not None:
                self._history.free(block.ptr, block.requested, block.stream, block.free_list.pool_id, True)
            self._freed.append(block)  # thread-safe without the lock; completed under it by the next call
            return
        with self._lock:
            if block.state != ALLOCATED:
                if block.state == NULL:
                    return
                raise RuntimeError(f"minitensor allocator: {block!r} freed twice")
            self._settle()
            if self._history is not None:  # completed now, or when its streams' events have (_events_done)
                self._history.free(block.ptr, block.requested, block.stream, block.free_list.pool_id,
                                   not block.stream_uses)
            self._free(block)

    def record_stream(self, block, stream):
        """Note that `stream` (a handle) uses the block: freeing it will wait for that stream's work."""
        if stream == block.stream or not block.size:
            return
        with self._lock:
            if block.stream_uses is None:
                block.stream_uses = {(self.device, stream)}
            else:
                block.stream_uses.add((self.device, stream))

    # ------------------------------------------------------------------ the torch.cuda.memory functions
    def empty_cache(self):
        """Wait for blocks still used by other streams, then give every unsplit cached segment back."""
        with self._lock:
            self._refuse_while_capturing("empty_cache()")
            self._settle()
            self._release_cached()

    def memory_stats(self):
        with self._lock:
            self._settle()
            return self.stats.as_dict(self.settings.max_split_size)

    def allocated_bytes(self):
        with self._lock:
            self._settle()
            return self.stats.current("allocated_bytes")

    def reserved_bytes(self):
        with self._lock:
            return self.stats.current("reserved_bytes")

    def peak(self, stat):
        """The all-pools peak of `stat` (e.g. "allocated_bytes")."""
        with self._lock:
            return getattr(self.stats.all, stat + "_peak")

    def set_memory_fraction(self, fraction, total):
        """Limit the segments to `fraction` of `total` device bytes (checked before asking the driver)."""
        with self._lock:
            self._fraction = fraction
            self._limit = None if fraction >= 1.0 else round(fraction * total)

    def memory_fraction(self):
        return self._fraction

    # ------------------------------------------------------------------ allocation, general path
    def _alloc_nothing(self, nbytes):
        if nbytes < 0:
            raise ValueError(f"cannot allocate {nbytes} bytes: expected a size >= 0")
        return self.null

    def _alloc(self, nbytes, stream):
        """Everything but the shortcuts (lock held, victim settled, events processed)."""
        if nbytes >= ONE_EB:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")
        size = round_size(nbytes, self._divisions)
        free_list = self._free_list(size <= SMALL_SIZE, stream, self._route(stream) if self._routes else None)
        block = self._find_cached(free_list, size)
        if block is None:
            block = self._new_block(free_list, size)
        if self._should_split(block, size):
            self._split(block, size)
        elif (block.prev is not None or block.next is not None) and block.expandable is None:
            p = free_list.stats
            p.inactive_split -= 1
            p.inactive_split_bytes -= block.size
        self._count_taken(block, nbytes)
        if self._history is not None:
            self._history.alloc(block.ptr, nbytes, block.stream, free_list.pool_id)
        return block

    def _free_list(self, small, stream, pool=None):
        """The free list of (stream, small or large) in the general cache, or in a private pool."""
        pools = self._small if small else self._large
        key = stream if pool is None else (pool.id, stream)
        free_list = pools.get(key)
        if free_list is None:
            stats, other = (self.stats.small, self.stats.large) if small else (self.stats.large, self.stats.small)
            free_list = pools[key] = FreeList(self, small, stream, stats, other, self.stats.all, pool)
        return free_list

    def _find_cached(self, free_list, size):
        """The best cached fit for `size` on the free list's stream, taken out of the cache, or None."""
        if not free_list.small and self._gc_threshold:
            self._gc_lookups += 1
        bin_ = free_list.best_fit(size)
        if bin_ is None:
            return None
        block = bin_[-1] if bin_[-1].expandable is None else self._expandable_fit(free_list, size)
        if block is None:
            return None
        if size < self._max_split <= block.size:
            return None  # an oversize block is not split for a smaller request
        if size >= self._max_split and block.size >= size + OVERSIZE_SLACK:
            return None  # nor used for a request much smaller than itself
        if block is bin_[-1]:
            free_list.version += 1
            bin_.pop()
        else:
            free_list.remove(block)
        return block

    def _should_split(self, block, size):
        remaining = block.size - size
        if block.free_list.small or block.expandable is not None:  # torch's rule for expandable segments too
            return remaining >= MIN_BLOCK
        return size < self._max_split and remaining > SMALL_SIZE

    def _split(self, block, size):
        """Keep the low `size` bytes in `block`, about to be handed out, and cache the rest."""
        rest = Block(block.ptr + size, block.size - size, block.stream, block.free_list)
        rest.expandable = block.expandable
        p = block.free_list.stats
        if block.expandable is None:  # an expandable segment has no inactive split blocks
            if block.prev is None and block.next is None:  # the rest is a new inactive split block
                p.inactive_split += 1
                p.inactive_split_bytes += rest.size
                p.inactive_split_inc += 1
                p.inactive_split_bytes_inc += rest.size
                self._split_peaks(p, 0, 0)
            else:  # the free split block it was loses its low part
                p.inactive_split_bytes -= size
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next = rest
        block.size = size
        self._cache_block(rest)

    # ------------------------------------------------------------------ statistics of taking and caching
    def _count_taken(self, block, nbytes):
        """Statistics of handing out a block (out of its free list, split if it was to be)."""
        stats = self.stats
        size = block.size
        block.state = ALLOCATED
        block.requested = nbytes
        free_list = block.free_list
        p, q, a = free_list.stats, free_list.other_stats, free_list.all_peaks
        n = p.allocation = p.allocation + 1
        b = p.allocated_bytes = p.allocated_bytes + size
        r = p.requested_bytes = p.requested_bytes + nbytes
        p.allocation_inc += 1
        p.allocated_bytes_inc += size
        p.requested_bytes_inc += nbytes
        if n > p.allocation_peak:
            p.allocation_peak = n
        if b > p.allocated_bytes_peak:
            p.allocated_bytes_peak = b
        if r > p.requested_bytes_peak:
            p.requested_bytes_peak = r
        if n + p.pending > p.active_peak:
            p.active_peak = n + p.pending
        if b + p.pending_bytes > p.active_bytes_peak:
            p.active_bytes_peak = b + p.pending_bytes
        n += q.allocation
        b += q.allocated_bytes
        r += q.requested_bytes
        if n > a.allocation_peak:
            a.allocation_peak = n
        if b > a.allocated_bytes_peak:
            a.allocated_bytes_peak = b
        if r > a.requested_bytes_peak:
            a.requested_bytes_peak = r
        n += p.pending + q.pending
        b += p.pending_bytes + q.pending_bytes
        if n > a.active_peak:
            a.active_peak = n
        if b > a.active_bytes_peak:
            a.active_bytes_peak = b
        if size >= self._max_split:
            stats.oversize_allocations.up()

    def _free(self, block):
        """The owner is done with the block: count it freed, then cache it, or wait for its other streams."""
        size = block.size
        p = block.free_list.stats
        p.allocation -= 1
        p.allocated_bytes -= size
        if size >= self._max_split:
            self.stats.oversize_allocations.down()
        if block.stream_uses:
            block.state = PENDING
            p.pending += 1
            p.pending_bytes += size
            if self._capturing:  # no event may be recorded on a capturing stream: after the capture
                self._deferred.append(block)
                return
            self._events.record(block)
            self._events.queue(block)
        else:
            self._cache(block, p)

    def _cache(self, block, p):
        """A block no stream uses any more: merge it with its free neighbours and cache it."""
        size, requested = block.size, block.requested
        split_n = split_b = 0
        prev = block.prev
        if prev is not None and prev.state == FREE:
            prev.free_list.remove(prev)
            split_n -= 1
            split_b -= prev.size
            prev.size += size
            prev.next = block.next
            if block.next is not None:
                block.next.prev = prev
            block = prev
        nxt = block.next
        if nxt is not None and nxt.state == FREE:
            nxt.free_list.remove(nxt)
            split_n -= 1
            split_b -= nxt.size
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        if block.expandable is not None:  # an expandable segment has no inactive split blocks
            split_n = split_b = 0
        elif block.prev is not None or block.next is not None:
            split_n += 1
            split_b += block.size
        p.requested_bytes -= requested
        p.inactive_split += split_n
        p.inactive_split_bytes += split_b
        if split_n > 0:
            p.inactive_split_inc += split_n
        if split_b > 0:
            p.inactive_split_bytes_inc += split_b
        if split_n > 0 or split_b > 0:
            self._split_peaks(p, 0, 0)
        self._cache_block(block)

    def _cache_block(self, block):
        block.state = FREE
        block.requested = 0
        if self._gc_threshold:
            block.gc_base = self._gc_lookups
        block.free_list.add(block)

    def _split_peaks(self, p, extra_n, extra_b):
        """Raise the inactive_split peaks to the current values plus (extra_n, extra_b) if they are higher."""
        stats = self.stats
        n, b = p.inactive_split + extra_n, p.inactive_split_bytes + extra_b
        if n > p.inactive_split_peak:
            p.inactive_split_peak = n
        if b > p.inactive_split_bytes_peak:
            p.inactive_split_bytes_peak = b
        q = stats.large if p is stats.small else stats.small
        n += q.inactive_split
        b += q.inactive_split_bytes
        if n > stats.all.inactive_split_peak:
            stats.all.inactive_split_peak = n
        if b > stats.all.inactive_split_bytes_peak:
            stats.all.inactive_split_bytes_peak = b

    def _events_done(self, block):
        """A pending block whose events have all completed (stream_events.py): cache it."""
        p = block.free_list.stats
        p.pending -= 1
        p.pending_bytes -= block.size
        if self._history is not None:
            self._history.event(FREE_COMPLETED, block.ptr, block.requested, block.stream,
                                block.free_list.pool_id)
        self._cache(block, p)
