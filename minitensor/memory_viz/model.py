"""The viewer's model of a snapshot: every allocation and segment paired into a lifetime, in states (state t: the
allocator after the trace's first t entries), per device, and the summary the page's table shows.

Each list walked is charged to the pickle's budget (snapshot.py): a trace entry, segment or block `ROW_WEIGHT`
elements, as each becomes a row of numbers on the page; so is each list of frames and each string the page keeps
(snapshot.py `Tables`).
"""
from pickle import UnpicklingError

from .snapshot import (INT64_MAX, INT64_MIN, Malformed, SnapshotError, Tables, as_dict, int_at, list_at, read,
                       str_at, time_at)

TOP = 10  # rows of the largest-allocations table
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot", "other")
ROW_WEIGHT = 8  # elements charged per trace entry, segment and block walked: each becomes a row of 7-9 numbers
_ACTION_CODE = {name: code for code, name in enumerate(ACTIONS)}
_ACTIVE = ("active_allocated", "active_pending_free")
_ORIGIN_TRACE, _ORIGIN_FREE, _ORIGIN_SNAPSHOT = 0, 1, 2  # where an allocation's start was seen


def _entry(entry, tables):
    """(action, addr, size, stream, time_us, stack, pool) of one trace entry, checked (the stack as
    `Tables.stack` gives it)."""
    as_dict(entry, "a trace entry")
    action = str_at(entry, "action", None)
    if action is None:
        raise Malformed("missing (an action string expected)", "['action']")
    return (action, int_at(entry, "addr", 0), int_at(entry, "size", 0), int_at(entry, "stream", 0, INT64_MIN),
            time_at(entry), tables.stack(entry), tables.pool(entry, "pool_id"))


def _segment(seg, tables):
    """(device, [address, total_size, stream, pool, segment type, blocks]) of one segment, checked; each block
    (address, requested size, state, stack), its address defaulting to the end of the one before (its rounded
    `size` places the next block; an allocation is shown with the size asked for, as the trace's entries and
    torch's viewer show it)."""
    as_dict(seg, "a segment")
    blocks = list_at(seg, "blocks")
    tables.spend(ROW_WEIGHT * (1 + len(blocks)), f"a segment of {len(blocks)} blocks")
    addr = start = int_at(seg, "address")
    out = []
    for k, block in enumerate(blocks):
        try:
            as_dict(block, "a block")
            addr, size = int_at(block, "address", addr), int_at(block, "size")
            out.append((addr, int_at(block, "requested_size", size), str_at(block, "state", ""), tables.stack(block)))
        except Malformed as e:
            raise e.within(f"['blocks'][{k}]") from None
        addr += size
    fields = [start, int_at(seg, "total_size"), int_at(seg, "stream", 0, INT64_MIN),
              tables.pool(seg, "segment_pool_id"), tables.segment_type(seg), out]
    return int_at(seg, "device", 0, 0, INT64_MAX), fields


def _segments(items, where, tables):
    """[(device, segment)] of a list of segments, checked; an error names `where`[index]."""
    out = []
    for j, seg in enumerate(items):
        try:
            out.append(_segment(seg, tables))
        except Malformed as e:
            raise e.within(f"{where}[{j}]") from None
    return out


# an allocation row: [start, end, free_requested state (-1: none), size, addr, stream, stack, pool, origin]
# a segment row:     [start, end, addr, size, stream, pool, segment type or None]
def _lifetimes(segments, trace, where, tables):
    """(allocation rows, segment rows, action codes, times) of one device, rows in stacking order: allocations
    that predate the trace at the bottom, as they hold memory from the first state."""
    tables.spend(ROW_WEIGHT * len(trace), f"a trace of {len(trace)} entries")
    alive = len(trace) + 1  # an end past the last state: still there at the snapshot
    rows, before, open_allocs = [], [], {}
    seg_rows, open_segs = [], {}
    actions, times = [], []
    for i, entry in enumerate(trace):
        try:
            action, addr, size, stream, time_us, stack, pool = _entry(entry, tables)
        except Malformed as e:
            raise e.within(f"{where}[{i}]") from None
        state = i + 1
        actions.append(_ACTION_CODE.get(action, _ACTION_CODE["other"]))
        times.append(time_us)
        if action == "alloc":
            if addr in open_allocs:  # a free the trace lost: end the old one here
                open_allocs.pop(addr)[1] = state
            open_allocs[addr] = row = [state, alive, -1, size, addr, stream, tables.index(stack), pool,
                                       _ORIGIN_TRACE]
            rows.append(row)
        elif action in ("free_requested", "free_completed", "free"):  # "free": both at once
            row = open_allocs.get(addr)
            if row is None:  # allocated before the trace began; the only stack known is the free's
                open_allocs[addr] = row = [0, alive, -1, size, addr, stream, tables.index(stack), pool,
                                           _ORIGIN_FREE]
                before.append(row)
            if action != "free_completed":
                row[2] = state
            if action != "free_requested":
                row[1] = state
                del open_allocs[addr]
        elif action in ("segment_alloc", "segment_map"):
            if addr in open_segs:
                open_segs.pop(addr)[1] = state
            open_segs[addr] = row = [state, alive, addr, size, stream, pool, None]
            seg_rows.append(row)
        elif action in ("segment_free", "segment_unmap"):
            row = open_segs.pop(addr, None)
            if row is None:
                seg_rows.append([0, state, addr, size, stream, pool, None])
            else:
                row[1] = state
    snapshot_only = []
    for start, total, stream, pool, kind, blocks in segments:
        row = open_segs.pop(start, None)
        if row is None:
            seg_rows.append([0, alive, start, total, stream, pool, kind])
        else:
            row[5], row[6] = pool, kind
        for addr, size, block_state, stack in blocks:
            if block_state in _ACTIVE:
                pending = block_state == "active_pending_free"
                row = open_allocs.pop(addr, None)
                if row is None:
                    snapshot_only.append([0, alive, 0 if pending else -1, size, addr, stream, tables.index(stack),
                                          pool, _ORIGIN_SNAPSHOT])
                else:
                    row[7] = pool
                    if row[6] == 0:
                        row[6] = tables.index(stack)
    snapshot_only.sort(key=lambda r: r[4])
    seg_rows.sort(key=lambda r: (r[0], r[2]))
    return snapshot_only + before + rows, seg_rows, actions, times


def _series(rows, states, start, end, size):
    """Bytes held at each state 0..states-1 by rows living [row[start], row[end])."""
    delta = [0] * (states + 1)
    for row in rows:
        delta[row[start]] += row[size]
        delta[min(row[end], states)] -= row[size]
    out, held = [], 0
    for step in delta[:states]:
        held += step
        out.append(held)
    return out


def _summary(rows, seg_rows, segments, n, tables):
    allocated = _series(rows, n + 1, 0, 1, 3)
    reserved = _series(seg_rows, n + 1, 0, 1, 3)
    peak = max(range(n + 1), key=allocated.__getitem__)  # the first state at the peak
    peak_res = max(range(n + 1), key=reserved.__getitem__)
    largest = sorted(range(len(rows)), key=lambda i: (-rows[i][3], i))[:TOP]
    return {
        "entries": n, "allocations": len(rows), "segments": len(segments),
        "peak_allocated": allocated[peak], "peak_allocated_at": peak, "reserved_at_peak": reserved[peak],
        "fragmentation": reserved[peak] - allocated[peak],
        "peak_reserved": reserved[peak_res], "peak_reserved_at": peak_res,
        "end_allocated": allocated[n], "end_reserved": reserved[n],
        "largest": [{"id": i, "size": rows[i][3], "addr": rows[i][4], "stream": rows[i][5],
                     "start": rows[i][0], "end": rows[i][1] if rows[i][1] <= n else None,
                     "top_frame": tables.frames[tables.stacks[rows[i][6]][0]] if rows[i][6] else None}
                    for i in largest],
    }


def _sources(snapshot, tables):
    """[(label, segments, trace, where)]: each device with segments or a trace, then pinned host memory if any."""
    by_device = {}
    for device, seg in _segments(snapshot["segments"], "segments", tables):
        by_device.setdefault(device, []).append(seg)
    traces = snapshot.get("device_traces") or []
    devices = sorted(set(by_device) | {i for i, trace in enumerate(traces) if trace})
    out = [(f"cuda:{d}", by_device.get(d, []), traces[d] if d < len(traces) else [], f"device_traces[{d}]")
           for d in devices]
    try:
        host_segments, host_traces = list_at(snapshot, "host_segments"), list_at(snapshot, "host_traces")
    except Malformed as e:
        raise e.within("the snapshot") from None
    where = "host_traces"
    if host_traces and type(host_traces[0]) in (list, tuple):  # one list per index, as device_traces
        if not all(type(trace) in (list, tuple) for trace in host_traces):
            raise Malformed("a list of lists of entries expected, as its first item is a list", where)
        tables.spend(sum(map(len, host_traces)), f"joining {len(host_traces)} host traces")
        host_traces, where = [entry for trace in host_traces for entry in trace], "host_traces (joined)"
    if host_segments or host_traces:
        out.append(("host (pinned)", [seg for _, seg in _segments(host_segments, "host_segments", tables)],
                    host_traces, where))
    return out or [("cuda:0", [], [], "device_traces[0]")]


def build(snapshot: dict, name: str, spend) -> dict:
    """The page's data: per device its lifetimes as columns (JSON arrays, compact to parse), and its summary.
    `spend(n, what)` charges the walk to the pickle's budget (None: a dict or list given, not charged)."""
    tables, devices = Tables(spend or (lambda n, what: None)), []
    try:
        for label, segments, trace, where in _sources(snapshot, tables):
            rows, seg_rows, actions, times = _lifetimes(segments, trace, where, tables)
            n = len(trace)
            summary = _summary(rows, seg_rows, segments, n, tables)
            t0 = times[0] if times else 0
            devices.append({
                "label": label, "entries": n, "t0": t0, "summary": summary, "actions": actions,
                "dt": [b - a for a, b in zip([t0] + times, times)],
                "a": {key: [r[col] for r in rows] for col, key in
                      enumerate(("start", "end", "req", "size", "addr", "stream", "stack", "pool", "origin"))},
                "s": {key: [r[col] for r in seg_rows] for col, key in
                      enumerate(("start", "end", "addr", "size", "stream", "pool", "type"))},
            })
    except Malformed as e:
        raise SnapshotError(f"{name}: not a memory snapshot: {e.path}: {e.what}") from None
    except UnpicklingError as e:  # the budget, spent by the walk
        raise SnapshotError(f"{name}: {e}") from None
    return {"devices": devices, "frames": tables.frames, "stacks": tables.stacks, "pools": tables.pools,
            "segment_types": tables.segment_types, "action_names": list(ACTIONS)}


def summarize(source: "dict | list | str | os.PathLike") -> "dict[str, dict]":
    """{device label: summary dict}: peaks of allocated and reserved bytes (at a state, see the package's
    docstring), fragmentation (reserved - allocated at the first peak of allocated) and the largest allocations."""
    snapshot, name, spend = read(source)
    return {d["label"]: d["summary"] for d in build(snapshot, name, spend)["devices"]}
