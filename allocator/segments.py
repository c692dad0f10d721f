"""Segments from the driver and back: a new one for a request no cached block fits, after torch's out-of-memory
ladder, and cached ones given back (empty_cache, the ladder, garbage collection).

Out of memory, in order: free old cached blocks (garbage_collection_threshold with a memory fraction), new
segment, release cached blocks of max_split_size that cover the request and retry, release every unsplit
cached block and retry (num_alloc_retries), then OutOfMemoryError (num_ooms). With expandable segments the new
segment is new pages of the free list's expandable segment, and releasing unmaps free pages (expandable.py).
"""
from minitensor.base.errors import OutOfMemoryError

from .block import Block
from .history import OOM, SEGMENT_ALLOC, SEGMENT_FREE
from .sizes import format_size, segment_size


class Segments:
    """DeviceCachingAllocator's traffic with the driver's malloc and free (lock held).

    State, set by the allocator: `_segments`, address -> first block of each segment the driver gave and has
    not taken back; `_limit`, the bytes they may total (None: the whole device); `_gc_lookups`, the clock of
    garbage_collection_threshold.
    Invariant: only a whole cached segment (a free block without neighbours) goes back, and the segment and
    reserved statistics move with every segment that comes or goes.
    """

    def _new_block(self, free_list, size):
        """A new segment for `size` (or new pages of an expandable one), after the out-of-memory retries; raises
        OutOfMemoryError."""
        if self._expandable_on:
            grow, alloc_size = self._expand, size
        else:
            grow, alloc_size = self._new_segment, segment_size(size)
        capturing = self._capturing  # freeing segments is illegal while a stream captures
        if self._limit is not None and self._gc_threshold and not capturing:
            self._garbage_collect()
        block = grow(free_list, alloc_size)
        if block is None and not capturing and self._release_oversize(free_list, size):
            block = grow(free_list, alloc_size)
        if block is None and not capturing:
            self._release_cached()
            self.stats.num_alloc_retries += 1
            block = grow(free_list, alloc_size)
        if block is None:
            self.stats.num_ooms += 1
            message = self._oom_message(alloc_size)  # before the observer, which may take a while
            self._observe_oom(alloc_size, free_list.stream)
            raise OutOfMemoryError(message)
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
        if free_list.pool is not None:
            free_list.pool.segments += 1
        p = free_list.stats
        p.segment += 1
        p.segment_inc += 1
        p.segment_peak = max(p.segment_peak, p.segment)
        stats.all.segment_peak = max(stats.all.segment_peak, stats.current("segment"))
        self._count_reserved(p, alloc_size)
        if alloc_size >= self._max_split:
            stats.oversize_segments.up()
        if self._history is not None:
            self._history.event(SEGMENT_ALLOC, ptr, alloc_size, free_list.stream, free_list.pool_id)
        return block

    def _count_reserved(self, p, nbytes):
        """Statistics of `nbytes` more from the driver (a segment, or pages mapped) for pool statistics `p`."""
        stats = self.stats
        p.reserved_bytes += nbytes
        p.reserved_bytes_inc += nbytes
        p.reserved_bytes_peak = max(p.reserved_bytes_peak, p.reserved_bytes)
        stats.all.reserved_bytes_peak = max(stats.all.reserved_bytes_peak, stats.current("reserved_bytes"))
        stats.num_device_alloc += 1

    def _observe_oom(self, alloc_size, stream):
        """Before an OutOfMemoryError: the history's "oom" entry, then the observer (the snapshot at the OOM)."""
        if self._history is not None:
            self._history.event(OOM, 0, alloc_size, stream, None, self.driver.mem_get_info(self.device)[0])
        if self.oom_observer is not None:
            memo = {}
            self.oom_observer(self._segment_dicts(memo), self._history.entries(memo) if self._history else [])

    def _oom_message(self, alloc_size):
        free, total = self.driver.mem_get_info(self.device)
        allowed = "" if self._limit is None else f"{format_size(self._limit)} allowed; "
        allocated, reserved = self.stats.current("allocated_bytes"), self.stats.current("reserved_bytes")
        private = self.private_bytes()
        private = f" with {format_size(private)} allocated in private pools (e.g., CUDA Graphs)," if private else ""
        hint = "" if self.settings.expandable_segments else (
            " If reserved but unallocated memory is large try setting MINITENSOR_ALLOC_CONF=expandable_segments:True "
            "to avoid fragmentation.")
        return (f"CUDA out of memory. Tried to allocate {format_size(alloc_size)}. GPU {self.device} has a total "
                f"capacity of {format_size(total)} of which {format_size(free)} is free. {allowed}Of the "
                f"allocated memory {format_size(allocated)} is allocated by minitensor,{private} and "
                f"{format_size(reserved - allocated)} is reserved by minitensor but unallocated.{hint}")

    def _release_cached(self):
        """Wait for every pending block's events and cache it, then free every unsplit cached segment of the
        general cache and of the private pools no graph uses any more."""
        self.stats.num_sync_all_streams += 1
        self._events.synchronize()
        for pools in (self._large, self._small):
            for key in sorted(pools, key=_general_first):
                free_list = pools[key]
                if free_list.pool is not None and free_list.pool.use_count:
                    continue
                for block in free_list.blocks():
                    if block.prev is None and block.next is None and block.expandable is None:
                        self._release(block)
                if free_list.expandable is not None:
                    self._unmap_cached(free_list)
                free_list.prune()
        self._events.destroy_spares()
        self._drop_unused_pools()

    def _release_oversize(self, free_list, size):
        """With max_split_size set: free one cached unsplit block covering the request, or else the
        largest oversize ones until they add up to it. True when that freed enough."""
        if not self.settings.max_split_size:
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
        candidates = [b for fl in self._large.values() if fl.pool is None for b in fl.blocks()
                      if (b.prev is None and b.next is None) or b.expandable is not None]
        reclaimed = 0
        while candidates and reclaimed < target:
            average = sum(self._gc_lookups - b.gc_base for b in candidates) / len(candidates)
            keep = []
            for block in candidates:
                if self._gc_lookups - block.gc_base >= average:
                    reclaimed += self._give_back(block)
                else:
                    keep.append(block)
            candidates = keep

    def _give_back(self, block):
        """A cached block's memory back to the driver: its whole segment, or the whole pages inside a block of an
        expandable segment. The bytes given back."""
        if block.expandable is not None:
            return self._unmap(block)
        self._release(block)
        return block.size

    def _release(self, block):
        """Give a cached whole segment back to the driver."""
        stats = self.stats
        block.free_list.remove(block)
        self.driver.free(self.device, block.ptr)
        if self._history is not None:
            self._history.event(SEGMENT_FREE, block.ptr, block.size, block.stream, block.free_list.pool_id)
        del self._segments[block.ptr]
        if block.free_list.pool is not None:
            block.free_list.pool.segments -= 1
        p = block.free_list.stats
        p.segment -= 1
        p.reserved_bytes -= block.size
        stats.num_device_free += 1
        if block.size >= self._max_split:
            stats.oversize_segments.down()


def _general_first(key):
    """Free-list keys in order: the general cache's (stream handles), then the private pools' ((pool id, stream))."""
    return (0, key, ()) if isinstance(key, int) else (1, key[1], key[0])
