"""Host time of the hot ops in this checkout against another commit's, measured in turns on this machine: a
change that must stay "within 5% of commit X" is held to it on the same device, in the same run.

    python -m bench.compare X [--rounds 3] [--bench NAME ...] [--quick]

X is a git revision of this repository (its files are taken with `git archive`, the work tree left as it is)
or a folder holding another tree's files. Each tree's package is laid out as pip installs it (kernels/ and
allocator/ inside minitensor/) in a temporary folder, beside this checkout's bench/: the same measuring code
runs on both packages (another commit's own bench may have rotted), `python -m bench.breakdown` and, for each
--bench NAME, `python -m bench --only NAME` (e.g. startup, pinned), in fresh processes, the two trees
alternating. The table gives each row's best time over the rounds and the ratio. The breakdown launches real
kernels, so run it on a GPU: on the simulator every launch runs Triton's interpreter.
"""
import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

from bench.table import table

_ROW = re.compile(r"^(.*?)\s+([\d.]+) us$")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PACKAGES = ("kernels", "allocator")  # top-level folders of the repository installed inside minitensor/


def _lay_out(tree, folder):
    """`tree`'s minitensor package, as an install places it, and this checkout's bench/, in `folder`."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(os.path.join(tree, "minitensor"), os.path.join(folder, "minitensor"), ignore=ignore)
    for package in _PACKAGES:
        if os.path.isdir(os.path.join(tree, package)):
            shutil.copytree(os.path.join(tree, package), os.path.join(folder, "minitensor", package), ignore=ignore)
    shutil.copytree(os.path.join(_REPO, "bench"), os.path.join(folder, "bench"), ignore=ignore)


def _tree(other, work):
    """A folder holding `other`'s files: `other` itself when it is one, else the git revision's files."""
    if os.path.isdir(other):
        return os.path.abspath(other)
    proc = subprocess.run(["git", "-C", _REPO, "archive", "--format=tar", other], capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"bench.compare: {other!r} is neither a folder nor a revision git archive takes: "
                         f"{proc.stderr.decode().strip()}")
    folder = os.path.join(work, "archive")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(folder, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return folder


# `python -m MODULE ARGS` without an editable install's finder, which would hand a module the folder's tree lacks
# from this checkout instead (the folder's package comes first on sys.path, its submodules only from it)
_ISOLATED = """import runpy, sys
sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")]
sys.argv[:] = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)"""


def _run(folder, module, args, what):
    """`python -m MODULE ARGS` in `folder`, on the folder's package alone."""
    proc = subprocess.run([sys.executable, "-c", _ISOLATED, module, *args], cwd=folder, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} in {folder} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc


def _breakdown(folder, quick, log):
    """{row: microseconds} of one `python -m bench.breakdown` run in `folder`; its whole output goes to `log`
    (a path, or None) too: the profile, import times and start-up stages it prints are worth reading."""
    proc = _run(folder, "bench.breakdown", ["--quick"] if quick else [], "bench.breakdown")
    if log:
        with open(log, "w") as f:
            f.write(proc.stdout + proc.stderr)
    return {m.group(1).strip(): float(m.group(2)) for m in map(_ROW.match, proc.stdout.splitlines()) if m}


def _bench(folder, only, quick):
    """{case name (unit): minitensor's time} of one `python -m bench --only ONLY` run in `folder`."""
    path = os.path.join(folder, "bench.json")
    _run(folder, "bench", ["--only", only, "--json", path, *(["--quick"] if quick else [])], f"bench --only {only}")
    with open(path) as f:
        rows = json.load(f)["results"]
    return {f"{r['name']} ({r['unit']})": r["time"]["minitensor"] for r in rows if "minitensor" in r["time"]}


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("other", help="a git revision (e.g. HEAD, main~3) or a folder holding another tree")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bench", action="append", default=[], metavar="NAME",
                        help="also compare `python -m bench --only NAME`'s minitensor times")
    parser.add_argument("--logs", metavar="DIR", help="keep each breakdown's output in DIR")
    parser.add_argument("--quick", action="store_true", help="one round of the quick breakdown and bench")
    args = parser.parse_args(argv)
    rounds = 1 if args.quick else args.rounds
    with tempfile.TemporaryDirectory() as work:
        trees = {"this": os.path.join(work, "this"), "other": os.path.join(work, "other")}
        _lay_out(_REPO, trees["this"])
        _lay_out(_tree(args.other, work), trees["other"])
        best = {name: {} for name in trees}
        for round_ in range(rounds):
            for name, folder in trees.items():
                log = args.logs and os.path.join(args.logs, f"breakdown-{name}-{round_}.log")
                times = _breakdown(folder, args.quick, log)
                for only in args.bench:
                    times.update(_bench(folder, only, args.quick))
                for row, t in times.items():
                    best[name][row] = min(t, best[name].get(row, t))
    rows = [[row, f"{best['this'][row]:.4g}", f"{best['other'].get(row, float('nan')):.4g}",
             f"{best['this'][row] / best['other'][row]:.3f}" if best["other"].get(row) else "-"]
            for row in best["this"]]
    print(f"this: {_REPO}   other: {args.other}   rounds: {rounds}")
    print(table(["time (best of rounds; breakdown rows in us)", "this", "other", "this / other"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
