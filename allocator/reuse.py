"""The queued frees and the victim shortcut: torch's results for an op's free-then-allocate without its merge
and search, since allocating and freeing is the hot path of every op.

A freed block goes on a queue, unmerged and uncounted, without taking the lock; the next call under the lock
completes the queued frees as torch does, in order (`_settle`), except in the common case of one queued block
(the "victim") and an allocation of its size on its stream that torch's policy would serve with this very
block (`_reuse_kind`): it is handed out again with the net statistics of the free and the allocation
(`_take_victim`). When the next call frees and asks for the same block again with nothing in between (every
op's loop), it repeats that step exactly, so only a count of the repeats is kept until something reads or
changes the statistics (`_end_repeats`).
"""
from bisect import bisect_left

from .block import ALLOCATED, FREE, UNMAPPED
from .sizes import SMALL_SIZE

# How freeing the victim and taking it again moves the inactive split blocks (see _reuse_kind).
_WHOLE, _ALONE, _REJOIN, _REJOIN_WHOLE = "whole", "alone", "rejoin", "rejoin whole"


class QueuedFrees:
    """DeviceCachingAllocator's queued frees and victim shortcut. Its alloc and free run the hot steps inline,
    where a call would cost as much as the step; the rest is here, under the lock.

    State, set by the allocator: `_freed`, the QUEUED blocks in the order they were freed; `_repeat_victim`,
    the block `_take_victim` last handed out, while no other call under the lock happened since, `_repeats`
    its hand-outs whose statistics are not yet added and `_repeat_increments` what each adds. Completing a
    free is the allocator's `_free`.
    Invariant: once `_settle` returns, the blocks and statistics are exactly what torch's policy gives, so
    every call that reads or changes them, but alloc's shortcuts, settles first.
    """

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
        or not), so the allocator keeps it until that list's version changes (configure changes every list's).
        A free that saw plain settings may queue its block just after another thread's configure changed them:
        under other settings no queued block is a victim."""
        if not self._plain or victim.free_list.pool is not None:
            return None  # a block of a private pool goes back to its pool
        prev, nxt = victim.prev, victim.next
        if prev is not None and prev.state == FREE:
            return None  # merged with its lower neighbour, the allocation would start lower
        free_list, size = victim.free_list, victim.size
        expandable = victim.expandable is not None  # no inactive split blocks to count: always _WHOLE
        growth_room = False  # unmapped pages above the block the free makes: any other fit is taken first
        if expandable:
            if not self._expandable_on:
                return None  # no new allocation goes into an expandable segment (expandable.py, _expandable_fit)
            above = nxt.next if nxt is not None and nxt.state == FREE else nxt
            growth_room = above is not None and above.state == UNMAPPED
        if nxt is None or nxt.state != FREE:  # it stays as it is: taken unless an equal block lies lower
            bin_ = free_list.bins.get(size)
            if bin_ and bin_[-1].ptr < victim.ptr or growth_room and next(free_list.fits(size), None) is not None:
                return None
            return _WHOLE if expandable or (prev is None and nxt is None) else _ALONE
        merged = size + nxt.size  # merged with its upper neighbour, then split again at the same place ...
        if not (free_list.small or expandable or (merged < self._max_split and nxt.size > SMALL_SIZE)):
            return None
        sizes, bins = free_list.sizes, free_list.bins  # ... unless another cached block fits better
        for fit in sizes[bisect_left(sizes, size):]:
            bin_ = bins[fit]
            if bin_ and not (fit == nxt.size and len(bin_) == 1):
                if growth_room or fit < merged or (fit == merged and bin_[-1].ptr < victim.ptr):
                    return None
                break
        if expandable:
            return _WHOLE
        return _REJOIN_WHOLE if prev is None and nxt.next is None else _REJOIN
