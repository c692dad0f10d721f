"""Timing loops shared by every framework, so all of them are measured the same way."""

import functools
import math
import time


def host_us_per_call(setups, calls, repeats):
    """Host time per call in microseconds for each framework, {name: setup}, setup() -> (fn, synchronize):
    the best of `repeats` tight loops of `calls` calls, timed in turns (best_s_in_turns).

    The device is drained, untimed, before each loop, and a loop is short enough (a few hundred calls) that
    its launches never fill the device's queue: so the loop measures the host's time per call. Were the
    queue full, the device's throughput would set the pace (a GPU still at idle clocks runs tiny kernels
    slower than any framework launches them) and every framework would measure alike.
    Returns ({name: us}, {name: exception})."""
    def looped(setup):
        fn, synchronize = setup()

        def loop():
            for _ in range(calls):
                fn()
        return loop, None, synchronize
    seconds, errors = best_s_in_turns({name: functools.partial(looped, setup) for name, setup in setups.items()},
                                      repeats)
    return {name: t / calls * 1e6 for name, t in seconds.items()}, errors


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


def best_s_in_turns(setups, repeats, pick=min):
    """Wall seconds of each contender's run, {label: setup}, setup() -> (fn, synchronize or None, prepare or
    None): the best of `repeats` (or `pick` of them, e.g. statistics.median for a figure that is one-off by
    nature, a graph capture), after one untimed run each (the warm-up: compiled kernels, filled caches).
    The contenders take turns, run by run, so that a drift of the machine's speed (clock boost, a
    neighbour's load, a passing slowdown of the link or the disk) falls on all of them alike. `prepare()` runs
    untimed before each timed run. A contender whose setup or run fails is dropped, and its exception
    returned: the package under test may lack an op. Returns ({label: seconds}, {label: exception})."""
    contenders, errors = {}, {}
    for label, setup in setups.items():
        try:
            fn, synchronize, _ = contenders[label] = setup()
            fn()
            if synchronize is not None:
                synchronize()
        except Exception as exc:
            contenders.pop(label, None)
            errors[label] = exc
    runs = {label: [] for label in contenders}
    for _ in range(repeats):
        for label in list(runs):
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
                del runs[label]
                continue
            runs[label].append(time.perf_counter() - start)
    return {label: pick(seconds) for label, seconds in runs.items() if seconds}, errors
