"""The size policy: how requests are rounded, which pool serves them and how big a new segment is.

These are torch's numbers (c10/cuda/CUDACachingAllocator.cpp), because users size their memory plans by them.
"""
MIN_BLOCK = 512  # every request rounds up to a multiple of this
SMALL_SIZE = 1 << 20  # rounded requests up to this come from the small pool
SMALL_SEGMENT = 2 << 20  # segment size for small requests
LARGE_SEGMENT = 20 << 20  # segment size for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20  # larger requests get a segment of their size rounded up to this
OVERSIZE_SLACK = 20 << 20  # an oversize cached block serves only requests at most this much smaller
ONE_EB = 1 << 60  # requests this big fail at once

_MB_LOG2 = 20  # roundup_power2_divisions intervals start at 1 MiB ...
INTERVALS = 16  # ... and there are 16 of them, one per power of two, the last open-ended


def round_size(nbytes, divisions=None):
    """The block size for a request of `nbytes` (> 0): a multiple of 512, or with `divisions` (16 per-interval
    counts, see settings) the next of N equal steps between two powers of two (1200 with N=4 -> 1280)."""
    if nbytes <= MIN_BLOCK:
        return MIN_BLOCK
    if divisions is not None:
        n = divisions[min(max(nbytes.bit_length() - 1 - _MB_LOG2, 0), INTERVALS - 1)]
        if n > 1 and nbytes > MIN_BLOCK * n:
            return _roundup_power2_division(nbytes, n)
    return (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def _roundup_power2_division(size, divisions):
    floor = 1 << (size.bit_length() - 1)
    if floor == size:
        return size
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def segment_size(size):
    """Bytes to ask the driver for when no cached block fits a rounded request of `size`."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (size + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def format_size(nbytes):
    """torch's format: "1024 bytes", "2.00 MiB", "79.19 GiB" (two decimals, no unit above GiB)."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1 << 20:
        return f"{nbytes / 1024:.2f} KiB"
    if nbytes <= 1 << 30:
        return f"{nbytes / (1 << 20):.2f} MiB"
    return f"{nbytes / (1 << 30):.2f} GiB"
