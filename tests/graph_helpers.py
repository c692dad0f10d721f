"""What tests/test_graphs.py and tests/test_graphs_pools.py share: host data, device tensors, comparisons, side
streams, a capture around a block. (Their clean device around each test is conftest.py's `clean_cuda_state`.)"""
import contextlib

import numpy as np

import minitensor as mt

DEV = "cuda"


def values(t):
    return np.asarray(t.cpu().numpy())


def rand(*shape, dtype=np.float32, low=-2.0, high=2.0):
    """Random host data, never all zeros."""
    data = np.random.uniform(low, high, shape).astype(dtype)
    data.flat[0] = 1.25
    return data


def dev(array):
    return mt.tensor(array, device=DEV)


def close(actual, expected, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


def other_stream(*avoid):
    """A new side stream whose handle is none of `avoid`'s (streams come from a pool of handles)."""
    handles = {s.cuda_stream for s in avoid} | {0}
    for _ in range(100):
        s = mt.cuda.Stream()
        if s.cuda_stream not in handles:
            return s
    raise AssertionError("no distinct stream")


@contextlib.contextmanager
def capturing(g, stream, **begin):
    """Graph `g` captures on `stream` for the block, whatever streams the block makes current: capture_begin and
    capture_end on `stream`, or abort_capture if the block raises, so a failed test leaves no stream capturing."""
    with mt.cuda.stream(stream):
        g.capture_begin(**begin)
    try:
        yield
    except BaseException:
        g.abort_capture()
        raise
    with mt.cuda.stream(stream):
        g.capture_end()
