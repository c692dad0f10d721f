"""The loader's limits: any checkpoint, however hostile, is read in time and memory bounded by its size, or refused
with an error naming the limit it passed.

The pickle's budgets (nesting depth, elements copied or hashed, keys of one hash) are those of every pickle
minitensor reads, so they live with the reader in base/pickle_guard.py (`Guard`) and are named here too; the
ones below are the checkpoint's own: what minitensor can hold of a tensor or device it loads.
"""
from ..base.pickle_guard import MAX_DEPTH, MAX_EQUAL_HASHES, SET_WEIGHT, WORK_FLOOR, WORK_PER_BYTE  # noqa: F401

MAX_DIMS = 64  # numpy's limit, so every CPU op works on a loaded tensor
MAX_NBYTES = 2**63 - 1  # numpy's and torch's: a tensor's byte size (its non-zero dims') is an int64
MAX_DEVICE_INDEX = 127  # torch.device indices past 127 do not survive torch's own parser (cuda:128 -> cuda:-128)


def shape_problem(shape, itemsize):
    """Why minitensor cannot hold a tensor of `shape` (non-negative ints) and `itemsize`-byte elements, or None.
    Checked when a tensor is loaded, so that one that loads can be used: numpy (every CPU op) refuses more than
    MAX_DIMS dims, and an array whose non-zero dims span more than MAX_NBYTES bytes, even an expanded or empty
    one."""
    if len(shape) > MAX_DIMS:
        return (f"a tensor may have at most {MAX_DIMS} dimensions, got {len(shape)} (numpy, and so every CPU op, "
                f"stops at {MAX_DIMS})")
    nbytes = itemsize
    for n in shape:
        nbytes *= n or 1
    if nbytes > MAX_NBYTES:
        text = repr(list(shape))
        return (f"a tensor of shape {text if len(text) <= 200 else text[:197] + '...'} spans {nbytes} bytes "
                f"({itemsize}-byte elements, its non-zero dims counted), more than 2^63 - 1 (numpy's and torch's "
                "limit)")
    return None
