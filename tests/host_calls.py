"""Host calls per hot op in steady state: counts that timing noise cannot blur, for tests/test_host_budget.py.

Run it in a fresh process (each measurement needs one: another test's state, or an earlier measurement's
wrappers, would change the counts):

    python tests/host_calls.py            # the counts on the active backend, and the budget they are held to
    python tests/host_calls.py --write    # write them as tests/budgets/<backend>.json (after a change that
                                          # lowers or, on purpose, raises a count), or --write PATH

Each op runs `WARMUP` times, then `ITERATIONS` times under `sys.setprofile` (twice: the two windows must agree),
with the garbage collector off. Counted per iteration, on the calling thread only (a profile function is per
thread, so the simulator's stream workers are not seen):
- python_calls: calls of Python functions in minitensor's code, plus one for each call from minitensor's code
  into other Python code (threading, Triton, numpy), whose inner calls are not counted: they depend on those
  packages' versions and, for threading's locks and conditions, on what the other threads are doing;
- c_calls: calls of built-in functions and methods from minitensor's code;
- driver_calls: calls into the active driver's methods of the protocol (minitensor/backends/base.py `Driver`)
  from outside the driver, seen by their code objects, so a bound method cached at warm-up is counted too;
- launches: kernel launches (the launch functions kernels/launcher.py hands out, wrapped as they are made);
- cuda_calls (nvidia): calls of `cuda.bindings.driver` functions, wrapped on the module before minitensor
  imports it (Cython functions are invisible to a profile function). The C launcher's cuLaunchKernel goes
  to libcuda directly and counts as a launch.
A wrapper's own frame is left out of every count, so the counts are those of the unwrapped program.
"""
import argparse
import collections
import gc
import json
import os
import sys
import types

BUDGETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "budgets")
WARMUP = 20
ITERATIONS = 50
METRICS = ("python_calls", "c_calls", "driver_calls", "launches", "cuda_calls")
COMMENT = ("Host calls per iteration of each hot op in steady state, counted by tests/host_calls.py (see its "
           "docstring) and held by tests/test_host_budget.py: a count above its budget fails. After a change "
           "that lowers a count (the test says so) or raises one on purpose, update this file on the same "
           "backend with `python tests/host_calls.py --write`")


def hot_ops(mt):
    """{name: op}: the operations whose host cost every op pays, on small inputs."""
    a = mt.rand(1024, device="cuda")
    b = mt.rand(1024, device="cuda")
    return {
        "empty(4096)+del": lambda: mt.empty(4096, device="cuda"),
        "pinned empty(1 MiB)+del": lambda: mt.empty(1 << 18, pin_memory=True),
        "a + b": lambda: a + b,
        "a.add_(b)": lambda: a.add_(b),
        "a.sum()": lambda: a.sum(),
        "current_stream()": lambda: mt.cuda.current_stream(),
        "Event().record()": lambda: mt.cuda.Event().record(),
    }


def _wrapper(target, name):
    """`target` behind a Python function whose code is named `name`: the profile function sees each call."""
    def call(*args, **kwargs):
        return target(*args, **kwargs)
    call.__code__ = call.__code__.replace(co_name=name)
    return call


class Wrappers:
    """The counting wrappers installed in this process: their code objects, and the count each call feeds."""

    def __init__(self):
        self.codes = {}  # wrapper code -> (metric, detail name, whether the target is a built-in function)

    def wrap(self, target, metric, name):
        wrapped = _wrapper(target, name)
        self.codes[wrapped.__code__] = (metric, name, isinstance(target, types.BuiltinFunctionType))
        return wrapped

    def wrap_cuda_bindings(self):
        """Wrap every function of `cuda.bindings.driver` on the module (before minitensor imports it)."""
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            return
        for name in dir(cu):
            value = getattr(cu, name)
            if name.startswith("cu") and callable(value) and not isinstance(value, type):
                setattr(cu, name, self.wrap(value, "cuda_calls", name))

    def wrap_launches(self, launcher):
        """Wrap each launch function as kernels/launcher.py makes it, before any op runs."""
        load = launcher._load

        def counted_load(*key):
            launch, scratch = load(*key)
            return self.wrap(launch, "launches", "launch"), scratch
        launcher._load = counted_load


class Counter:
    """The profile function: see the module's docstring for what it counts."""

    def __init__(self, own_dirs, driver, protocol, wrappers):
        self.own_dirs = tuple(os.path.join(d, "") for d in own_dirs)
        cls = type(driver)
        self.driver_codes = {}
        for name in protocol:
            method = getattr(cls, name, None)
            if isinstance(method, types.FunctionType):
                self.driver_codes[method.__code__] = name
        self.driver_files = {sys.modules[c.__module__].__file__ for c in cls.__mro__ if c is not object}
        self.wrappers = wrappers.codes
        self.own = {}  # code -> whether it is minitensor's (cached: the test's ops count as minitensor's)
        self.reset(None)

    def reset(self, op_code):
        self.own[op_code] = True
        self.op_code = op_code
        self.counts = dict.fromkeys(METRICS, 0)
        self.detail = collections.Counter()
        self.foreign = None  # the frame of foreign code being run, whose inner events are not counted

    def _is_own(self, code):
        own = self.own.get(code)
        if own is None:
            own = self.own[code] = code.co_filename.startswith(self.own_dirs)
        return own

    def __call__(self, frame, event, arg):
        if self.foreign is not None:
            if frame is self.foreign and event == "return":
                self.foreign = None
            return
        code = frame.f_code
        if event == "call":
            wrapper = self.wrappers.get(code)
            if wrapper is not None:
                metric, name, builtin = wrapper
                self.counts[metric] += 1
                self.detail[f"{metric}: {name}"] += 1
                self.counts["c_calls"] += builtin  # the unwrapped call would have been a c_call
                return
            if code is self.op_code:
                return
            self.counts["python_calls"] += 1
            if not self._is_own(code):
                self.foreign = frame
                self.detail[f"foreign: {code.co_name} ({os.path.basename(code.co_filename)})"] += 1
                return
            self.detail[f"python: {code.co_name} ({os.path.basename(code.co_filename)})"] += 1
            name = self.driver_codes.get(code)
            caller = frame.f_back
            if name is not None and (caller is None or caller.f_code.co_filename not in self.driver_files):
                self.counts["driver_calls"] += 1
                self.detail[f"driver_calls: {name}"] += 1
        elif event == "c_call" and code not in self.wrappers and arg is not sys.setprofile:
            self.counts["c_calls"] += 1


def _window(counter, fn, n):
    counter.reset(fn.__code__)
    sys.setprofile(counter)
    try:
        for _ in range(n):
            fn()
    finally:
        sys.setprofile(None)
    return _per_iteration(counter.counts, n), _per_iteration(counter.detail, n)


def _per_iteration(counts, n):
    return {k: v // n if v % n == 0 else v / n for k, v in counts.items()}


def measure(iterations=ITERATIONS, make_ops=hot_ops):
    """{"backend", "python", "ops": {name: {metric: calls per iteration}}, "detail", "unsteady"} of the ops
    `make_ops(mt)` gives (each a lambda: its own call is not counted), in this process, a fresh one."""
    wrappers = Wrappers()
    if os.environ.get("MINITENSOR_BACKEND", "").strip().lower() != "sim":
        wrappers.wrap_cuda_bindings()
    import minitensor as mt
    from minitensor import allocator, backends, kernels
    from minitensor.backends.base import Driver
    from minitensor.kernels import launcher
    wrappers.wrap_launches(launcher)
    driver = backends.active_driver()
    protocol = [n for n, v in vars(Driver).items() if callable(v) and not n.startswith("_")]
    own_dirs = [*mt.__path__, *kernels.__path__, *allocator.__path__]
    counter = Counter(own_dirs, driver, protocol, wrappers)
    result = {"backend": mt.cuda.backend(), "python": sys.version.split()[0], "ops": {}, "detail": {},
              "unsteady": {}}
    for name, fn in make_ops(mt).items():
        for _ in range(WARMUP):
            fn()
        mt.cuda.synchronize()
        gc.collect()
        gc.disable()
        try:
            first, detail = _window(counter, fn, iterations)
            mt.cuda.synchronize()
            second, _ = _window(counter, fn, iterations)
            mt.cuda.synchronize()
        finally:
            gc.enable()
        if result["backend"] != "nvidia":
            del first["cuda_calls"], second["cuda_calls"]
        result["ops"][name] = first
        result["detail"][name] = dict(sorted(detail.items()))
        if first != second:
            result["unsteady"][name] = [first, second]
    return result


def budget_path(backend):
    return os.path.join(BUDGETS, f"{backend}.json")


def compare(ops, budget):
    """(grown, shrunk): a line for each count above its budget (and each op without one), and for each below."""
    grown, shrunk = [], []
    for name, counts in ops.items():
        held = budget.get(name)
        if held is None:
            grown.append(f"{name}: no budget")
            continue
        for metric, value in counts.items():
            if metric not in held:
                grown.append(f"{name}: {metric} {value:g}, no budget")
            elif value > held[metric]:
                grown.append(f"{name}: {metric} {value:g} > budget {held[metric]:g}")
            elif value < held[metric]:
                shrunk.append(f"{name}: {metric} {value:g} < budget {held[metric]:g}")
    return grown, shrunk


def _table(result, budget):
    metrics = [m for m in METRICS if any(m in c for c in result["ops"].values())]
    lines = [f"{'op':26s}" + "".join(f"{m:>14s}" for m in metrics)]
    for name, counts in result["ops"].items():
        held = (budget or {}).get(name, {})
        cells = [f"{counts[m]:g}" + (f" ({held[m]:g})" if m in held and held[m] != counts[m] else "")
                 for m in metrics]
        lines.append(f"{name:26s}" + "".join(f"{c:>14s}" for c in cells))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description="Host calls per hot op (see tests/host_calls.py).")
    parser.add_argument("--write", nargs="?", const="", metavar="PATH",
                        help="write the counts as a budget file: tests/budgets/<backend>.json, or PATH")
    parser.add_argument("--json", metavar="PATH", help="write the whole measurement (with details) to PATH")
    parser.add_argument("--detail", action="store_true", help="print what each op's counts are made of")
    args = parser.parse_args(argv)
    result = measure()
    path = budget_path(result["backend"])
    budget = None
    if os.path.exists(path):
        with open(path) as f:
            budget = json.load(f)["ops"]
    print(f"backend {result['backend']}, Python {result['python']}; per iteration, (budget) where it differs:")
    print(_table(result, budget))
    if args.detail:
        for name, detail in result["detail"].items():
            print(f"\n{name}:\n" + "\n".join(f"  {v:8g}  {k}" for k, v in detail.items()))
    if result["unsteady"]:
        print(f"\nnot steady (the two windows differ): {sorted(result['unsteady'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.write is not None:
        if result["unsteady"]:
            print("not written: the counts are not steady")
            return 1
        path = args.write or path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump({"comment": COMMENT, "python": result["python"], "ops": result["ops"]}, f, indent=1)
            f.write("\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
