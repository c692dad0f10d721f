"""Speed targets, judged from one run's measurements (ratios, so the machine's own drift cancels out).

`rows` below is the benchmark's results by case key; see `bench.__main__`.
"""

from dataclasses import dataclass
from typing import Callable, Optional

from bench.traces import GROWING_BATCH, TRACES


def _time(rows, key, fw):
    row = rows.get(key)
    return row["time"].get(fw) if row else None


def _mt_over_torch(key):
    """minitensor's time as a fraction of torch's (lower is better)."""
    def measure(rows):
        mt, torch = _time(rows, key, "minitensor"), _time(rows, key, "torch")
        return mt / torch if mt and torch else None
    return measure


def _torch_over_mt(key):
    """Speed ratio torch_time / minitensor_time (higher is better)."""
    def measure(rows):
        mt, torch = _time(rows, key, "minitensor"), _time(rows, key, "torch")
        return torch / mt if mt and torch else None
    return measure


def best_copy(rows):
    """(GB/s, framework) of the fastest device-to-device copy in this run, or None."""
    row = rows.get("device.copy_")
    rates = [(gbps, fw) for fw, gbps in row["gbps"].items() if gbps] if row else []
    return max(rates, default=None)


def add_vs_copy(rows):
    """minitensor's add bandwidth as a fraction of the best D2D copy bandwidth in this run."""
    add, copy = rows.get("device.add_out"), best_copy(rows)
    mt_add = add["gbps"].get("minitensor") if add else None
    return mt_add / copy[0] if mt_add and copy else None


def _value(key):
    return lambda rows: _time(rows, key, "minitensor")


def _over_mt(key, baseline):
    """Speed ratio baseline_time / minitensor_time for any baseline of a row (e.g. "torch_mmap")."""
    def measure(rows):
        mt, other = _time(rows, key, "minitensor"), _time(rows, key, baseline)
        return other / mt if mt and other else None
    return measure


def _mt_over(key, baseline, contender="minitensor"):
    """minitensor's time (or another contender's) as a fraction of another's of the same row (lower is better)."""
    def measure(rows):
        mine, other = _time(rows, key, contender), _time(rows, key, baseline)
        return mine / other if mine and other else None
    return measure


def _disk_write_over_mt(key):
    """The raw file write's time of the same run (io.disk_write, the same size) over minitensor's save: the
    share of the disk's own write speed a save reaches (higher is better), whatever torch's speed that day."""
    def measure(rows):
        mt, disk = _time(rows, key, "minitensor"), _time(rows, "io.disk_write", "disk")
        return disk / mt if mt and disk else None
    return measure


def _peak_vs_torch(key):
    """minitensor's peak reserved bytes on an allocation trace as a fraction of torch's (lower is better)."""
    def measure(rows):
        peaks = rows[key]["peak_reserved"] if key in rows else {}
        mt, torch = peaks.get("minitensor"), peaks.get("torch")
        return mt / torch if mt and torch else None
    return measure


def _replay_allocations(key):
    """How many allocations minitensor's graph replays made (growth of the counters bench/graphs.py reads
    around a batch of replays), or None when not checked."""
    def measure(rows):
        counts = rows[key].get("alloc_check", {}).get("minitensor") if key in rows else None
        return sum(after - before for before, after in counts.values()) if counts else None
    return measure


def _history_ratio(key, setting="minitensor"):
    """A setting's host time with memory history on over its time with history off (bench/history.py)."""
    def measure(rows):
        return rows[key].get("history_ratio", {}).get(setting) if key in rows else None
    return measure


def _expandable_vs(key, other):
    """minitensor's peak reserved over live peak with expandable segments as a fraction of the setting `other`'s
    (bench/expandable.py; lower is better)."""
    def measure(rows):
        fragmentation = rows[key].get("fragmentation", {}) if key in rows else {}
        mine, theirs = fragmentation.get("minitensor_expandable"), fragmentation.get(other)
        return mine / theirs if mine and theirs else None
    return measure


def _expandable_ratio(key):
    """minitensor's host time with expandable segments over its time with the default ones."""
    def measure(rows):
        return rows[key].get("expandable_ratio", {}).get("minitensor") if key in rows else None
    return measure


@dataclass(frozen=True)
class Target:
    name: str
    case: str  # key of the case it judges
    text: str  # the target, in words
    measure: Callable[[dict], Optional[float]]
    ok: Callable[[float], bool]
    fmt: str  # format of the measured figure
    gpu_only: bool = False  # meaningless on the simulated device


TARGETS = [
    Target("host a + b, 1K", "host.add", "<= 0.65x torch time",
           _mt_over_torch("host.add"), lambda v: v <= 0.65, "{:.2f}x torch time"),
    Target("host add(out=), 1K", "host.add_out", "<= 0.80x torch time",
           _mt_over_torch("host.add_out"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("host exp(a), 1K", "host.exp", "<= 0.80x torch time",
           _mt_over_torch("host.exp"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("host a < b, 1K", "host.lt", "<= 0.80x torch time",
           _mt_over_torch("host.lt"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("host where, 1K", "host.where", "<= 0.80x torch time",
           _mt_over_torch("host.where"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("exp 2^28 vs torch", "device.exp_out", ">= 0.97x torch speed",
           _torch_over_mt("device.exp_out"), lambda v: v >= 0.97, "{:.3f}x torch speed"),
    Target("broadcast add 16384^2 vs torch", "device.broadcast_add", ">= 0.95x torch speed",
           _torch_over_mt("device.broadcast_add"), lambda v: v >= 0.95, "{:.3f}x torch speed"),
    Target("add 2^28 vs torch", "device.add_out", ">= 0.97x torch speed",
           _torch_over_mt("device.add_out"), lambda v: v >= 0.97, "{:.3f}x torch speed"),
    Target("add 2^28 vs D2D copy", "device.add_out", ">= 0.90 of copy GB/s",
           add_vs_copy, lambda v: v >= 0.90, "{:.3f} of copy GB/s", gpu_only=True),
    Target("host uniform_, 1K", "host.uniform_", "<= 0.80x torch time",
           _mt_over_torch("host.uniform_"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("uniform_ 2^28 vs torch", "device.uniform_", ">= 0.95x torch speed",
           _torch_over_mt("device.uniform_"), lambda v: v >= 0.95, "{:.3f}x torch speed"),
    Target("normal_ 2^28 vs CuPy", "device.normal_", ">= 1.0x CuPy speed",
           _over_mt("device.normal_", "cupy"), lambda v: v >= 1.0, "{:.3f}x CuPy speed"),
    Target("host sum, 1K", "host.sum", "<= 0.80x torch time",
           _mt_over_torch("host.sum"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("sum 2^28 vs torch", "device.sum", ">= 0.90x torch speed",
           _torch_over_mt("device.sum"), lambda v: v >= 0.90, "{:.3f}x torch speed"),
    Target("host gather, 1K", "host.gather", "<= 0.80x torch time",
           _mt_over_torch("host.gather"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("gather 2^28 random vs torch", "device.gather", ">= 1.0x torch speed",
           _torch_over_mt("device.gather"), lambda v: v >= 1.0, "{:.3f}x torch speed"),
    Target("transpose 8192^2 vs torch", "device.transpose", ">= 0.90x torch speed",
           _torch_over_mt("device.transpose"), lambda v: v >= 0.90, "{:.3f}x torch speed"),
    Target("import minitensor", "startup.import", "<= 0.25 s",
           _value("startup.import"), lambda v: v <= 0.25, "{:.3f} s"),
    Target("first op, fresh process", "startup.first_op", "<= 0.15 s",
           _value("startup.first_op"), lambda v: v <= 0.15, "{:.3f} s"),
    Target("save 1 GiB cuda vs the disk", "io.save_cuda", ">= 0.9x raw file write",
           _disk_write_over_mt("io.save_cuda"), lambda v: v >= 0.9, "{:.2f}x raw write speed", gpu_only=True),
    Target("load 1 GiB to cuda vs torch.load", "io.load_cuda", ">= 5x torch speed",
           _torch_over_mt("io.load_cuda"), lambda v: v >= 5.0, "{:.2f}x torch speed", gpu_only=True),
    Target("load 1 GiB to cuda vs torch mmap", "io.load_cuda", ">= 1x torch.load(mmap=True)",
           _over_mt("io.load_cuda", "torch_mmap"), lambda v: v >= 1.0, "{:.2f}x torch mmap speed", gpu_only=True),
    Target("save 1 GiB CPU tensor vs torch", "io.save_cpu", ">= 1.0x torch speed",
           _torch_over_mt("io.save_cpu"), lambda v: v >= 1.0, "{:.2f}x torch speed"),
    Target("load 1 GiB CPU tensor vs torch", "io.load_cpu", ">= 1.0x torch speed",
           _torch_over_mt("io.load_cpu"), lambda v: v >= 1.0, "{:.2f}x torch speed"),
    Target("alloc+delete 4 KiB (cache hit)", "host.alloc_pair", "<= CuPy's time",
           _mt_over("host.alloc_pair", "cupy"), lambda v: v <= 1.0, "{:.2f}x CuPy time", gpu_only=True),
    Target("empty(4096) + del", "host.empty_del", "<= 0.80x torch time",
           _mt_over_torch("host.empty_del"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("empty(4096) + del vs CuPy", "host.empty_del", "<= CuPy's time",
           _mt_over("host.empty_del", "cupy"), lambda v: v <= 1.0, "{:.2f}x CuPy time", gpu_only=True),
    Target("pinned empty(1 MiB) + del", "host.pinned_empty_del", "<= CuPy's time",
           _mt_over("host.pinned_empty_del", "cupy"), lambda v: v <= 1.0, "{:.2f}x CuPy time", gpu_only=True),
    Target("H2D 256 MiB pinned vs raw", "copy.h2d_pinned", ">= 0.95x raw cuMemcpyHtoDAsync",
           _over_mt("copy.h2d_pinned", "raw"), lambda v: v >= 0.95, "{:.3f}x raw speed", gpu_only=True),
    Target("D2H 256 MiB pinned vs raw", "copy.d2h_pinned", ">= 0.95x raw cuMemcpyDtoHAsync",
           _over_mt("copy.d2h_pinned", "raw"), lambda v: v >= 0.95, "{:.3f}x raw speed", gpu_only=True),
    Target("D2H 256 MiB pageable vs raw", "copy.d2h_pageable", ">= 0.90x raw cuMemcpyDtoHAsync",
           _over_mt("copy.d2h_pageable", "raw"), lambda v: v >= 0.90, "{:.3f}x raw speed", gpu_only=True),
    Target("H2D 256 MiB pageable vs torch .cuda()", "copy.h2d_pageable", ">= 1.0x torch speed (aim 2x)",
           _torch_over_mt("copy.h2d_pageable"), lambda v: v >= 1.0, "{:.2f}x torch speed", gpu_only=True),
    Target("graph replay per kernel vs torch", "graph.replay_add_out", "<= torch's time per kernel",
           _mt_over_torch("graph.replay_add_out"), lambda v: v <= 1.0, "{:.2f}x torch time"),
    Target("graph capture vs torch", "graph.capture", "<= torch's capture time",
           _mt_over_torch("graph.capture"), lambda v: v <= 1.0, "{:.2f}x torch time"),
    Target("graph replays allocate nothing", "graph.replay_alloc", "0 allocations",
           _replay_allocations("graph.replay_alloc"), lambda v: v == 0, "{:.0f} allocations"),
    Target("empty(4096) + del, history on / off", "history.empty_del", "<= 1.5x history off",
           _history_ratio("history.empty_del"), lambda v: v <= 1.5, "{:.2f}x history off"),
    Target("_snapshot(), 10,000 live blocks", "history.snapshot", "<= 200 ms",
           _value("history.snapshot"), lambda v: v <= 200, "{:.1f} ms", gpu_only=True),
    Target("_dump_snapshot(), 10,000 live blocks", "history.dump", "<= 500 ms",
           _value("history.dump"), lambda v: v <= 500, "{:.1f} ms", gpu_only=True),
    *(Target(f"peak reserved: {t.name}", t.key, "<= torch's", _peak_vs_torch(t.key), lambda v: v <= 1.0,
             "{:.3f}x torch's") for t in TRACES),
    *(Target(f"expandable: {t.name}", "expandable." + t.key.split(".", 1)[1], "<= torch expandable's",
             _expandable_vs("expandable." + t.key.split(".", 1)[1], "torch_expandable"), lambda v: v <= 1.0,
             "{:.3f}x torch expandable's") for t in (*TRACES, GROWING_BATCH)),
    *(Target(f"expandable vs default: {t.name}", "expandable." + t.key.split(".", 1)[1], "<= minitensor default's",
             _expandable_vs("expandable." + t.key.split(".", 1)[1], "minitensor"), lambda v: v <= 1.0,
             "{:.3f}x default's") for t in (*TRACES, GROWING_BATCH)),
    Target("empty(4096) + del, expandable / default", "expandable.empty_del", "<= 1.1x default",
           _expandable_ratio("expandable.empty_del"), lambda v: v <= 1.1, "{:.2f}x default"),
    Target("expandable segment growth vs torch", "expandable.growth", "<= torch's time",
           _mt_over_torch("expandable.growth"), lambda v: v <= 1.0, "{:.2f}x torch time", gpu_only=True),
    Target("cold compile of saxpy to cubin", "user.cold_compile", "<= 1.2x raw NVRTC",
           _mt_over("user.cold_compile", "nvrtc"), lambda v: v <= 1.2, "{:.2f}x raw NVRTC", gpu_only=True),
    Target("codecache hit, fresh process", "user.fresh_hit", "<= 1 ms",
           _value("user.fresh_hit"), lambda v: v <= 1.0, "{:.2f} ms", gpu_only=True),
    Target("codecache hit, same process", "user.memory_hit", "<= CuPy's time",
           _mt_over("user.memory_hit", "cupy"), lambda v: v <= 1.0, "{:.2f}x CuPy time", gpu_only=True),
    Target("RawKernel launch vs minitensor's Triton launch", "user.launch", "<= 1.1x y.add_(x)",
           _mt_over("user.launch", "minitensor_op"), lambda v: v <= 1.1, "{:.2f}x y.add_(x)", gpu_only=True),
    Target("user @triton.jit launch vs minitensor's own", "user.launch", "<= 1.5x y.add_(x)",
           _mt_over("user.launch", "minitensor_op", "minitensor_user_triton"), lambda v: v <= 1.5,
           "{:.2f}x y.add_(x)", gpu_only=True),
]


def evaluate(rows, sim):
    """One dict per target of the cases that ran: measured figure, target and PASS / FAIL / n.a."""
    results = []
    for t in (t for t in TARGETS if t.case in rows):
        value = t.measure(rows)
        if value is None or (sim and t.gpu_only):
            status = "n.a."
        else:
            status = "PASS" if t.ok(value) else "FAIL"
        results.append({
            "name": t.name, "case": t.case, "measured": value,
            "measured_text": "n/a" if value is None else t.fmt.format(value),
            "target": t.text, "status": status,
        })
    return results
