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
    from minitensor import ops, pointwise
    from minitensor.cuda.streams import current_stream_handle
    from minitensor.storage import UntypedStorage
    a = mt.ones(1024, device="cuda")
    b = mt.ones(1024, device="cuda")
    c = mt.empty(1024, device="cuda")
    a + b
    mt.add(a, b, out=c)
    mt.cuda.synchronize()
    plan = ops.plans().binary_plan(0, mt.float32, mt.float32, mt.float32, (1024,), (1,), (1,), (1,), mt.float32, 0)
    pa, pb, pc = a.data_ptr(), b.data_ptr(), c.data_ptr()
    stream = current_stream_handle(0)
    allocator = mt.cuda.memory.allocator(0)
    dev = a.device
    from minitensor.backends import active_driver
    from minitensor.kernels import launcher
    import ctypes
    cur = ctypes.c_void_p()
    ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent(ctypes.byref(cur))
    print("current ctx", cur.value, "primary ctx", int(active_driver()._contexts[0]))
    fast = [v for k, v in launcher._compiled.items() if k[0] == "elementwise.binary_contiguous"]
    spin = launcher.get("timing._spin_for", 0, ("i64",), ())
    rows = [
        ("Launcher direct", lambda: fast[-1](1, 1, 1, stream, pa, pb, pc, 0, 0, 1024)),
        ("Launcher spin(0)", lambda: spin(1, 1, 1, stream, 0)),
        ("mt a + b", lambda: a + b),
        ("mt add(out=)", lambda: mt.add(a, b, out=c)),
        ("mt plan.run (launch only)", lambda: plan.run(stream, (pa, pb, pc), (0, 0))),
        ("mt current_stream_handle", lambda: current_stream_handle(0)),
        ("mt storage alloc+free", lambda: UntypedStorage._allocate(4096, dev, allocator, stream)),
        ("mt empty(1024)+del", lambda: mt.empty(1024, device="cuda")),
        ("mt binary key lookup", lambda: pointwise._runs.get(("add", pointwise._key(a), pointwise._key(b), None))),
    ]
    try:
        import torch
        ta = torch.ones(1024, device="cuda")
        tb = torch.ones(1024, device="cuda")
        tc = torch.empty(1024, device="cuda")
        rows += [("torch _sleep(0)", lambda: torch.cuda._sleep(0)), ("torch a + b", lambda: ta + tb), ("torch add(out=)", lambda: torch.add(ta, tb, out=tc)),
                 ("torch empty(1024)+del", lambda: torch.empty(1024, device="cuda"))]
    except ImportError:
        pass
    for name, fn in rows:
        print(f"{name:30s} {per_call_us(fn):7.2f} us")
        mt.cuda.synchronize()
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
d = active_driver()
t3 = time.perf_counter()
d.set_device(0)
t4 = time.perf_counter()
a = mt.empty(1024, device="cuda")
t5 = time.perf_counter()
d._launcher_module()
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
