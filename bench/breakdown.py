"""Where the host time of a small op goes, piece by piece (a diagnostic, not a target): run on a GPU with
`python -m bench.breakdown`."""
import cProfile
import pstats
import subprocess
import sys
import time


def per_call_us(fn, n=20000, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t) / n)
    return best * 1e6


def main():
    import minitensor as mt
    from minitensor.core import fields
    from minitensor.cuda.streams import current_stream_handle
    from minitensor.kernels import launcher, plans
    from minitensor.ops import pointwise
    from minitensor.tensor import Tensor
    a = mt.rand(1024, device="cuda")
    b = mt.rand(1024, device="cuda")
    c = mt.empty(1024, device="cuda")
    stream = current_stream_handle(0)
    allocator = mt.cuda.memory.allocator(0)
    dev = a.device
    storage = c.untyped_storage()
    ops = [("a + b", lambda: a + b), ("a < b", lambda: a < b), ("a.exp()", lambda: a.exp()),
           ("add(out=)", lambda: mt.add(a, b, out=c))]
    for _, fn in ops:
        fn()
    mt.cuda.synchronize()
    add_launch = next(v for k, v in launcher._compiled.items() if k[0] == "elementwise.binary_contiguous")
    pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
    rows = [("launch of the add kernel", lambda: add_launch(1, 1, 1, stream, pa, pb, pc, 0, 0, 1024)),
            *ops,
            ("allocator alloc+free 4 KiB", lambda: allocator.free(allocator.alloc(4096, stream))),
            ("storage alloc+free 4 KiB", lambda: fields.allocate(4096, dev, allocator, stream)),
            ("Tensor(storage, ...)+del", lambda: Tensor(storage, (1024,), (1,), 0, mt.float32)),
            ("empty(1024)+del", lambda: mt.empty(1024, device="cuda")),
            ("current_stream_handle", lambda: current_stream_handle(0))]
    try:
        import torch
        ta = torch.ones(1024, device="cuda")
        tb = torch.ones(1024, device="cuda")
        tc = torch.empty(1024, device="cuda")
        rows += [("torch a + b", lambda: ta + tb), ("torch a < b", lambda: ta < tb),
                 ("torch add(out=)", lambda: torch.add(ta, tb, out=tc)),
                 ("torch empty(1024)+del", lambda: torch.empty(1024, device="cuda"))]
    except ImportError:
        pass
    for name, fn in rows:
        print(f"{name:30s} {per_call_us(fn):7.2f} us")
        mt.cuda.synchronize()
    # The same ops with every kernel launch replaced by a Python no-op: the host time that is minitensor's own.
    noop = lambda *args: None  # noqa: E731
    for key in launcher._compiled:
        launcher._compiled[key] = noop
    for plan in (plans.binary_plan, plans.unary_plan, plans.ternary_plan):
        plan.cache_clear()
    pointwise._runs.clear()
    for name, fn in [("no-op call", lambda: noop(1, 1, 1, 0, 1, 2, 3, 0, 0, 1024)), *ops]:
        fn()
        print(f"{name + ' (no-op launch)':30s} {per_call_us(fn):7.2f} us")
    pointwise._runs.clear()
    launcher._compiled.clear()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20000):
        a + b
    prof.disable()
    mt.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import minitensor"], capture_output=True,
                         text=True).stderr.splitlines()
    rows = sorted((int(l.split("|")[1]), l) for l in out if l.startswith("import time:") and "|" in l
                  and l.split("|")[1].strip().isdigit())
    print("\n".join(l for _, l in rows[-15:]))
    stages = subprocess.run([sys.executable, "-c", _STAGES], capture_output=True, text=True)
    print(stages.stdout, stages.stderr[-2000:])


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
print("  ".join(f"{n} {t * 1000:.1f}ms" for n, t in zip(names, times)), "| triton imported:", "triton" in sys.modules)
"""

if __name__ == "__main__":
    main()
