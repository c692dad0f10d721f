"""The loader fuzz target (tests/loader_fuzz.py), run in a child process capped at 2 GiB of address space.

By default it runs MINITENSOR_FUZZ_SECONDS=20 seconds of cases from seed MINITENSOR_FUZZ_SEED=17; set them
for a longer run (`MINITENSOR_FUZZ_SECONDS=600 pytest tests/test_loader_fuzz.py`). A finding names its case,
which `python tests/loader_fuzz.py --seed S --case N --save f.bin` writes out.
"""
import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout

import loader_fuzz
import minitensor as mt
from helpers import REPO


def test_mutated_checkpoints_load_or_fail_cleanly():
    seconds = float(os.environ.get("MINITENSOR_FUZZ_SECONDS", 20))
    seed = os.environ.get("MINITENSOR_FUZZ_SEED", "17")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), MINITENSOR_BACKEND="sim")
    p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "loader_fuzz.py"), "--seconds", str(seconds),
                        "--seed", seed], env=env, capture_output=True, text=True,
                       timeout=seconds + loader_fuzz.HANG_SECONDS + 120)
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    if p.returncode and not lines[-1].get("summary"):  # killed by a signal, or by the hang watchdog
        raise AssertionError(f"the loader died (exit {p.returncode}) on case {lines[-1]['case']} of seed {seed}; "
                             f"reproduce with `python tests/loader_fuzz.py --seed {seed} --case {lines[-1]['case']}`"
                             f"\n{p.stderr[-3000:]}")
    summary = lines[-1]
    assert summary["findings"] == [], json.dumps(summary["findings"][:20], indent=1)
    assert summary["cases"] >= 20 * seconds, summary  # a few hundred per second here: the loop really ran
    outcomes = {key.split(" / ")[0] + " / " + key.split(" / ")[2] for key in summary["outcomes"]}
    assert {"zip / loaded", "zip / UnpicklingError", "zip / RuntimeError", "safetensors / loaded",
            "safetensors / SafetensorError"} <= outcomes, summary["outcomes"]


def test_the_fuzz_target_reports_an_unclean_exception(monkeypatch):
    """A loader raising KeyError is a finding, and one case replays alone from its number."""
    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(mt, "load", broken)
    monkeypatch.setattr(mt, "load_safetensors", broken)
    out = io.StringIO()
    with redirect_stdout(out):
        assert loader_fuzz.main(["--seed", "3", "--case", "5", "--memory", "0"]) == 1
    summary = json.loads(out.getvalue().splitlines()[-1])
    assert summary["cases"] == 1 and summary["findings"][0]["case"] == 5
    assert summary["findings"][0]["error"] == "KeyError: 'a bug'"
