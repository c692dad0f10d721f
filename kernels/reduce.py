"""Reduction kernels: sum, mean, min, max, all, any, argmin/argmax (their launches: reduce_plans.py), and the
elementwise `isclose` that `equal` and `allclose` reduce.

A reduction sees its input as M outputs by N reduced elements. In `reduce_strided`, output m's elements
start at an offset decomposed from m over up to four kept dims, element r at an offset decomposed from r
over up to four reduced dims (right-aligned, as in elementwise.py); `reduce_simple` has one dim each, and
half the arguments. K_UNIT / R_UNIT mark a single unit-stride dim, so the compiler sees contiguous
addresses and vectorises. A program reduces BLOCK_M outputs over one split of the
reduced range into a [BLOCK_M, BLOCK_N] accumulator, then across it. With one split it writes the
results; with several, each split writes its partials (accumulator type, and indices) into row `split`
of a [splits, M] buffer, and a second launch (PARTIAL_IN) reduces those. No atomics: the order of every
addition is fixed by the plan, so results are the same run to run.

NaN wins in min and max (as in torch), and the first index wins among equal values.
"""
import triton.language as tl

from .compat import dtype, jit, narrow, widen
from .elementwise import _strided_offset

SUM, MAX, MIN = 0, 1, 2


# tl.sum / tl.max / tl.min are @jit library functions, which the interpreter cannot call from an interpreted
# kernel; tl.reduce with the library's own combine functions is what they compile to on the GPU, and what
# the interpreter maps to numpy.
@jit
def _sum(x):
    return tl.reduce(x, 1, tl.standard._sum_combine)


@jit
def _max(x):
    return tl.reduce(x, 1, tl.standard._elementwise_max)


@jit
def _min(x):
    return tl.reduce(x, 1, tl.standard._elementwise_min)


@jit
def _to(x, ty, NONZERO: tl.constexpr):
    """An input element in the accumulator type: its truth value for all/any, half types through float32."""
    x = widen(x)
    if NONZERO:
        x = x != 0
    return x.to(ty)


@jit
def _better(a, b, OP: tl.constexpr):
    """Whether a beats b in max (OP == MAX) or min: NaN beats any number."""
    if OP == 1:
        return (a > b) | ((a != a) & (b == b))
    return (a < b) | ((a != a) & (b == b))


@jit
def _extreme(acc, acc_idx, OP: tl.constexpr):
    """Max (OP == MAX) or min of each row of acc, NaN if the row has one, and the lowest index in acc_idx
    of that value. Built from plain reductions: a custom combine runs per element in the interpreter, and
    max drops NaN on the GPU."""
    if OP == 1:
        best = _max(acc)
    else:
        best = _min(acc)
    hit = acc == best[:, None]
    if acc.dtype.is_floating():
        nan = acc != acc
        nan_row = _max(nan.to(tl.int32)) > 0
        best = tl.where(nan_row, float("nan"), best)
        hit = tl.where(nan_row[:, None], nan, hit)
    if acc_idx.dtype.is_int64():
        top = 9223372036854775807
    else:
        top = 2147483647
    return best, _min(tl.where(hit, acc_idx, top))


@jit
def _cast_out(x, OUT_BOOL: tl.constexpr, out_ty):
    if OUT_BOOL:
        return x != 0
    if out_ty.is_fp16() or out_ty.is_bf16():
        x = x.to(tl.float32)
    return narrow(x, out_ty)


@jit
def _reduce(in_ptr, in_idx_ptr, out_ptr, out_idx_ptr, M, N, blocks_per_split, divisor,
            ks1, ks2, ks3, kt0, kt1, kt2, kt3, rs1, rs2, rs3, rt0, rt1, rt2, rt3,
            OP: tl.constexpr, ACC: tl.constexpr, IDENTITY: tl.constexpr, NONZERO: tl.constexpr,
            ARG: tl.constexpr, PARTIAL_IN: tl.constexpr, FINAL: tl.constexpr, MEAN: tl.constexpr,
            OUT_BOOL: tl.constexpr, KRANK: tl.constexpr, K_UNIT: tl.constexpr, RRANK: tl.constexpr,
            R_UNIT: tl.constexpr, INDEX64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    if INDEX64:
        pid_m = pid_m.to(tl.int64)
        split = split.to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    if K_UNIT:
        row_off = rows
    else:
        row_off = _strided_offset(rows, ks1, ks2, ks3, kt0, kt1, kt2, kt3, KRANK)
    acc_ty = dtype(ACC)
    identity = tl.full([BLOCK_M, BLOCK_N], IDENTITY, acc_ty)
    acc = identity
    if INDEX64:  # indices in the index width: int64 registers would slow the arg reductions
        index_ty = tl.int64
    else:
        index_ty = tl.int32
    acc_idx = tl.full([BLOCK_M, BLOCK_N], 0, index_ty)
    # a while loop: the interpreter cannot take a kernel scalar as a range() bound
    col = split * blocks_per_split * BLOCK_N
    end = col + blocks_per_split * BLOCK_N
    while col < end:
        cols = tl.multiple_of(col, BLOCK_N) + tl.arange(0, BLOCK_N)
        if R_UNIT:
            col_off = cols
        else:
            col_off = _strided_offset(cols, rs1, rs2, rs3, rt0, rt1, rt2, rt3, RRANK)
        mask = row_mask[:, None] & (cols < N)[None, :]
        offs = row_off[:, None] + col_off[None, :]
        x = _to(tl.load(in_ptr + offs, mask=mask), acc_ty, NONZERO)
        x = tl.where(mask, x, identity)
        if OP == 0:
            acc += x
        else:
            # strict: a slot keeps the earliest of equal values. A slot that only ever saw the identity keeps
            # index 0, which is right: the identity wins only when every element equals it.
            take = _better(x, acc, OP)
            acc = tl.where(take, x, acc)
            if ARG:
                if PARTIAL_IN:
                    idx = tl.load(in_idx_ptr + offs, mask=mask, other=0).to(index_ty)
                else:
                    idx = tl.full([BLOCK_M, BLOCK_N], 0, index_ty) + cols[None, :]
                acc_idx = tl.where(take, idx, acc_idx)
        col += BLOCK_N
    if OP == 0:
        result = _sum(acc)
    else:
        result, result_idx = _extreme(acc, acc_idx, OP)
    out_offs = split * M + rows
    if FINAL:
        if MEAN:
            result = result / divisor.to(acc_ty)
        tl.store(out_ptr + out_offs, _cast_out(result, OUT_BOOL, out_ptr.dtype.element_ty), mask=row_mask)
    else:
        tl.store(out_ptr + out_offs, result, mask=row_mask)
    if ARG:
        tl.store(out_idx_ptr + out_offs, result_idx.to(tl.int64), mask=row_mask)


@jit
def reduce_strided(in_ptr, in_idx_ptr, out_ptr, out_idx_ptr, M, N, blocks_per_split, divisor,
                   ks1, ks2, ks3, kt0, kt1, kt2, kt3, rs1, rs2, rs3, rt0, rt1, rt2, rt3,
                   OP: tl.constexpr, ACC: tl.constexpr, IDENTITY: tl.constexpr, NONZERO: tl.constexpr,
                   ARG: tl.constexpr, PARTIAL_IN: tl.constexpr, FINAL: tl.constexpr, MEAN: tl.constexpr,
                   OUT_BOOL: tl.constexpr, KRANK: tl.constexpr, K_UNIT: tl.constexpr, RRANK: tl.constexpr,
                   R_UNIT: tl.constexpr, INDEX64: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    _reduce(in_ptr, in_idx_ptr, out_ptr, out_idx_ptr, M, N, blocks_per_split, divisor,
            ks1, ks2, ks3, kt0, kt1, kt2, kt3, rs1, rs2, rs3, rt0, rt1, rt2, rt3, OP, ACC, IDENTITY, NONZERO, ARG,
            PARTIAL_IN, FINAL, MEAN, OUT_BOOL, KRANK, K_UNIT, RRANK, R_UNIT, INDEX64, BLOCK_M, BLOCK_N)


@jit
def reduce_simple(in_ptr, in_idx_ptr, out_ptr, out_idx_ptr, M, N, blocks_per_split, divisor, k_stride, r_stride,
                  OP: tl.constexpr, ACC: tl.constexpr, IDENTITY: tl.constexpr, NONZERO: tl.constexpr,
                  ARG: tl.constexpr, PARTIAL_IN: tl.constexpr, FINAL: tl.constexpr, MEAN: tl.constexpr,
                  OUT_BOOL: tl.constexpr, K_UNIT: tl.constexpr, R_UNIT: tl.constexpr, INDEX64: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One kept dim and one reduced dim (whole-tensor, row and column reductions, and second passes): half
    the arguments of reduce_strided, which is host time per launch."""
    _reduce(in_ptr, in_idx_ptr, out_ptr, out_idx_ptr, M, N, blocks_per_split, divisor,
            1, 1, 1, 0, 0, 0, k_stride, 1, 1, 1, 0, 0, 0, r_stride, OP, ACC, IDENTITY, NONZERO, ARG,
            PARTIAL_IN, FINAL, MEAN, OUT_BOOL, 1, K_UNIT, 1, R_UNIT, INDEX64, BLOCK_M, BLOCK_N)


@jit
def isclose_contiguous(a_ptr, b_ptr, out_ptr, rtol, atol, n, COMPUTE: tl.constexpr, DIFF: tl.constexpr,
                       TOLERANT: tl.constexpr, EQUAL_NAN: tl.constexpr, INDEX64: tl.constexpr,
                       BLOCK: tl.constexpr):
    """out = isclose(a, b) as torch computes it: a == b, or both NaN with EQUAL_NAN, or (TOLERANT) a finite
    |a - b| <= atol + rtol * |b|. The difference is taken in DIFF (the inputs' own type for integers, so it
    wraps as torch's does), the comparison in COMPUTE."""
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = _to(tl.load(a_ptr + offs, mask=mask), dtype(COMPUTE), False)
    b = _to(tl.load(b_ptr + offs, mask=mask), dtype(COMPUTE), False)
    close = a == b
    if EQUAL_NAN:
        close = close | ((a != a) & (b != b))
    if TOLERANT:
        if COMPUTE == "fp64":
            fty = tl.float64
        else:
            fty = tl.float32
        diff = tl.abs(a.to(dtype(DIFF)) - b.to(dtype(DIFF))).to(fty)
        bound = atol.to(fty) + tl.abs(rtol.to(fty) * b.to(fty))
        close = close | ((diff == diff) & (diff != float("inf")) & (diff <= bound))
    tl.store(out_ptr + offs, close, mask=mask)
