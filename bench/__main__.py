"""python -m bench [--quick] [--only NAME] [--json PATH] | --summary PATH"""

import argparse
import datetime
import json
import math
import platform
import sys
from dataclasses import dataclass

from bench import (allocator, copies, expandable, frameworks, graphs, history, report, serialization, startup,
                   user_kernels)
from bench.cases import CASES, DEVICE, HOST
from bench.startup import STARTUP_CASES
from bench.targets import evaluate
from bench.timing import device_s_per_launch, host_us_per_call


@dataclass(frozen=True)
class Config:
    sim: bool
    host_calls: int
    host_repeats: int
    device_launches: int
    device_repeats: int
    import_runs: int
    first_op_runs: int


def make_config(sim, quick):
    """Iteration counts: the simulated device runs kernels in Triton's interpreter, ~1 ms per program."""
    if sim:
        return Config(sim, host_calls=20 if quick else 50, host_repeats=1 if quick else 3,
                      device_launches=2 if quick else 5, device_repeats=1 if quick else 3,
                      import_runs=3 if quick else 5, first_op_runs=1 if quick else 3)
    return Config(sim, host_calls=500, host_repeats=15 if quick else 90,  # see timing.host_us_per_call
                  device_launches=5 if quick else 20, device_repeats=3 if quick else 5,
                  import_runs=3 if quick else 5, first_op_runs=2 if quick else 3)


def _new_row(key, kind, name, shape):
    return {"key": key, "kind": kind, "name": name, "shape": list(shape),
            "unit": {HOST: "us", DEVICE: "s"}.get(kind, "s"),
            "time": {}, "gbps": {}, "errors": {}, "ratios": {}}


def run_case(case, fws, cfg):
    """One row: each framework timed; a framework that fails is recorded and the rest still run."""
    shape = case.shape(cfg.sim)
    row = _new_row(case.key, case.kind, case.name, shape)
    if case.kind == HOST:
        _time_host(case, fws, cfg, row)
    else:
        for fw in fws:
            try:
                fn = case.build(fw, cfg.sim)
                row["time"][fw.name] = device_s_per_launch(fn, fw, cfg.device_launches, cfg.device_repeats)
            except Exception as exc:  # the package under test may lack an op: report it, go on
                row["errors"][fw.name] = report.error_text(exc)
            fn = None  # free this framework's inputs before the next one allocates
        moved = case.bytes_per_element * math.prod(shape)
        row["bytes"] = moved
        row["gbps"] = {name: moved / t / 1e9 for name, t in row["time"].items()}
    return _with_ratios(row)


def _time_host(case, fws, cfg, row):
    """Small inputs: every framework's at once, timed in turns (timing.host_us_per_call)."""
    setups = {fw.name: (lambda fw=fw: (case.build(fw, cfg.sim), fw.synchronize)) for fw in fws}
    report.add_times(row, *host_us_per_call(setups, cfg.host_calls, cfg.host_repeats))


def _with_ratios(row):
    """Speed ratios baseline_time / minitensor_time."""
    mt = row["time"].get("minitensor")
    for name, t in row["time"].items():
        if name != "minitensor" and mt:
            row["ratios"][f"mt_vs_{name}"] = t / mt
    return row


def run_startup(key, fws, cfg):
    row = _new_row(key, "startup", STARTUP_CASES[key], ())
    for name in (fw.name for fw in fws if fw.name in startup.MODULES):
        try:
            if key == "startup.import":
                row["time"][name] = startup.import_s(name, cfg.import_runs)
            else:
                row["time"][name] = startup.first_op_s(name, cfg.first_op_runs)
        except Exception as exc:  # a broken child process is a result too
            row["errors"][name] = report.error_text(exc)
    return _with_ratios(row)


def _selected(key, name, only):
    return only is None or only.lower() in key.lower() or only.lower() in name.lower()


def _device_name(mt):
    try:
        return mt.cuda.get_device_name()
    except Exception as exc:  # informational only
        return f"unknown ({report.error_text(exc)})"


def meta(mt, fws, args, cfg):
    return {
        "backend": mt.cuda.backend(), "device": _device_name(mt), "quick": args.quick, "only": args.only,
        "frameworks": {fw.name: fw.version for fw in fws},
        "python": sys.version.split()[0], "platform": platform.platform(),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "config": cfg.__dict__, "ratio": report.RATIO_HELP,
        "units": "host: us per call; device: s per launch and GB/s (bytes read + written); startup: s; "
                 "graphs, history, expandable, users' kernels: each row's own unit",
    }


def print_results(info, rows, verdicts, sim):
    by_key = {r["key"]: r for r in rows}
    print(f"minitensor bench: backend={info['backend']} device={info['device']} quick={info['quick']}")
    print("frameworks: " + ", ".join(f"{n} {v}" for n, v in info["frameworks"].items()))
    if sim:
        print("simulated device: sizes scaled down, no torch/CuPy baselines, figures are not GPU speeds")
    print(report.RATIO_HELP)
    sections = [
        (HOST, report.host_section), (DEVICE, report.device_section), ("startup", report.startup_section),
        (serialization.KIND, serialization.section), (allocator.KIND, allocator.section),
        (copies.KIND, copies.section), (graphs.KIND, graphs.section), (history.KIND, history.section),
        (expandable.KIND, expandable.section), (user_kernels.KIND, user_kernels.section),
    ]
    for kind, section in sections:
        selected = [r for r in rows if r["kind"] == kind]
        if selected:
            print()
            print(section(selected, verdicts))
            if kind == DEVICE:
                print(report.add_vs_copy_line(by_key))
    errors = report.errors_section(rows)
    if errors:
        print()
        print(errors)


def print_summary(data):
    """The targets of an earlier run; before them its CUDA graph rows, whose "eager vs graph per op" and
    allocation check no target holds, and its memory history and expandable segments rows (the settings and
    torch's figures beside the targets')."""
    for kind, section in ((graphs.KIND, graphs.section), (history.KIND, history.section),
                          (expandable.KIND, expandable.section), (user_kernels.KIND, user_kernels.section)):
        rows = [r for r in data.get("results", []) if r["kind"] == kind]
        if rows:
            print(section(rows, data["targets"]))
            print()
    print(report.summary(data["targets"]))


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer iterations")
    p.add_argument("--only", metavar="NAME", help="run only cases whose key or name contains NAME")
    p.add_argument("--json", metavar="PATH", default="bench-results.json", help="where to write all numbers")
    p.add_argument("--summary", metavar="PATH", help="print the target summary of an earlier run's JSON and exit")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.summary:
        with open(args.summary) as f:
            print_summary(json.load(f))
        return 0
    mt_fw = frameworks.minitensor()
    backend = mt_fw.module.cuda.backend()
    sim = backend == "sim"
    cfg = make_config(sim, args.quick)
    fws = [mt_fw, *frameworks.baselines(backend)]

    rows = [run_case(c, fws, cfg) for c in CASES if _selected(c.key, c.name, args.only)]
    rows += [run_startup(k, fws, cfg) for k, name in STARTUP_CASES.items() if _selected(k, name, args.only)]
    rows += [_with_ratios(r) for r in serialization.run(fws, sim, 1 if sim or args.quick else 3,
                                                         lambda k, n: _selected(k, n, args.only), _new_row)]
    rows += allocator.run(fws, sim, lambda k, n: _selected(k, n, args.only), _new_row)
    rows += copies.run(fws, sim, lambda k, n: _selected(k, n, args.only), _new_row)
    rows += graphs.run(fws, sim, args.quick, lambda k, n: _selected(k, n, args.only), _new_row)
    rows += history.run(fws, sim, args.quick, lambda k, n: _selected(k, n, args.only), _new_row)
    rows += expandable.run(fws, sim, lambda k, n: _selected(k, n, args.only), _new_row)
    rows += user_kernels.run(fws, sim, lambda k, n: _selected(k, n, args.only), _new_row)
    verdicts = evaluate({r["key"]: r for r in rows}, sim)
    info = meta(mt_fw.module, fws, args, cfg)

    print_results(info, rows, verdicts, sim)
    with open(args.json, "w") as f:
        json.dump({"meta": info, "results": rows, "targets": verdicts}, f, indent=2)
    print(f"\nwrote {args.json}\n")
    print(report.summary(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
