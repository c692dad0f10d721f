"""Elementwise kernels (fill, strided copy with dtype cast, binary arithmetic) and their host side.

Host side, as CuPy does: drop size-1 dims and merge dims that are contiguous in every operand, then pick
the kernel by rank class, not by strides. Rank 1 with unit strides everywhere uses the `*_contiguous`
kernel (few arguments, vector loads); rank 2 to 4 uses the `*_strided` kernel, whose offsets come from
the linear index by div/mod, right-aligned in four dims; higher ranks loop over the leading dims on the
host. Indices are 32-bit unless some extent needs 64 bits (INDEX64).
"""
import itertools
import math

import triton
import triton.language as tl

from minitensor import dtypes

from . import launcher
from .compat import INTERPRETED, jit

# The interpreter costs ~1 ms per program whatever its size: give it few, large programs.
BLOCK = 1 << 16 if INTERPRETED else 1024
MAX_RANK = 4
ADD, SUB, MUL, DIV, OR, AND = range(6)

_TL_COMPUTE = {"bool": tl.int1, "uint8": tl.uint8, "int8": tl.int8, "int16": tl.int16, "int32": tl.int32,
               "int64": tl.int64, "float16": tl.float32, "bfloat16": tl.float32, "float32": tl.float32,
               "float64": tl.float64}


@jit
def _linear_offsets(INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    if INDEX64:
        pid = pid.to(tl.int64)
    return pid * BLOCK + tl.arange(0, BLOCK)


@jit
def _strided_offset(i, s1, s2, s3, t0, t1, t2, t3, RANK: tl.constexpr):
    """Offset of linear index i in a right-aligned (s0, s1, s2, s3) layout with strides t0..t3."""
    if RANK == 1:
        off = i * t3
    elif RANK == 2:
        off = (i % s3) * t3 + (i // s3) * t2
    elif RANK == 3:
        off = (i % s3) * t3
        i = i // s3
        off += (i % s2) * t2 + (i // s2) * t1
    else:
        off = (i % s3) * t3
        i = i // s3
        off += (i % s2) * t2
        i = i // s2
        off += (i % s1) * t1 + (i // s1) * t0
    return off


@jit
def _cast(x, OUT_BOOL: tl.constexpr, out_ty):
    """Convert to the output's element type as torch does: to bool by `!= 0`, and to or from a half type
    through float32 (which is also the only bfloat16 conversion Triton's interpreter gets right)."""
    if OUT_BOOL:
        return x != 0
    if tl.constexpr(x.dtype.is_fp16() or x.dtype.is_bf16() or out_ty.is_fp16() or out_ty.is_bf16()):
        x = x.to(tl.float32)
    return x.to(out_ty)


@jit
def _binary_op(x, y, OP: tl.constexpr):
    if OP == 0:
        r = x + y
    elif OP == 1:
        r = x - y
    elif OP == 2:
        r = x * y
    elif OP == 3:
        r = x / y
    elif OP == 4:
        r = x | y
    else:
        r = x & y
    return r


@jit
def fill_contiguous(dst_ptr, value, n, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    v = _cast(value, OUT_BOOL, dst_ptr.dtype.element_ty)
    tl.store(dst_ptr + offs, tl.full([BLOCK], 0, dst_ptr.dtype.element_ty) + v, mask=offs < n)


@jit
def fill_strided(dst_ptr, value, n, s1, s2, s3, o0, o1, o2, o3, OUT_BOOL: tl.constexpr, RANK: tl.constexpr,
                 INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    v = _cast(value, OUT_BOOL, dst_ptr.dtype.element_ty)
    dst = dst_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, tl.full([BLOCK], 0, dst_ptr.dtype.element_ty) + v, mask=offs < n)


@jit
def copy_contiguous(src_ptr, dst_ptr, n, OUT_BOOL: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + offs, mask=mask)
    tl.store(dst_ptr + offs, _cast(x, OUT_BOOL, dst_ptr.dtype.element_ty), mask=mask)


@jit
def copy_strided(src_ptr, dst_ptr, n, s1, s2, s3, i0, i1, i2, i3, o0, o1, o2, o3, OUT_BOOL: tl.constexpr,
                 RANK: tl.constexpr, INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    x = tl.load(src_ptr + _strided_offset(offs, s1, s2, s3, i0, i1, i2, i3, RANK), mask=mask)
    dst = dst_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, _cast(x, OUT_BOOL, dst_ptr.dtype.element_ty), mask=mask)


@jit
def binary_contiguous(a_ptr, b_ptr, out_ptr, a_scalar, b_scalar, n, OP: tl.constexpr, A_SCALAR: tl.constexpr,
                      B_SCALAR: tl.constexpr, COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr,
                      INDEX64: tl.constexpr, BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    if A_SCALAR:
        x = a_scalar.to(COMPUTE)
    else:
        x = _cast(tl.load(a_ptr + offs, mask=mask), False, COMPUTE)
    if B_SCALAR:
        y = b_scalar.to(COMPUTE)
    else:
        y = _cast(tl.load(b_ptr + offs, mask=mask), False, COMPUTE)
    r = _binary_op(x, y, OP)
    tl.store(out_ptr + offs, _cast(r, OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


@jit
def binary_strided(a_ptr, b_ptr, out_ptr, a_scalar, b_scalar, n, s1, s2, s3, a0, a1, a2, a3, b0, b1, b2, b3,
                   o0, o1, o2, o3, OP: tl.constexpr, A_SCALAR: tl.constexpr, B_SCALAR: tl.constexpr,
                   COMPUTE: tl.constexpr, OUT_BOOL: tl.constexpr, RANK: tl.constexpr, INDEX64: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = _linear_offsets(INDEX64, BLOCK)
    mask = offs < n
    if A_SCALAR:
        x = a_scalar.to(COMPUTE)
    else:
        a_offs = _strided_offset(offs, s1, s2, s3, a0, a1, a2, a3, RANK)
        x = _cast(tl.load(a_ptr + a_offs, mask=mask), False, COMPUTE)
    if B_SCALAR:
        y = b_scalar.to(COMPUTE)
    else:
        b_offs = _strided_offset(offs, s1, s2, s3, b0, b1, b2, b3, RANK)
        y = _cast(tl.load(b_ptr + b_offs, mask=mask), False, COMPUTE)
    r = _binary_op(x, y, OP)
    dst = out_ptr + _strided_offset(offs, s1, s2, s3, o0, o1, o2, o3, RANK)
    tl.store(dst, _cast(r, OUT_BOOL, out_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------- host side
def collapse(shape, strides_list):
    """Drop size-1 dims and merge neighbours that are contiguous in every operand.

    Returns (shape, [strides per operand]) with at least one dim."""
    merged_shape, merged = [], [[] for _ in strides_list]
    for d, size in enumerate(shape):
        if size == 1:
            continue
        if merged_shape and all(m[-1] == s[d] * size for m, s in zip(merged, strides_list)):
            merged_shape[-1] *= size
            for m, s in zip(merged, strides_list):
                m[-1] = s[d]
            continue
        merged_shape.append(size)
        for m, s in zip(merged, strides_list):
            m.append(s[d])
    if not merged_shape:
        return [1], [[1] for _ in strides_list]
    return merged_shape, merged


def _needs_int64(n, shape, strides_list):
    extent = max([n] + [sum((size - 1) * abs(st) for size, st in zip(shape, s)) + 1 for s in strides_list])
    return extent >= 2**31


def _index_type(index64):
    return "i64" if index64 else "i32"


def _grid(n):
    return triton.cdiv(n, BLOCK)


def _strided_launches(shape, strides_list, pointers, itemsizes):
    """Split a collapsed problem of any rank into launches of rank <= MAX_RANK.

    Yields (pointers, sizes padded to 4 dims, strides per operand padded to 4 dims, rank)."""
    lead = len(shape) - MAX_RANK
    inner_shape = shape[max(lead, 0):]
    rank = len(inner_shape)
    sizes = [1] * (MAX_RANK - rank) + list(inner_shape)
    inner = [[0] * (MAX_RANK - rank) + list(s[max(lead, 0):]) for s in strides_list]
    if lead <= 0:
        yield pointers, sizes, inner, rank
        return
    for index in itertools.product(*(range(size) for size in shape[:lead])):
        moved = [p + sum(i * st for i, st in zip(index, s[:lead])) * size if p else p
                 for p, s, size in zip(pointers, strides_list, itemsizes)]
        yield moved, sizes, inner, rank


def fill(t, value, stream):
    """t[...] = value on the device; `value` is already a Python number of t's category."""
    n = t.numel()
    if n == 0:
        return
    device, ptr = t.device.index, t.data_ptr()
    # torch converts a fill value through float unless the tensor is double
    value_type = ("fp64" if t.dtype is dtypes.float64 else "fp32") if t.dtype.is_floating_point else "i64"
    out_bool = t.dtype is dtypes.bool_
    shape, (strides,) = collapse(t._shape, [t._stride])
    index64 = _needs_int64(n, shape, [strides])
    itype = _index_type(index64)
    if len(shape) == 1 and strides[0] == 1:
        args = (ptr, value, n)
        launch = launcher.get(fill_contiguous, device, ("*" + t.dtype.triton, value_type, itype),
                              (out_bool, index64, BLOCK), launcher.aligned_indices(args, (0,), (2,)))
        launch(_grid(n), 1, 1, stream, *args)
        return
    for (p,), sizes, (st,), rank in _strided_launches(shape, [strides], [ptr], [t.dtype.itemsize]):
        launch = launcher.get(fill_strided, device, ("*" + t.dtype.triton, value_type) + (itype,) * 8,
                              (out_bool, rank, index64, BLOCK))
        launch(_grid(math.prod(sizes)), 1, 1, stream, p, value, math.prod(sizes), *sizes[1:], *st)


def copy(dst, src, stream):
    """dst[...] = src on one device, casting to dst's dtype; src already has dst's shape (expanded)."""
    n = dst.numel()
    if n == 0:
        return
    device = dst.device.index
    out_bool = dst.dtype is dtypes.bool_
    shape, (s_strides, d_strides) = collapse(dst._shape, [src._stride, dst._stride])
    index64 = _needs_int64(n, shape, [s_strides, d_strides])
    ptrs = (src.data_ptr(), dst.data_ptr())
    pointer_types = ("*" + src.dtype.triton, "*" + dst.dtype.triton)
    itype = _index_type(index64)
    if len(shape) == 1 and s_strides[0] == 1 and d_strides[0] == 1:
        args = ptrs + (n,)
        launch = launcher.get(copy_contiguous, device, pointer_types + (itype,), (out_bool, index64, BLOCK),
                              launcher.aligned_indices(args, (0, 1), (2,)))
        launch(_grid(n), 1, 1, stream, *args)
        return
    itemsizes = (src.dtype.itemsize, dst.dtype.itemsize)
    for p, sizes, (si, so), rank in _strided_launches(shape, [s_strides, d_strides], list(ptrs), itemsizes):
        launch = launcher.get(copy_strided, device, pointer_types + (itype,) * 12, (out_bool, rank, index64, BLOCK))
        m = math.prod(sizes)
        launch(_grid(m), 1, 1, stream, *p, m, *sizes[1:], *si, *so)


def binary(op, a, b, out, compute, stream):
    """out[...] = a (op) b. Tensor operands are already expanded to out's shape; a Python-number operand
    is passed as a kernel scalar. `compute` is the dtype the operation is done in."""
    from minitensor.tensor import Tensor
    n = out.numel()
    if n == 0:
        return
    device = out.device.index
    compute_tl = _TL_COMPUTE[compute.name]
    scalar_type = "fp64" if compute is dtypes.float64 else "fp32" if compute.is_floating_point else "i64"
    a_scalar, b_scalar = not isinstance(a, Tensor), not isinstance(b, Tensor)
    operands = [x for x in (a, b) if isinstance(x, Tensor)] + [out]
    shape, strides = collapse(out._shape, [x._stride for x in operands])
    index64 = _needs_int64(n, shape, strides)
    ptrs = [0 if a_scalar else a.data_ptr(), 0 if b_scalar else b.data_ptr(), out.data_ptr()]
    types = ("*i8" if a_scalar else "*" + a.dtype.triton, "*i8" if b_scalar else "*" + b.dtype.triton,
             "*" + out.dtype.triton, scalar_type, scalar_type)
    scalars = (a if a_scalar else 0, b if b_scalar else 0)
    out_bool = out.dtype is dtypes.bool_
    itype = _index_type(index64)
    if len(shape) == 1 and all(s[0] == 1 for s in strides):
        args = (*ptrs, *scalars, n)
        launch = launcher.get(binary_contiguous, device, types + (itype,),
                              (op, a_scalar, b_scalar, compute_tl, out_bool, index64, BLOCK),
                              launcher.aligned_indices(args, (0, 1, 2), (5,)))
        launch(_grid(n), 1, 1, stream, *args)
        return
    # scalar operands get zero strides, so the three operands share one layout
    full = iter(strides)
    strides_abo = [[0] * len(shape) if a_scalar else next(full), [0] * len(shape) if b_scalar else next(full),
                   next(full)]
    itemsizes = (1 if a_scalar else a.dtype.itemsize, 1 if b_scalar else b.dtype.itemsize, out.dtype.itemsize)
    for p, sizes, (sa, sb, so), rank in _strided_launches(shape, strides_abo, ptrs, itemsizes):
        launch = launcher.get(binary_strided, device, types + (itype,) * 16,
                              (op, a_scalar, b_scalar, compute_tl, out_bool, rank, index64, BLOCK))
        m = math.prod(sizes)
        launch(_grid(m), 1, 1, stream, *p, *scalars, m, *sizes[1:], *sa, *sb, *so)
