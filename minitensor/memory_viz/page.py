"""The page: one self-contained HTML file, the model as inline JSON drawn by memory_viz.js (beside this file,
inlined) on <canvas>, and the summary as tables.

A snapshot's strings (file names, function names, segment types) are someone else's text, so nothing of it is
markup: every value the HTML shows goes through `_e` (escaped), memory_viz.js writes text only (textContent,
canvas), the JSON cannot close its <script type="application/json"> (<, > and & escaped), and the
Content-Security-Policy runs only the page's own script, named by its sha256.
"""
import argparse
import base64
import hashlib
import html
import json
import os
import re
import sys

from .model import build
from .snapshot import SnapshotError, read

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "memory_viz.js")


def _size(n):
    value, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{n} B" if unit == "B" else f"{value:.1f} {unit} ({n} bytes)"


def _e(value):
    """Any value as HTML text or a quoted attribute's value: everything the page shows goes through here."""
    return html.escape(str(value), quote=True)


def _cell(key, value, text):
    return f'<td data-key="{_e(key)}" data-value="{_e(value)}">{_e(text)}</td>'


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
    body = "".join(f"<tr><th>{_e(title)}</th>{_cell(key, value, _size(value))}<td>{_e(note)}</td></tr>"
                   for title, key, value, note in rows)
    body += "".join(f"<tr><th>{_e(title)}</th>{_cell(key, s[key], s[key])}<td></td></tr>" for title, key in
                    (("Trace entries", "entries"), ("Allocations", "allocations"),
                     ("Segments at the snapshot", "segments")))
    largest = "".join(
        f'<tr data-id="{_e(a["id"])}"><td>#{_e(a["id"])}</td>{_cell("size", a["size"], _size(a["size"]))}'
        f'<td>{_e(hex(a["addr"]))}</td><td>{_e(a["stream"])}</td>'
        f'<td>{_e(a["start"] or "before the trace")} .. {_e("the snapshot" if a["end"] is None else a["end"])}</td>'
        f'<td class="frame">{_e(a["top_frame"] or "(no frames recorded)")}</td></tr>'
        for a in s["largest"])
    return (f'<div class="summary" data-device="{_e(label)}"><h3>{_e(label)}</h3>'
            f'<table class="numbers">{body}</table><h4>Largest allocations</h4><table class="largest">'
            f'<tr><th>allocation</th><th>size</th><th>address</th><th>stream</th><th>lives (entries)</th>'
            f'<th>allocated at (innermost frame)</th></tr>{largest}</table></div>')


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Memory: @TITLE@</title>
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; script-src '@SCRIPT_HASH@'; style-src 'unsafe-inline'; img-src data:;
 base-uri 'none'; form-action 'none'">
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


def _script():
    try:
        with open(_SCRIPT, encoding="utf-8") as f:
            script = f.read()
    except OSError as e:
        raise RuntimeError(f"the viewer's script {_SCRIPT} is missing ({e.strerror}); minitensor was installed "
                           f"without its package data") from None
    assert "</script" not in script.lower()
    return script


def render(source: "dict | list | str | os.PathLike") -> str:
    """The page as a string, for a snapshot dict or list, or a pickle's path (SnapshotError naming what is wrong)."""
    snapshot, name, spend = read(source)
    model = build(snapshot, name, spend)
    script = _script()
    data = json.dumps(model, separators=(",", ":"), allow_nan=False)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    parts = {"TITLE": _e(os.path.basename(name)), "SUMMARY": "\n".join(map(_summary_html, model["devices"])),
             "SCRIPT": script, "DATA": data,
             "SCRIPT_HASH": "sha256-" + base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()}
    return re.sub(r"@([A-Z_]+)@", lambda m: parts[m.group(1)], _PAGE)  # one pass: no part is searched for markers


def write_html(source: "dict | list | str | os.PathLike", out_path: "str | os.PathLike") -> "str | os.PathLike":
    """Write the page for `source` (a snapshot dict or list, or a pickle's path) to `out_path`; returns it."""
    page = render(source)
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(page)
    return out_path


def main(argv: "list[str] | None" = None) -> int:
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
        print(f"memory_viz: error: {e}".replace("\n", "\\n"), file=sys.stderr)  # one line, even for a file name
        return 1
    except OSError as e:
        print(f"memory_viz: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0
