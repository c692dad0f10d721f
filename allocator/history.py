"""Memory history: what an allocator did and the Python stacks that asked, as torch's _record_memory_history
keeps it (c10/cuda/CUDACachingAllocator.cpp `record_trace`, torch/cuda/memory.py).

`enabled="all"` keeps a trace of actions (a ring of `max_entries`, oldest dropped); "state" keeps only the stack
of each live allocation, for the snapshot's blocks. `context` says which stacks are taken: None none, "state"
those of live allocations, "alloc" also the trace's allocations, "all" its frees too. An entry is a tuple until
a snapshot turns it into torch's dict, so recording costs one stack walk and one append.
"""
import array
import collections
import glob
import os
import sys
import time

from minitensor.base import cext

ALLOC, FREE_REQUESTED, FREE_COMPLETED = "alloc", "free_requested", "free_completed"
SEGMENT_ALLOC, SEGMENT_FREE, OOM, SNAPSHOT = "segment_alloc", "segment_free", "oom", "snapshot"
ENABLED = ("all", "state", None)
CONTEXTS = ("all", "alloc", "state", None)
STACKS = ("python", "all")
_NO_FRAMES = ()
_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN = frozenset(glob.glob(os.path.join(_HERE, "*.py")))  # the allocator's modules: not part of a stack
_walker = None  # _stack.c's module, built or loaded when a history is first made


def _stack():
    """The calling Python frames, innermost first, without the allocator's own: (codes, positions), a tuple of
    code objects and their int32 positions packed in bytes, each the byte offset of the frame's last
    instruction or its line negated (frame_dicts reads both)."""
    return _walker.stack(_OWN)


def _python_stack():
    """_stack in Python, where no C compiler builds _stack.c (several times slower)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _OWN:
        frame = frame.f_back
    codes, lines = [], array.array("i")
    while frame is not None:
        codes.append(frame.f_code)
        lines.append(-frame.f_lineno)
        frame = frame.f_back
    return tuple(codes), lines.tobytes()


def _load_walker():
    """The C walker, or _python_stack's stand-in without a C compiler."""
    global _walker, _stack
    if _walker is None:
        try:
            _walker = cext.load(os.path.join(_HERE, "_stack.c"), "_minitensor_stack")
        except RuntimeError:
            _walker, _stack = False, _python_stack


class History:
    """One allocator's history. `trace` (None with enabled="state"): entries (action, address, size, stream,
    time in ns, stack, pool id, free device bytes for an oom); `live`: address -> stack of each allocated
    block, while stacks of live allocations are kept."""

    __slots__ = ("trace", "live", "alloc_stacks", "free_stacks")

    def __init__(self, enabled="all", context="all", max_entries=sys.maxsize):
        if enabled not in ENABLED[:2]:
            raise ValueError(f"enabled must be one of {ENABLED}, got {enabled!r}")
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.trace = collections.deque(maxlen=max_entries) if enabled == "all" else None
        self.live = {} if context is not None else None
        self.alloc_stacks = enabled == "all" and context in ("alloc", "all")
        self.free_stacks = enabled == "all" and context == "all"
        if self.live is not None:
            _load_walker()

    def alloc(self, block, pool_id):
        stack = _stack() if self.live is not None else _NO_FRAMES
        if self.live is not None:
            self.live[block.ptr] = stack
        if self.trace is not None:
            self.trace.append((ALLOC, block.ptr, block.size, block.stream, time.time_ns(),
                               stack if self.alloc_stacks else _NO_FRAMES, pool_id, None))

    def free(self, block, pool_id, completed):
        """The owner frees the block; `completed`: it is reusable at once (no other stream used it)."""
        if self.live is not None:
            self.live.pop(block.ptr, None)
        if self.trace is not None:
            now = time.time_ns()
            self.trace.append((FREE_REQUESTED, block.ptr, block.size, block.stream, now,
                               _stack() if self.free_stacks else _NO_FRAMES, pool_id, None))
            if completed:
                self.trace.append((FREE_COMPLETED, block.ptr, block.size, block.stream, now, _NO_FRAMES, pool_id,
                                   None))

    def event(self, action, ptr, size, stream, pool_id, device_free=None):
        """An entry without a stack: free_completed, segment_alloc, segment_free, oom, snapshot."""
        if self.trace is not None:
            self.trace.append((action, ptr, size, stream, time.time_ns(), _NO_FRAMES, pool_id, device_free))

    def frames(self, ptr, memo):
        """The frames of the live allocation at `ptr`, as the snapshot's list of dicts (see frame_dicts)."""
        stack = self.live.get(ptr) if self.live is not None else None
        return frame_dicts(stack, memo) if stack else []

    def entries(self, memo):
        """The trace as torch's list of dicts, oldest first (`memo`: see frame_dicts)."""
        if self.trace is None:
            return []
        out = []
        for action, ptr, size, stream, time_ns, stack, pool_id, device_free in list(self.trace):
            entry = {"action": action, "addr": ptr, "size": size, "stream": stream, "time_us": time_ns // 1000,
                     "frames": frame_dicts(stack, memo) if stack else []}
            if pool_id is not None:
                entry["pool_id"] = pool_id
            if device_free is not None:
                entry["device_free"] = device_free
            out.append(entry)
        return out


_frame_dicts = {}  # (id(code), position) -> (code, its frame dict): one dict per distinct frame


def frame_dicts(stack, memo):
    """A stack (see _stack) as torch's list of frames {"filename", "line", "name"}. `memo`, a dict kept for one
    snapshot, maps id(stack) to its list, so a block and its "alloc" entry share one list (pickled once). Keys are
    ids because hashing a code object walks its constants: a snapshot of 10,000 blocks would spend its time so."""
    frames = memo.get(id(stack))
    if frames is None:
        codes, positions = stack
        frames = memo[id(stack)] = [_frame(code, position)
                                    for code, position in zip(codes, memoryview(positions).cast("i"))]
    return frames


def _frame(code, position):
    key = (id(code), position)
    found = _frame_dicts.get(key)
    if found is None:  # the code object is kept with its dict, so its id is never another's
        found = _frame_dicts[key] = (code, {"filename": code.co_filename, "line": _line(code, position),
                                            "name": code.co_name})
    return found[1]


def _line(code, position):
    if position < 0:
        return -position
    for start, end, line in code.co_lines():
        if start <= position < end:
            return line if line is not None else code.co_firstlineno
    return code.co_firstlineno
