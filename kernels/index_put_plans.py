"""Launch plans of the scatter kernels (kernels/index_put.py), worked out once per signature and kept.

`offsets_plan` launches `row_offsets` for one index tensor; `scatter_plan` launches `scatter` over the R x C
problem, its column dims collapsed as the elementwise plans collapse theirs (`plans.collapse`). Column dims
beyond the kernel's four loop on the host, one launch per position of the leading ones.

Nothing here imports Triton: kernels are named for the launcher, which loads compiled ones from its cache.
"""
import functools
import itertools
import math

from minitensor.backends import active_driver

from . import launcher
from .plans import collapse

BLOCK = 1 << 16 if active_driver().interprets_kernels else 1024  # the interpreter: few, large programs
NUM_WARPS = 4
MAX_RANK = 4
STORE, ADD, ADD_IN_WORDS = 0, 1, 2  # the kernel's MODE
_BITS = {1: "i8", 2: "i16", 4: "i32", 8: "i64"}  # stored elements move as raw bits
# The types tl.atomic_add adds, compiled and interpreted, and as what (unsigned ints as signed: the same bits)
_ATOMIC_ADD = {"i32": "i32", "u32": "i32", "i64": "i64", "u64": "i64", "fp16": "fp16", "fp32": "fp32",
               "fp64": "fp64"}
_IN_WORDS = {"u8": 0, "i8": 0, "i16": 0, "u16": 0, "i1": 1, "bf16": 2}  # the others: _add_in_words' KIND


def accumulate_mode(triton_type):
    """How `scatter` adds elements of this type: ADD (atomic_add) or ADD_IN_WORDS (the compare-and-swap loop,
    for bool, 1- and 2-byte integers and bfloat16)."""
    return ADD if triton_type in _ATOMIC_ADD else ADD_IN_WORDS


@functools.lru_cache(maxsize=1024)
def offsets_plan(index_type, rows, size, stride, info, first, device):
    """run(stream, index_ptr, offsets_ptr, err_ptr): offsets (+)= the rows' wrapped indices times `stride`
    (`first`: =), for a contiguous `index_type` ("i64" or "i32") index of `rows` elements."""
    index64 = rows >= 2**31
    types = ("*" + index_type, "*i64", "*i64", "i64" if index64 else "i32", "i64", "i64", "i64")
    launch = launcher.get("index_put.row_offsets", device, types, (first, index64, BLOCK), (), NUM_WARPS)
    grid = -(-rows // BLOCK)

    def run(stream, index_ptr, offsets_ptr, err_ptr):
        launch(grid, 1, 1, stream, index_ptr, offsets_ptr, err_ptr, rows, size, stride, info)
    return run


@functools.lru_cache(maxsize=1024)
def scatter_plan(triton_type, itemsize, mode, rows, cols_shape, out_strides, value_strides, value_row_stride,
                 device):
    """run(stream, out_ptr, values_ptr, offsets_ptr): the scatter of `rows` index rows, each over the column
    dims `cols_shape` (strides `out_strides` in self, `value_strides` in values; `value_row_stride` between the
    values of two rows), for elements of `triton_type` and `mode` (STORE, ADD, ADD_IN_WORDS)."""
    cols = math.prod(cols_shape)
    extent = max(rows * cols, (rows - 1) * value_row_stride + _extent(cols_shape, value_strides),
                 _extent(cols_shape, out_strides))
    index64 = extent >= 2**31
    shape, (out_strides, value_strides) = collapse(cols_shape, [out_strides, value_strides])
    lead = max(len(shape) - MAX_RANK, 0)
    inner, inner_out, inner_values = shape[lead:], out_strides[lead:], value_strides[lead:]
    element = _ATOMIC_ADD[triton_type] if mode == ADD else _BITS[itemsize]
    itype = "i64" if index64 else "i32"
    types = ("*" + element, "*i32", "*" + element, "*i64") + (itype,) * 15
    consts = (mode, itemsize, _IN_WORDS.get(triton_type, 0), len(inner), index64, BLOCK)
    launch = launcher.get("index_put.scatter", device, types, consts, (), NUM_WARPS)
    inner_cols = math.prod(inner)
    n = rows * inner_cols
    pad = [0] * (MAX_RANK - len(inner))
    sizes = [1] * (MAX_RANK - len(inner)) + list(inner)
    tail = (value_row_stride, *sizes[1:], *pad, *inner_out, *pad, *inner_values)
    grid = -(-n // BLOCK)
    starts = [(sum(p * s for p, s in zip(position, out_strides[:lead])) * itemsize,
               sum(p * s for p, s in zip(position, value_strides[:lead])) * itemsize)
              for position in itertools.product(*(range(s) for s in shape[:lead]))]

    def run(stream, out_ptr, values_ptr, offsets_ptr):
        for out_start, values_start in starts:
            out = out_ptr + out_start
            launch(grid, 1, 1, stream, out, out & ~3, values_ptr + values_start, offsets_ptr, n, inner_cols,
                   out & 3, *tail)
    return run


def _extent(shape, strides):
    return sum((size - 1) * abs(stride) for size, stride in zip(shape, strides)) + 1
