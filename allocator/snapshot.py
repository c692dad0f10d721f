"""`memory_snapshot()`'s format: torch's list of segment dicts, each with its blocks in address order.

The allocator settles its queued frees and walks the segments under its lock, but frees take no lock: a block
another thread frees during the walk is QUEUED, and is shown as what it was when the lock was taken, allocated.
So a snapshot is the allocator at one instant, and agrees with memory_stats() read at that instant.
"""
from .block import ALLOCATED, FREE, PENDING, QUEUED

_STATES = {ALLOCATED: "active_allocated", QUEUED: "active_allocated", PENDING: "active_pending_free",
           FREE: "inactive"}


def segment_dict(device, first):
    """The dict of the segment whose first block is `first` (walked through `next`)."""
    blocks = []
    total = allocated = active = requested = 0
    block = first
    while block is not None:
        blocks.append({"address": block.ptr, "size": block.size, "requested_size": block.requested,
                       "state": _STATES[block.state], "frames": []})
        total += block.size
        if block.state == ALLOCATED or block.state == QUEUED:
            allocated += block.size
        if block.state != FREE:
            active += block.size
            requested += block.requested
        block = block.next
    return {"device": device, "address": first.ptr, "total_size": total, "allocated_size": allocated,
            "active_size": active, "requested_size": requested, "stream": first.stream,
            "segment_type": "small" if first.free_list.small else "large",
            "segment_pool_id": (0, 0) if first.free_list.pool is None else first.free_list.pool.id,
            "is_expandable": False, "frames": [], "blocks": blocks}
