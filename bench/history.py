"""Memory history benchmarks (allocator/history.py): what recording costs the allocator, and how long a snapshot
and its dump take.

- empty(4096) + del: the host time per call of `empty(4096, device="cuda")` dropped at once (bench/allocator.py's
  case), with history off, with `_record_memory_history()`'s defaults (enabled="all", context="all": one stack
  walk per allocation and per free) and with context=None (the trace without stacks). The figure is each
  setting's time over the time with history off. torch, when it sees a GPU, the same with its own
  `torch.cuda.memory._record_memory_history()` defaults (stacks="all": C++ frames too) and with
  stacks="python", the closer match to minitensor's Python-only stacks. The settings take turns, each timed
  run preceded, untimed, by switching its framework's history to its setting, which also starts a new trace
  (timing.best_s_in_turns).
- snapshot: `_snapshot()` with `blocks` live 4 KiB allocations made with history on (10,000 on a GPU): the
  median, in ms. torch's `torch.cuda.memory._snapshot()` on its own 10,000 blocks, recorded with
  stacks="python" (the same frames as minitensor's; its default would add C++ frames to symbolize).
- dump: `_dump_snapshot(path)` of that state into a temporary folder: the median, in ms, and the file's size.

On the simulated device the allocator is the same Python code, so the on/off ratio holds there too; the live
blocks are fewer and the millisecond targets are judged on a GPU only.
"""
import gc
import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass

from bench.report import add_times
from bench.table import table
from bench.timing import best_s_in_turns

KIND = "history"
EMPTY_DEL, SNAPSHOT, DUMP = "history.empty_del", "history.snapshot", "history.dump"
CASES = {  # key -> name, formatted with the number of live blocks
    EMPTY_DEL: "empty(4096) + del, history on / off",
    SNAPSHOT: "_snapshot(), {} live blocks, history on",
    DUMP: "_dump_snapshot(), {} live blocks",
}
UNITS = {EMPTY_DEL: "us per call", SNAPSHOT: "ms", DUMP: "ms"}
ELEMENTS = 4096  # empty(4096): float32, 16 KiB
BLOCK_ELEMENTS = 1024  # a live block of the snapshot cases: 4 KiB
# (label, framework, _record_memory_history keyword arguments or None for history off)
SETTINGS = (
    ("minitensor", "minitensor", None),
    ("minitensor_history", "minitensor", {}),
    ("minitensor_context_none", "minitensor", {"context": None}),
    ("torch", "torch", None),
    ("torch_history", "torch", {}),
    ("torch_history_python", "torch", {"stacks": "python"}),
)
RATIOS = {  # history_ratio key -> (label with history, label without)
    "minitensor": ("minitensor_history", "minitensor"),
    "minitensor_context_none": ("minitensor_context_none", "minitensor"),
    "torch": ("torch_history", "torch"),
    "torch_stacks_python": ("torch_history_python", "torch"),
}
TORCH_SNAPSHOT_HISTORY = {"stacks": "python"}


@dataclass(frozen=True)
class Sizes:
    calls: int  # empty+del calls per timed loop
    repeats: int  # timed loops per setting; the best is kept
    blocks: int  # live blocks of the snapshot cases
    snapshots: int  # timed snapshots (dumps); the median is kept


def sizes(sim, quick):
    if sim:
        return Sizes(calls=200, repeats=2 if quick else 5, blocks=500, snapshots=2 if quick else 3)
    return Sizes(calls=500, repeats=15 if quick else 60, blocks=10_000, snapshots=3 if quick else 7)


# ---------------------------------------------------------------------------- history switches
def _record(fw, kwargs):
    """Turn `fw`'s history off, then on with `kwargs` unless None: a new, empty trace."""
    record = fw.module.cuda.memory._record_memory_history  # minitensor and torch spell it the same
    record(enabled=None)
    if kwargs is not None:
        record(**kwargs)


def _snapshot_fn(fw):
    return fw.module.cuda.memory._snapshot


def _dump_fn(fw):
    return fw.module.cuda.memory._dump_snapshot


# ---------------------------------------------------------------------------- empty + del
def _empty_del_setup(fw, kwargs, calls):
    def setup():
        empty = fw.module.empty

        def loop():
            for _ in range(calls):
                empty(ELEMENTS, device="cuda")

        def prepare():
            _record(fw, kwargs)
        prepare()
        return loop, fw.synchronize, prepare
    return setup


def _empty_del_row(fws, size, new_row):
    by_name = {fw.name: fw for fw in fws}
    row = new_row(EMPTY_DEL, KIND, CASES[EMPTY_DEL], (ELEMENTS,))
    row.update(unit=UNITS[EMPTY_DEL], calls=size.calls, repeats=size.repeats, statistic="best",
               settings={label: kwargs for label, name, kwargs in SETTINGS if name in by_name})
    setups = {label: _empty_del_setup(by_name[name], kwargs, size.calls) for label, name, kwargs in SETTINGS
              if name in by_name}
    try:
        seconds, errors = best_s_in_turns(setups, size.repeats)
    finally:
        for fw in by_name.values():
            _off(fw)
    add_times(row, {label: t / size.calls * 1e6 for label, t in seconds.items()}, errors)
    t = row["time"]
    row["history_ratio"] = {key: t[on] / t[off] for key, (on, off) in RATIOS.items()
                            if t.get(on) and t.get(off)}
    if t.get("minitensor_history") and t.get("torch_history"):
        row["ratios"]["mt_vs_torch"] = t["torch_history"] / t["minitensor_history"]
    return row


def _off(fw):
    try:
        _record(fw, None)
    except Exception:  # a framework that failed earlier may fail here too; its error is already recorded
        pass


# ---------------------------------------------------------------------------- snapshot and dump
class _Live:
    """`blocks` live 4 KiB allocations of one framework, made with history on."""

    def __init__(self, fw, blocks, kwargs):
        self.fw = fw
        _record(fw, kwargs)
        self.tensors = [fw.module.empty(BLOCK_ELEMENTS, device="cuda") for _ in range(blocks)]
        fw.synchronize()
        self.entries = len(_snapshot_fn(fw)()["device_traces"][0])

    def close(self):
        self.tensors = None
        _off(self.fw)
        gc.collect()
        self.fw.module.cuda.empty_cache()


def _snapshot_setup(live):
    def setup():
        snapshot = _snapshot_fn(live.fw)
        return snapshot, None, None
    return setup


def _dump_setup(live, path):
    def dump():
        _dump_fn(live.fw)(path)

    def prepare():
        if os.path.exists(path):
            os.remove(path)

    def setup():
        return dump, None, prepare
    return setup


def _snapshot_rows(fws, size, keys, new_row):
    """The snapshot and dump rows, over one set of live blocks per framework (minitensor with its history
    defaults, torch with TORCH_SNAPSHOT_HISTORY)."""
    rows = {key: new_row(key, KIND, CASES[key].format(size.blocks), (size.blocks,)) for key in keys}
    lives, errors = {}, {}
    folder = tempfile.mkdtemp(prefix="bench-history-")
    try:
        for fw in (fw for fw in fws if fw.name in ("minitensor", "torch")):
            try:
                lives[fw.name] = _Live(fw, size.blocks, {} if fw.name == "minitensor" else TORCH_SNAPSHOT_HISTORY)
            except Exception as exc:  # the package may lack history: report it, time the others
                errors[fw.name] = exc
                _off(fw)
        for key, row in rows.items():
            row.update(unit=UNITS[key], blocks=size.blocks, repeats=size.snapshots, statistic="median",
                       trace_entries={name: live.entries for name, live in lives.items()},
                       torch_history=TORCH_SNAPSHOT_HISTORY)
            paths = {name: os.path.join(folder, f"{name}.pickle") for name in lives}
            if key == SNAPSHOT:
                setups = {name: _snapshot_setup(live) for name, live in lives.items()}
            else:
                setups = {name: _dump_setup(live, paths[name]) for name, live in lives.items()}
            seconds, failed = best_s_in_turns(setups, size.snapshots, pick=statistics.median)
            add_times(row, {name: t * 1e3 for name, t in seconds.items()}, {**errors, **failed})
            if key == DUMP:
                row["file_bytes"] = {name: os.path.getsize(path) for name, path in paths.items()
                                     if os.path.exists(path)}
            mt, torch = row["time"].get("minitensor"), row["time"].get("torch")
            if mt and torch:
                row["ratios"]["mt_vs_torch"] = torch / mt
    finally:
        for live in lives.values():
            live.close()
        shutil.rmtree(folder, ignore_errors=True)
    return list(rows.values())


def run(fws, sim, quick, selected, new_row):
    """One row per selected case."""
    size = sizes(sim, quick)
    rows = []
    if selected(EMPTY_DEL, CASES[EMPTY_DEL]):
        rows.append(_empty_del_row(fws, size, new_row))
    keys = [key for key in (SNAPSHOT, DUMP) if selected(key, CASES[key].format(size.blocks))]
    if keys:
        rows += _snapshot_rows(fws, size, keys, new_row)
    return rows


# ---------------------------------------------------------------------------- table
def _cell(row, label, fmt="{:.2f}"):
    if label in row["errors"]:
        return "ERR"
    value = row["time"].get(label)
    return "n/a" if value is None else fmt.format(value)


def _ratio(row, key):
    value = row.get("history_ratio", {}).get(key)
    return "n/a" if value is None else f"{value:.2f}x"


def section(rows, verdicts):
    """The empty+del times per setting and their ratios to history off, then the snapshot and dump times."""
    header = ["memory history", "unit", "minitensor", "torch", "target"]
    body, lines = [], []
    for r in rows:
        status = "/".join(v["status"] for v in verdicts if v["case"] == r["key"])
        if r["key"] == EMPTY_DEL:
            body += [
                ["empty(4096) + del, history off", r["unit"], _cell(r, "minitensor"), _cell(r, "torch"), ""],
                ["empty(4096) + del, _record_memory_history()", r["unit"], _cell(r, "minitensor_history"),
                 _cell(r, "torch_history"), ""],
                ["empty(4096) + del, context=None", r["unit"], _cell(r, "minitensor_context_none"), "n/a", ""],
                ["empty(4096) + del, stacks=\"python\"", r["unit"], "n/a", _cell(r, "torch_history_python"), ""],
                ["history on / off (defaults)", "ratio", _ratio(r, "minitensor"), _ratio(r, "torch"), status],
                ["context=None / off", "ratio", _ratio(r, "minitensor_context_none"), "n/a", ""],
                ["stacks=\"python\" / off", "ratio", "n/a", _ratio(r, "torch_stacks_python"), ""],
            ]
        else:
            body.append([r["name"], r["unit"], _cell(r, "minitensor", "{:.1f}"), _cell(r, "torch", "{:.1f}"),
                         status])
            if r["key"] == DUMP and r.get("file_bytes"):
                lines.append("dump file sizes: " + ", ".join(f"{name} {n / 2**20:.2f} MiB"
                                                             for name, n in r["file_bytes"].items()))
    if any(r["key"] != EMPTY_DEL for r in rows):
        entries = next(r["trace_entries"] for r in rows if r["key"] != EMPTY_DEL)
        lines.append("trace entries at the snapshots: " + ", ".join(f"{n} {k}" for n, k in entries.items())
                     + f"; torch recorded with {TORCH_SNAPSHOT_HISTORY}")
    return "\n".join([table(header, body), *lines])
