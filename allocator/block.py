"""Blocks, the pieces of driver segments the allocator hands out, and the free lists that cache them."""
from bisect import bisect_left, insort

# Block.state
FREE = 0  # cached in its free list, reusable by its stream
ALLOCATED = 1  # handed out
PENDING = 2  # freed by its owner, but other streams (record_stream) may still use it: waits on events
NULL = 3  # the zero-byte block: freeing it does nothing
QUEUED = 4  # freed by its owner, the free not yet completed by the allocator
UNMAPPED = 5  # addresses of an expandable segment with no memory mapped (expandable.py): never in a free list


class Block:
    """`size` bytes at `ptr`, part of one segment (a driver allocation), reusable only by `stream`.

    Blocks of a segment form a doubly linked list by address (`prev`/`next`, None at the segment's ends).
    A split keeps the block object on the low part and makes a new one for the rest, and a merge folds a
    block into its lower neighbour, so a segment's first block object lives as long as the segment.
    """

    __slots__ = ("ptr", "size", "requested", "stream", "free_list", "prev", "next", "state", "stream_uses",
                 "events", "event_count", "gc_base", "reuse_version", "reuse_kind", "expandable")

    def __init__(self, ptr, size, stream, free_list):
        self.ptr = ptr
        self.size = size
        self.requested = 0  # bytes asked for, before rounding
        self.stream = stream  # handle of the stream it was allocated on
        self.free_list = free_list  # its segment's (stream, pool) cache; None for the null block
        self.prev = None
        self.next = None
        self.state = FREE
        # other streams that used it (record_stream): a set of (allocator's device, stream handle) once there is one
        self.stream_uses = None
        self.events = None  # their events, from recording at free to queueing (stream_events.py)
        self.event_count = 0  # events still to complete before a PENDING block is free
        self.gc_base = 0  # the pool's lookup count when it was cached (garbage_collection_threshold)
        self.reuse_version = -1  # free_list.version when reuse_kind was worked out (see the allocator)
        self.reuse_kind = None
        self.expandable = None  # the expandable segment it is part of (expandable.py), or None

    def __repr__(self):
        state = ("free", "allocated", "pending", "null", "queued", "unmapped")[self.state]
        return f"Block(ptr={self.ptr:#x}, size={self.size}, stream={self.stream:#x}, {state})"


def _descending_ptr(block):
    return -block.ptr


class FreeList:
    """The cached free blocks of one (stream, pool), best fit first: smallest size, then lowest address.

    `bins` maps a size to its blocks (highest address first, so the lowest pops off the end) and `sizes`
    keeps the sizes in order for bisect. A bin that empties stays (a size freed once is usually freed again:
    the exact-size reuse is the hot path); `best_fit` drops empty bins it steps over. `version` counts the
    changes to the cached blocks (whoever pops a bin counts it too).
    """

    __slots__ = ("owner", "small", "stream", "pool", "pool_id", "stats", "other_stats", "all_peaks", "sizes", "bins",
                 "version", "expandable")

    def __init__(self, owner, small, stream, stats, other_stats, all_peaks, pool=None):
        self.owner = owner  # the allocator
        self.small = small  # the small pool (requests up to 1 MiB) or the large one
        self.stream = stream
        self.pool = pool  # the private pool (allocator/private_pools.py) it belongs to, None: the general cache
        self.pool_id = None if pool is None else pool.id  # as memory-history entries name the pool
        # the statistics it moves: its pool's, the other pool's, and the all-pools peaks (see stats.py)
        self.stats, self.other_stats, self.all_peaks = stats, other_stats, all_peaks
        self.sizes = []
        self.bins = {}
        self.version = 0
        self.expandable = None  # its expandable segment (expandable.py), once it grew one

    def add(self, block):
        self.version += 1
        size = block.size
        bin_ = self.bins.get(size)
        if bin_ is None:
            self.bins[size] = [block]
            insort(self.sizes, size)
        elif not bin_ or bin_[-1].ptr > block.ptr:
            bin_.append(block)
        else:
            insort(bin_, block, key=_descending_ptr)

    def remove(self, block):
        self.version += 1
        self.bins[block.size].remove(block)

    def best_fit(self, size):
        """The bin holding the smallest cached blocks of at least `size` bytes, or None."""
        sizes, bins = self.sizes, self.bins
        i = bisect_left(sizes, size)
        while i < len(sizes):
            bin_ = bins[sizes[i]]
            if bin_:
                return bin_
            del bins[sizes[i]], sizes[i]
        return None

    def fits(self, size):
        """The cached blocks of at least `size` bytes, best fit first (smallest, then lowest address)."""
        sizes, bins = self.sizes, self.bins
        for fit in sizes[bisect_left(sizes, size):]:
            yield from reversed(bins[fit])

    def prune(self):
        """Drop the empty bins."""
        self.sizes = [s for s in self.sizes if self.bins[s]]
        self.bins = {s: self.bins[s] for s in self.sizes}

    def blocks(self):
        return [b for s in self.sizes for b in reversed(self.bins[s])]

    def largest_first(self):
        return [b for s in reversed(self.sizes) for b in self.bins[s]]
