"""`index_put_`, `index_put` and item assignment with tensor indices (`t[idx] = v`): torch's advanced-indexing
writes, checked as torch checks them; the work in the scatter kernels (kernels/index_put.py) for cuda tensors
and in numpy for CPU tensors.

The index tensors (int64 or int32; bool masks, and deprecated uint8 ones, become their nonzero positions, which
costs a copy to the host as torch's nonzero does) broadcast together to the shape B, and each indexes one dim of
self. Those dims come first for `index_put_`; item assignment applies ints, slices, None and Ellipsis first
(views), then the tensors to the dims they stand at. As in torch and numpy, the result's B dims stand where the
indexed dims were when those are adjacent, else first. Every op here first moves to a canonical problem: self
viewed with the indexed dims first and the other dims (the columns) after, and values viewed in the same order,
broadcast to B + columns.

Negative indices wrap; out-of-range ones raise IndexError: on the CPU before anything is written, on cuda from
the kernels' error record as for gather (cuda/device_errors.py: at the call on the simulator, at the thread's
next synchronising call on a GPU). The kernels skip the rows with a bad index and write the others, as torch's
kernels may have before their device-side assert; they never write outside self.
"""
import math
import warnings

import numpy as np

from ..backends import active_driver
from ..base.device import CPU
from ..base.dtypes import TORCH_NAMES, bf16_bits_to_f32, bfloat16, f32_to_bf16_bits, int64
from ..core import fields
from ..core.alloc import empty
from ..core.host_arrays import numpy_view
from ..core.shapes import OVERLAP, broadcast_shapes, expanded, overlaps_itself
from ..cuda import capturing
from ..cuda.device_errors import INDEX_PUT, info_word, thread_records
from ..cuda.streams import Stream, current_stream_handle
from .runs import kernels
from .typing import refuse_registered

_INTEGER_INDEX = ("int64", "int32")
_MASK_INDEX = ("bool", "uint8")


# ---------------------------------------------------------------------------------------------- public API
def index_put_(self, indices, values, accumulate=False):
    """self[indices] = values, in place; with accumulate, self[indices] += values, every duplicate index adding
    its value (torch.Tensor.index_put_). `values` must have self's dtype and broadcast to the indexed shape."""
    if not isinstance(indices, (tuple, list)):
        raise TypeError(f"index_put_(): argument 'indices' (position 1) must be tuple of Tensors, not "
                        f"{type(indices).__name__}")
    for i, index in enumerate(indices):
        if not isinstance(index, fields.TensorFields):
            raise TypeError(f"expected Tensor as element {i} in argument 0, but got {type(index).__name__}")
    if not isinstance(values, fields.TensorFields):
        raise TypeError(f"index_put_(): argument 'values' (position 2) must be Tensor, not {type(values).__name__}")
    if not isinstance(accumulate, bool):
        raise TypeError(f"index_put_(): argument 'accumulate' must be bool, not {type(accumulate).__name__}")
    if not indices:
        raise RuntimeError("index_put_(): expected at least one index tensor, got none")
    taken = sum(_dims_taken(index) for index in indices)
    if taken > self.dim():
        raise IndexError(f"too many indices for tensor of dimension {self.dim()} (got {taken})")
    entries, dim = [], 0
    for index in indices:
        entries.append((dim, index))
        dim += _dims_taken(index)
    _put(self, entries, values, accumulate)
    return self


def index_put(self, indices, values, accumulate=False):
    """index_put_ on a copy of self (torch.index_put)."""
    return index_put_(self.clone(), indices, values, accumulate)


def has_tensor(index):
    """Whether an item-assignment index holds a tensor: then it is advanced indexing, done here."""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(item, fields.TensorFields) for item in items)


def setitem(t, index, value):
    """t[index] = value with tensor indices: ints, slices, None and Ellipsis make a view first, then the tensors
    index it (torch's order). A number is stored as t's dtype; a tensor value must have t's dtype (as in torch),
    and its leading size-1 dims are dropped first."""
    items = index if isinstance(index, tuple) else (index,)
    taken = sum(_dims_of_t(item) for item in items)
    basic, entries, position = [], [], 0
    for item in items:
        if isinstance(item, fields.TensorFields):
            entries.append((position, item))
            basic.extend([slice(None)] * _dims_taken(item))
            position += _dims_taken(item)
            continue
        basic.append(item)
        if item is Ellipsis:
            position += t.dim() - taken
        elif item is None or isinstance(item, slice):
            position += 1
    target = t[tuple(basic)]
    if isinstance(value, fields.TensorFields):
        lead = 0
        while lead < value.dim() and value._shape[lead] == 1:
            lead += 1
        value = value._view(value._shape[lead:], value._stride[lead:])
    else:
        value = empty((), t.dtype, t.device).fill_(value)
    _put(target, entries, value, False)


# ---------------------------------------------------------------------------------------------- checks
def _dims_of_t(item):
    """How many of t's dims an item of an item-assignment index covers (Ellipsis: none of its own)."""
    if isinstance(item, fields.TensorFields):
        return _dims_taken(item)
    return 0 if item is None or item is Ellipsis else 1


def _dims_taken(index):
    """How many dims of self an index tensor covers: a mask its own, an integer index one."""
    return index.dim() if index.dtype.name in _MASK_INDEX else 1


def _put(self, entries, values, accumulate):
    """self[entries] (+)= values, where each entry is (the dim of self it starts at, an index tensor)."""
    refuse_registered(self.device, "index_put_")
    dims, indices = _integer_indices(self, entries)
    values = _checked_values(self, values)
    try:
        rows_shape = broadcast_shapes(*(index._shape for index in indices))
    except RuntimeError:
        shapes = ", ".join(str(list(index._shape)) for index in indices)
        raise IndexError(f"shape mismatch: indexing tensors could not be broadcast together with shapes {shapes}")
    target, values = _canonical(self, dims, rows_shape, values)
    if target.numel() and 0 in target._stride and overlaps_itself(target._shape, target._stride):
        raise RuntimeError(OVERLAP)
    if math.prod(rows_shape) * math.prod(target._shape[len(dims):]) == 0:
        return
    if self.device.type == "cpu":
        _put_numpy(target, dims, indices, values, accumulate)
    else:
        _put_cuda(target, dims, indices, values, accumulate)


def _integer_indices(self, entries):
    """(dims, index tensors): one int64 or int32 index per indexed dim of self, masks turned into the indices
    of their nonzero elements (int64, on self's device)."""
    dims, indices = [], []
    for dim, index in entries:
        name = index.dtype.name
        if name not in _INTEGER_INDEX and name not in _MASK_INDEX:
            raise IndexError("tensors used as indices must be long, int, byte or bool tensors")
        if index.device != self.device and index.device.type != "cpu":
            raise RuntimeError(f"indices should be either on cpu or on the same device as the indexed tensor "
                               f"({self.device})")
        if name in _INTEGER_INDEX:
            dims.append(dim)
            indices.append(index)
            continue
        if name == "uint8":
            warnings.warn("indexing with dtype minitensor.uint8 is now deprecated, please use a dtype "
                          "minitensor.bool instead.", UserWarning, stacklevel=4)
        dims.extend(range(dim, dim + index.dim()))
        indices.extend(_mask_positions(self, dim, index))
    return dims, indices


def _mask_positions(self, dim, mask):
    """The positions of a mask's nonzero elements, one int64 index tensor per dim it covers."""
    if mask.dim() == 0:
        raise IndexError("index_put_(): a 0-d bool mask is not supported: index with a 1-d mask instead")
    for j, size in enumerate(mask._shape):
        if size != self._shape[dim + j]:
            raise IndexError(f"The shape of the mask {list(mask._shape)} at index {j} does not match the shape of "
                             f"the indexed tensor {list(self._shape)} at index {dim + j}")
    positions = []
    for found in np.nonzero(numpy_view(mask.cpu()) if mask.numel() else np.zeros(mask._shape, bool)):
        index = empty(found.shape, int64, CPU)
        numpy_view(index)[...] = found
        positions.append(index if self.device.type == "cpu" else index.to(self.device))
    return positions


def _checked_values(self, values):
    if values.device != self.device:
        if values.dim() or values.device.type != "cpu":  # a 0-d CPU value may join a cuda op, as in torch
            raise RuntimeError(f"expected device {self.device} but got device {values.device} for value tensor")
        values = values.to(self.device)
    if values.dtype is not self.dtype:
        raise RuntimeError(f"Index put requires the source and destination dtypes match, got "
                           f"{TORCH_NAMES[self.dtype.name]} for the destination and "
                           f"{TORCH_NAMES[values.dtype.name]} for the source.")
    if values._storage is self._storage and values.numel() and self.numel():
        start, end = _byte_span(self)
        value_start, value_end = _byte_span(values)
        if start < value_end and value_start < end:
            raise RuntimeError("unsupported operation: some elements of the input tensor and the written-to tensor "
                               "refer to a single memory location. Please clone() the tensor before performing "
                               "the operation.")
    return values


def _byte_span(t):
    first = t._offset * t.dtype.itemsize
    return first, first + (sum((n - 1) * s for n, s in zip(t._shape, t._stride)) + 1) * t.dtype.itemsize


def _canonical(self, dims, rows_shape, values):
    """(self viewed as indexed dims then column dims, values broadcast and viewed as rows_shape + columns).
    RuntimeError when values do not broadcast to the indexing result, as in torch."""
    columns = [d for d in range(self.dim()) if d not in dims]
    rows = len(rows_shape)
    if dims == list(range(dims[0], dims[0] + len(dims))):  # adjacent: the rows stand where the dims were
        result = self._shape[:dims[0]] + rows_shape + self._shape[dims[-1] + 1:]
        order = [*range(dims[0], dims[0] + rows), *range(dims[0]), *range(dims[0] + rows, len(result))]
    else:
        result = rows_shape + tuple(self._shape[d] for d in columns)
        order = list(range(len(result)))
    try:
        fits = broadcast_shapes(result, values._shape) == result
    except RuntimeError:
        fits = False
    if not fits:
        raise RuntimeError(f"shape mismatch: value tensor of shape {list(values._shape)} cannot be broadcast to "
                           f"indexing result of shape {list(result)}")
    value_strides = expanded(values._shape, values._stride, result)[1]
    values = values._view([result[d] for d in order], [value_strides[d] for d in order])
    layout = dims + columns
    return self._view([self._shape[d] for d in layout], [self._stride[d] for d in layout]), values


# ---------------------------------------------------------------------------------------------- CPU
def _put_numpy(target, dims, indices, values, accumulate):
    """The canonical problem with numpy: indices checked first, so a bad one leaves target untouched."""
    rows_shape = values._shape[:values.dim() - (target.dim() - len(dims))]
    key = []
    for j, (dim, index) in enumerate(zip(dims, indices)):
        found = numpy_view(index).astype(np.int64)  # a copy: target may share index's memory
        size = target._shape[j]
        bad = (found < -size) | (found >= size)
        if bad.any():
            if not size:
                raise IndexError("index is out of bounds for dimension with size 0")
            raise IndexError(f"index {int(found[bad].flat[0])} is out of bounds for dimension {dim} with size {size}")
        key.append(np.broadcast_to(found, rows_shape))
    array, key, source = numpy_view(target), tuple(key), numpy_view(values)
    if not accumulate:
        array[key] = source
    elif target.dtype is bfloat16:  # numpy has no bfloat16: sum in float32, round once
        wide = bf16_bits_to_f32(array)
        np.add.at(wide, key, bf16_bits_to_f32(source))
        array[...] = f32_to_bf16_bits(wide)
    else:
        np.add.at(array, key, source)


# ---------------------------------------------------------------------------------------------- cuda
def _put_cuda(target, dims, indices, values, accumulate):
    """The canonical problem with the scatter kernels: the rows' offsets into target, then the scatter."""
    device = target.device
    d = device.index
    stream = current_stream_handle(d)
    plans = kernels().index_put_plans
    if target.dtype.is_complex:  # a complex element is two floats: one more column dim
        target, values = _as_components(target), _as_components(values)
    columns = target.dim() - len(dims)
    rows_shape = values._shape[:values.dim() - columns]
    rows = math.prod(rows_shape)
    offsets = empty((rows,), int64, device)
    for j, (dim, index) in enumerate(zip(dims, indices)):
        index = index.to(device)
        index = index._view(*expanded(index._shape, index._stride, rows_shape)).contiguous()
        size = target._shape[j]
        plans.offsets_plan(index.dtype.triton, rows, size, target._stride[j], info_word(INDEX_PUT, dim, size), j == 0,
                           d)(stream, index.data_ptr(), offsets.data_ptr(), thread_records.addresses[d])
    row_stride = _row_stride(rows_shape, values._stride[:len(rows_shape)])
    if row_stride is None:
        values = values.contiguous()
        row_stride = math.prod(values._shape[len(rows_shape):])
    mode = plans.accumulate_mode(target.dtype.triton) if accumulate else plans.STORE
    plans.scatter_plan(target.dtype.triton, target.dtype.itemsize, mode, rows, target._shape[len(dims):],
                       target._stride[len(dims):], values._stride[len(rows_shape):], row_stride,
                       d)(stream, target.data_ptr(), values.data_ptr(), offsets.data_ptr())
    if active_driver().interprets_kernels and stream not in capturing.by_stream:  # a captured kernel runs at replay
        Stream(d, _handle=stream).synchronize()  # the simulator raises a bad index at the call


def _row_stride(shape, strides):
    """The one stride that steps from each row of values to the next (rows in row-major order), or None."""
    steps = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if any(outer != inner * n for (_, outer), (n, inner) in zip(steps, steps[1:])):
        return None
    return steps[-1][1] if steps else 0


def _as_components(t):
    """A complex tensor as its float components: one more dim of 2, (real, imag)."""
    return fields.tensor(t._storage, t._shape + (2,), tuple(2 * s for s in t._stride) + (1,), 2 * t._offset,
                         t.dtype.component)
