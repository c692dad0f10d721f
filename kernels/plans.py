"""Launch plans of the elementwise kernels (kernels/elementwise.py; kernels/complex.py for complex types): which
kernel, which arguments, how many programs, worked out once per signature (dtypes, shape, strides) and kept.

As CuPy does: drop size-1 dims and merge dims that are contiguous in every operand, then pick the kernel by
rank class, not by strides. Rank 1 with unit strides everywhere uses the `*_contiguous` kernel; rank 2 to 4
uses the `*_strided` kernel; higher ranks loop over the leading dims on the host.

Nothing here imports Triton: kernels are named for the launcher, which loads compiled ones from its cache.
"""
import functools
import itertools
import math

from minitensor.base import dtypes
from minitensor.backends import active_driver

from . import launcher

# The interpreter costs ~1 ms per program whatever its size: give it few, large programs.
BLOCK = 1 << 16 if active_driver().interprets_kernels else 1024
MAX_RANK = 4
_MAX_GRID_Z = 65535
TENSOR, SCALAR, ABSENT = range(3)  # how an operand reaches a kernel: loaded, as a kernel scalar, or not at all


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

    __slots__ = ("run", "contiguous")

    def __init__(self, device, pointer_types, scalar_types, shape, strides_list, itemsizes, contiguous_kernel,
                 strided_kernel, constexprs):
        n = math.prod(shape)
        present = [s for s in strides_list if s is not None]  # None: a scalar operand, zero strides
        shape, present = collapse(shape, present)
        index64 = _needs_int64(n, shape, present)
        itype = "i64" if index64 else "i32"
        npointers = len(pointer_types)
        self.contiguous = None
        if len(shape) == 1 and all(s[0] == 1 for s in present):
            types = pointer_types + scalar_types + (itype,)
            consts = constexprs + (index64, BLOCK)
            n_aligned = (len(types) - 1,) if n % 16 == 0 else ()
            all_aligned = tuple(range(npointers)) + n_aligned
            grid = -(-n // BLOCK)
            aligned_launch = launcher.get(contiguous_kernel, device, types, consts, all_aligned)

            def run(stream, pointers, scalars):
                bits = 0
                for p in pointers:
                    bits |= p
                if bits & 15:
                    aligned = tuple(i for i, p in enumerate(pointers) if p % 16 == 0) + n_aligned
                    launch = launcher.get(contiguous_kernel, device, types, consts, aligned)
                else:
                    launch = aligned_launch
                launch(grid, 1, 1, stream, *pointers, *scalars, n)
            self.run = run
            # for callers that inline the common case: (launch when every pointer is 16-byte aligned, grid, n)
            self.contiguous = (aligned_launch, grid, n)
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
    """How a Python number travels to a kernel computing in `dtype` (uint64's values need all 64 bits)."""
    if dtype.is_floating_point:
        return "fp64" if dtype is dtypes.float64 else "fp32"
    return "u64" if dtype is dtypes.uint64 else "i64"


# ---------------------------------------------------------------------------------------------- complex
COPY = 17  # kernels/complex.py's unary op code for a copy with cast (its others are elementwise.py's codes)
_COMPLEX, _NUMBER, _REAL = 0, 1, 3  # complex.py's operand kinds: complex tensor, (real, imag) scalars, real tensor


class _PairScalars:
    """A plan of complex.py's kernels, which take each number operand as two kernel scalars, its real and
    imaginary parts. It has no inline fast path (`contiguous`): ops/runs.py calls `run`."""

    __slots__ = ("run", "contiguous")

    def __init__(self, plan):
        run = plan.run
        self.run = lambda stream, pointers, scalars: run(stream, pointers,
                                                         [part for s in scalars for part in (s.real, s.imag)])
        self.contiguous = None


def _complex_plan(family, op, operand_dtypes, out_dtype, shape, strides_list, compute, device):
    """A unary (neg, abs, conj, copy), binary or ternary (where) op computing in complex `compute`, operands complex
    tensors, real tensors or numbers (None), as plans of complex.py's kernels; the output complex or real (abs,
    comparisons, a copy to a real type)."""
    part = compute.component.triton
    pointers, kinds, sizes = [], [], []
    for d in operand_dtypes:
        pointers.append("*" + (d.component or d).triton if d is not None else "*i8")
        kinds.append(_NUMBER if d is None else _COMPLEX if d.is_complex else _REAL)
        sizes.append(1 if d is None else d.itemsize)
    pointers.append("*" + (out_dtype.component or out_dtype).triton)
    scalars = (part,) * (2 * len(operand_dtypes)) if family != "unary" else ()
    constexprs = (op, *kinds, part, 0 if out_dtype.is_complex else 1, out_dtype is dtypes.bool_)
    return _PairScalars(_Plan(device, tuple(pointers), scalars, shape, list(strides_list), sizes + [out_dtype.itemsize],
                              f"complex.{family}_contiguous", f"complex.{family}_strided", constexprs))


@functools.lru_cache(maxsize=4096)
def fill_plan(dtype, shape, strides, device):
    """run(stream, (ptr,), (value,)): t[...] = value, the value already a number of t's category (torch
    converts fill values through float unless the tensor is double)."""
    if dtype.is_complex:
        part = dtype.component.triton
        return _PairScalars(_Plan(device, ("*" + part,), (part, part), shape, [strides], [dtype.itemsize],
                                  "complex.fill_contiguous", "complex.fill_strided", ()))
    return _Plan(device, ("*" + dtype.triton,), (_scalar_type(dtype),), shape, [strides], [dtype.itemsize],
                 "elementwise.fill_contiguous", "elementwise.fill_strided", (dtype is dtypes.bool_,))


@functools.lru_cache(maxsize=4096)
def copy_plan(src_dtype, dst_dtype, shape, src_strides, dst_strides, device):
    """run(stream, (src_ptr, dst_ptr), ()): dst[...] = src cast to dst's dtype; src has dst's shape."""
    if src_dtype.is_complex or dst_dtype.is_complex:
        compute = dst_dtype if dst_dtype.is_complex else src_dtype
        return _complex_plan("unary", COPY, (src_dtype,), dst_dtype, shape, (src_strides, dst_strides), compute,
                             device)
    types = ("*" + src_dtype.triton, "*" + dst_dtype.triton)
    merged, (src_merged, dst_merged) = collapse(shape, [src_strides, dst_strides])
    if _is_transposition(merged, src_merged, dst_merged):
        return _TransposedCopyPlan(types, merged, src_merged, dst_merged, dst_dtype is dtypes.bool_, device)
    return _Plan(device, types, (), shape, [src_strides, dst_strides], [src_dtype.itemsize, dst_dtype.itemsize],
                 "elementwise.copy_contiguous", "elementwise.copy_strided", (dst_dtype is dtypes.bool_,))


def _is_transposition(shape, src_strides, dst_strides):
    """Whether the copy writes row-major (batch, R, C) matrices from a source that runs along R: a transposed view
    made contiguous (at most 65535 batches: the grid's third axis)."""
    return (len(shape) in (2, 3) and dst_strides[-1] == 1 and dst_strides[-2] == shape[-1] and src_strides[-2] == 1
            and src_strides[-1] != 1 and (len(shape) == 2 or shape[0] <= _MAX_GRID_Z))


class _TransposedCopyPlan:
    """copy_plan's run for a transposition: elementwise.copy_transposed over square tiles."""
    __slots__ = ("run", "contiguous")

    def __init__(self, types, shape, src_strides, dst_strides, out_bool, device):
        batch, rows, cols = ([1] + list(shape))[-3:]
        s_b, d_b = (src_strides[0], dst_strides[0]) if len(shape) == 3 else (0, 0)
        index64 = _needs_int64(math.prod(shape), shape, [src_strides, dst_strides])
        block = 32 if active_driver().interprets_kernels else 64
        launch = launcher.get("elementwise.copy_transposed", device, types + ("i64" if index64 else "i32",) * 5,
                              (out_bool, index64, block, block))
        grid = (-(-rows // block), -(-cols // block), batch)
        self.contiguous = None

        def run(stream, pointers, scalars):
            launch(*grid, stream, *pointers, rows, cols, s_b, src_strides[-1], d_b)
        self.run = run


@functools.lru_cache(maxsize=4096)
def unary_plan(op, x_dtype, out_dtype, shape, x_strides, out_strides, compute, device):
    """run(stream, (x_ptr, out_ptr), ()): out[...] = op(x) computed in `compute`."""
    if compute.is_complex:
        return _complex_plan("unary", op, (x_dtype,), out_dtype, shape, (x_strides, out_strides), compute, device)
    return _Plan(device, ("*" + x_dtype.triton, "*" + out_dtype.triton), (), shape, [x_strides, out_strides],
                 [x_dtype.itemsize, out_dtype.itemsize], "elementwise.unary_contiguous", "elementwise.unary_strided",
                 (op, compute.triton, out_dtype is dtypes.bool_))


def _operand_types(operand_dtypes, compute):
    """Pointer types, scalar types, kinds and element sizes of kernel operands; a None dtype is a Python number
    travelling as a kernel scalar, ABSENT an operand the op does not have."""
    scalar_type = _scalar_type(compute)
    pointers, kinds, sizes = [], [], []
    for d in operand_dtypes:
        kind = ABSENT if d is ABSENT else SCALAR if d is None else TENSOR
        pointers.append("*" + d.triton if kind == TENSOR else "*i8")
        kinds.append(kind)
        sizes.append(d.itemsize if kind == TENSOR else 1)
    return tuple(pointers), (scalar_type,) * len(operand_dtypes), tuple(kinds), sizes


@functools.lru_cache(maxsize=4096)
def binary_plan(op, a_dtype, b_dtype, out_dtype, shape, a_strides, b_strides, out_strides, compute, device):
    """run(stream, (a_ptr, b_ptr, out_ptr), (a_scalar, b_scalar)): out[...] = a (op) b in `compute`.

    A None dtype marks a Python-number operand: its pointer is 0 and its value travels as a kernel scalar
    (zero strides, so the three operands share one layout)."""
    if compute.is_complex:
        return _complex_plan("binary", op, (a_dtype, b_dtype), out_dtype, shape, (a_strides, b_strides, out_strides),
                             compute, device)
    pointers, scalars, kinds, sizes = _operand_types((a_dtype, b_dtype), compute)
    return _Plan(device, pointers + ("*" + out_dtype.triton,), scalars, shape, [a_strides, b_strides, out_strides],
                 sizes + [out_dtype.itemsize], "elementwise.binary_contiguous", "elementwise.binary_strided",
                 (op, *kinds, compute.triton, out_dtype is dtypes.bool_))


@functools.lru_cache(maxsize=4096)
def ternary_plan(op, a_dtype, b_dtype, c_dtype, out_dtype, shape, a_strides, b_strides, c_strides, out_strides,
                 compute, device):
    """run(stream, (a_ptr, b_ptr, c_ptr, out_ptr), (a_scalar, b_scalar, c_scalar)): where(a, b, c) (op 0) or
    clamp(a, b, c) (op 1) in `compute`; the where condition stays bool. Operand dtypes as in binary_plan, or
    ABSENT for a clamp bound not given."""
    if compute.is_complex:  # where; complex types have no clamp
        return _complex_plan("ternary", op, (a_dtype, b_dtype, c_dtype), out_dtype, shape,
                             (a_strides, b_strides, c_strides, out_strides), compute, device)
    pointers, scalars, kinds, sizes = _operand_types((a_dtype, b_dtype, c_dtype), compute)
    a_compute = a_dtype.triton if op == 0 else compute.triton
    return _Plan(device, pointers + ("*" + out_dtype.triton,), scalars, shape,
                 [a_strides, b_strides, c_strides, out_strides], sizes + [out_dtype.itemsize],
                 "elementwise.ternary_contiguous", "elementwise.ternary_strided",
                 (op, *kinds, a_compute, compute.triton, out_dtype is dtypes.bool_))
