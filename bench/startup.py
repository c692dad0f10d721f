"""Start-up costs, each measured in a fresh Python process so nothing is already imported or cached in memory.

torch is measured the same way when it is a baseline: it shows what creating the CUDA context costs anyway.

minitensor's sources are compiled to bytecode first, as `pip install` does for a regular install: an editable
install under PYTHONDONTWRITEBYTECODE (set on some machines) would otherwise compile every module in every
child, and that is not what a user's import costs.
"""

import compileall
import importlib
import json
import statistics
import subprocess
import sys

# Times are taken inside the child, so the interpreter's own start-up is not counted.
# minitensor and torch spell this first op the same way.
_SCRIPT = """
import json, time
t0 = time.perf_counter()
import {module} as m
t1 = time.perf_counter()
first_op_s = None
if {first_op}:
    a = m.ones(1024, device="cuda")
    b = m.ones(1024, device="cuda")
    c = a + b
    m.cuda.synchronize()
    first_op_s = time.perf_counter() - t1
print(json.dumps({{"import_s": t1 - t0, "first_op_s": first_op_s}}))
"""

STARTUP_CASES = {
    "startup.import": "import",
    "startup.first_op": "first a + b, fresh process",
}
MODULES = ("minitensor", "torch")  # the frameworks these cases run for


def _child(module, first_op):
    """Run one fresh process and return its timings."""
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(module=module, first_op=first_op)],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"child exited {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_bytecode(module):
    """Bytecode for every source of minitensor (its kernels and allocator live in folders of their own, see
    pyproject.toml); the baselines are regular installs, compiled when installed."""
    if module != "minitensor":
        return
    for package in ("minitensor", "minitensor.kernels", "minitensor.allocator"):
        for folder in importlib.import_module(package).__path__:
            compileall.compile_dir(folder, quiet=1)


def import_s(module, runs):
    """Median wall time of `import module` over `runs` fresh processes, its bytecode compiled first."""
    compile_bytecode(module)
    return statistics.median(_child(module, False)["import_s"] for _ in range(runs))


def first_op_s(module, runs):
    """Median time from after the import to a finished first `a + b` on cuda, context creation included.

    One unmeasured child runs first so Triton's disk cache (kernels, C launcher) is warm,
    which is the state a user's second and later programs start in.
    """
    compile_bytecode(module)  # the first op imports more of the package
    _child(module, True)
    return statistics.median(_child(module, True)["first_op_s"] for _ in range(runs))
