"""Expandable segments benchmarks (allocator/expandable.py), each setting switched with
`cuda.memory._set_allocator_settings("expandable_segments:True")` (minitensor and torch spell it the same).

- Fragmentation: every allocation trace of bench/traces.py and the growing-batch trace replayed (as
  bench/allocator.py replays them) with torch's and minitensor's default allocators and with expandable
  segments: the peak reserved bytes over the trace's own peak of live bytes.
- empty(4096) + del, a cache hit, with expandable segments over the same with the default segments: the host
  time per call of each, timed in turns.
- Growth: one allocation of 400 MiB (40 on the simulated device) with expandable segments and nothing cached
  (empty_cache before each run, untimed), which maps its pages, and reserves the segment's addresses again if the
  allocator gave them back: the median time, minitensor and torch.

Traces run scaled down 16x on the simulated device, as in bench/allocator.py.
"""
import statistics

from bench.allocator import SIM_SCALE, live_peak, peak_reserved
from bench.report import add_times
from bench.table import table
from bench.timing import best_s_in_turns
from bench.traces import GROWING_BATCH, MiB, TRACES

KIND = "expandable"
EMPTY_DEL, GROWTH = "expandable.empty_del", "expandable.growth"
ON, OFF = "expandable_segments:True", "expandable_segments:False"
SETTINGS = {"": OFF, "_expandable": ON}  # label suffix -> settings string


def _trace_key(trace):
    return "expandable." + trace.key.split(".", 1)[1]


def _set(fw, settings):
    fw.module.cuda.memory._set_allocator_settings(settings)


def _fragmentation_rows(fws, sim, selected, new_row):
    rows = []
    for trace in (*TRACES, GROWING_BATCH):
        key = _trace_key(trace)
        if not selected(key, trace.name):
            continue
        ops = trace.make(SIM_SCALE if sim else 1.0)
        row = new_row(key, KIND, trace.name, (len(ops),))
        row.update(unit="peak reserved / live peak", live_peak=live_peak(ops), fragmentation={})
        for fw in (fw for fw in fws if fw.name in ("minitensor", "torch")):
            for suffix, settings in SETTINGS.items():
                try:
                    _set(fw, settings)
                    row["fragmentation"][fw.name + suffix] = peak_reserved(fw.module, ops) / row["live_peak"]
                except Exception as exc:  # one setting failing still leaves the others' numbers
                    row["errors"][fw.name + suffix] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                finally:
                    _set(fw, OFF)
        rows.append(row)
    return rows


def _empty_del_setup(fw, settings, calls):
    def setup():
        empty, cuda = fw.module.empty, fw.module.cuda

        def loop():
            for _ in range(calls):
                empty(4096, device="cuda")

        def prepare():
            _set(fw, settings)
            cuda.empty_cache()  # the next block comes from a segment made with these settings
            empty(4096, device="cuda")
        prepare()
        return loop, fw.synchronize, prepare
    return setup


def _empty_del_row(fws, sim, new_row):
    row = new_row(EMPTY_DEL, KIND, "empty(4096) + del, expandable / default", (4096,))
    calls, repeats = (200, 5) if sim else (500, 40)
    row.update(unit="us per call", calls=calls, repeats=repeats, statistic="best")
    setups = {fw.name + suffix: _empty_del_setup(fw, settings, calls) for fw in fws
              if fw.name in ("minitensor", "torch") for suffix, settings in SETTINGS.items()}
    try:
        seconds, errors = best_s_in_turns(setups, repeats)
    finally:
        for fw in fws:
            if fw.name in ("minitensor", "torch"):
                _set(fw, OFF)
    add_times(row, {label: t / calls * 1e6 for label, t in seconds.items()}, errors)
    t = row["time"]
    row["expandable_ratio"] = {name: t[name + "_expandable"] / t[name] for name in ("minitensor", "torch")
                               if t.get(name) and t.get(name + "_expandable")}
    return row


def _growth_setup(fw, nbytes):
    def setup():
        cuda = fw.module.cuda
        alloc, delete = cuda.caching_allocator_alloc, cuda.caching_allocator_delete
        held = []

        def grow():
            held.append(alloc(nbytes))

        def prepare():
            while held:
                delete(held.pop())
            cuda.synchronize()
            cuda.empty_cache()
        _set(fw, ON)
        prepare()
        return grow, fw.synchronize, prepare
    return setup


def _growth_row(fws, sim, new_row):
    nbytes = (40 if sim else 400) * MiB
    row = new_row(GROWTH, KIND, f"growth of an expandable segment by {nbytes // MiB} MiB", (nbytes,))
    repeats = 3 if sim else 15
    row.update(unit="ms", repeats=repeats, statistic="median")
    setups = {fw.name: _growth_setup(fw, nbytes) for fw in fws if fw.name in ("minitensor", "torch")}
    try:
        seconds, errors = best_s_in_turns(setups, repeats, pick=statistics.median)
    finally:
        for fw in fws:
            if fw.name in ("minitensor", "torch"):
                _set(fw, OFF)
                fw.module.cuda.empty_cache()
    add_times(row, {label: t * 1e3 for label, t in seconds.items()}, errors)
    mt, torch = row["time"].get("minitensor"), row["time"].get("torch")
    if mt and torch:
        row["ratios"]["mt_vs_torch"] = torch / mt
    return row


def run(fws, sim, selected, new_row):
    rows = _fragmentation_rows(fws, sim, selected, new_row)
    if selected(EMPTY_DEL, "empty(4096) + del, expandable / default"):
        rows.append(_empty_del_row(fws, sim, new_row))
    if selected(GROWTH, "growth of an expandable segment"):
        rows.append(_growth_row(fws, sim, new_row))
    return rows


# ---------------------------------------------------------------------------- table
LABELS = ("torch", "torch_expandable", "minitensor", "minitensor_expandable")


def _cell(value, errors, label, fmt):
    return "ERR" if label in errors else "n/a" if value is None else fmt.format(value)


def section(rows, verdicts):
    """Peak reserved over live peak per trace and setting, then the empty+del and growth times."""
    def status(key):
        return "/".join(v["status"] for v in verdicts if v["case"] == key)

    header = ["expandable segments", "unit", *LABELS, "target"]
    body = []
    for r in rows:
        if "fragmentation" in r:
            cells = [_cell(r["fragmentation"].get(label), r["errors"], label, "{:.2f}x") for label in LABELS]
            body.append([f"{r['name']} (live peak {r['live_peak'] / MiB:.0f} MiB)", "reserved/live", *cells,
                         status(r["key"])])
        elif r["key"] == EMPTY_DEL:
            cells = [_cell(r["time"].get(label), r["errors"], label, "{:.2f}") for label in LABELS]
            body.append([r["name"], r["unit"], *cells, status(r["key"])])
        else:
            t = r["time"]
            body.append([r["name"], r["unit"], "n/a", _cell(t.get("torch"), r["errors"], "torch", "{:.2f}"), "n/a",
                         _cell(t.get("minitensor"), r["errors"], "minitensor", "{:.2f}"), status(r["key"])])
    return table(header, body)
