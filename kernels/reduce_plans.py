"""Launch plans of the reduction kernels (kernels/reduce.py), worked out once per signature and kept.

A reduction of a strided input over some of its dims becomes M outputs by N reduced elements: the kept
dims (in order, so the output is contiguous) and the reduced dims (sorted by stride: the order of the
reduced elements does not change a result) each collapse like plans.collapse. The tile follows the memory:
rows (reduced dim contiguous) get long BLOCK_N, columns (kept dim contiguous) long BLOCK_M. When there are
too few row blocks to fill the device, the reduced range splits across programs that write partials, and
a second launch reduces them: a full sum of 2^28 elements runs as a few hundred programs each streaming a
contiguous chunk, then one program over their partials.

Nothing here imports Triton.
"""
import functools
import math

from minitensor.base import dtypes
from minitensor.backends import active_driver

from . import launcher

SUM, MAX, MIN = 0, 1, 2
MAX_RANK = 4
_INTERPRETED = active_driver().interprets_kernels
# The interpreter costs ~1 ms per program whatever its size: give it few, large programs.
TILE = 1 << 16 if _INTERPRETED else 4096  # elements a program loads per step
_COLUMN_BLOCK = 1 << 12 if _INTERPRETED else 256  # outputs per program when they are contiguous
_STRIDED_BLOCK = 1 << 10 if _INTERPRETED else 32  # outputs per program when neither side is contiguous
_PROGRAMS_PER_SM = 2 if _INTERPRETED else 4
_MIN_BLOCKS_PER_SPLIT = 2 if _INTERPRETED else 4
ELEMENTWISE_BLOCK = 1 << 16 if _INTERPRETED else 1024
_ACC_BYTES = {"u8": 1, "i8": 1, "i16": 2, "i32": 4, "i64": 8, "fp32": 4, "fp64": 8}


def _collapse(dims):
    """(sizes, strides) of (size, stride) pairs in order, size-1 dims dropped, contiguous neighbours merged."""
    sizes, strides = [], []
    for size, stride in dims:
        if size == 1:
            continue
        if sizes and strides[-1] == stride * size:
            sizes[-1] *= size
            strides[-1] = stride
        else:
            sizes.append(size)
            strides.append(stride)
    return sizes or [1], strides or [0]


def layout(shape, strides, dims):
    """(kept sizes, kept strides, reduced sizes, reduced strides), collapsed; None when a side keeps more
    than MAX_RANK dims (the caller reduces a contiguous copy)."""
    kept = [(shape[d], strides[d]) for d in range(len(shape)) if d not in dims]
    reduced = sorted(((shape[d], strides[d]) for d in dims), key=lambda p: -p[1])
    k_sizes, k_strides = _collapse(kept)
    r_sizes, r_strides = _collapse(reduced)
    if len(k_sizes) > MAX_RANK or len(r_sizes) > MAX_RANK:
        return None
    return k_sizes, k_strides, r_sizes, r_strides


def accumulator(op, in_dtype, nonzero):
    """The Triton type a reduction accumulates in: int64 for integer sums, float32 for half types."""
    if nonzero or in_dtype is dtypes.bool_ and op != SUM:
        return "i32"
    if in_dtype.is_floating_point:
        return "fp64" if in_dtype is dtypes.float64 else "fp32"
    return "i64" if op == SUM else in_dtype.triton


def _identity(op, acc, in_dtype, nonzero):
    if op == SUM:
        return 0
    if nonzero or in_dtype is dtypes.bool_:
        return int(op == MIN)
    if acc.startswith("fp"):
        return float("inf") if op == MIN else float("-inf")
    bits = in_dtype.itemsize * 8
    low, high = (-(1 << bits - 1), (1 << bits - 1) - 1) if in_dtype.is_signed else (0, (1 << bits) - 1)
    return high if op == MIN else low


def _pow2(n):
    return 1 << max(n - 1, 0).bit_length()


def _blocks(m, n, k_unit, r_unit):
    """(BLOCK_M, BLOCK_N): the tile runs along whichever side is contiguous in memory."""
    if k_unit and not r_unit:
        block_m = min(_pow2(m), _COLUMN_BLOCK)
        return block_m, min(_pow2(n), TILE // block_m)
    block_n = min(_pow2(n), TILE)
    block_m = min(_pow2(m), TILE // block_n)
    if not r_unit:
        block_m = min(block_m, _STRIDED_BLOCK)
    return block_m, block_n


def _padded(right_aligned, fill):
    """Right-align a list of up to MAX_RANK values."""
    return [fill] * (MAX_RANK - len(right_aligned)) + list(right_aligned)


def _launch(device, in_type, out_type, m, n, k_sizes, k_strides, r_sizes, r_strides, splits, blocks, flags,
            index64, divisor, partial_in):
    """One launch of reduce_simple (one kept and one reduced dim) or reduce_strided over a fixed layout, as
    run(stream, in_ptr, out_ptr, out_idx, unused) for a first pass (the plan's own signature), or
    run(stream, in_ptr, in_idx, out_ptr, out_idx) for a pass over partials; and its parts for a caller that
    launches an aligned input itself, (launch, grid_x, grid_y, tail): launch(grid_x, grid_y, 1, stream, in_ptr,
    in_idx, out_ptr, out_idx, *tail). A mean divides by `divisor`, the count of the whole reduction."""
    block_m, block_n = blocks
    k_unit = len(k_sizes) == 1 and k_strides[0] == 1
    r_unit = len(r_sizes) == 1 and r_strides[0] == 1
    nblocks = -(-n // block_n)
    per_split = -(-nblocks // splits) if nblocks else 0
    itype = "i64" if index64 else "i32"
    types = ("*" + in_type, "*i64", "*" + out_type, "*i64", itype, itype, itype, "fp64")
    head = (m, n, per_split, float(divisor))
    if len(k_sizes) == 1 and len(r_sizes) == 1:
        kernel, stride_args = "reduce.reduce_simple", (8, 9)
        tail = head + (k_strides[0], r_strides[0])
        types += (itype,) * 2
        constexprs = flags + (k_unit, r_unit, index64, block_m, block_n)
    else:
        kernel, stride_args = "reduce.reduce_strided", (14, 21)
        tail = head + (*_padded(k_sizes, 1)[1:], *_padded(k_strides, 0), *_padded(r_sizes, 1)[1:],
                       *_padded(r_strides, 0))
        types += (itype,) * 14
        constexprs = flags + (len(k_sizes), k_unit, len(r_sizes), r_unit, index64, block_m, block_n)
    hints = (4,) * (m % 16 == 0) + (5,) * (n % 16 == 0) + (stride_args[0],) * (k_strides[-1] % 16 == 0) + \
        (stride_args[1],) * (r_strides[-1] % 16 == 0)
    num_warps = 8 if block_m * block_n >= 4096 else 4
    aligned = launcher.get(kernel, device, types, constexprs, (0,) + hints, num_warps)
    unaligned = []
    grid_m = -(-m // block_m)

    def misaligned(in_ptr):
        """The launch for an input pointer that is not 16-byte aligned, compiled on first use."""
        if not unaligned:
            unaligned.append(launcher.get(kernel, device, types, constexprs, hints, num_warps))
        return unaligned[0]

    parts = (aligned, grid_m, splits, tail)
    if partial_in:
        return (lambda stream, in_ptr, in_idx, out_ptr, out_idx: (misaligned(in_ptr) if in_ptr & 15 else aligned)(
            grid_m, splits, 1, stream, in_ptr, in_idx, out_ptr, out_idx, *tail)), parts
    return (lambda stream, in_ptr, out_ptr, out_idx, unused: (misaligned(in_ptr) if in_ptr & 15 else aligned)(
        grid_m, splits, 1, stream, in_ptr, 0, out_ptr, out_idx, *tail)), parts


class ReducePlan:
    """The launches of one reduction, fixed once per signature.

    run(stream, in_ptr, out_ptr, idx_ptr, scratch_ptr): idx_ptr receives int64 indices for arg reductions
    (else 0); scratch_ptr points at `scratch_bytes` of device memory (0 when it needs none). `single` is the
    parts of a one-pass plan's launch (see _launch), for the hot path to call directly; None for two passes."""

    __slots__ = ("run", "scratch_bytes", "single")

    def __init__(self, op, in_dtype, out_dtype, k_sizes, k_strides, r_sizes, r_strides, extent, device, arg,
                 nonzero, mean):
        m, n = math.prod(k_sizes), math.prod(r_sizes)
        acc = accumulator(op, in_dtype, nonzero)
        identity = _identity(op, acc, in_dtype, nonzero)
        out_bool = out_dtype is dtypes.bool_
        k_unit = len(k_sizes) == 1 and k_strides[0] == 1
        r_unit = len(r_sizes) == 1 and r_strides[0] == 1
        blocks = _blocks(m, n, k_unit, r_unit)
        row_blocks, nblocks = -(-m // blocks[0]), -(-n // blocks[1])
        target = _PROGRAMS_PER_SM * active_driver().properties(device).multi_processor_count
        splits = 1
        if row_blocks < target and nblocks >= 2 * _MIN_BLOCKS_PER_SPLIT:
            splits = min(-(-target // row_blocks), nblocks // _MIN_BLOCKS_PER_SPLIT)
            splits = -(-nblocks // -(-nblocks // splits))  # no empty split
        # every index a program forms, masked lanes included: the last split's columns run past N by up to a split
        index64 = max(extent, m * n, splits * m, 2 * (nblocks + 1) * blocks[1]) >= 2**31

        def flags(partial_in, final):
            return (op, acc, identity, nonzero and not partial_in, arg, partial_in, final, mean, out_bool)

        if splits == 1:
            self.scratch_bytes = 0
            self.run, self.single = _launch(device, in_dtype.triton, out_dtype.triton, m, n, k_sizes, k_strides,
                                            r_sizes, r_strides, 1, blocks, flags(False, True), index64, n, False)
            return
        self.single = None
        first, _ = _launch(device, in_dtype.triton, acc, m, n, k_sizes, k_strides, r_sizes, r_strides, splits, blocks,
                           flags(False, False), index64, n, False)
        second, _ = _launch(device, acc, out_dtype.triton, m, splits, [m], [1], [splits], [m], 1,
                            _blocks(m, splits, True, m == 1), flags(True, True), index64, n, True)
        values_bytes = -(-splits * m * _ACC_BYTES[acc] // 16) * 16
        self.scratch_bytes = values_bytes + (splits * m * 8 if arg else 0)

        def run(stream, in_ptr, out_ptr, idx_ptr, scratch_ptr):
            partial_idx = scratch_ptr + values_bytes if arg else 0
            first(stream, in_ptr, scratch_ptr, partial_idx, 0)
            second(stream, scratch_ptr, partial_idx, out_ptr, idx_ptr)
        self.run = run


@functools.lru_cache(maxsize=4096)
def reduce_plan(op, in_dtype, out_dtype, shape, strides, dims, device, arg=False, nonzero=False, mean=False):
    """The plan reducing a (shape, strides) input of in_dtype over `dims` (a frozenset of dim indices) into
    a contiguous output of out_dtype, or None when the layout needs a contiguous copy first.

    op is SUM, MAX or MIN; `arg` also writes the index of the winner (one reduced dim only), `nonzero`
    reduces truth values (all: MIN, any: MAX), `mean` divides the sum by the number of reduced elements."""
    collapsed = layout(shape, strides, dims)
    if collapsed is None:
        return None
    extent = sum((size - 1) * stride for size, stride in zip(shape, strides)) + 1
    return ReducePlan(op, in_dtype, out_dtype, *collapsed, extent, device, arg, nonzero, mean)


@functools.lru_cache(maxsize=1024)
def isclose_plan(a_dtype, b_dtype, compute, n, tolerant, equal_nan, device):
    """run(stream, a_ptr, b_ptr, out_ptr, rtol, atol) over contiguous operands of n elements into bool."""
    diff = "fp32" if compute is dtypes.bool_ else compute.triton  # torch subtracts bools as float
    index64 = n + ELEMENTWISE_BLOCK >= 2**31
    itype = "i64" if index64 else "i32"
    launch = launcher.get("reduce.isclose_contiguous", device,
                          ("*" + a_dtype.triton, "*" + b_dtype.triton, "*i1", "fp64", "fp64", itype),
                          (compute.triton, diff, tolerant, equal_nan, index64, ELEMENTWISE_BLOCK))
    grid = -(-n // ELEMENTWISE_BLOCK)

    def run(stream, a_ptr, b_ptr, out_ptr, rtol, atol):
        launch(grid, 1, 1, stream, a_ptr, b_ptr, out_ptr, rtol, atol, n)
    return run
