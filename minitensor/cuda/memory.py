"""Device memory: one caching allocator per device (minitensor.allocator), and torch.cuda.memory's
functions over it.

`MINITENSOR_NO_CACHING=1` sends every request straight to the driver; `MINITENSOR_ALLOC_CONF` and
`set_allocator_settings` take torch's allocator settings string.
"""
import dataclasses
import os
import pickle
import sys
import threading
import warnings

from ..allocator import DeviceCachingAllocator, UncachedAllocator, history as allocator_history, \
    settings as allocator_settings
from ..backends import active_driver
from ..base.atomicfile import atomic_write
from . import host_memory
from .devices import device as device_context, index_of, mem_get_info
from .streams import current_stream_handle

__all__ = ["caching_allocator_alloc", "caching_allocator_delete", "empty_cache", "get_per_process_memory_fraction",
           "max_memory_allocated", "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved",
           "memory_snapshot", "memory_stats", "record_memory_history", "reset_accumulated_memory_stats",
           "reset_peak_memory_stats", "set_allocator_settings", "set_oom_snapshot", "set_per_process_memory_fraction"]

_allocators = {}
_lock = threading.Lock()
_raw = {}  # pointer -> block of caching_allocator_alloc's allocations
_only = None  # the allocator of device 0 when there is no other: the hot path needs no device lookup


def allocator(index):
    """The allocator of device `index`, created on first use."""
    global _only
    a = _allocators.get(index)
    if a is None:
        with _lock:
            a = _allocators.get(index)
            if a is None:
                cls = UncachedAllocator if _no_caching() else DeviceCachingAllocator
                driver = active_driver()
                a = cls(driver, index, allocator_settings.current())
                if _history_options is not None:
                    a.record_history(allocator_history.History(*_history_options))
                a.oom_observer = _oom_observer(index)
                _allocators[index] = a
                if driver.device_count() == 1:
                    _only = a
    return a


def pool_allocator(index, what):
    """The allocator of device `index` where `what` needs private pools, which only the caching one has."""
    a = allocator(index)
    if isinstance(a, UncachedAllocator):
        raise RuntimeError(f"{what} needs the caching allocator, and MINITENSOR_NO_CACHING=1 turns it off")
    return a


def _no_caching():
    """MINITENSOR_NO_CACHING as torch reads its boolean flags: 1 or 0, anything else warns and counts as 0."""
    value = os.environ.get("MINITENSOR_NO_CACHING", "0")
    if value not in ("0", "1"):
        warnings.warn(f"Ignoring invalid value for boolean flag MINITENSOR_NO_CACHING: {value!r}; valid values "
                      "are 0 or 1.", RuntimeWarning, stacklevel=4)
    return value == "1"


def _allocator_of(device):
    return allocator(index_of(device))


# ---------------------------------------------------------------------------- raw allocations
def caching_allocator_alloc(size, device=None, stream=None):
    """`size` bytes from the caching allocator, for use on `stream` (default: the device's current stream);
    returns the device pointer as an int. Free it with caching_allocator_delete."""
    if device is None and stream is None:
        if _only is not None:
            block = _only.alloc(size, current_stream_handle(0))
        else:
            index = active_driver().current_device()
            block = allocator(index).alloc(size, current_stream_handle(index))
    else:
        index = index_of(device)
        if stream is None:
            stream = current_stream_handle(index)
        elif not isinstance(stream, int):
            stream = getattr(stream, "cuda_stream", None)
            if not isinstance(stream, int):
                raise TypeError("Invalid type for stream argument, must be `minitensor.cuda.Stream` or `int` "
                                "representing a pointer to a existing stream")
        with device_context(index):
            block = allocator(index).alloc(size, stream)
    ptr = block.ptr
    if ptr:
        _raw[ptr] = block
    return ptr


def caching_allocator_delete(mem_ptr):
    """Free memory from caching_allocator_alloc (0, the pointer of a zero-byte allocation, is ignored)."""
    block = _raw.pop(mem_ptr, None)
    if block is None:
        if mem_ptr == 0:
            return
        raise RuntimeError(f"invalid device pointer: {mem_ptr:#x} (not allocated by caching_allocator_alloc, "
                           "or already freed)")
    block.free_list.owner.free(block)


# ---------------------------------------------------------------------------- statistics
def memory_stats(device=None):
    """torch's dict of allocator statistics, keys "<stat>.<all|small_pool|large_pool>.<field>" and counters."""
    return _allocator_of(device).memory_stats()


def memory_allocated(device=None):
    """Bytes handed out to tensors (rounded block sizes)."""
    return _allocator_of(device).allocated_bytes()


def max_memory_allocated(device=None):
    return _allocator_of(device).peak("allocated_bytes")


def memory_reserved(device=None):
    """Bytes of the segments the allocator holds from the driver."""
    return _allocator_of(device).reserved_bytes()


def max_memory_reserved(device=None):
    return _allocator_of(device).peak("reserved_bytes")


def reset_peak_memory_stats(device=None):
    """Set every peak to its current value."""
    _allocator_of(device).reset_peak_stats()


def reset_accumulated_memory_stats(device=None):
    """Zero the accumulated fields (allocated/freed) and the counters (num_*)."""
    _allocator_of(device).reset_accumulated_stats()


def memory_snapshot():
    """Every segment of every device, as torch's memory_snapshot() lists them."""
    return [segment for index in sorted(_allocators) for segment in _allocators[index].snapshot()]


# ---------------------------------------------------------------------------- cache and limits
def empty_cache():
    """Wait for blocks other streams still use, then give every unsplit cached segment back to the driver."""
    for a in list(_allocators.values()):
        a.empty_cache()


def set_per_process_memory_fraction(fraction, device=None):
    """Limit this process's segments on the device to `fraction` of its total memory."""
    if not isinstance(fraction, float):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    index = index_of(device)
    allocator(index).set_memory_fraction(fraction, active_driver().properties(index).total_memory)


def get_per_process_memory_fraction(device=None):
    return _allocator_of(device).memory_fraction()


def set_allocator_settings(settings):
    """Apply a torch-style settings string, e.g. "max_split_size_mb:128,garbage_collection_threshold:0.8"."""
    new = allocator_settings.update(settings)
    for a in list(_allocators.values()):
        a.configure(new)
    host_memory.configure(new)


_set_allocator_settings = set_allocator_settings  # torch.cuda.memory's name


# ---------------------------------------------------------------------------- memory history (allocator/history.py)
_history_options = None  # (enabled, context, max_entries) while recording: also for allocators made later
_oom_snapshot = os.environ.get("MINITENSOR_OOM_SNAPSHOT") or None  # where an out-of-memory error dumps a snapshot


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                           clear_history=False):
    """Record the history of every device allocator and of the pinned host allocator, as
    torch.cuda.memory._record_memory_history (with record_pinned_host_memory): `enabled` "all"
    (a trace of actions, at most `max_entries`, the oldest dropped), "state" (only the stacks of live
    allocations) or None (stop); `context` which stacks ("all", "alloc", "state", None); `stacks` "python" or
    "all" (minitensor's stacks are Python's). A new call keeps what was recorded unless `clear_history`.
    `device` is accepted for torch's signature: every device records."""
    global _history_options
    if isinstance(enabled, bool):  # torch's legacy signature: a flag first
        enabled = "all" if enabled else None
    if stacks not in allocator_history.STACKS:
        raise ValueError(f"stacks must be one of {allocator_history.STACKS}, got {stacks!r}")
    options = None if enabled is None else (enabled, context, max_entries)
    if options is not None:
        allocator_history.History(*options)  # checks the arguments before anything changes
    with _lock:
        _history_options = options
        for a in [*_allocators.values(), host_memory.allocator()]:
            a.record_history(None if options is None else _continued(a, options, clear_history))


record_memory_history = _record_memory_history


def _continued(a, options, clear_history):
    """A new History for allocator `a`, holding its current one's trace unless `clear_history`, and the stacks
    of the blocks still allocated."""
    new, old = allocator_history.History(*options), a._history
    if old is not None:
        new.carry_over(old, trace=not clear_history)
    return new


def _snapshot(device=None):
    """torch's snapshot dict: "segments" (memory_snapshot()'s, blocks with the frames of their allocation),
    "device_traces" (one list of history entries per device, each ending with a "snapshot" entry),
    "allocator_settings", and "host_traces" (the pinned host allocator's entries) while recording."""
    index = None if device is None else index_of(device)
    segments, traces = [], [[] for _ in range(active_driver().device_count())]
    for i in sorted(_allocators):
        if index is None or i == index:
            segments_i, traces[i] = _allocators[i].history_snapshot()
            segments += segments_i
    snapshot = _snapshot_dict(segments, traces)
    if _history_options is not None:
        snapshot["host_traces"] = host_memory.allocator().history_entries()
    return snapshot


def _snapshot_dict(segments, traces):
    settings = {key: list(value) if isinstance(value, tuple) else value
                for key, value in dataclasses.asdict(allocator_settings.current()).items()}
    return {"segments": segments, "device_traces": traces, "allocator_settings": settings}


def _dump_snapshot(filename="dump_snapshot.pickle"):
    """Pickle `_snapshot()` to `filename` with protocol 4, which torch's viewers read."""
    _write_pickle(_snapshot(), filename)


def _write_pickle(data, filename):
    """Through a temporary file (base/atomicfile.py), so a failed dump leaves no half file under the name."""
    with atomic_write(filename) as f:
        pickle.dump(data, f, protocol=4)


def set_oom_snapshot(path):
    """Dump the snapshot of the device that runs out of memory to `path` (None: don't), at the moment of the
    error; MINITENSOR_OOM_SNAPSHOT=path sets it at start."""
    global _oom_snapshot
    _oom_snapshot = None if path is None else os.fspath(path)


def _oom_observer(index):
    def observe(segments, trace):
        if _oom_snapshot is not None:
            traces = [[] for _ in range(active_driver().device_count())]
            traces[index] = trace
            try:
                _write_pickle(_snapshot_dict(segments, traces), _oom_snapshot)
            except (OSError, RuntimeError) as e:  # RuntimeError: atomic_write's missing folder
                warnings.warn(f"minitensor: could not write the out-of-memory snapshot to {_oom_snapshot!r}: {e}",
                              RuntimeWarning, stacklevel=2)
    return observe
