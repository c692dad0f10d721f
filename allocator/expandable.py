"""Expandable segments (torch's Note [Expandable Segments]): with `expandable_segments:True` a request no cached
block fits grows one segment per free list (stream x small/large pool x private pool) in virtual memory instead of
asking the driver for another segment. Allocations whose sizes change from step to step then tile one address
range, where separate segments would leave slivers at their ends that no larger request can use.

A segment reserves addresses for 9/8 of the device's memory once (driver.vmm_reserve) and maps physical pages into
them on demand: 2 MiB pages for the small pool and 20 MiB for the large one (whole multiples of the driver's
granularity), since mapping and unmapping cost in proportion to the pages they touch. Its blocks tile the whole
range: UNMAPPED blocks (whole pages, never in a free list) and mapped ones, which split and merge as in any
segment. A request maps the lowest run of free and unmapped blocks that holds it (`_expand`); empty_cache, the
out-of-memory retry and the garbage-collection threshold unmap the whole pages inside free blocks (`_unmap`),
and a segment with nothing mapped gives its addresses back.

Statistics are torch's: reserved_bytes follows the mapped pages, num_device_alloc and num_device_free count maps
and unmaps, the segment count leaves expandable segments out, and so do the inactive split blocks (a free block
of an expandable segment costs no more than its pages). Pages are unmapped only from FREE blocks: a block another
stream still uses (record_stream) is PENDING until its events complete, and the driver waits for the device's
work before it unmaps.
"""
from minitensor.base.errors import OutOfMemoryError

from .block import FREE, UNMAPPED, Block
from .history import SEGMENT_MAP, SEGMENT_UNMAP
from .sizes import LARGE_SEGMENT, SMALL_SEGMENT


class ExpandableSegment:
    """The reserved range [ptr, ptr + size) of one free list; `first`, the block at ptr (the lowest block object
    of a segment lives as long as the segment: a merge keeps the lower one)."""

    __slots__ = ("ptr", "size", "page", "first")

    def __init__(self, ptr, size, page):
        self.ptr, self.size, self.page = ptr, size, page
        self.first = None

    def blocks(self):
        block = self.first
        while block is not None:
            yield block
            block = block.next

    def unmapped(self):
        """Nothing of it is mapped."""
        return self.first.state == UNMAPPED and self.first.next is None


def _room(segment, size):
    """The lowest run of consecutive free and unmapped blocks that holds `size` bytes, starting at an unmapped
    block or at the free block just below one (torch's find_expandable_block), or None."""
    for block in segment.blocks():
        if block.state != UNMAPPED:
            continue
        start = block.prev if block.prev is not None and block.prev.state == FREE else block
        run, total = [], 0
        while start is not None and total < size and (start.state == FREE or start.state == UNMAPPED):
            run.append(start)
            total += start.size
            start = start.next
        if total >= size:
            return run
    return None


def _expandable_size(block):
    """What a cached block can grow to: itself and the unmapped pages right above it."""
    nxt = block.next
    return block.size + nxt.size if nxt is not None and nxt.state == UNMAPPED else block.size


def _link_after(block, new):
    new.prev, new.next = block, block.next
    if block.next is not None:
        block.next.prev = new
    block.next = new


def _fold_next(block):
    """Merge block.next into block (the lower block object stays)."""
    gone = block.next
    block.size += gone.size
    block.next = gone.next
    if gone.next is not None:
        gone.next.prev = block


class ExpandableSegments:
    """DeviceCachingAllocator's expandable segments (a mixin: they share its lock, free lists and statistics).
    A free list's segment is `free_list.expandable`, made on its first growth."""

    def _expandable_fit(self, free_list, size):
        """The cached block for `size` when the best fit is in an expandable segment (torch's get_free_block): from
        the best fit on, the next block in best-fit order while it can grow to less than the current one (a block
        below unmapped pages counts them: it is where growth goes, so a fit elsewhere is kept first); with
        expandable segments off, the first fit outside them (no new allocation goes into one). None if none."""
        fits = free_list.fits(size)
        block = next(fits)
        if not self._expandable_on:
            return next((b for b in fits if b.expandable is None), None)
        for following in fits:
            if block.expandable is None or _expandable_size(following) >= _expandable_size(block):
                break
            block = following
        return block

    def _takes_exact(self, free_list, bin_):
        """Whether the lowest block of an exact-size bin is _expandable_fit's choice: expandable segments are on,
        and no unmapped pages lie above it or no other block fits."""
        block = bin_[-1]
        return self._expandable_on and (block.next is None or block.next.state != UNMAPPED or (
            len(bin_) == 1 and free_list.sizes[-1] == block.size))

    def _expand(self, free_list, size):
        """A FREE block of at least `size` bytes, taken out of the free list, made by mapping pages at the lowest
        room of the free list's segment; None when the device or the memory fraction has no room for them (the
        pages mapped so far stay cached)."""
        segment = free_list.expandable or self._reserve(free_list)
        run = _room(segment, size)
        if run is None:  # 9/8 of the device's memory, all of it in use or mapped
            return None
        end = run[0].ptr + size
        for block in run:
            if block.state == UNMAPPED:
                pages = -(-(min(end, block.ptr + block.size) - block.ptr) // segment.page) * segment.page
                if not self._map(block, min(pages, block.size)):
                    return None
        start = run[0]
        start.free_list.remove(start)
        return start

    def _reserve(self, free_list):
        """The free list's expandable segment, new: addresses for 9/8 of the device's memory, nothing mapped."""
        total = self.driver.mem_get_info(self.device)[1]
        granularity = self.driver.vmm_granularity(self.device)
        page = -(-(SMALL_SEGMENT if free_list.small else LARGE_SEGMENT) // granularity) * granularity
        size = -(-(total + total // 8) // page) * page
        segment = ExpandableSegment(self.driver.vmm_reserve(self.device, size), size, page)
        segment.first = Block(segment.ptr, size, free_list.stream, free_list)
        segment.first.state = UNMAPPED
        segment.first.expandable = segment
        free_list.expandable = segment
        if free_list.pool is not None:
            free_list.pool.segments += 1
        return segment

    def _map(self, block, nbytes):
        """Map the low `nbytes` of an unmapped block and cache them, merged with free neighbours; False when the
        memory fraction or the device has no room."""
        if self._limit is not None and self.stats.current("reserved_bytes") + nbytes > self._limit:
            return False
        try:
            self.driver.vmm_map(self.device, block.ptr, nbytes, block.expandable.page)
        except OutOfMemoryError:
            return False
        if nbytes < block.size:
            rest = Block(block.ptr + nbytes, block.size - nbytes, block.stream, block.free_list)
            rest.state = UNMAPPED
            rest.expandable = block.expandable
            _link_after(block, rest)
            block.size = nbytes
        free_list = block.free_list
        self._count_reserved(free_list.stats, nbytes)
        if self._history is not None:
            self._history.event(SEGMENT_MAP, block.ptr, nbytes, block.stream, free_list.pool_id)
        if block.prev is not None and block.prev.state == FREE:
            free_list.remove(block.prev)
            block = block.prev
            _fold_next(block)
        if block.next is not None and block.next.state == FREE:
            free_list.remove(block.next)
            _fold_next(block)
        self._cache_block(block)
        return True

    def _unmap(self, block):
        """Unmap the whole pages inside a cached block of an expandable segment: the bytes unmapped."""
        segment, free_list = block.expandable, block.free_list
        page, base = segment.page, segment.ptr
        start = base + -(-(block.ptr - base) // page) * page
        end = base + (block.ptr + block.size - base) // page * page
        if end <= start:
            return 0
        self.driver.vmm_unmap(self.device, start, end - start)
        free_list.remove(block)
        if block.ptr + block.size > end:  # the free tail above the pages
            tail = Block(end, block.ptr + block.size - end, block.stream, free_list)
            tail.expandable = segment
            _link_after(block, tail)
            block.size -= tail.size
            self._cache_block(tail)
        if block.ptr < start:  # the free head below them
            middle = Block(start, end - start, block.stream, free_list)
            middle.expandable = segment
            _link_after(block, middle)
            block.size = start - block.ptr
            self._cache_block(block)
            block = middle
        block.state = UNMAPPED
        if block.next is not None and block.next.state == UNMAPPED:
            _fold_next(block)
        if block.prev is not None and block.prev.state == UNMAPPED:
            _fold_next(block.prev)
        p = free_list.stats
        p.reserved_bytes -= end - start
        self.stats.num_device_free += 1
        if self._history is not None:
            self._history.event(SEGMENT_UNMAP, start, end - start, block.stream, free_list.pool_id)
        return end - start

    def _unmap_cached(self, free_list):
        """Unmap every whole free page of the free list's segment; give its addresses back once none is mapped."""
        segment = free_list.expandable
        for block in free_list.blocks():
            if block.expandable is not None:
                self._unmap(block)
        if segment.unmapped():
            self.driver.vmm_release(self.device, segment.ptr, segment.size)
            free_list.expandable = None
            if free_list.pool is not None:
                free_list.pool.segments -= 1

    def _expandable_segments(self):
        """Every expandable segment of every free list."""
        return [fl.expandable for pools in (self._small, self._large) for fl in pools.values()
                if fl.expandable is not None]
