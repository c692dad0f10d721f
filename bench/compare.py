"""Host time of the hot ops in this checkout against another one, measured in turns on this machine: a change
that must stay "within 5% of commit X" is held to it on the same device, in the same run.

    git archive X | tar -x -C /tmp/x         # the other commit's files
    python -m bench.compare /tmp/x [--rounds 3] [--bench NAME ...]

Each tree is laid out as pip installs it (kernels/ and allocator/ inside minitensor/) in a temporary folder and
runs its own `python -m bench.breakdown` there, and `python -m bench --only NAME` for each --bench NAME (e.g.
startup, pinned), in fresh processes, the two trees alternating. The table gives each row's best time over
the rounds and the ratio. The breakdown launches real kernels, so run it on a GPU: on the simulator every
launch runs Triton's interpreter.
"""
import json
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

from bench.table import table

_ROW = re.compile(r"^(.*?)\s+([\d.]+) us$")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _lay_out(tree, folder):
    """`tree`'s minitensor package and bench in `folder`, as an install places them."""
    shutil.copytree(os.path.join(tree, "minitensor"), os.path.join(folder, "minitensor"))
    for package in ("kernels", "allocator"):
        shutil.copytree(os.path.join(tree, package), os.path.join(folder, "minitensor", package))
    shutil.copytree(os.path.join(tree, "bench"), os.path.join(folder, "bench"))


def _breakdown(folder, log):
    """{row: microseconds} of one `python -m bench.breakdown` run in `folder`; its whole output goes to `log`
    (a path, or None) too: the profile, import times and start-up stages it prints are worth reading."""
    proc = subprocess.run([sys.executable, "-m", "bench.breakdown"], cwd=folder, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"bench.breakdown in {folder} failed:\n{proc.stderr[-2000:]}")
    if log:
        with open(log, "w") as f:
            f.write(proc.stdout + proc.stderr)
    return {m.group(1).strip(): float(m.group(2)) for m in map(_ROW.match, proc.stdout.splitlines()) if m}


def _bench(folder, only):
    """{case name (unit): minitensor's time} of one `python -m bench --only ONLY` run in `folder`."""
    path = os.path.join(folder, "bench.json")
    proc = subprocess.run([sys.executable, "-m", "bench", "--only", only, "--json", path], cwd=folder,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"bench --only {only} in {folder} failed:\n{proc.stderr[-2000:]}")
    with open(path) as f:
        rows = json.load(f)["results"]
    return {f"{r['name']} ({r['unit']})": r["time"]["minitensor"] for r in rows if "minitensor" in r["time"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", help="a folder holding the other commit's files")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench", action="append", default=[], metavar="NAME",
                        help="also compare `python -m bench --only NAME`'s minitensor times")
    parser.add_argument("--logs", metavar="DIR", help="keep each breakdown's output in DIR")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        trees = {"this": os.path.join(work, "this"), "other": os.path.join(work, "other")}
        _lay_out(_REPO, trees["this"])
        _lay_out(os.path.abspath(args.other), trees["other"])
        best = {name: {} for name in trees}
        for round_ in range(args.rounds):
            for name, folder in trees.items():
                times = _breakdown(folder, args.logs and os.path.join(args.logs, f"breakdown-{name}-{round_}.log"))
                for only in args.bench:
                    times.update(_bench(folder, only))
                for row, t in times.items():
                    best[name][row] = min(t, best[name].get(row, t))
    rows = [[row, f"{best['this'][row]:.4g}", f"{best['other'].get(row, float('nan')):.4g}",
             f"{best['this'][row] / best['other'][row]:.3f}" if row in best["other"] else "-"]
            for row in best["this"]]
    print(table(["time (best of rounds; breakdown rows in us)", "this", "other", "this / other"], rows))


if __name__ == "__main__":
    main()
