"""Offline memory viewer: one self-contained HTML page from a memory snapshot in torch's `_snapshot()` format.

    python -m minitensor.memory_viz snap.pickle -o memory.html
    write_html(snapshot_dict_or_path, "memory.html")

Why a page of our own: torch's viewer (torch/utils/viz/MemoryViz.js) loads d3 from a CDN and unpickles in the
browser, and machines that record snapshots often have no network; a report should also still open years later.
So the pickle is read here, every allocation and segment is paired into a lifetime here (so the summary table and
the page agree by construction), and the page carries that model as inline JSON, drawn by memory_viz.js (beside
this file, inlined into the page) on <canvas>.

Time is counted in trace entries: state t is the allocator after the trace's first t entries (0: before the
first, N: the snapshot). An allocation lives from the state after its "alloc" to the state after its
"free_completed"; one freed without an alloc in the trace lived from state 0, one still in the snapshot's blocks
lives to the end, as in torch's viewer. Segments (reserved memory) are paired the same way from "segment_alloc"
/"segment_free" and the snapshot's segments.

Stdlib only, and nothing else from minitensor: a snapshot taken by torch renders without minitensor's runtime.
"""
import argparse
import html
import json
import os
import pickle
import sys

__all__ = ["SnapshotError", "load", "summarize", "write_html", "main"]

TOP = 10  # rows of the largest-allocations table
ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot", "other")
_ACTION_CODE = {name: code for code, name in enumerate(ACTIONS)}
_GENERAL_POOL = (0, 0)
_ORIGIN_TRACE, _ORIGIN_FREE, _ORIGIN_SNAPSHOT = 0, 1, 2  # where an allocation's start was seen
_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_viz.js")


class SnapshotError(ValueError):
    """The input is not a memory snapshot, or cannot be read; the message names the file."""


class _PlainUnpickler(pickle.Unpickler):
    """Snapshots hold only dicts, lists, tuples, strings and numbers: refusing every other class means that
    opening a pickle someone sent cannot run code from it."""

    _HARMLESS = {("builtins", "set"), ("builtins", "frozenset"), ("collections", "OrderedDict")}

    def find_class(self, module, name):
        if (module, name) in self._HARMLESS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, and a snapshot holds plain Python values only")


def load(source):
    """(snapshot dict, name) from a `_snapshot()` dict, a `memory_snapshot()` list, or the path of a pickle of
    either (what `_dump_snapshot` writes). Raises SnapshotError naming the file."""
    if isinstance(source, (dict, list)):
        return _checked(source, "the snapshot"), "snapshot"
    name = os.fspath(source)
    try:
        with open(name, "rb") as f:
            obj = _PlainUnpickler(f).load()
    except FileNotFoundError:
        raise SnapshotError(f"{name}: no such file") from None
    except OSError as e:
        raise SnapshotError(f"{name}: cannot read it ({e.strerror or e})") from None
    except Exception as e:  # garbage makes pickle raise nearly anything: UnpicklingError, EOFError, KeyError...
        raise SnapshotError(f"{name}: not a memory snapshot pickle ({type(e).__name__}: {e})") from None
    return _checked(obj, name), name


def _checked(obj, name):
    if isinstance(obj, list):
        obj = {"segments": obj, "device_traces": []}
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        raise SnapshotError(f"{name}: not a memory snapshot: expected a dict with a 'segments' list (torch's "
                            f"_snapshot()) or a list of segments (memory_snapshot()), got {type(obj).__name__}")
    traces = obj.get("device_traces") or []
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise SnapshotError(f"{name}: not a memory snapshot: 'device_traces' must be a list of lists")
    return obj


# ------------------------------------------------------------------------------------ the model
class _Tables:
    """Frames, stacks and pool ids, interned once for the whole page: a long trace repeats a few stacks, and
    recorders (minitensor's included) share one dict per distinct frame, so frames are keyed by identity
    first; the snapshot keeps them alive while the model is built."""

    def __init__(self):
        self.frames, self.stacks, self.pools = [], [[]], [_GENERAL_POOL]
        self._frame_ids, self._frame_objs, self._stack_ids, self._pool_ids = {}, {}, {(): 0}, {_GENERAL_POOL: 0}

    def _frame(self, frame):
        found = self._frame_objs.get(id(frame))
        if found is not None:
            return found
        text = f"{frame.get('filename', '?')}:{frame.get('line', '?')} {frame.get('name', '?')}"
        index = self._frame_ids.setdefault(text, len(self._frame_ids))
        if index == len(self.frames):
            self.frames.append(text)
        self._frame_objs[id(frame)] = index
        return index

    def stack(self, frames):
        if not frames:
            return 0
        key = tuple(map(self._frame, frames))
        index = self._stack_ids.setdefault(key, len(self._stack_ids))
        if index == len(self.stacks):
            self.stacks.append(list(key))
        return index

    def pool(self, pool_id):
        key = tuple(pool_id) if pool_id is not None else _GENERAL_POOL
        index = self._pool_ids.setdefault(key, len(self._pool_ids))
        if index == len(self.pools):
            self.pools.append(list(key))
        return index


# an allocation row: [start, end, free_requested state (-1: none), size, addr, stream, stack, pool, origin]
# a segment row:     [start, end, addr, size, stream, pool, segment_type or None]
def _lifetimes(segments, trace, tables):
    """(allocation rows, segment rows, action codes, times) of one device, rows in stacking order: allocations
    that predate the trace at the bottom, as they hold memory from the first state."""
    alive = len(trace) + 1  # an end past the last state: still there at the snapshot
    rows, before, open_allocs = [], [], {}
    seg_rows, open_segs = [], {}
    actions, times = [], []
    for i, entry in enumerate(trace):
        action, addr, state = entry.get("action"), entry.get("addr", 0), i + 1
        actions.append(_ACTION_CODE.get(action, _ACTION_CODE["other"]))
        times.append(entry.get("time_us", 0))
        if action == "alloc":
            if addr in open_allocs:  # a free the trace lost: end the old one here
                open_allocs.pop(addr)[1] = state
            open_allocs[addr] = row = [state, alive, -1, entry.get("size", 0), addr, entry.get("stream", 0),
                                       tables.stack(entry.get("frames")), tables.pool(entry.get("pool_id")),
                                       _ORIGIN_TRACE]
            rows.append(row)
        elif action in ("free_requested", "free_completed", "free"):  # "free": both at once
            row = open_allocs.get(addr)
            if row is None:  # allocated before the trace began; the only stack known is the free's
                open_allocs[addr] = row = [0, alive, -1, entry.get("size", 0), addr, entry.get("stream", 0),
                                           tables.stack(entry.get("frames")), tables.pool(entry.get("pool_id")),
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
            open_segs[addr] = row = [state, alive, addr, entry.get("size", 0), entry.get("stream", 0),
                                     tables.pool(entry.get("pool_id")), None]
            seg_rows.append(row)
        elif action in ("segment_free", "segment_unmap"):
            row = open_segs.pop(addr, None)
            if row is None:
                seg_rows.append([0, state, addr, entry.get("size", 0), entry.get("stream", 0),
                                 tables.pool(entry.get("pool_id")), None])
            else:
                row[1] = state
    snapshot_only = []
    for seg in segments:
        start, pool, stream = seg["address"], tables.pool(seg.get("segment_pool_id")), seg.get("stream", 0)
        row = open_segs.pop(start, None)
        if row is None:
            seg_rows.append([0, alive, start, seg["total_size"], stream, pool, seg.get("segment_type")])
        else:
            row[5], row[6] = pool, seg.get("segment_type")
        addr = start
        for block in seg.get("blocks", ()):
            addr, next_addr = block.get("address", addr), block.get("address", addr) + block["size"]
            if block.get("state") in ("active_allocated", "active_pending_free"):
                pending = block["state"] == "active_pending_free"
                row = open_allocs.pop(addr, None)
                if row is None:
                    snapshot_only.append([0, alive, 0 if pending else -1, block["size"], addr, stream,
                                          tables.stack(block.get("frames")), pool, _ORIGIN_SNAPSHOT])
                else:
                    row[7] = pool
                    if row[6] == 0:
                        row[6] = tables.stack(block.get("frames"))
            addr = next_addr
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


def _sources(snapshot):
    """[(label, segments, trace)]: each device with segments or a trace, then pinned host memory if any."""
    by_device = {}
    for seg in snapshot["segments"]:
        by_device.setdefault(seg.get("device", 0), []).append(seg)
    traces = snapshot.get("device_traces") or []
    devices = sorted(set(by_device) | {i for i, trace in enumerate(traces) if trace})
    out = [(f"cuda:{d}", by_device.get(d, []), traces[d] if d < len(traces) else []) for d in devices]
    host_segments, host_traces = snapshot.get("host_segments") or [], snapshot.get("host_traces") or []
    if host_traces and isinstance(host_traces[0], list):  # one list per index, as device_traces
        host_traces = [entry for trace in host_traces for entry in trace]
    if host_segments or host_traces:
        out.append(("host (pinned)", host_segments, host_traces))
    return out or [("cuda:0", [], [])]


def _model(snapshot, name):
    """The page's data: per device its lifetimes as columns (JSON arrays, compact to parse), and its summary."""
    tables, devices = _Tables(), []
    try:
        for label, segments, trace in _sources(snapshot):
            rows, seg_rows, actions, times = _lifetimes(segments, trace, tables)
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
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        raise SnapshotError(f"{name}: not a memory snapshot: malformed entry ({type(e).__name__}: {e})") from None
    return {"devices": devices, "frames": tables.frames, "stacks": tables.stacks, "pools": tables.pools,
            "action_names": list(ACTIONS)}


def summarize(source):
    """{device label: summary dict}: peaks of allocated and reserved bytes (at a state, see the module's
    docstring), fragmentation (reserved - allocated at the first peak of allocated) and the largest allocations."""
    snapshot, name = load(source)
    return {d["label"]: d["summary"] for d in _model(snapshot, name)["devices"]}


# ------------------------------------------------------------------------------------ the page
def _size(n):
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit} ({n} bytes)"


def _cell(key, value, text):
    return f'<td data-key="{key}" data-value="{value}">{html.escape(text)}</td>'


def _summary_html(device):
    s, label = device["summary"], device["label"]
    share = f"{100 * s['fragmentation'] / s['reserved_at_peak']:.1f}% of reserved" if s["reserved_at_peak"] else ""
    rows = [
        ("Peak allocated", "peak_allocated", s["peak_allocated"], f"after entry {s['peak_allocated_at']}"),
        ("Reserved at that peak", "reserved_at_peak", s["reserved_at_peak"], ""),
        ("Fragmentation at that peak (reserved - allocated)", "fragmentation", s["fragmentation"], share),
        ("Peak reserved", "peak_reserved", s["peak_reserved"], f"after entry {s['peak_reserved_at']}"),
        ("Allocated at the snapshot", "end_allocated", s["end_allocated"], ""),
        ("Reserved at the snapshot", "end_reserved", s["end_reserved"], ""),
    ]
    body = "".join(f"<tr><th>{html.escape(title)}</th>{_cell(key, value, _size(value))}<td>{html.escape(note)}</td>"
                   f"</tr>" for title, key, value, note in rows)
    body += "".join(f"<tr><th>{title}</th>{_cell(key, s[key], str(s[key]))}<td></td></tr>" for title, key in
                    (("Trace entries", "entries"), ("Allocations", "allocations"),
                     ("Segments at the snapshot", "segments")))
    largest = "".join(
        f'<tr data-id="{a["id"]}"><td>#{a["id"]}</td>{_cell("size", a["size"], _size(a["size"]))}'
        f'<td>0x{a["addr"]:x}</td><td>{a["stream"]}</td>'
        f'<td>{a["start"] or "before the trace"} .. {"the snapshot" if a["end"] is None else a["end"]}</td>'
        f'<td class="frame">{html.escape(a["top_frame"] or "(no frames recorded)")}</td></tr>'
        for a in s["largest"])
    return (f'<div class="summary" data-device="{html.escape(label)}"><h3>{html.escape(label)}</h3>'
            f'<table class="numbers">{body}</table><h4>Largest allocations</h4><table class="largest">'
            f'<tr><th>allocation</th><th>size</th><th>address</th><th>stream</th><th>lives (entries)</th>'
            f'<th>allocated at (innermost frame)</th></tr>{largest}</table></div>')


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Memory: @TITLE@</title>
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<style>
body{font:13px system-ui,sans-serif;margin:12px 16px;color:#222}
h1{font-size:18px;margin:0 0 6px}h2{font-size:15px;margin:14px 0 4px}h3{font-size:14px;margin:10px 0 4px}
h4{font-size:13px;margin:8px 0 4px}.bar{display:flex;gap:10px;align-items:center;flex-wrap:wrap}
.hint{color:#666;font-size:12px}#timeline{width:100%;height:380px;display:block;cursor:crosshair}
#segbox{max-height:440px;overflow:auto;border:1px solid #ddd}#segments{width:100%;display:block}
#tooltip{position:fixed;z-index:9;pointer-events:none;background:#fffff4;border:1px solid #999;padding:5px 7px;
font:12px ui-monospace,monospace;white-space:pre;max-width:90vw;box-shadow:2px 2px 6px #0003}
#brush{position:absolute;pointer-events:none;background:#4e79a733;border:1px solid #4e79a7;display:none}
#time{flex:1;min-width:200px}table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;
text-align:left;vertical-align:top}td.frame{font-family:ui-monospace,monospace}.key span{display:inline-block;
width:10px;height:10px;margin:0 3px 0 8px;border:1px solid #888}#error{color:#b00;white-space:pre}
</style></head><body>
<h1>Memory snapshot: @TITLE@</h1>
<div class="bar"><label>device <select id="device"></select></label>
<button id="reset">Reset zoom</button><label><input type="checkbox" id="show-reserved" checked> reserved</label>
<button id="png">Save timeline PNG</button><span id="stats" class="hint"></span></div>
<div id="error"></div>
<h2>Active memory timeline</h2>
<div class="hint">Each band is one allocation, stacked; grey: allocations thinner than a pixel, merged;
dashed: reserved; red marks: out-of-memory errors. Wheel: zoom; drag: zoom to a range; double-click: reset;
click: move the segment map there.</div>
<div style="position:relative"><canvas id="timeline"></canvas><div id="brush"></div></div>
<h2>Segments</h2>
<div class="bar"><input type="range" id="time" min="0" max="0" value="0"><span id="time-label"></span></div>
<div class="key hint">blocks:<span style="background:#4e79a7"></span>active_allocated
<span style="background:#f28e2c"></span>active_pending_free<span style="background:#e9e9e9"></span>inactive</div>
<div id="segbox"><canvas id="segments"></canvas></div>
<h2>Summary</h2>
@SUMMARY@
<div id="tooltip" hidden></div>
<script type="application/json" id="mtviz-data">@DATA@</script>
<script>@SCRIPT@</script>
</body></html>
"""


def render(source):
    """The page as a string."""
    snapshot, name = load(source)
    model = _model(snapshot, name)
    try:
        with open(_SCRIPT, encoding="utf-8") as f:
            script = f.read()
    except OSError as e:
        raise RuntimeError(f"the viewer's script {_SCRIPT} is missing ({e.strerror}); minitensor was installed "
                           f"without its package data") from None
    assert "</script" not in script.lower()
    data = json.dumps(model, separators=(",", ":")).replace("<", "\\u003c")  # no "</script>" inside strings
    page = _PAGE.replace("@TITLE@", html.escape(os.path.basename(name)))
    page = page.replace("@SUMMARY@", "\n".join(map(_summary_html, model["devices"])))
    return page.replace("@SCRIPT@", script).replace("@DATA@", data)  # last: data may hold any "@...@"


def write_html(source, out_path):
    """Write the page for `source` (a snapshot dict or list, or a pickle's path) to `out_path`; returns it."""
    page = render(source)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(page)
    return out_path


def main(argv=None):
    """The command line; returns the exit status (1 with one line on stderr naming the file at fault)."""
    parser = argparse.ArgumentParser(prog="python -m minitensor.memory_viz", description=(
        "Write one self-contained HTML page (no network needed) showing a memory snapshot: the timeline of "
        "allocated memory, the segments at any time, and a summary."))
    parser.add_argument("snapshot", help="a pickle written by _dump_snapshot (or torch.cuda.memory._dump_snapshot)")
    parser.add_argument("-o", "--output", help="the HTML file to write (default: the snapshot's name + .html)")
    args = parser.parse_args(argv)
    out = args.output or os.path.splitext(args.snapshot)[0] + ".html"
    try:
        write_html(args.snapshot, out)
    except SnapshotError as e:
        print(f"memory_viz: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"memory_viz: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
