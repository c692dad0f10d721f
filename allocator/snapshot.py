"""`memory_snapshot()`'s format: torch's list of segment dicts, each with its blocks in address order, and the
allocator's snapshots (`Snapshots`), with the memory history's frames and trace when one is recorded.

The allocator settles its queued frees and walks the segments under its lock, but frees take no lock: a block
another thread frees during the walk is QUEUED, and is shown as what it was when the lock was taken, allocated.
So a snapshot is the allocator at one instant, and agrees with memory_stats() read at that instant.
"""
from .block import ALLOCATED, FREE, PENDING, QUEUED, UNMAPPED
from .history import SNAPSHOT

_STATES = {ALLOCATED: "active_allocated", QUEUED: "active_allocated", PENDING: "active_pending_free",
           FREE: "inactive"}


def segment_dict(device, first, frames=None):
    """The dict of the segment whose first block is `first` (walked through `next`; in an expandable segment, one
    run of mapped blocks, as torch shows them); `frames(ptr)`, when given, is the stack of the allocation at ptr
    (history.py)."""
    blocks = []
    total = allocated = active = requested = 0
    block = first
    while block is not None and block.state != UNMAPPED:
        live = block.state == ALLOCATED or block.state == QUEUED
        blocks.append({"address": block.ptr, "size": block.size, "requested_size": block.requested,
                       "state": _STATES[block.state], "frames": frames(block.ptr) if frames and live else []})
        total += block.size
        if live:
            allocated += block.size
        if block.state != FREE:
            active += block.size
            requested += block.requested
        block = block.next
    return {"device": device, "address": first.ptr, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": first.stream,
            "segment_type": "small" if first.free_list.small else "large",
            "segment_pool_id": (0, 0) if first.free_list.pool is None else first.free_list.pool.id,
            "is_expandable": first.expandable is not None, "frames": [], "blocks": blocks}


class Snapshots:
    """DeviceCachingAllocator's snapshots and the memory history it records (a mixin: they read its segments
    under its lock). State, set by the allocator: `_history`, the history.History being recorded, or None."""

    def snapshot(self):
        """Every segment, by address, as torch's memory_snapshot() describes it (see snapshot.py)."""
        with self._lock:
            self._settle()
            return self._segment_dicts()

    def history_snapshot(self):
        """(segments, trace entries) at one instant, the trace ending with a "snapshot" entry (torch's)."""
        with self._lock:
            self._settle()
            if self._history is None:
                return self._segment_dicts(), []
            self._history.event(SNAPSHOT, 0, 0, 0, None)
            memo = {}  # a stack's frames, shared by its block and its entries (history.frame_dicts)
            return self._segment_dicts(memo), self._history.entries(memo)

    def record_history(self, history):
        """Start recording into a history.History, or stop with None."""
        with self._lock:
            self._settle()
            self._history = history

    def _segment_dicts(self, memo=None):
        history = self._history
        frames = None if history is None else (lambda ptr: history.frames(ptr, {} if memo is None else memo))
        firsts = [*self._segments.values(), *(block for segment in self._expandable_segments()
                                               for block in segment.blocks() if block.state != UNMAPPED
                                               and (block.prev is None or block.prev.state == UNMAPPED))]
        return [segment_dict(self.device, first, frames) for first in sorted(firsts, key=_address)]


def _address(block):
    return block.ptr
