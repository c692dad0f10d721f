"""Shape and stride arithmetic, with torch's rules and error messages: what a view, a broadcast or a basic
index makes of (shape, strides, offset). Pure functions of tuples, shared by the Tensor class and the ops below
it; strides and offsets count elements."""
import functools
import math
import numbers
import operator

import numpy as np

from ..base.arguments import int_arg
from ..base.dtypes import INT
from .fields import TensorFields

INT64_MAX = 2**63 - 1  # torch's sizes, strides and offsets are int64, and so are the kernels' offsets
OVERLAP = ("unsupported operation: more than one element of the written-to tensor refers to a single memory "
           "location. Please clone() the tensor before performing the operation.")


@functools.lru_cache(maxsize=4096)
def contiguous_strides(shape):
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def normalize_dim(dim, ndim):
    """Wrap a possibly negative dim, with torch's IndexError for one out of range."""
    bound = max(ndim, 1)
    if not -bound <= dim < bound:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, {bound - 1}], "
                         f"but got {dim})")
    return dim % bound


def shape_arg(size):
    """Accept f(2, 3), f((2, 3)) and f([2, 3]) of ints (Python's, numpy's, int tensors: operator.index); a float
    is refused, not truncated, as in torch."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    try:
        return tuple(map(operator.index, size))
    except TypeError:
        return int_tuple(size, "size")  # raises, naming the element


def size_key(size):
    """A memo key for a factory's `*size`: the arguments and their elements' types, so that 3, 3.0 and True, equal
    as dict keys, stay apart (a float size is refused)."""
    inner = size[0] if len(size) == 1 and isinstance(size[0], tuple) else size
    return size, tuple(map(type, inner))


def new_shape(size):
    """The shape of a new tensor, from f(2, 3), f((2, 3)) or f([2, 3]): ints >= 0 whose product fits int64."""
    shape = shape_arg(size)
    negative = next((n for n in shape if n < 0), None)
    if negative is not None:
        raise RuntimeError(f"Trying to create tensor with negative dimension {negative}: {list(shape)}")
    if math.prod(shape) >= 2**63:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(shape)}")
    return shape


def is_contiguous(shape, stride):
    if 0 in shape:
        return True
    expected = 1
    for size, step in zip(reversed(shape), reversed(stride)):
        if size != 1 and step != expected:
            return False
        expected *= size
    return True


def is_dense(shape, stride):
    """True when the layout is a permutation of a contiguous one: it covers exactly numel elements from offset 0,
    so a fresh buffer can take the same strides."""
    dims = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: stride[d])
    expected = 1
    for d in dims:
        if stride[d] != expected:
            return False
        expected *= shape[d]
    return True


def extent(shape, stride):
    """Elements from the first to one past the last (non-negative strides); 0 when empty."""
    if 0 in shape:
        return 0
    return sum((n - 1) * s for n, s in zip(shape, stride)) + 1


def storage_nbytes(shape, stride, offset, itemsize, name):
    """The bytes a storage needs under the view (shape, stride, offset): torch's computeStorageNbytes, 0 for an
    empty view whatever its offset, with torch's errors for negative numbers and for what int64 cannot hold.
    `name` (the caller) starts the message for negative strides, as torch's does."""
    if any(n < 0 for n in shape):
        raise RuntimeError(f"Trying to create tensor with negative dimension {min(shape)}: {list(shape)}")
    if any(s < 0 for s in stride):
        raise RuntimeError(f"{name}: Negative strides are not supported at the moment, got strides: {list(stride)}")
    if offset < 0:
        raise RuntimeError(f"Tensor: invalid storage offset {offset}")
    if 0 in shape:
        return 0
    nbytes = (offset + extent(shape, stride)) * itemsize
    if nbytes > INT64_MAX or max(stride, default=0) > INT64_MAX:
        raise RuntimeError(f"Storage size calculation overflowed with sizes={list(shape)} and strides={list(stride)}")
    if math.prod(shape) > INT64_MAX:  # with stride 0 the bytes fit where the element count does not
        raise RuntimeError("numel: integer multiplication overflow")
    return nbytes


def as_strided(size, stride, offset, itemsize, nbytes):
    """(shape, stride, offset) of `t.as_strided(size, stride, offset)` on a storage of `nbytes`, checked as torch
    checks it: ints only, and the view inside the storage, or a kernel would reach the next allocation."""
    shape = int_tuple(size, "as_strided(): argument 'size' (position 1)")
    stride = int_tuple(stride, "as_strided(): argument 'stride' (position 2)")
    offset = int_arg(offset, "as_strided(): argument 'storage_offset' (position 3)")
    if len(shape) != len(stride):
        raise RuntimeError("mismatch in length of strides and shape")
    needed = storage_nbytes(shape, stride, offset, itemsize, "as_strided")
    if needed > nbytes:
        raise RuntimeError(f"setStorage: sizes {list(shape)}, strides {list(stride)}, storage offset {offset}, and "
                           f"itemsize {itemsize} requiring a storage size of {needed} are out of bounds for storage "
                           f"of size {nbytes}")
    return shape, stride, offset


def int_tuple(values, what):
    """A sequence of sizes or strides given by a user or a foreign array as a tuple of ints, with torch's
    TypeError for anything else (floats and bools included)."""
    if not isinstance(values, (tuple, list)):
        raise TypeError(f"{what} must be tuple of ints, not {type(values).__name__}")
    for i, value in enumerate(values):
        if isinstance(value, bool) or not hasattr(type(value), "__index__"):
            raise TypeError(f"{what} must be tuple of ints, but found element of type {type(value).__name__} at "
                            f"pos {i}")
    return tuple(map(operator.index, values))


def overlaps_itself(shape, stride):
    """True when several elements share one memory location (a stride 0 over a size above 1): torch's
    has_internal_overlap, where it answers YES. Writing through such a view is refused, as torch does."""
    return any(st == 0 and n > 1 for n, st in zip(shape, stride))


def infer_shape(shape, numel):
    """Resolve one -1 in a requested shape against `numel`, with torch's errors."""
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    known = math.prod(s for s in shape if s != -1)
    if any(s < -1 for s in shape):
        raise RuntimeError(f"invalid shape dimension {min(shape)}")
    if -1 in shape:
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    elif known != numel:
        raise RuntimeError(f"shape '{list(shape)}' is invalid for input of size {numel}")
    return shape


def view_strides(shape, stride, new_shape):
    """Strides for viewing (shape, stride) as new_shape without copying, or None (torch's computeStride)."""
    numel = math.prod(shape)
    if numel <= 1:
        return contiguous_strides(new_shape)
    new_stride = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = stride[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and stride[d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_stride[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk_base_stride = stride[d - 1]
                tensor_numel = view_numel = 1
    return tuple(new_stride) if view_d == -1 else None


def broadcast_shapes(*shapes):
    ndim = max((len(s) for s in shapes), default=0)
    result = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape, ndim - len(shape)):
            if size != 1:
                if result[i] not in (1, size):
                    raise RuntimeError(f"The size of tensor a ({result[i]}) must match the size of tensor b "
                                       f"({size}) at non-singleton dimension {i}")
                result[i] = size
            elif result[i] == 1:
                result[i] = size
    return tuple(result)


def expanded(shape, stride, sizes):
    """(shape, stride) of `expand(*sizes)`: size-1 dims and new leading dims get stride 0; -1 keeps a size."""
    n = len(shape)
    if len(sizes) < n:
        raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to "
                           f"the number of dimensions in the tensor ({n})")
    new_shape, new_stride = [], []
    lead = len(sizes) - n
    for i, size in enumerate(sizes):
        if i < lead:
            if size < 0:
                raise RuntimeError(f"expand: -1 is not allowed in a leading, non-existing dimension ({i})")
            new_shape.append(size)
            new_stride.append(0)
            continue
        own, own_stride = shape[i - lead], stride[i - lead]
        if size == -1:
            size = own
        elif size < 0:
            raise RuntimeError(f"Trying to create tensor with negative dimension {size}: {list(sizes)}")
        if own == size:
            new_shape.append(size)
            new_stride.append(own_stride)
        elif own == 1:
            new_shape.append(size)
            new_stride.append(0)
        else:
            raise RuntimeError(f"The expanded size of the tensor ({size}) must match the existing size ({own}) "
                               f"at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  Tensor sizes: "
                               f"{list(shape)}")
    return tuple(new_shape), tuple(new_stride)


def permuted(shape, stride, dims):
    """(shape, stride) with the dims reordered as `dims` lists them."""
    n = len(shape)
    if len(dims) != n:
        raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match the "
                           f"length of the desired ordering of dimensions i.e. input.dim() = {n} is not equal "
                           f"to len(dims) = {len(dims)}")
    dims = [normalize_dim(d, n) for d in dims]
    if len(set(dims)) != n:
        raise RuntimeError("permute(): duplicate dims are not allowed.")
    return tuple(shape[d] for d in dims), tuple(stride[d] for d in dims)


def narrowed(shape, stride, offset, dim, start, length):
    """(shape, stride, offset) of `narrow(dim, start, length)`: `length` elements from `start` (negative: from
    the end) along `dim`, inside it."""
    if not shape:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    start, length = int_arg(start, "narrow(): argument 'start' (position 2)"), \
        int_arg(length, "narrow(): argument 'length' (position 3)")
    dim = normalize_dim(dim, len(shape))
    size = shape[dim]
    if start < 0:
        start += size
    if not (0 <= start <= size and 0 <= length and start + length <= size):
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
    return shape[:dim] + (length,) + shape[dim + 1:], stride, offset + start * stride[dim]


def selected(shape, stride, offset, dim, index):
    """(shape, stride, offset) of `select(dim, index)`: the slice at `index` (negative: from the end)."""
    if not shape:
        raise IndexError("select() cannot be applied to a 0-dim tensor.")
    index = int_arg(index, "select(): argument 'index' (position 2)")
    dim = normalize_dim(dim, len(shape))
    size = shape[dim]
    if not -size <= index < size:
        raise IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")
    return shape[:dim] + shape[dim + 1:], stride[:dim] + stride[dim + 1:], offset + (index % size) * stride[dim]


def squeezed(shape, stride, dim):
    """(shape, stride) without the size-1 dims among `dim` (an int or a sequence; None: all of them)."""
    n = len(shape)
    if dim is None:
        keep = [i for i in range(n) if shape[i] != 1]
    else:
        dims = {normalize_dim(d, n) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
        keep = [i for i in range(n) if i not in dims or shape[i] != 1]
    return tuple(shape[i] for i in keep), tuple(stride[i] for i in keep)


def indexed(shape, stride, offset, index):
    """(shape, stride, offset) of the view `t[index]` for basic indexing: ints, slices, None and '...'."""
    if not isinstance(index, tuple):
        index = (index,)
    specified = sum(1 for i in index if i is not None and i is not Ellipsis)
    if sum(1 for i in index if i is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if specified > len(shape):
        raise IndexError(f"too many indices for tensor of dimension {len(shape)}")
    new_shape, new_stride = [], []
    d = 0  # the dim the next index applies to
    for item in index:
        if item is None:
            new_shape.append(1)
            new_stride.append(stride[d] * shape[d] if d < len(shape) else 1)
        elif item is Ellipsis:
            skip = len(shape) - specified
            new_shape.extend(shape[d:d + skip])
            new_stride.extend(stride[d:d + skip])
            d += skip
        elif isinstance(item, slice):
            start, stop, step = item.indices(shape[d])
            if step <= 0:
                raise ValueError("step must be greater than zero")
            offset += start * stride[d]  # also for an empty slice: torch's offset is where it starts
            new_shape.append(max(0, -(-(stop - start) // step)))
            new_stride.append(stride[d] * step)
            d += 1
        elif _is_integer(item):
            i = int(item)
            size = shape[d]
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
            offset += (i % size) * stride[d]
            d += 1
        else:
            raise IndexError(f"minitensor supports indexing with integers, slices, None and '...' (basic "
                             f"indexing); got {type(item).__name__}. Use index_select or gather for "
                             "tensor indices.")
    new_shape.extend(shape[d:])
    new_stride.extend(stride[d:])
    return tuple(new_shape), tuple(new_stride), offset


def _is_integer(item):
    """An int index: a Python or numpy integer (not a bool), or a 0-d integer tensor."""
    if isinstance(item, (numbers.Integral, np.integer)):
        return not isinstance(item, bool)
    return isinstance(item, TensorFields) and item.dim() == 0 and item.dtype.category == INT


class Size(tuple):
    """torch.Size: a tuple of ints with a torch-like repr."""

    def __repr__(self):
        return f"minitensor.Size({list(self)})"

    def numel(self):
        return math.prod(self)

