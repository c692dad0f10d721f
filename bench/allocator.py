"""Device allocator benchmarks.

- Host latency (cases in bench/cases.py): `caching_allocator_alloc` + `caching_allocator_delete` of 4 KiB, a
  cache hit, and `empty(4096)` + `del`, for minitensor, torch and CuPy (its memory pool).
- Fragmentation: allocation traces (sizes, frees and streams, generated in bench/traces.py) replayed through
  minitensor's and torch's caching allocators with `caching_allocator_alloc/delete`; each reports the peak
  reserved bytes above what was reserved before, next to the trace's own peak of live bytes (the floor).

Traces run at full size on a GPU and scaled down 16x on the simulated device (whose memory is 4 GiB).
"""
from bench.table import table
from bench.traces import MiB, TRACES

KIND = "memory"
SIM_SCALE = 1 / 16


# ---------------------------------------------------------------------------- host latency cases
def alloc_pair(m, x):
    """minitensor and torch spell it the same."""
    alloc, delete = m.cuda.caching_allocator_alloc, m.cuda.caching_allocator_delete
    return lambda: delete(alloc(4096))


def cupy_alloc_pair(cp, x):
    alloc = cp.cuda.alloc  # a MemoryPointer from the default pool; dropping it gives the memory back
    return lambda: alloc(4096)


def empty_del(m, x):
    empty = m.empty
    return lambda: empty(4096, device="cuda")


def cupy_empty_del(cp, x):
    empty, f32 = cp.empty, cp.float32
    return lambda: empty(4096, dtype=f32)


# ---------------------------------------------------------------------------- traces (bench/traces.py), replayed
def live_peak(ops):
    """The most bytes the trace itself holds at once."""
    sizes, live, peak = {}, 0, 0
    for op in ops:
        if op[0] == "alloc":
            sizes[op[1]] = op[2]
            live += op[2]
            peak = max(peak, live)
        else:
            live -= sizes.pop(op[1])
    return peak


def peak_reserved(m, ops):
    """Replay `ops` through module `m` (minitensor or torch: the same calls) and return the peak reserved
    bytes above what was reserved before."""
    cuda = m.cuda
    streams = {0: cuda.default_stream(), 1: cuda.Stream()}
    alloc, delete = cuda.caching_allocator_alloc, cuda.caching_allocator_delete
    cuda.synchronize()
    cuda.empty_cache()
    cuda.reset_peak_memory_stats()
    base = cuda.memory_reserved()
    live = {}
    try:
        for op in ops:
            if op[0] == "alloc":
                live[op[1]] = alloc(op[2], stream=streams[op[3]])
            else:
                delete(live.pop(op[1]))
    finally:
        for ptr in live.values():
            delete(ptr)
    peak = cuda.max_memory_reserved() - base
    cuda.empty_cache()
    return peak


def run(fws, sim, selected, new_row):
    """One row per selected trace: peak reserved bytes per framework (CuPy has no such API: not run)."""
    rows = []
    for trace in TRACES:
        if not selected(trace.key, trace.name):
            continue
        ops = trace.make(SIM_SCALE if sim else 1.0)
        row = new_row(trace.key, KIND, trace.name, (len(ops),))
        row["unit"] = "bytes"
        row["live_peak"] = live_peak(ops)
        row["peak_reserved"] = {}
        for fw in (fw for fw in fws if fw.name in ("minitensor", "torch")):
            try:
                row["peak_reserved"][fw.name] = peak_reserved(fw.module, ops)
            except Exception as exc:  # one framework failing still leaves the other's numbers
                row["errors"][fw.name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        mt, torch = row["peak_reserved"].get("minitensor"), row["peak_reserved"].get("torch")
        if mt and torch:
            row["ratios"]["mt_vs_torch"] = torch / mt
        rows.append(row)
    return rows


def section(rows, verdicts):
    header = ["fragmentation trace", "ops", "live peak MiB", "minitensor MiB", "torch MiB", "mt / torch", "target"]
    body = []
    for r in rows:
        peaks = [("ERR" if fw in r["errors"] else "n/a" if fw not in r["peak_reserved"]
                  else f"{r['peak_reserved'][fw] / MiB:.1f}") for fw in ("minitensor", "torch")]
        ratio = r["ratios"].get("mt_vs_torch")
        status = "/".join(v["status"] for v in verdicts if v["case"] == r["key"])
        body.append([r["name"], r["shape"][0], f"{r['live_peak'] / MiB:.1f}", *peaks,
                     "n/a" if ratio is None else f"{1 / ratio:.3f}", status])
    return table(header, body)
