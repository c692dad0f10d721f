"""Launch plans of the gather kernels (kernels/index.py), worked out once per signature and kept.

A problem is the output's shape (row-major, contiguous) with two affine layouts over it: where each element's
index sits in the index tensor, and where its row starts in the input (`base`, zero stride on the indexed dim),
plus the indexed dim's size and stride. As for the elementwise plans, size-1 dims are dropped and dims that
are contiguous in every layout merged. Then: a unit-stride index in one dim uses `gather_contiguous`; an
innermost dim that is contiguous in the input and shares one index (index_select along a leading dim) uses
`gather_rows`; anything else `gather_strided`. Dims beyond what a kernel takes loop on the host.

Nothing here imports Triton: kernels are named for the launcher, which loads compiled ones from its cache.
"""
import functools
import itertools
import math

from minitensor.backends import active_driver

from . import launcher
from .plans import collapse

# The interpreter costs ~1 ms per program whatever its size: give it few, large programs.
_SIM = active_driver().interprets_kernels
BLOCK = 1 << 16 if _SIM else 1024
ROWS_TILE = 1 << 16 if _SIM else 16384  # elements per program of gather_rows
ROWS_MAX_COLS = 1 << 16 if _SIM else 1024  # its widest column block
NUM_WARPS = 4
ROWS_WARPS = 8
MAX_RANK = 4
_BITS = {1: "*i8", 2: "*i16", 4: "*i32", 8: "*i64"}  # elements move as raw bits


def _extent(shape, strides):
    return sum((size - 1) * abs(stride) for size, stride in zip(shape, strides)) + 1


class GatherPlan:
    """`run(stream, data_ptr, index_ptr, out_ptr, err_ptr)`: out (contiguous) = the gathered elements.

    `fast`, for a unit-stride index, is (launch, grid, tail): when the index and out pointers are 16-byte
    aligned, `launch(grid, 1, 1, stream, data_ptr, index_ptr, out_ptr, err_ptr, *tail)` is the whole run, for
    callers that inline it (minitensor.indexing's hot path); None otherwise."""

    __slots__ = ("run", "fast")

    def __init__(self, run, fast=None):
        self.run, self.fast = run, fast


@functools.lru_cache(maxsize=4096)
def gather_plan(itemsize, index_type, shape, index_strides, base_strides, size, dim_stride, info, device):
    """The GatherPlan of a problem (see the module docstring). `index_type` is "i64" or "i32"; `info` is the
    word the kernel records beside a bad index (see minitensor.indexing)."""
    n = math.prod(shape)
    out_strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    index64 = max(n, _extent(shape, index_strides),
                  _extent(shape, base_strides) + max(size - 1, 0) * abs(dim_stride)) >= 2**31
    shape, strides = collapse(shape, [index_strides, base_strides, out_strides])
    args = (itemsize, index_type, size, dim_stride, info, device, index64)
    if len(shape) == 1 and strides[0][0] == 1:
        return _contiguous(*args, shape[0], strides[1][0])
    rows = len(shape) >= 2 and strides[0][-1] == 0 and strides[1][-1] == 1
    if rows and -(-shape[-1] // _column_block(shape[-1])) <= 65535:  # column blocks go on the grid's y axis
        inner = len(shape) - 1  # the outer dims, one index each
        lead = max(inner - MAX_RANK, 0)
        launch = _rows(*args, shape[lead:], [s[lead:] for s in strides])
    else:
        lead = max(len(shape) - MAX_RANK, 0)
        launch = _strided(*args, shape[lead:], [s[lead:] for s in strides])
    if not lead:
        return GatherPlan(launch)
    index_size, data_size = int(index_type[1:]) // 8, itemsize
    starts = [tuple(sum(i * s for i, s in zip(position, layout[:lead])) * size_of
                    for layout, size_of in zip(strides, (index_size, data_size, data_size)))
              for position in itertools.product(*(range(s) for s in shape[:lead]))]

    def run(stream, data_ptr, index_ptr, out_ptr, err_ptr):
        for index_start, data_start, out_start in starts:
            launch(stream, data_ptr + data_start, index_ptr + index_start, out_ptr + out_start, err_ptr)
    return GatherPlan(run)


def _pointer_types(itemsize, index_type):
    return (_BITS[itemsize], "*" + index_type, _BITS[itemsize], "*i64")


def _contiguous(itemsize, index_type, size, dim_stride, info, device, index64, n, base_stride):
    itype = "i64" if index64 else "i32"
    types = _pointer_types(itemsize, index_type) + (itype, "i64", itype, itype, "i64")
    consts = (index64, BLOCK)
    kernel = "index.gather_contiguous"
    n_aligned = (4,) if n % 16 == 0 else ()
    fast = launcher.get(kernel, device, types, consts, (1, 2, 3) + n_aligned, NUM_WARPS)
    grid = -(-n // BLOCK)
    tail = (n, size, dim_stride, base_stride, info)

    def run(stream, data_ptr, index_ptr, out_ptr, err_ptr):
        if (index_ptr | out_ptr) & 15:
            aligned = tuple(i for i, p in ((1, index_ptr), (2, out_ptr)) if p % 16 == 0) + (3,) + n_aligned
            launch = launcher.get(kernel, device, types, consts, aligned, NUM_WARPS)
        else:
            launch = fast
        launch(grid, 1, 1, stream, data_ptr, index_ptr, out_ptr, err_ptr, *tail)
    return GatherPlan(run, (fast, grid, tail))


def _outer(shape, strides):
    """Sizes s1..s3 and both strides i0..i3, b0..b3 of up to four dims, right-aligned and padded."""
    pad = [0] * (MAX_RANK - len(shape))
    sizes = [1] * (MAX_RANK - len(shape)) + list(shape)
    return (*sizes[1:], *pad, *strides[0], *pad, *strides[1])


def _strided(itemsize, index_type, size, dim_stride, info, device, index64, shape, strides):
    itype = "i64" if index64 else "i32"
    types = _pointer_types(itemsize, index_type) + (itype, "i64", itype, "i64") + (itype,) * 11
    launch = launcher.get("index.gather_strided", device, types, (len(shape), index64, BLOCK), (3,), NUM_WARPS)
    m = math.prod(shape)
    tail = (m, size, dim_stride, info, *_outer(shape, strides))
    grid = -(-m // BLOCK)

    def run(stream, data_ptr, index_ptr, out_ptr, err_ptr):
        launch(grid, 1, 1, stream, data_ptr, index_ptr, out_ptr, err_ptr, *tail)
    return run


def _column_block(cols):
    """A power of two covering the row, up to ROWS_MAX_COLS: masked lanes cost no memory traffic, while
    splitting a row over more programs repeats its index load and offsets (300 columns: 512, not 64)."""
    return min(1 << (cols - 1).bit_length(), ROWS_MAX_COLS)


def _rows(itemsize, index_type, size, dim_stride, info, device, index64, shape, strides):
    """gather_rows over `shape` (outer dims, then the contiguous row), with vector copies when every row
    start is 16-byte aligned: the strides statically, the data pointer at the call."""
    itype = "i64" if index64 else "i32"
    types = _pointer_types(itemsize, index_type) + (itype, itype, "i64", itype, "i64") + (itype,) * 11
    cols = shape[-1]
    rows = math.prod(shape[:-1])
    block_c = _column_block(cols)
    block_r = max(ROWS_TILE // block_c, 1)
    vec = 16 // itemsize
    vectorisable = all(s % vec == 0 for s in (cols, dim_stride, *strides[1][:-1]))
    cols_aligned = (5,) if cols % 16 == 0 else ()

    def kernel(vec, aligned):
        consts = (len(shape) - 1, vec, index64, block_r, block_c)
        return launcher.get("index.gather_rows", device, types, consts, aligned + (3,) + cols_aligned, ROWS_WARPS)
    fast = kernel(vec, (0, 2)) if vectorisable else None
    tail = (rows, cols, size, dim_stride, info, *_outer(shape[:-1], [s[:-1] for s in strides]))
    grid_x, grid_y = -(-rows // block_r), -(-cols // block_c)

    def run(stream, data_ptr, index_ptr, out_ptr, err_ptr):
        launch = fast if fast is not None and not (data_ptr | out_ptr) & 15 else kernel(1, ())
        launch(grid_x, grid_y, 1, stream, data_ptr, index_ptr, out_ptr, err_ptr, *tail)
    return run
