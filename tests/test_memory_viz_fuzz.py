"""The memory viewer's fuzz target (tests/memory_viz_fuzz.py), run in a child process capped at 2 GiB of address
space, so that a crash or a runaway allocation is a failure here, not the end of the test run.

By default it runs MINITENSOR_FUZZ_SECONDS=4 seconds of cases from seed MINITENSOR_VIZ_FUZZ_SEED=5; set them for a
longer run (`MINITENSOR_FUZZ_SECONDS=600 pytest tests/test_memory_viz_fuzz.py`). A finding names its case, which
`python tests/memory_viz_fuzz.py --seed S --case N --save f.pickle` writes out.
"""
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout

import memory_viz_fuzz
from helpers import REPO
from minitensor import memory_viz


def test_mutated_snapshots_render_or_fail_in_one_line():
    seconds = float(os.environ.get("MINITENSOR_FUZZ_SECONDS", 4))
    seed = os.environ.get("MINITENSOR_VIZ_FUZZ_SEED", "5")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "memory_viz_fuzz.py"), "--seconds", str(seconds),
                        "--seed", seed], env=env, capture_output=True, text=True,
                       timeout=seconds + memory_viz_fuzz.HANG_SECONDS + 120)
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    if p.returncode and not (lines and lines[-1].get("summary")):  # killed by a signal, or by the hang watchdog
        last = lines[-1]["case"] if lines else None
        raise AssertionError(f"the viewer died (exit {p.returncode}) on case {last} of seed {seed}; reproduce with "
                             f"`python tests/memory_viz_fuzz.py --seed {seed} --case {last}`\n{p.stderr[-3000:]}")
    summary = lines[-1]
    assert summary["findings"] == [], json.dumps(summary["findings"][:20], indent=1)
    assert summary["cases"] >= 10 * seconds, summary  # tens per second here: the loop really ran
    outcomes = set(summary["outcomes"])
    assert {"value / rendered", "value / SnapshotError", "bytes / SnapshotError", "hostile / SnapshotError",
            "hostile / rendered"} <= outcomes, summary["outcomes"]


def test_the_fuzz_target_reports_what_is_not_clean(monkeypatch):
    """A viewer raising KeyError is a finding, as is a page with the snapshot's markup in it; one case replays alone
    from its number."""
    def broken(source):
        raise KeyError("a bug")

    monkeypatch.setattr(memory_viz, "render", broken)
    out = io.StringIO()
    with redirect_stdout(out):
        assert memory_viz_fuzz.main(["--seed", "3", "--case", "5", "--memory", "0"]) == 1
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["cases"] == 1 and summary["findings"][0]["case"] == 5
    assert summary["findings"][0]["error"] == "KeyError: 'a bug'"
    monkeypatch.setattr(memory_viz, "render", lambda source: "<script></script><script></script><img src=x>")
    with redirect_stdout(io.StringIO()):
        assert memory_viz_fuzz.main(["--seed", "3", "--case", "5", "--memory", "0"]) == 1
