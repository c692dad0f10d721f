"""Elementwise kernels (fill, strided copy with dtype cast, binary arithmetic) and their host side.

Host side, as CuPy does: drop size-1 dims and merge dims that are contiguous in every operand, then pick
the kernel by rank class, not by strides. Rank 1 with unit strides everywhere uses the `*_contiguous`
kernel (few arguments, vector loads); rank 2 to 4 uses the `*_strided` kernel, whose offsets come from
the linear index by div/mod, right-aligned in four dims; higher ranks loop over the leading dims on the
host. Indices are 32-bit unless some extent needs 64 bits (INDEX64).
"""
import functools
import itertools
import math

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


class _Plan:
    """The launches of one elementwise problem, fixed once per signature (dtypes, shape, strides).

    Contiguous problems are one launch of the `*_contiguous` kernel, compiled with 16-byte alignment
    hints when every pointer of the call is aligned. Strided problems are launches of the `*_strided`
    kernel, one per index of the dims beyond MAX_RANK."""

    __slots__ = ("run",)

    def __init__(self, device, pointer_types, scalar_types, shape, strides_list, itemsizes, contiguous_kernel,
                 strided_kernel, constexprs):
        n = math.prod(shape)
        present = [s for s in strides_list if s is not None]  # None: a scalar operand, zero strides
        shape, present = collapse(shape, present)
        index64 = _needs_int64(n, shape, present)
        itype = "i64" if index64 else "i32"
        npointers = len(pointer_types)
        if len(shape) == 1 and all(s[0] == 1 for s in present):
            types = pointer_types + scalar_types + (itype,)
            consts = constexprs + (index64, BLOCK)
            n_aligned = (len(types) - 1,) if n % 16 == 0 else ()
            all_aligned = tuple(range(npointers)) + n_aligned
            grid = -(-n // BLOCK)
            fast = []

            def run(stream, pointers, scalars):
                bits = 0
                for p in pointers:
                    bits |= p
                if bits & 15:
                    aligned = tuple(i for i, p in enumerate(pointers) if p % 16 == 0) + n_aligned
                    launch = launcher.get(contiguous_kernel, device, types, consts, aligned)
                else:
                    if not fast:
                        fast.append(launcher.get(contiguous_kernel, device, types, consts, all_aligned))
                    launch = fast[0]
                launch(grid, 1, 1, stream, *pointers, *scalars, n)
            self.run = run
            return
        collapsed = iter(present)
        strides_list = [[0] * len(shape) if s is None else next(collapsed) for s in strides_list]
        lead = max(len(shape) - MAX_RANK, 0)
        rank = len(shape) - lead
        sizes = [1] * (MAX_RANK - rank) + list(shape[lead:])
        inner = [x for s in strides_list for x in [0] * (MAX_RANK - rank) + list(s[lead:])]
        m = math.prod(sizes)
        types = pointer_types + scalar_types + (itype,) * (3 + len(inner) + 1)
        launch = launcher.get(strided_kernel, device, types, constexprs + (rank, index64, BLOCK))
        tail = (m, *sizes[1:], *inner)
        grid = -(-m // BLOCK)
        starts = [[sum(i * st for i, st in zip(index, s[:lead])) * size for s, size in zip(strides_list, itemsizes)]
                  for index in itertools.product(*(range(size) for size in shape[:lead]))]

        def run(stream, pointers, scalars):
            for offsets in starts:
                moved = [p + o if p else p for p, o in zip(pointers, offsets)]
                launch(grid, 1, 1, stream, *moved, *scalars, *tail)
        self.run = run


def _scalar_type(dtype):
    """How a Python number travels to a kernel computing in `dtype`."""
    return ("fp64" if dtype is dtypes.float64 else "fp32") if dtype.is_floating_point else "i64"


@functools.lru_cache(maxsize=4096)
def fill_plan(dtype, shape, strides, device):
    """run(stream, (ptr,), (value,)): t[...] = value, the value already a number of t's category (torch
    converts fill values through float unless the tensor is double)."""
    return _Plan(device, ("*" + dtype.triton,), (_scalar_type(dtype),), shape, [strides], [dtype.itemsize],
                 fill_contiguous, fill_strided, (dtype is dtypes.bool_,))


@functools.lru_cache(maxsize=4096)
def copy_plan(src_dtype, dst_dtype, shape, src_strides, dst_strides, device):
    """run(stream, (src_ptr, dst_ptr), ()): dst[...] = src cast to dst's dtype; src has dst's shape."""
    return _Plan(device, ("*" + src_dtype.triton, "*" + dst_dtype.triton), (), shape, [src_strides, dst_strides],
                 [src_dtype.itemsize, dst_dtype.itemsize], copy_contiguous, copy_strided,
                 (dst_dtype is dtypes.bool_,))


@functools.lru_cache(maxsize=4096)
def binary_plan(op, a_dtype, b_dtype, out_dtype, shape, a_strides, b_strides, out_strides, compute, device):
    """run(stream, (a_ptr, b_ptr, out_ptr), (a_scalar, b_scalar)): out[...] = a (op) b in `compute`.

    A None dtype marks a Python-number operand: its pointer is 0 and its value travels as a kernel scalar
    (zero strides, so the three operands share one layout)."""
    scalar_type = _scalar_type(compute)
    return _Plan(device,
                 ("*i8" if a_dtype is None else "*" + a_dtype.triton, "*i8" if b_dtype is None else "*" + b_dtype.triton,
                  "*" + out_dtype.triton), (scalar_type, scalar_type), shape,
                 [a_strides, b_strides, out_strides],
                 [1 if a_dtype is None else a_dtype.itemsize, 1 if b_dtype is None else b_dtype.itemsize,
                  out_dtype.itemsize],
                 binary_contiguous, binary_strided,
                 (op, a_dtype is None, b_dtype is None, _TL_COMPUTE[compute.name], out_dtype is dtypes.bool_))
