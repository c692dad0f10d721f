"""The gather kernels behind `gather` and `index_select` (their launches: index_plans.py).

    out[i] = data[base(i) + index[j(i)] * dim_stride]

over the output's elements i in row-major order (the output is always a fresh contiguous tensor). `base` and
`j` are affine in i: for gather, j(i) walks the index tensor and base(i) the input with a zero stride on the
indexed dim; index_select is the same with an index broadcast along every other dim. `gather_strided` takes
up to four dims, right-aligned, after the plan has merged the contiguous ones; `gather_contiguous` is the
common case of a unit-stride index (vector index loads, coalesced stores; a random gather is bound by its
random reads, as torch's and CuPy's are), and `gather_rows` the case where whole contiguous rows move under
one index (index_select along any dim but the last): one index load per row, vector copies of the rows.

Each index is checked against `size`, the extent of the indexed dim: neither op wraps negative indices. A bad
index is never dereferenced (its output element becomes 0) and the lanes holding one store (index, info) into
ERR, a two-word record the host reads after synchronising (minitensor.indexing). Good lanes store nothing
there, so correct calls pay one compare per element. Offsets are 32-bit unless some extent needs 64
(INDEX64); the index, loaded as int64 or int32, is narrowed once checked.

Elements move as raw bits: data pointers are typed by element size (i8/i16/i32/i64), so one binary serves
every dtype of that size.
"""
import triton.language as tl

from .compat import jit
from .elementwise import _linear_offsets


@jit
def _two_offsets(i, s1, s2, s3, a0, a1, a2, a3, b0, b1, b2, b3, RANK: tl.constexpr):
    """Offsets of linear index i in two right-aligned (s0, s1, s2, s3) layouts, strides a0..a3 and b0..b3."""
    if RANK == 1:
        a = i * a3
        b = i * b3
    else:
        c = i % s3
        a = c * a3
        b = c * b3
        i = i // s3
        if RANK == 2:
            a += i * a2
            b += i * b2
        else:
            c = i % s2
            a += c * a2
            b += c * b2
            i = i // s2
            if RANK == 3:
                a += i * a1
                b += i * b1
            else:
                c = i % s1
                a += c * a1 + (i // s1) * a0
                b += c * b1 + (i // s1) * b0
    return a, b


@jit
def _checked(idx, mask, size, err_ptr, info, INDEX64: tl.constexpr):
    """(ok, safe): the lanes whose index is in [0, size), and the index with the others set to 0. Lanes with a
    bad index store it and `info` into the error record."""
    good = (idx >= 0) & (idx < size)
    bad = mask & (good == 0)
    record = err_ptr + tl.full(idx.shape, 0, tl.int32)
    tl.store(record, idx.to(tl.int64), mask=bad)
    tl.store(record + 1, tl.full(idx.shape, 0, tl.int64) + info, mask=bad)
    ok = mask & good
    safe = tl.where(ok, idx, 0)
    if not INDEX64:
        safe = safe.to(tl.int32)
    return ok, safe


@jit
def gather_contiguous(data_ptr, index_ptr, out_ptr, err_ptr, n, size, dim_stride, base_stride, info,
                      INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    idx = tl.load(index_ptr + offs, mask=mask, other=0)
    ok, safe = _checked(idx, mask, size, err_ptr, info, INDEX64)
    x = tl.load(data_ptr + (offs * base_stride + safe * dim_stride), mask=ok, other=0)
    tl.store(out_ptr + offs, x, mask=mask)


@jit
def gather_strided(data_ptr, index_ptr, out_ptr, err_ptr, n, size, dim_stride, info, s1, s2, s3, i0, i1, i2, i3,
                   b0, b1, b2, b3, RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    index_offs, base = _two_offsets(offs, s1, s2, s3, i0, i1, i2, i3, b0, b1, b2, b3, RANK)
    idx = tl.load(index_ptr + index_offs, mask=mask, other=0)
    ok, safe = _checked(idx, mask, size, err_ptr, info, INDEX64)
    x = tl.load(data_ptr + (base + safe * dim_stride), mask=ok, other=0)
    tl.store(out_ptr + offs, x, mask=mask)


@jit
def gather_rows(data_ptr, index_ptr, out_ptr, err_ptr, rows, cols, size, dim_stride, info, s1, s2, s3, i0, i1, i2, i3,
                b0, b1, b2, b3, RANK: tl.constexpr, VEC: tl.constexpr, INDEX64: tl.constexpr, BLOCK_R: tl.constexpr,
                BLOCK_C: tl.constexpr):
    """Rows of `cols` contiguous elements: row r (of the outer dims, RANK of them) starts at
    base(r) + index[j(r)] * dim_stride in data and at r * cols in out. VEC: every row start is a multiple
    of VEC elements (16 bytes), so the row copies are vector loads and stores."""
    r = _linear_offsets(INDEX64, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_mask = r < rows
    index_offs, base = _two_offsets(r, s1, s2, s3, i0, i1, i2, i3, b0, b1, b2, b3, RANK)
    idx = tl.load(index_ptr + index_offs, mask=row_mask, other=0)
    ok, safe = _checked(idx, row_mask, size, err_ptr, info, INDEX64)
    start = base + safe * dim_stride
    out_start = r * cols
    if VEC > 1:
        start = tl.multiple_of(start, VEC)
        out_start = tl.multiple_of(out_start, VEC)
    col_mask = c < cols
    x = tl.load(data_ptr + (start[:, None] + c[None, :]), mask=ok[:, None] & col_mask[None, :], other=0)
    tl.store(out_ptr + (out_start[:, None] + c[None, :]), x, mask=row_mask[:, None] & col_mask[None, :])
