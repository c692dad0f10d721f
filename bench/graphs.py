"""CUDA graph benchmarks: a chain of small adds captured once and replayed, against the same chain run eagerly.

- replay: a chain of `add(x, b, out=y)` / `add(y, b, out=x)` (1K float32) captured in one graph, replayed many
  times between two synchronizes; the figure is the time per replay / the chain's length, in us per kernel.
  What a graph saves is the host's launch cost, so this is the device's time per tiny kernel plus the graph
  launch's share.
- eager: the same chain run op by op, timed the same way: us per op. "eager vs graph per op" is their ratio.
- capture: one capture of the chain, capture_begin (CuPy: begin_capture) to capture_end with the graph's
  instantiation, each repeat into a fresh graph object; the median, in ms (a one-off cost: no best-of).
- allocating replay: `x = x + b` captured along a chain, every intermediate from the graph's private pool;
  replayed like the first. The allocator's counters (`num_device_alloc`, `allocation.all.allocated`) are read
  before and after a batch of replays, which must allocate nothing.

Every timed loop is host-timed, with the device drained untimed before it and synchronized inside the timing
after it, so the figure holds the device's work; the frameworks take turns (timing.best_s_in_turns). Replays
and eager ops run on each framework's default stream; captures on a side stream, as CUDA requires. CuPy's
memory pool is not graph-aware: the blocks the allocating capture freed go back to its pool while the graph
still writes them, harmless here since nothing else allocates from CuPy until the graph is dropped.
"""
import gc
import statistics
from dataclasses import dataclass

from bench.report import add_times
from bench.table import table
from bench.timing import best_s_in_turns

KIND = "graphs"
N = 1024  # elements per tensor
BASELINES = ("torch", "cupy")
ALLOC_KEYS = ("num_device_alloc", "allocation.all.allocated")

REPLAY, EAGER, CAPTURE, ALLOC = "graph.replay_add_out", "graph.eager_add_out", "graph.capture", "graph.replay_alloc"
CASES = {  # key -> name, formatted with the chain's length (shorter on the simulated device)
    REPLAY: "graph replay, {} x add 1K out=",
    EAGER: "eager, {} x add 1K out=",
    CAPTURE: "graph capture, {} x add 1K",
    ALLOC: "graph replay, {} x allocating add (x = x + b)",
}
UNITS = {REPLAY: "us per kernel", EAGER: "us per op", CAPTURE: "ms per capture", ALLOC: "us per kernel"}


@dataclass(frozen=True)
class Sizes:
    chain: int  # kernels in the chain
    runs: int  # replays (eager: chain runs) between two synchronizes
    repeats: int  # timed loops; the best is kept
    captures: int  # timed captures; the median is kept


def sizes(sim, quick):
    """The simulated device runs each kernel in Triton's interpreter (~1 ms): a short chain keeps CI fast."""
    if sim:
        return Sizes(chain=4, runs=2, repeats=1, captures=3)
    return Sizes(chain=100, runs=200, repeats=5 if quick else 15, captures=5 if quick else 9)


# ---------------------------------------------------------------------------- the chains
def _inputs(fw):
    """x and b uniform in [0, 1), y uninitialised: the chain adds b about a million times at most, far from
    float32's overflow."""
    return fw.rand((N,)), fw.rand((N,)), fw.empty((N,))


def _out_chain(m, x, b, y, length):
    """add(x, b, out=y), add(y, b, out=x), ...: each kernel reads the previous one's output. minitensor, torch
    and CuPy spell `add(..., out=)` alike."""
    add = m.add

    def chain():
        for i in range(length):
            if i % 2:
                add(y, b, out=x)
            else:
                add(x, b, out=y)
    return chain


def _alloc_chain(x, b, length):
    """x = x + b, `length` times: every kernel allocates its output; returns the last."""
    def chain():
        out = x
        for _ in range(length):
            out = out + b
        return out
    return chain


def _chain(fw, allocating, length):
    """(chain, tensors to keep alive as long as a graph of it lives)."""
    x, b, y = _inputs(fw)
    chain = _alloc_chain(x, b, length) if allocating else _out_chain(fw.module, x, b, y, length)
    return chain, (x, b, y)


# ---------------------------------------------------------------------------- capture and replay
def _captured(fw, chain):
    """The chain captured into a graph, after one eager run (a kernel's first launch compiles it), and a
    function launching it once, on the default stream; the graph's outputs are kept with it."""
    chain()
    fw.synchronize()
    if fw.name == "cupy":
        stream = fw.module.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            outputs = chain()
            graph = stream.end_capture()  # instantiated here
        return graph.launch, (graph, outputs, stream)
    graph = fw.module.cuda.CUDAGraph()
    with fw.module.cuda.graph(graph):  # on a side stream
        outputs = chain()
    return graph.replay, (graph, outputs)


def _looped(fn, runs, keep):
    def loop():
        for _ in range(runs):
            fn()
    loop.keep = keep  # the graph, its inputs and outputs live as long as the loop
    return loop


def _replay_setup(fw, size, allocating, made):
    """setup() for best_s_in_turns: `size.runs` replays between an untimed and a timed synchronize."""
    def setup():
        chain, tensors = _chain(fw, allocating, size.chain)
        launch, graph = _captured(fw, chain)
        loop = made[fw.name] = _looped(launch, size.runs, (tensors, graph))
        return loop, fw.synchronize, fw.synchronize
    return setup


def _eager_setup(fw, size):
    def setup():
        chain, tensors = _chain(fw, False, size.chain)
        return _looped(chain, size.runs, tensors), fw.synchronize, fw.synchronize
    return setup


class _Captures:
    """One framework's capture contender: each timed run captures into a fresh graph object; the previous
    graph is dropped (reset) untimed, in `prepare`."""

    def __init__(self, fw, size):
        self.fw, self.m = fw, fw.module
        self.chain, self.tensors = _chain(fw, False, size.chain)
        self.chain()  # compiled and loaded before any capture
        fw.synchronize()
        self.stream = self.m.cuda.Stream(non_blocking=True) if fw.name == "cupy" else self.m.cuda.Stream()
        self.graph = None
        self.prepare()

    def prepare(self):
        if self.graph is not None and self.fw.name != "cupy":
            self.graph.reset()
        self.graph = None if self.fw.name == "cupy" else self.m.cuda.CUDAGraph()
        self.fw.synchronize()
        gc.collect()  # as torch.cuda.graph does before a capture: no collection inside the timing

    def capture(self):
        if self.fw.name == "cupy":
            with self.stream:
                self.stream.begin_capture()
                self.chain()
                self.graph = self.stream.end_capture()  # cudaStreamEndCapture + cudaGraphInstantiate
            return
        with self.m.cuda.stream(self.stream):
            self.graph.capture_begin()
            self.chain()
            self.graph.capture_end()  # ends the capture and instantiates the graph

    def setup(self):
        return self.capture, None, self.prepare


# ---------------------------------------------------------------------------- allocation check
def _alloc_counts(m):
    stats = m.cuda.memory_stats()
    return {key: stats.get(key) for key in ALLOC_KEYS}


def _alloc_check(fws, made, runs):
    """{framework: {counter: [before, after]}} around `runs` more replays of each allocating graph, for the
    frameworks whose allocator keeps torch's counters (minitensor, torch)."""
    check = {}
    for fw in fws:
        loop = made.get(fw.name)
        if loop is None or fw.name == "cupy":
            continue
        fw.synchronize()
        before = _alloc_counts(fw.module)
        loop()
        fw.synchronize()
        after = _alloc_counts(fw.module)
        check[fw.name] = {key: [before[key], after[key]] for key in ALLOC_KEYS if before[key] is not None}
    return check


# ---------------------------------------------------------------------------- rows
def _setups(key, fws, size, made):
    if key == CAPTURE:
        return {fw.name: (lambda fw=fw: _Captures(fw, size).setup()) for fw in fws}
    if key == EAGER:
        return {fw.name: _eager_setup(fw, size) for fw in fws}
    return {fw.name: _replay_setup(fw, size, key == ALLOC, made) for fw in fws}


def _row(key, fws, size, new_row):
    made = {}
    row = new_row(key, KIND, CASES[key].format(size.chain), (N,))
    row.update(unit=UNITS[key], chain=size.chain, runs=1 if key == CAPTURE else size.runs,
               repeats=size.captures if key == CAPTURE else size.repeats,
               statistic="median" if key == CAPTURE else "best")
    if key == CAPTURE:
        seconds, errors = best_s_in_turns(_setups(key, fws, size, made), size.captures, pick=statistics.median)
        add_times(row, {name: t * 1e3 for name, t in seconds.items()}, errors)
    else:
        seconds, errors = best_s_in_turns(_setups(key, fws, size, made), size.repeats)
        add_times(row, {name: t / (size.runs * size.chain) * 1e6 for name, t in seconds.items()}, errors)
    if key == ALLOC:
        row["alloc_check"] = _alloc_check(fws, made, size.runs)
        row["alloc_check_replays"] = size.runs
    mt = row["time"].get("minitensor")
    row["ratios"] = {f"mt_vs_{name}": t / mt for name, t in row["time"].items() if mt and name != "minitensor"}
    return row


def run(fws, sim, quick, selected, new_row):
    """One row per selected case; with both the replay and the eager row, the replay row also gets
    `eager_over_graph`, each framework's eager time per op / graph time per kernel."""
    size = sizes(sim, quick)
    rows = {key: _row(key, fws, size, new_row) for key, name in CASES.items()
            if selected(key, name.format(size.chain))}
    if REPLAY in rows and EAGER in rows:
        graph, eager = rows[REPLAY]["time"], rows[EAGER]["time"]
        rows[REPLAY]["eager_over_graph"] = {name: eager[name] / t for name, t in graph.items() if name in eager}
    return list(rows.values())


# ---------------------------------------------------------------------------- table
def _cell(row, fw, fmt):
    if fw in row["errors"]:
        return "ERR"
    value = row["time"].get(fw)
    return "n/a" if value is None else fmt.format(value)


def _alloc_notes(row):
    """A failure line for each framework whose replays moved the allocator's counters."""
    notes = []
    for fw, counts in row.get("alloc_check", {}).items():
        moved = {key: pair for key, pair in counts.items() if pair[0] != pair[1]}
        if moved:
            notes.append(f"FAILED: {row['alloc_check_replays']} replays of '{row['name']}' allocated ({fw}): "
                         + ", ".join(f"{key} {before} -> {after}" for key, (before, after) in moved.items()))
    return notes


def _alloc_line(row):
    counts = row.get("alloc_check", {})
    if not counts:
        return "allocations during replays: not checked"
    text = "; ".join(f"{fw} " + ", ".join(f"{key} {a} -> {b}" for key, (a, b) in c.items())
                     for fw, c in counts.items())
    return f"allocations during {row['alloc_check_replays']} replays: {text}"


def section(rows, verdicts):
    """The graph rows, then "eager vs graph per op" (eager us per op / graph us per kernel: > 1 means the
    graph is faster) and the allocation check."""
    header = ["CUDA graphs", "unit", "minitensor", *BASELINES, *(f"mt_vs_{b}" for b in BASELINES), "target"]
    speedup = next((r["eager_over_graph"] for r in rows if "eager_over_graph" in r), None)
    body, lines = [], []
    for r in rows:
        fmt = "{:.3f}" if r["key"] == CAPTURE else "{:.2f}"
        ratios = [f"{r['ratios'][f'mt_vs_{b}']:.2f}x" if f"mt_vs_{b}" in r["ratios"] else "n/a" for b in BASELINES]
        status = "/".join(v["status"] for v in verdicts if v["case"] == r["key"])
        body.append([r["name"], r["unit"], *(_cell(r, fw, fmt) for fw in ("minitensor", *BASELINES)), *ratios,
                     status])
        if r["key"] == EAGER and speedup is not None:
            body.append(["eager vs graph per op", "eager / graph",
                         *(f"{speedup[fw]:.2f}x" if fw in speedup else "n/a" for fw in ("minitensor", *BASELINES)),
                         "", "", ""])
        if r["key"] == ALLOC:
            lines += [_alloc_line(r), *_alloc_notes(r)]
    return "\n".join([table(header, body), *lines])
