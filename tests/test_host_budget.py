"""The host cost of the hot ops held to a budget per backend (tests/budgets/<backend>.json), as counts of calls
(Python functions, built-ins, driver methods, kernel launches, cuda-bindings functions) per op in steady state,
which timing noise cannot blur: tests/host_calls.py counts them in a fresh process. A count above its budget
fails; one below it asks, in a warning, for the budget to be lowered (`python tests/host_calls.py --write`)."""
import json
import os
import subprocess
import sys
import warnings

import pytest

import host_calls
import minitensor as mt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _measure(tmp_path, backend):
    """The counts of tests/host_calls.py, measured in a fresh process on `backend`."""
    path = tmp_path / "counts.json"
    env = dict(os.environ, MINITENSOR_BACKEND=backend)
    proc = subprocess.run([sys.executable, host_calls.__file__, "--json", str(path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"tests/host_calls.py failed:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(path.read_text()), proc.stdout


@pytest.mark.parametrize("backend", ["sim", "nvidia"])
def test_hot_ops_stay_within_their_budget(tmp_path, backend):
    if mt.cuda.backend() != backend:
        pytest.skip(f"the {backend} budget is checked on the {backend} backend (this is {mt.cuda.backend()})")
    path = host_calls.budget_path(backend)
    write = f"MINITENSOR_BACKEND={backend} python tests/host_calls.py --write"
    if not os.path.exists(path):
        pytest.fail(f"{os.path.relpath(path, REPO)} is missing: on a machine with the {backend} backend (a GPU "
                    f"for nvidia), run `{write}` from the repository root and commit the file")
    with open(path) as f:
        budget = json.load(f)
    result, table = _measure(tmp_path, backend)
    assert not result["unsteady"], f"counts that differ between two windows of the same op: {result['unsteady']}"
    grown, shrunk = host_calls.compare(result["ops"], budget["ops"])
    if shrunk:
        warnings.warn(f"host calls below the budget: lower it with `{write}`: " + "; ".join(shrunk))
    if grown:
        details = "\n".join(f"{name}:\n" + "\n".join(f"  {v:g}  {k}" for k, v in result["detail"][name].items())
                            for name in sorted({line.split(":")[0] for line in grown} & set(result["detail"])))
        version = ("" if budget.get("python") == result["python"] else
                   f" (the budget was written under Python {budget.get('python')}, this is {result['python']}: "
                   "the counts of built-in calls may differ between versions)")
        pytest.fail("host calls above the budget" + version + ":\n" + "\n".join(grown) +
                    f"\n\nThe counts (budget where it differs):\n{table}\n{details}\n\nIf the growth is "
                    f"intended, update the budget with `{write}`.")


def test_a_call_added_on_a_hot_path_is_counted():
    """The counts see what a regression adds, even through a bound method cached at warm-up: a driver call
    (in a fresh process, so the counting of the budget test above is not disturbed)."""
    code = f"""
import sys
sys.path.insert(0, {os.path.dirname(host_calls.__file__)!r})
import host_calls

def ops(mt):
    query = mt.backends.active_driver().stream_query  # cached, as a hot path caches its bound methods
    current = mt.cuda.current_stream
    return {{"current_stream()": lambda: current(), "query + current_stream()": lambda: (query(0), current())}}

counts = host_calls.measure(iterations=5, make_ops=ops)["ops"]
print(counts["query + current_stream()"]["driver_calls"] - counts["current_stream()"]["driver_calls"])
"""
    env = dict(os.environ, MINITENSOR_BACKEND=mt.cuda.backend())
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert float(proc.stdout.split()[-1]) == 1
