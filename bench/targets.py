"""Speed targets, judged from one run's measurements (ratios, so the machine's own drift cancels out).

`rows` below is the benchmark's results by case key; see `bench.__main__`.
"""

from dataclasses import dataclass
from typing import Callable, Optional


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
    Target("host a + b, 1K", "host.add", "<= 0.80x torch time",
           _mt_over_torch("host.add"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("host add(out=), 1K", "host.add_out", "<= 0.80x torch time",
           _mt_over_torch("host.add_out"), lambda v: v <= 0.80, "{:.2f}x torch time"),
    Target("add 2^28 vs torch", "device.add_out", ">= 0.97x torch speed",
           _torch_over_mt("device.add_out"), lambda v: v >= 0.97, "{:.3f}x torch speed"),
    Target("add 2^28 vs D2D copy", "device.add_out", ">= 0.90 of copy GB/s",
           add_vs_copy, lambda v: v >= 0.90, "{:.3f} of copy GB/s", gpu_only=True),
    Target("transpose 8192^2 vs torch", "device.transpose", ">= 0.90x torch speed",
           _torch_over_mt("device.transpose"), lambda v: v >= 0.90, "{:.3f}x torch speed"),
    Target("import minitensor", "startup.import", "<= 0.30 s",
           _value("startup.import"), lambda v: v <= 0.30, "{:.3f} s"),
    Target("first op, fresh process", "startup.first_op", "<= 0.20 s",
           _value("startup.first_op"), lambda v: v <= 0.20, "{:.3f} s"),
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
