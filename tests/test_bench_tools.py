"""bench.breakdown and bench.compare, in their quick modes: they reach into minitensor's internals (the launcher's
compiled kernels, the plan caches, the allocator), so a change there that breaks them fails here, not on the
next GPU run that needs them."""
import os
import re
import subprocess
import sys

import pytest

import minitensor as mt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# rows whose figures bench.compare compares
ROWS = ["launch of the add kernel", "a + b", "a < b", "a.exp()", "add(out=)", "a.add_(b)", "a.sum()",
        "allocator alloc+free 4 KiB", "storage alloc+free 4 KiB", "Tensor(storage, ...)+del", "empty(1024)+del",
        "pinned empty(1 MiB)+del", "current_stream()", "Event().record()", "a + b (no-op launch)"]


def _run(*args):
    env = dict(os.environ, MINITENSOR_BACKEND=mt.cuda.backend())
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"python -m {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_breakdown_measures_every_row():
    out = _run("bench.breakdown", "--quick")
    assert " n/a (" not in out and "Traceback" not in out, out
    for row in ROWS:
        assert re.search(rf"^{re.escape(row)}\s+[\d.]+ us$", out, re.MULTILINE), f"no row {row!r} in:\n{out}"
    assert "function calls" in out  # the profile
    assert re.search(r"^start-up: import [\d.]+ms", out, re.MULTILINE), out


def test_compare_measures_both_trees():
    out = _run("bench.compare", REPO, "--quick")
    for row in ROWS:
        assert re.search(rf"^{re.escape(row)}\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.MULTILINE), \
            f"no row {row!r} compared in:\n{out}"


def test_compare_takes_a_git_revision(tmp_path):
    """The other tree may be a revision, taken with git archive (the work tree left alone)."""
    if subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: only folders can be compared")
    code = f"from bench.compare import _tree; print(_tree('HEAD', {str(tmp_path)!r}))"
    folder = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    assert os.path.isfile(os.path.join(folder, "minitensor", "__init__.py"))
    assert os.path.isfile(os.path.join(folder, "kernels", "launcher.py"))
