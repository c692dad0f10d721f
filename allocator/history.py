"""Memory history: what an allocator did and the Python stacks that asked, as torch's _record_memory_history
keeps it (c10/cuda/CUDACachingAllocator.cpp `record_trace`, torch/cuda/memory.py).

`enabled="all"` keeps a trace of actions (a ring of `max_entries`, oldest dropped); "state" keeps only the stack
of each live allocation, for the snapshot's blocks. `context` says which stacks are taken: None none, "state"
those of live allocations, "alloc" also the trace's allocations, "all" its frees too.

Recording is on the allocator's hot path, so it keeps what it must and builds nothing else: an entry is FIELDS
slots appended to one flat list (a kept tuple per entry cost more than the rest of the entry), a stack is
interned, and a snapshot turns both into torch's dicts. The recorder that does it is _recorder.c's, built with
the system C compiler, or PythonRecorder without one.
"""
import array
import glob
import os
import sys
import time

from minitensor.base import cext

ALLOC, FREE_REQUESTED, FREE_COMPLETED = "alloc", "free_requested", "free_completed"
SEGMENT_ALLOC, SEGMENT_FREE, OOM, SNAPSHOT = "segment_alloc", "segment_free", "oom", "snapshot"
SEGMENT_MAP, SEGMENT_UNMAP = "segment_map", "segment_unmap"  # pages of an expandable segment (expandable.py)
FREED = "free"  # a free completed at once, kept as one entry: torch's free_requested and free_completed
ENABLED = ("all", "state", None)
CONTEXTS = ("all", "alloc", "state", None)
STACKS = ("python", "all")
FIELDS = 8  # a trace entry's slots: action, address, size, stream, time in ns, stack, pool id, free device bytes
MAX_INTERNED = 8192  # stacks a recorder keeps for reuse (the C table's slots; the Python one starts over)
_NO_FRAMES = ()
_HERE = os.path.dirname(os.path.abspath(__file__))
_OWN = frozenset(glob.glob(os.path.join(_HERE, "*.py")))  # the allocator's modules: not part of a stack
_recorder_type = None  # _recorder.c's Recorder or PythonRecorder, chosen when a history is first made


def _python_stack(own, table, max_interned):
    """The caller's stack without the frames of files in `own`, interned in `table` (see _recorder.c)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in own:
        frame = frame.f_back
    codes, lines = [], array.array("i")
    while frame is not None:
        codes.append(frame.f_code)
        lines.append(-frame.f_lineno)
        frame = frame.f_back
    key = (tuple(map(id, codes)), lines.tobytes())
    found = table.get(key)
    if found is None:  # the codes kept in the value keep their ids unique
        if len(table) >= max_interned:
            table.clear()
        found = table[key] = (tuple(codes), key[1])
    return found


class PythonRecorder:
    """_recorder.c's Recorder in Python, for machines without a C compiler (several times slower). Each entry is
    appended by one list.extend, so threads freeing without the allocator's lock never interleave their slots."""

    __slots__ = ("trace", "live", "stacks", "own", "alloc_stacks", "free_stacks", "keep", "max_interned")

    def __init__(self, trace, live, own, alloc_stacks, free_stacks, keep, max_interned):
        self.trace, self.live, self.stacks, self.own = trace, live, {}, own
        self.alloc_stacks, self.free_stacks = alloc_stacks, free_stacks
        self.keep, self.max_interned = keep, max_interned

    def alloc(self, ptr, size, stream, pool_id):
        if self.live is not None:
            stack = self.live[ptr] = _python_stack(self.own, self.stacks, self.max_interned)
        if self.trace is not None:
            self._append((ALLOC, ptr, size, stream, time.time_ns(), stack if self.alloc_stacks else _NO_FRAMES,
                          pool_id, None))

    def free(self, ptr, size, stream, pool_id, completed):
        if self.live is not None:
            self.live.pop(ptr, None)
        if self.trace is not None:
            now = time.time_ns()
            stack = _python_stack(self.own, self.stacks, self.max_interned) if self.free_stacks else _NO_FRAMES
            self._append((FREED if completed else FREE_REQUESTED, ptr, size, stream, now, stack, pool_id, None))

    def interned(self):
        """How many stacks the intern table holds."""
        return len(self.stacks)

    def _append(self, slots):
        trace = self.trace
        trace.extend(slots)
        if len(trace) > 2 * self.keep:
            del trace[:-self.keep]  # one step, so a concurrent append is never cut in half


def _load_recorder_type():
    global _recorder_type
    if _recorder_type is None:
        try:
            _recorder_type = cext.load(os.path.join(_HERE, "_recorder.c"), "_minitensor_recorder").Recorder
        except RuntimeError:  # no C compiler
            _recorder_type = PythonRecorder


class History:
    """One allocator's history: what its recorder keeps, read back as torch's dicts. `trace` (None with
    enabled="state"): FIELDS slots per entry, oldest first, `max_entries` entries once trimmed (it grows to twice
    that between trims, so a trim is rare; a FREED entry reads back as two); `live`: address -> stack of each
    allocated block, while stacks of live allocations are kept. The allocator calls `alloc(ptr, size, stream,
    pool_id)` when it hands a block out, `free(ptr, size, stream, pool_id, completed)` when the owner frees it
    (`completed`: reusable at once, no other stream used it), and `event` for entries without a stack. As in
    torch, `size` is the bytes the caller asked for in alloc and free entries (the block's rounded size is the
    snapshot's), and the segment's or the pages' in segment entries."""

    __slots__ = ("trace", "live", "keep", "alloc", "free")

    def __init__(self, enabled="all", context="all", max_entries=sys.maxsize):
        if enabled not in ENABLED[:2]:
            raise ValueError(f"enabled must be one of {ENABLED}, got {enabled!r}")
        if context not in CONTEXTS:
            raise ValueError(f"context must be one of {CONTEXTS}, got {context!r}")
        if not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        self.trace = [] if enabled == "all" else None
        self.live = {} if context is not None else None
        self.keep = FIELDS * min(max_entries, sys.maxsize // (2 * FIELDS))  # slots; twice it fits a C size
        _load_recorder_type()
        recorder = _recorder_type(self.trace, self.live, _OWN, enabled == "all" and context in (
            "alloc", "all"), enabled == "all" and context == "all", self.keep, MAX_INTERNED)
        self.alloc, self.free = recorder.alloc, recorder.free  # bound here: the allocator calls them directly

    def carry_over(self, old, trace):
        """Go on from History `old`: the stacks of its blocks still allocated and, if `trace`, its entries."""
        if trace and self.trace is not None and old.trace is not None:
            self.trace.extend(old.trace[-min(old.keep, self.keep):])  # what each ring holds
        if self.live is not None and old.live is not None:
            self.live.update(old.live)

    def event(self, action, ptr, size, stream, pool_id, device_free=None):
        """An entry without a stack: free_completed, segment_alloc, segment_free, oom, snapshot."""
        trace = self.trace
        if trace is not None:
            trace.extend((action, ptr, size, stream, time.time_ns(), _NO_FRAMES, pool_id, device_free))
            if len(trace) > 2 * self.keep:
                del trace[:-self.keep]

    def frames(self, ptr, memo):
        """The frames of the live allocation at `ptr`, as the snapshot's list of dicts (see frame_dicts)."""
        stack = self.live.get(ptr) if self.live is not None else None
        return frame_dicts(stack, memo) if stack else []

    def entries(self, memo):
        """The trace as torch's list of dicts, oldest first (`memo`: see frame_dicts)."""
        if self.trace is None:
            return []
        slots = self.trace[-self.keep:]
        out = []
        for i in range(0, len(slots), FIELDS):
            action, ptr, size, stream, time_ns, stack, pool_id, device_free = slots[i:i + FIELDS]
            entry = {"action": FREE_REQUESTED if action == FREED else action, "addr": ptr, "size": size,
                     "stream": stream, "time_us": time_ns // 1000, "frames": frame_dicts(stack, memo) if stack else []}
            if pool_id is not None:
                entry["pool_id"] = pool_id
            if device_free is not None:
                entry["device_free"] = device_free
            out.append(entry)
            if action == FREED:
                out.append({**entry, "action": FREE_COMPLETED, "frames": []})
        return out[-(self.keep // FIELDS):]  # a FREED entry is two of torch's


_frame_dicts = {}  # (id(code), position) -> (code, its frame dict): one dict per distinct frame


def frame_dicts(stack, memo):
    """A stack (see _recorder.c) as torch's list of frames {"filename", "line", "name"}. `memo`, a dict kept for one
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
