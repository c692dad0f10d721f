"""Timing loops shared by every framework, so all of them are measured the same way."""

import math
import time


def host_us_per_call(fn, synchronize, calls, repeats):
    """Host time per call in microseconds: the best of `repeats` tight loops of `calls` calls.

    The loop ends with a synchronize, so a framework cannot hide work in a queue that
    grows without bound; with small kernels the host side is what this measures.
    """
    for _ in range(max(3, calls // 10)):  # warm-up: compile kernels, fill caches
        fn()
    synchronize()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        synchronize()
        best = min(best, time.perf_counter() - start)
    return best / calls * 1e6


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


def best_s(fn, repeats, synchronize=None):
    """Wall seconds of fn() (then synchronize(), when given): the best of `repeats`, after one untimed run."""
    fn()
    if synchronize is not None:
        synchronize()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if synchronize is not None:
            synchronize()
        best = min(best, time.perf_counter() - start)
    return best
