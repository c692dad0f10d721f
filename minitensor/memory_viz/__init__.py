"""Offline memory viewer: one self-contained HTML page from a memory snapshot in torch's `_snapshot()` format.

    python -m minitensor.memory_viz snap.pickle -o memory.html
    write_html(snapshot_dict_or_path, "memory.html")

Why a page of our own: torch's viewer (torch/utils/viz/MemoryViz.js) loads d3 from a CDN and unpickles in the
browser, and machines that record snapshots often have no network; a report should also still open years later.
So the pickle is read here (snapshot.py: as mt.load reads a checkpoint, bounded by its size, every field checked),
every allocation and segment is paired into a lifetime here (model.py: so the summary table and the page agree by
construction), and the page carries that model as inline JSON, drawn by memory_viz.js on <canvas> (page.py).

Time is counted in trace entries: state t is the allocator after the trace's first t entries (0: before the
first, N: the snapshot). An allocation lives from the state after its "alloc" to the state after its
"free_completed"; one freed without an alloc in the trace lived from state 0, one still in the snapshot's blocks
lives to the end, as in torch's viewer. Segments (reserved memory) are paired the same way from "segment_alloc"
/"segment_free" and the snapshot's segments.

Stdlib and minitensor.base only (its pickle reader): a snapshot taken by torch renders without minitensor's runtime.
"""
from .model import ACTIONS, TOP, summarize
from .page import main, render, write_html
from .snapshot import SnapshotError, load

__all__ = ["SnapshotError", "load", "summarize", "render", "write_html", "main", "TOP", "ACTIONS"]
