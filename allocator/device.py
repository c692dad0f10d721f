"""Device memory for tensors: torch's caching allocator policy, in pure Python over the driver protocol.

The driver (minitensor.backends.base.Driver, or a fake in tests) gives malloc/free of segments, events
(create/record/query/synchronize/destroy), mem_get_info, and current_device/set_device. One allocator per
device; every public method but `free` takes the lock once.

Policy (reference/allocator.md, torch's c10/cuda/CUDACachingAllocator.cpp):
- Requests round up to 512 bytes (or roundup_power2_divisions); up to 1 MiB they come from the small pool,
  else from the large one. A miss asks the driver for a segment: 2 MiB (small), 20 MiB (under 10 MiB), or
  the request rounded up to 2 MiB.
- Free blocks are cached per (stream, pool) and only reused by their stream: the smallest that fits, lowest
  address first. A request takes the low end of a block and the rest stays cached (small pool: when at
  least 512 bytes remain; large: when the request is under max_split_size and more than 1 MiB remains).
  Blocks of max_split_size or more are never split nor used for a request 20 MiB smaller. A freed block
  merges with its free neighbours.
- A block used by other streams (record_stream) is cached only once an event recorded on each of them at
  free time has completed; pending events are polled, oldest first per stream, at each allocation.
- Out of memory, in order: free old cached blocks (garbage_collection_threshold with a memory fraction),
  new segment, release cached blocks of max_split_size that cover the request and retry, release every
  unsplit cached block and retry (num_alloc_retries), then OutOfMemoryError (num_ooms).

Speed: allocating and freeing is the hot path of every op, so two shortcuts give torch's results without
its search and merge:
- a cached block of exactly the rounded size is the best fit: it is taken straight from its size's bin;
- a freed block goes on a queue, unmerged and uncounted, without taking the lock; the next call under the
  lock completes the queued frees as torch does, in order, except in the common case of one queued block
  (the "victim") and an allocation of its size on its stream that torch's policy would serve with this
  very block (see `_reuse_kind`): it is handed out again with the net statistics of the free and the
  allocation. When the next call frees and asks for the same block again with nothing in between (every
  op's loop), it repeats that step exactly, so only a count of the repeats is kept until something reads
  or changes the statistics. Every reader of state (stats, snapshot) completes the queue first.
"""
import collections
import threading
from bisect import bisect_left

from minitensor.errors import OutOfMemoryError

from .block import ALLOCATED, FREE, NULL, PENDING, QUEUED, Block, FreeList
from .settings import Settings
from .sizes import MIN_BLOCK, ONE_EB, OVERSIZE_SLACK, SMALL_SIZE, format_size, round_size, segment_size
from .snapshot import segment_dict
from .stats import DeviceStats
from .stats_reset import StatsReset

_UNLIMITED = 1 << 64  # max_split_size when none is set: no block reaches it
# How freeing the victim and taking it again moves the inactive split blocks (see _reuse_kind).
_WHOLE, _ALONE, _REJOIN, _REJOIN_WHOLE = "whole", "alone", "rejoin", "rejoin whole"


class DeviceCachingAllocator(StatsReset):
    """The caching allocator of one device."""

    def __init__(self, driver, device, settings=None):
        self.driver = driver
        self.device = device
        self._lock = threading.Lock()
        self._small = {}  # stream -> FreeList of the small pool
        self._large = {}  # stream -> FreeList of the large pool
        self._segments = {}  # segment address -> its first block
        self._events = {}  # stream -> deque of (event, block): record_stream uses not yet known complete
        self._spare_events = []  # completed events, recorded again rather than created
        self._freed = collections.deque()  # blocks freed, their frees not yet completed (see the docstring)
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
            # The shortcuts assume plain 512-byte rounding and no garbage-collection clock to advance.
            self._plain = self._divisions is None and not self._gc_threshold
            for free_list in [*self._small.values(), *self._large.values()]:
                free_list.version += 1  # a victim's reuse depends on max_split_size

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
            if self._events:
                self._settle()
                self._process_events()
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
                        return victim
                    if self._take_victim(victim, size, nbytes):
                        return victim
                self._settle()
            elif self._repeat_victim is not None:
                self._end_repeats()
            if self._plain:
                free_list = (self._small if size <= SMALL_SIZE else self._large).get(stream)
                if free_list is not None:
                    bin_ = free_list.bins.get(size)
                    if bin_:  # an exact fit is the best fit, taken whole
                        free_list.version += 1
                        block = bin_.pop()
                        if block.prev is not None or block.next is not None:
                            p = free_list.stats
                            p.inactive_split -= 1
                            p.inactive_split_bytes -= size
                        self._count_taken(block, nbytes)
                        return block
            return self._alloc(nbytes, stream)
        finally:
            lock.release()

    def free(self, block):
        """Give a block back: cached at once, or once the streams it was recorded on are done with it."""
        if block.state == ALLOCATED and block.stream_uses is None and self._plain:
            block.state = QUEUED  # not FREE: no other block merges with it before its free completes
            self._freed.append(block)  # thread-safe without the lock; completed under it by the next call
            return
        with self._lock:
            if block.state != ALLOCATED:
                if block.state == NULL:
                    return
                raise RuntimeError(f"minitensor allocator: {block!r} freed twice")
            self._settle()
            self._free(block)

    def record_stream(self, block, stream):
        """Note that `stream` (a handle) uses the block: freeing it will wait for that stream's work."""
        if stream == block.stream or not block.size:
            return
        with self._lock:
            if block.stream_uses is None:
                block.stream_uses = {stream}
            else:
                block.stream_uses.add(stream)

    # ------------------------------------------------------------------ the torch.cuda.memory functions
    def empty_cache(self):
        """Wait for blocks still used by other streams, then give every unsplit cached segment back."""
        with self._lock:
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

    def snapshot(self):
        """Every segment, by address, as torch's memory_snapshot() describes it (see snapshot.py)."""
        with self._lock:
            self._settle()
            return [segment_dict(self.device, self._segments[ptr]) for ptr in sorted(self._segments)]

    def set_memory_fraction(self, fraction, total):
        """Limit the segments to `fraction` of `total` device bytes (checked before asking the driver)."""
        with self._lock:
            self._fraction = fraction
            self._limit = None if fraction >= 1.0 else round(fraction * total)

    def memory_fraction(self):
        return self._fraction

    # ------------------------------------------------------------------ the victim shortcut
    def _settle(self):
        """Complete the queued frees, in order, as torch does, and count the repeated hand-outs (lock held)."""
        if self._repeat_victim is not None:
            self._end_repeats()
        freed = self._freed
        for _ in range(len(freed)):
            self._free(freed.popleft())

    def _take_victim(self, victim, size, nbytes):
        """Hand out the one queued block (the victim) again if torch's free of it followed by this allocation
        would (see _reuse_kind), counting both in one step, and make it the block whose repeats alloc
        counts. False, with nothing changed, when torch would hand out another block."""
        free_list = victim.free_list
        if victim.reuse_version != free_list.version:
            victim.reuse_kind = self._reuse_kind(victim)
            victim.reuse_version = free_list.version
        kind = victim.reuse_kind
        if kind is None:
            return False
        self._freed.popleft()
        p = free_list.stats
        split = split_bytes = 0  # what the free and the take add to the inactive splits' increases
        if kind is _REJOIN:  # the free grows the split block above by `size`, the take undoes it
            split_bytes = size
            b = p.inactive_split_bytes + size
            if b > p.inactive_split_bytes_peak:
                p.inactive_split_bytes_peak = b
            b += free_list.other_stats.inactive_split_bytes
            if b > free_list.all_peaks.inactive_split_bytes_peak:
                free_list.all_peaks.inactive_split_bytes_peak = b
        elif kind is _REJOIN_WHOLE:  # the free unsplits the segment, the take splits it again
            split, split_bytes = 1, victim.next.size
        elif kind is _ALONE:  # the free makes it a free split block, the take undoes it
            split, split_bytes = 1, size
            self._split_peaks(p, 1, size)
        if nbytes != victim.requested:
            self._count_requested(victim, nbytes)
        if self._repeat_victim is not None:
            self._end_repeats()
        self._repeat_victim, self._repeats = victim, 1
        self._repeat_increments = (p, split, split_bytes, size, nbytes, size >= self._max_split)
        victim.state = ALLOCATED
        return True

    def _end_repeats(self):
        """Add the increases of the victim's hand-outs since _take_victim to the statistics: each repeat
        adds what the first did (current values and peaks end where they were), so they are added up only
        here, before anything reads or changes the statistics."""
        n = self._repeats
        p, split, split_bytes, size, nbytes, oversize = self._repeat_increments
        p.inactive_split_inc += n * split
        p.inactive_split_bytes_inc += n * split_bytes
        p.allocation_inc += n
        p.allocated_bytes_inc += n * size
        p.requested_bytes_inc += n * nbytes
        if oversize:
            self.stats.oversize_allocations.inc += n
        self._repeat_victim, self._repeats = None, 0

    def _count_requested(self, victim, nbytes):
        """A victim handed out again for another number of bytes than before."""
        free_list = victim.free_list
        p = free_list.stats
        r = p.requested_bytes = p.requested_bytes + nbytes - victim.requested
        if r > p.requested_bytes_peak:
            p.requested_bytes_peak = r
        r += free_list.other_stats.requested_bytes
        if r > free_list.all_peaks.requested_bytes_peak:
            free_list.all_peaks.requested_bytes_peak = r
        victim.requested = nbytes

    def _reuse_kind(self, victim):
        """How torch's free-then-allocate of the victim (same size, same stream) goes: None when it would
        not hand out the victim itself, else what happens to the inactive split blocks (_WHOLE, _ALONE,
        _REJOIN, _REJOIN_WHOLE). It depends only on the victim's free list (its neighbours are cached there
        or not), so the allocator keeps it until that list's version changes."""
        prev, nxt = victim.prev, victim.next
        if prev is not None and prev.state == FREE:
            return None  # merged with its lower neighbour, the allocation would start lower
        free_list, size = victim.free_list, victim.size
        if nxt is None or nxt.state != FREE:  # it stays as it is: taken unless an equal block lies lower
            bin_ = free_list.bins.get(size)
            if bin_ and bin_[-1].ptr < victim.ptr:
                return None
            return _WHOLE if prev is None and nxt is None else _ALONE
        merged = size + nxt.size  # merged with its upper neighbour, then split again at the same place ...
        if not free_list.small and not (merged < self._max_split and nxt.size > SMALL_SIZE):
            return None
        sizes, bins = free_list.sizes, free_list.bins  # ... unless another cached block fits better
        for fit in sizes[bisect_left(sizes, size):]:
            bin_ = bins[fit]
            if bin_ and not (fit == nxt.size and len(bin_) == 1):
                if fit < merged or (fit == merged and bin_[-1].ptr < victim.ptr):
                    return None
                break
        return _REJOIN_WHOLE if prev is None and nxt.next is None else _REJOIN

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
        free_list = self._free_list(size <= SMALL_SIZE, stream)
        block = self._find_cached(free_list, size)
        if block is None:
            block = self._new_block(free_list, size)
        if self._should_split(block, size):
            self._split(block, size)
        elif block.prev is not None or block.next is not None:
            p = free_list.stats
            p.inactive_split -= 1
            p.inactive_split_bytes -= block.size
        self._count_taken(block, nbytes)
        return block

    def _free_list(self, small, stream):
        pools = self._small if small else self._large
        free_list = pools.get(stream)
        if free_list is None:
            stats, other = (self.stats.small, self.stats.large) if small else (self.stats.large, self.stats.small)
            free_list = pools[stream] = FreeList(self, small, stream, stats, other, self.stats.all)
        return free_list

    def _find_cached(self, free_list, size):
        """The best cached fit for `size` on the free list's stream, taken out of the cache, or None."""
        if not free_list.small and self._gc_threshold:
            self._gc_lookups += 1
        bin_ = free_list.best_fit(size)
        if bin_ is None:
            return None
        found = bin_[-1].size
        if size < self._max_split <= found:
            return None  # an oversize block is not split for a smaller request
        if size >= self._max_split and found >= size + OVERSIZE_SLACK:
            return None  # nor used for a request much smaller than itself
        free_list.version += 1
        return bin_.pop()

    def _should_split(self, block, size):
        remaining = block.size - size
        if block.free_list.small:
            return remaining >= MIN_BLOCK
        return size < self._max_split and remaining > SMALL_SIZE

    def _split(self, block, size):
        """Keep the low `size` bytes in `block`, about to be handed out, and cache the rest."""
        rest = Block(block.ptr + size, block.size - size, block.stream, block.free_list)
        p = block.free_list.stats
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

    def _new_block(self, free_list, size):
        """A new segment for `size`, after the out-of-memory retries; raises OutOfMemoryError."""
        alloc_size = segment_size(size)
        if self._limit is not None and self._gc_threshold:
            self._garbage_collect()
        block = self._new_segment(free_list, alloc_size)
        if block is None and self._release_oversize(free_list, size):
            block = self._new_segment(free_list, alloc_size)
        if block is None:
            self._release_cached()
            self.stats.num_alloc_retries += 1
            block = self._new_segment(free_list, alloc_size)
        if block is None:
            self.stats.num_ooms += 1
            raise OutOfMemoryError(self._oom_message(alloc_size))
        return block

    def _new_segment(self, free_list, alloc_size):
        """A fresh segment as one block, or None when the memory fraction or the driver refuses."""
        stats = self.stats
        if self._limit is not None and stats.current("reserved_bytes") + alloc_size > self._limit:
            return None
        try:
            ptr = self.driver.malloc(self.device, alloc_size)
        except OutOfMemoryError:
            return None
        block = Block(ptr, alloc_size, free_list.stream, free_list)
        self._segments[ptr] = block
        p = free_list.stats
        p.segment += 1
        p.reserved_bytes += alloc_size
        p.segment_inc += 1
        p.reserved_bytes_inc += alloc_size
        p.segment_peak = max(p.segment_peak, p.segment)
        p.reserved_bytes_peak = max(p.reserved_bytes_peak, p.reserved_bytes)
        stats.all.segment_peak = max(stats.all.segment_peak, stats.current("segment"))
        stats.all.reserved_bytes_peak = max(stats.all.reserved_bytes_peak, stats.current("reserved_bytes"))
        stats.num_device_alloc += 1
        if alloc_size >= self._max_split:
            stats.oversize_segments.up()
        return block

    def _oom_message(self, alloc_size):
        free, total = self.driver.mem_get_info(self.device)
        allowed = "" if self._limit is None else f"{format_size(self._limit)} allowed; "
        allocated, reserved = self.stats.current("allocated_bytes"), self.stats.current("reserved_bytes")
        return (f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU {self.device} has a total "
                f"capacity of {format_size(total)} of which {format_size(free)} is free. {allowed}Of the "
                f"allocated memory {format_size(allocated)} is allocated by minitensor, and "
                f"{format_size(reserved - allocated)} is reserved by minitensor but unallocated.")

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
            self._record_events(block)
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
        if block.prev is not None or block.next is not None:
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

    # ------------------------------------------------------------------ record_stream events
    def _record_events(self, block):
        """One event per stream that used the freed block, recorded on the allocator's device."""
        driver, device = self.driver, self.device
        previous = driver.current_device()
        if previous != device:
            driver.set_device(device)
        try:
            for stream in sorted(block.stream_uses):
                event = self._spare_events.pop() if self._spare_events else driver.event_create(device, False, False)
                driver.event_record(event, stream)
                block.event_count += 1
                queue = self._events.get(stream)
                if queue is None:
                    queue = self._events[stream] = collections.deque()
                queue.append((event, block))
        finally:
            if previous != device:
                driver.set_device(previous)
        block.stream_uses = None

    def _process_events(self):
        """Cache the pending blocks whose events have all completed; per stream, oldest first, stopping at
        the first event not yet complete."""
        query = self.driver.event_query
        for stream, queue in list(self._events.items()):
            while queue:
                event, block = queue[0]
                if not query(event):
                    break
                queue.popleft()
                self._event_done(event, block)
            if not queue:
                del self._events[stream]

    def _synchronize_events(self):
        """Wait for every pending event and cache their blocks (empty_cache, out-of-memory retry)."""
        self.stats.num_sync_all_streams += 1
        synchronize = self.driver.event_synchronize
        for queue in self._events.values():
            for event, block in queue:
                synchronize(event)
                self._event_done(event, block)
        self._events.clear()

    def _event_done(self, event, block):
        self._spare_events.append(event)
        block.event_count -= 1
        if block.event_count == 0:
            p = block.free_list.stats
            p.pending -= 1
            p.pending_bytes -= block.size
            self._cache(block, p)

    # ------------------------------------------------------------------ giving memory back
    def _release_cached(self):
        """Cache every block whose events are pending, then free every unsplit cached segment."""
        self._synchronize_events()
        for pools in (self._large, self._small):
            for free_list in [pools[stream] for stream in sorted(pools)]:
                for block in free_list.blocks():
                    if block.prev is None and block.next is None:
                        self._release(block)
                free_list.prune()
        for event in self._spare_events:
            self.driver.event_destroy(event)
        self._spare_events.clear()

    def _release_oversize(self, free_list, size):
        """With max_split_size set: free one cached unsplit block covering the request, or else the
        largest oversize ones until they add up to it. True when that freed enough."""
        if self._max_split == _UNLIMITED:
            return False
        want = max(size, self._max_split)
        bin_ = free_list.best_fit(want)
        if bin_ is not None and bin_[-1].prev is None and bin_[-1].next is None:
            self._release(bin_[-1])
            return True
        released = 0
        for block in free_list.largest_first():
            if released >= want or block.size < self._max_split:
                break
            if block.prev is None and block.next is None:
                released += block.size
                self._release(block)
        return released >= want

    def _garbage_collect(self):
        """Free unsplit large cached blocks, oldest (in large-pool lookups) first, until the segments are
        back under garbage_collection_threshold of the memory fraction."""
        target = self.stats.current("reserved_bytes") - int(self._gc_threshold * self._limit)
        if target <= 0:
            return
        candidates = [b for fl in self._large.values() for b in fl.blocks() if b.prev is None and b.next is None]
        reclaimed = 0
        while candidates and reclaimed < target:
            average = sum(self._gc_lookups - b.gc_base for b in candidates) / len(candidates)
            keep = []
            for block in candidates:
                if self._gc_lookups - block.gc_base >= average:
                    reclaimed += block.size
                    self._release(block)
                else:
                    keep.append(block)
            candidates = keep

    def _release(self, block):
        """Give a cached whole segment back to the driver."""
        stats = self.stats
        block.free_list.remove(block)
        self.driver.free(self.device, block.ptr)
        del self._segments[block.ptr]
        p = block.free_list.stats
        p.segment -= 1
        p.reserved_bytes -= block.size
        stats.num_device_free += 1
        if block.size >= self._max_split:
            stats.oversize_segments.down()
