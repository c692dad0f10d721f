"""Timing loops shared by every framework, so all of them are measured the same way."""

import math
import time


def host_us_per_call(contenders, calls, repeats):
    """Host time per call in microseconds for each of `contenders` ({name: (fn, synchronize)}): the best of
    `repeats` tight loops of `calls` calls. The frameworks take turns, loop by loop, so that a drift of the
    machine's speed (clock boost, a neighbour's load) falls on all of them alike.

    Each loop ends with a synchronize, so a framework cannot hide work in a queue that grows without bound;
    with small kernels the host side is what this measures. Returns ({name: us}, {name: error text}).
    """
    errors = {}
    for name, (fn, synchronize) in contenders.items():
        try:
            for _ in range(max(3, calls // 10)):  # warm-up: compile kernels, fill caches
                fn()
            synchronize()
        except Exception as exc:  # the package under test may lack an op: report it, go on
            errors[name] = exc
    best = {name: math.inf for name in contenders if name not in errors}
    for _ in range(repeats):
        for name in best:
            fn, synchronize = contenders[name]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            synchronize()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: t / calls * 1e6 for name, t in best.items()}, errors


def device_s_per_launch(fn, fw, launches, repeats):
    """Device time per launch in seconds from timing events around `launches` back-to-back launches.

    Best of `repeats`, after one warm-up launch so compilation is not timed.
    """
    fn()
    fw.synchronize()
    best = math.inf
    for _ in range(repeats):
        start, end = fw.event(), fw.event()
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        best = min(best, fw.elapsed_ms(start, end) / 1e3 / launches)
    return best


def best_s_in_turns(contenders, repeats):
    """Wall seconds of each contender's run, {label: (fn, synchronize or None, prepare or None)}: the best of
    `repeats`, after one untimed run each, the contenders taking turns run by run (as host_us_per_call does)
    so that a passing slowdown of the link or the disk falls on all of them alike. `prepare()` runs untimed
    before each timed run. Returns ({label: seconds}, {label: exception})."""
    errors = {}
    for label, (fn, synchronize, _) in contenders.items():
        try:
            fn()
            if synchronize is not None:
                synchronize()
        except Exception as exc:  # one contender failing still leaves the others' numbers
            errors[label] = exc
    best = {label: math.inf for label in contenders if label not in errors}
    for _ in range(repeats):
        for label in list(best):
            fn, synchronize, prepare = contenders[label]
            try:
                if prepare is not None:
                    prepare()
                start = time.perf_counter()
                fn()
                if synchronize is not None:
                    synchronize()
            except Exception as exc:
                errors[label] = exc
                del best[label]
                continue
            best[label] = min(best[label], time.perf_counter() - start)
    return best, errors
