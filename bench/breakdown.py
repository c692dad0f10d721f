"""Where the host time of a small op goes, piece by piece (a diagnostic, not a target):

    python -m bench.breakdown [--quick]

Run it on a GPU: on the simulator every launch runs Triton's interpreter, so only the "(no-op launch)" rows,
where launches are replaced by a Python no-op, say something about minitensor's own host time there.
Prints a row per piece (`name   N.NN us`, which bench.compare reads), then a profile of `a + b`, the largest
import times and the start-up stages. bench.compare runs this file against other commits' packages too: a row
reaching into internals that such a tree lacks prints `n/a` with the reason, and the rest still run.
"""
import argparse
import cProfile
import math
import os
import pstats
import subprocess
import sys
import time

ADD_KERNEL = "elementwise.binary_contiguous"


def per_call_us(fn, synchronize, calls, repeats):
    """Host microseconds per call: the best of `repeats` loops of `calls` calls, the device drained (untimed)
    after each, so the launches of a loop never fill the device's queue (bench.timing says why)."""
    fn()
    synchronize()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
        synchronize()
    return best * 1e6


def _launch_entry(entry):
    """A launcher._compiled value's launch function: (launch, scratch bytes) now; older trees kept the bare
    launch, and bench.compare measures them with this file too."""
    return entry[0] if isinstance(entry, tuple) else entry


def _add_launch(mt, a, b, c):
    """A call of the launch function of `a + b`'s kernel (the first add kernel loaded), as its fast path makes it."""
    from minitensor.cuda.streams import current_stream_handle
    from minitensor.kernels import launcher
    key, entry = next((k, v) for k, v in launcher._compiled.items() if k[0] == ADD_KERNEL)
    launch, grid, n = _launch_entry(entry), -(-a.numel() // key[3][-1]), a.numel()  # the last constexpr: BLOCK
    stream, pa, pb, pc = current_stream_handle(0), a.data_ptr(), b.data_ptr(), c.data_ptr()
    return [("launch of the add kernel", lambda: launch(grid, 1, 1, stream, pa, pb, pc, 0, 0, n))]


def _allocator_rows(mt, c):
    """The allocator, a storage and a Tensor, each made and dropped: the pieces of an op's output."""
    from minitensor.core import fields
    from minitensor.cuda.streams import current_stream_handle
    from minitensor.tensor import Tensor
    stream, allocator, dev, storage = current_stream_handle(0), mt.cuda.memory.allocator(0), c.device, \
        c.untyped_storage()
    return [("allocator alloc+free 4 KiB", lambda: allocator.free(allocator.alloc(4096, stream))),
            ("storage alloc+free 4 KiB", lambda: fields.allocate(4096, dev, allocator, stream)),
            ("Tensor(storage, ...)+del", lambda: Tensor(storage, (1024,), (1,), 0, mt.float32)),
            ("current_stream_handle", lambda: current_stream_handle(0))]


def _torch_rows():
    """torch's figures beside them, where torch has a GPU."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    ta, tb, tc = torch.ones(1024, device="cuda"), torch.ones(1024, device="cuda"), torch.empty(1024, device="cuda")
    return [("torch a + b", lambda: ta + tb, torch.cuda.synchronize),
            ("torch a < b", lambda: ta < tb, torch.cuda.synchronize),
            ("torch add(out=)", lambda: torch.add(ta, tb, out=tc), torch.cuda.synchronize),
            ("torch empty(1024)+del", lambda: torch.empty(1024, device="cuda"), torch.cuda.synchronize)]


def _print_rows(rows, synchronize, calls, repeats, suffix=""):
    for name, fn, *sync in rows:
        try:
            us = per_call_us(fn, sync[0] if sync else synchronize, calls, repeats)
        except Exception as exc:  # another tree's package may lack what a row calls
            print(f"{name + suffix:38s} n/a ({type(exc).__name__}: {exc})")
        else:
            print(f"{name + suffix:38s} {us:8.2f} us")


def _internal(name, build, *args):
    """`build(*args)`'s rows, or one row saying why there are none (a tree without these internals)."""
    try:
        return build(*args)
    except Exception as exc:
        print(f"{name:38s} n/a ({type(exc).__name__}: {exc})")
        return []


def _with_noop_launches(ops, synchronize, calls, repeats):
    """The ops again with every kernel launch replaced by a Python no-op: the host time that is minitensor's own.
    The launches and the caches holding them are restored afterwards."""
    from minitensor.kernels import launcher, plans
    from minitensor.ops import pointwise
    caches = [plans.binary_plan, plans.unary_plan, plans.ternary_plan]
    noop = lambda *args: None  # noqa: E731
    saved = dict(launcher._compiled)
    try:
        for key, entry in saved.items():
            launcher._compiled[key] = (noop, *entry[1:]) if isinstance(entry, tuple) else noop
        for cache in caches:
            cache.cache_clear()
        pointwise._runs.clear()
        _print_rows([("no-op call", lambda: noop(1, 1, 1, 0, 1, 2, 3, 0, 0, 1024)), *ops], synchronize, calls,
                    repeats, " (no-op launch)")
    finally:
        launcher._compiled.update(saved)
        for cache in caches:
            cache.cache_clear()
        pointwise._runs.clear()


def _profile(fn, synchronize, n):
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def _import_times():
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import minitensor"], capture_output=True,
                         text=True).stderr.splitlines()
    rows = sorted((int(line.split("|")[1]), line) for line in out if line.startswith("import time:") and "|" in line
                  and line.split("|")[1].strip().isdigit())
    print("\n".join(line for _, line in rows[-15:]))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.breakdown", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few calls per row (a check that it runs)")
    args = parser.parse_args(argv)
    import minitensor as mt
    sim = mt.cuda.backend() == "sim"
    # on a GPU 20000 calls a row; on the simulator each launch interprets the kernel (milliseconds)
    calls, repeats, profiled = {(False, False): (500, 40, 20000), (False, True): (100, 3, 500),
                                (True, False): (20, 3, 50), (True, True): (5, 1, 10)}[sim, args.quick]
    print(f"minitensor from {os.path.dirname(mt.__file__)}, backend {mt.cuda.backend()}, {calls} calls x "
          f"{repeats} loops a row")
    a, b, c = mt.rand(1024, device="cuda"), mt.rand(1024, device="cuda"), mt.empty(1024, device="cuda")
    ops = [("a + b", lambda: a + b), ("a < b", lambda: a < b), ("a.exp()", lambda: a.exp()),
           ("add(out=)", lambda: mt.add(a, b, out=c))]
    for _, fn in ops:
        fn()
    mt.cuda.synchronize()
    rows = [*_internal("launch of the add kernel", _add_launch, mt, a, b, c), *ops,
            ("a.add_(b)", lambda: a.add_(b)), ("a.sum()", lambda: a.sum()),
            *_internal("allocator, storage, Tensor", _allocator_rows, mt, c),
            ("empty(1024)+del", lambda: mt.empty(1024, device="cuda")),
            ("pinned empty(1 MiB)+del", lambda: mt.empty(1 << 18, pin_memory=True)),
            ("current_stream()", lambda: mt.cuda.current_stream()),
            ("Event().record()", lambda: mt.cuda.Event().record()),
            *_torch_rows()]
    _print_rows(rows, mt.cuda.synchronize, calls, repeats)
    _internal("(no-op launch) rows", _with_noop_launches, ops, mt.cuda.synchronize, calls, repeats)
    _profile(lambda: a + b, mt.cuda.synchronize, profiled)
    _import_times()
    stages = subprocess.run([sys.executable, "-c", _STAGES], capture_output=True, text=True)
    print(stages.stdout, stages.stderr[-2000:])
    return 0


_STAGES = """
import time
t0 = time.perf_counter()
import minitensor as mt
t1 = time.perf_counter()
from cuda.bindings import driver
t2 = time.perf_counter()
from minitensor.backends import active_driver
from minitensor.kernels import launcher
d = active_driver()
t3 = time.perf_counter()
d.set_device(0)
t4 = time.perf_counter()
a = mt.empty(1024, device="cuda")
t5 = time.perf_counter()
if not d.interprets_kernels:  # the simulator has no C launcher
    launcher.native()
t6 = time.perf_counter()
a.fill_(1)
t7 = time.perf_counter()
c = a + a
t8 = time.perf_counter()
mt.cuda.synchronize()
t9 = time.perf_counter()
import sys
names = ["import", "cuda-bindings", "driver init", "context", "first malloc", "C launcher", "fill", "add", "sync"]
times = [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, t7 - t6, t8 - t7, t9 - t8]
print("start-up:", "  ".join(f"{n} {t * 1000:.1f}ms" for n, t in zip(names, times)),
      "| triton imported:", "triton" in sys.modules)
"""

if __name__ == "__main__":
    sys.exit(main())
