"""`gather`, `index_select` and item assignment (`t[idx] = value`; with tensor indices: index_put.py): torch's
checks and shapes here, the work in the gather kernels (kernels/index.py) for cuda tensors and in numpy for CPU
tensors.

Out-of-range indices (negative ones too: neither op wraps them, as in torch) are never read. On the CPU they
raise IndexError at the call. On cuda the kernel masks them (their output elements are 0) and writes the bad
index into the calling thread's error record for its device (cuda/device_errors.py). On the simulated device the
call waits for its kernel and raises at once; on a GPU the thread's next synchronising call raises it
(`mt.cuda.synchronize`, `Stream.synchronize`, `Event.synchronize`, and through them `.item()`, `.cpu()`,
`.tolist()`), as torch's device-side assert surfaces late, but the device stays usable. Other threads never
see it.

Checks, output shape and launch plan are worked out once per signature (dtypes, shapes, strides, devices,
dim): a repeated cuda call is a dict lookup, an allocation and a launch.
"""
import math
import operator

import numpy as np

from ..backends import active_driver
from ..base.device import CPU
from ..core import fields
from ..core.alloc import empty
from ..core.fields import allocate
from ..core.host_arrays import numpy_view
from ..core.layout import layout_number, layout_of
from ..core.shapes import OVERLAP, contiguous_strides, normalize_dim, overlaps_itself
from ..cuda import capturing, memory
from ..cuda.device_errors import GATHER, INDEX_SELECT, info_word, message, thread_records
from ..cuda.streams import Stream, _tls as _streams_tls, current_stream_handle
from . import complex_views, index_put, support
from .runs import kernels
from .typing import refuse_registered

# ---------------------------------------------------------------------------------------------- public API
def _cached(name, checked, doc):
    """The public op `name`: the checked-once run of the call's signature when there is one, else `checked`
    (which checks, builds that run and keeps it in `runs`)."""
    runs = {}  # signature -> run(input, index) of an already checked cuda call

    def op(input, dim, index):
        key = _signature(input, dim, index)
        run = runs.get(key)
        if run is not None:
            return run(input, index)
        return checked(input, dim, index, key, runs)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = doc
    return op


def _signature(input, dim, index):
    """What a gather or index_select call is cached under; None when an argument is not a tensor (the
    checked path then says which). type(dim) is part of it: 1.0 == 1, but 1.0 is no dim."""
    try:
        return input._layout or layout_of(input), dim, type(dim), index._layout or layout_of(index)
    except AttributeError:
        return None


def setitem(t, index, value):
    """t[index] = value: a number fills, a tensor is cast and broadcast into the indexed view. As in torch,
    leading size-1 dims of the value are dropped first, so t[0] = ones(1, 3) writes a row. Tensor indices are
    advanced indexing: index_put.py."""
    if index_put.has_tensor(index):
        return index_put.setitem(t, index, value)
    target = t[index]
    if isinstance(value, fields.TensorFields):
        shape = value._shape
        lead = 0
        while lead < len(shape) and shape[lead] == 1:
            lead += 1
        if lead:
            value = value._view(shape[lead:], value._stride[lead:])
        target.copy_(value)
    else:
        if 0 in target._stride and overlaps_itself(target._shape, target._stride):
            raise RuntimeError(OVERLAP)  # torch's t[...] = number is a copy_, refused where fill_ is not
        target.fill_(value)


# ---------------------------------------------------------------------------------------------- checks
def _tensor_arg(name, position, x):
    if not isinstance(x, fields.TensorFields):
        raise TypeError(f"{name}(): argument '{('input', 'dim', 'index')[position - 1]}' (position {position}) "
                        f"must be Tensor, not {type(x).__name__}")


def _dim_arg(name, dim, ndim):
    try:
        if isinstance(dim, bool):  # an int to Python, not to torch
            raise TypeError
        dim = operator.index(dim)
    except TypeError:
        raise TypeError(f"{name}(): argument 'dim' (position 2) must be int, not {type(dim).__name__}") from None
    return normalize_dim(dim, ndim)


def _same_device(input, index):
    if input.device != index.device:
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{input.device} and {index.device}!")


def _gather_checked(input, dim, index, key, runs):
    _tensor_arg("gather", 1, input)
    _tensor_arg("gather", 3, index)
    dim = _dim_arg("gather", dim, input.dim())
    _same_device(input, index)
    refuse_registered(input.device, "gather")
    support.check_indexing("gather", input.dtype, input.device)
    in_shape = input._shape or (1,)
    index_shape = index._shape or (1,)
    if index.numel():  # torch checks nothing more for an empty index
        if index.dtype.name not in ("int64", "int32"):
            raise RuntimeError("gather(): Expected dtype int32/int64 for index")
        if len(in_shape) != len(index_shape):
            raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
        for d, (n, m) in enumerate(zip(index_shape, in_shape)):
            if d != dim and n > m:
                raise RuntimeError(f"Size does not match at dimension {d} expected index {list(index._shape)} to "
                                   f"be smaller than self {list(input._shape)} apart from dimension {dim}")
    if input.device.type == "cpu":
        return _gather_numpy(input, dim, index)
    if input.dtype.itemsize > 8:  # complex128: the kernels move elements of up to 8 bytes
        return complex_views.gather_pairs(gather, input, dim, index)
    in_stride = input._stride or (1,)
    base = tuple(0 if d == dim else s for d, s in enumerate(in_stride[:len(index_shape)]))
    run = _cuda_run(GATHER, input, index, dim, index._shape, index_shape, index._stride or (1,), base,
                    in_shape[dim], in_stride[dim])
    if key is not None:
        runs[key] = run
    return run(input, index)


def _index_select_checked(input, dim, index, key, runs):
    _tensor_arg("index_select", 1, input)
    _tensor_arg("index_select", 3, index)
    dim = _dim_arg("index_select", dim, input.dim())
    _same_device(input, index)
    refuse_registered(input.device, "index_select")
    support.check_indexing("index_select", input.dtype, input.device)
    count = index.numel()
    if index.dim() > 1:
        raise IndexError("index_select(): Index is supposed to be a vector")
    if input.dim() == 0 and count != 1:
        raise RuntimeError(f"index_select(): Index to scalar can have only 1 value, got {count} value(s)")
    if index.dtype.name not in ("int64", "int32"):
        raise RuntimeError("index_select(): Expected dtype int32 or int64 for index")
    out_shape = input._shape[:dim] + (count,) + input._shape[dim + 1:] if input.dim() else ()
    if input.device.type == "cpu":
        return _index_select_numpy(input, dim, index, out_shape)
    if input.dtype.itemsize > 8:  # complex128: the kernels move elements of up to 8 bytes
        return complex_views.index_select_pairs(index_select, input, dim, index)
    in_shape = input._shape or (1,)
    in_stride = input._stride or (1,)
    kernel_shape = in_shape[:dim] + (count,) + in_shape[dim + 1:]
    index_strides = tuple((index._stride or (1,))[0] if d == dim else 0 for d in range(len(in_shape)))
    base = tuple(0 if d == dim else s for d, s in enumerate(in_stride))
    run = _cuda_run(INDEX_SELECT, input, index, dim, out_shape, kernel_shape, index_strides, base, in_shape[dim],
                    in_stride[dim])
    if key is not None:
        runs[key] = run
    return run(input, index)


gather = _cached("gather", _gather_checked,
                 "out[i][j][k] = input[index[i][j][k]][j][k] (dim 0), with out shaped as index (an int64 or "
                 "int32 index); torch.gather.")
index_select = _cached("index_select", _index_select_checked,
                       "The slices input[..., index[j], ...] along `dim`, for a 1-D int64 or int32 index; "
                       "torch.index_select.")


# ---------------------------------------------------------------------------------------------- cuda
def _cuda_run(op, input, index, dim, out_shape, kernel_shape, index_strides, base_strides, size, dim_stride):
    """The checked-once fast path for operands laid out as input and index are: allocate, launch, return."""
    device, dtype = input.device, input.dtype
    d = device.index
    n = math.prod(out_shape)
    nbytes = n * dtype.itemsize
    out_strides = contiguous_strides(out_shape)
    out_layout = layout_number(dtype, out_shape, out_strides, d)
    allocator = memory.allocator(d)
    if n == 0:
        def run_empty(input, index):
            stream = current_stream_handle(d)
            return fields.tensor(allocate(0, device, allocator, stream), out_shape, out_strides, 0, dtype,
                                 out_layout)
        return run_empty
    info = info_word(op, dim, size)
    plan = kernels().index_plans.gather_plan(dtype.itemsize, index.dtype.triton, kernel_shape, index_strides,
                                             base_strides, size, dim_stride, info, d)
    in_size, index_size = dtype.itemsize, index.dtype.itemsize
    plan_run, new_storage, new_tensor, records = plan.run, allocate, fields.tensor, thread_records
    wait = active_driver().interprets_kernels

    def run(input, index):
        stream = current_stream_handle(d)
        storage = new_storage(nbytes, device, allocator, stream)
        plan_run(stream, input._storage._block.ptr + input._offset * in_size,
                 index._storage._block.ptr + index._offset * index_size, storage._block.ptr,
                 records.addresses[d])
        if wait and stream not in capturing.by_stream:  # a captured kernel runs at replay
            _raise_now(d, stream)
        return new_tensor(storage, out_shape, out_strides, 0, dtype, out_layout)
    if wait or plan.fast is None:
        return run
    launch, grid, (n, size, dim_stride, base_stride, info) = plan.fast

    def run_contiguous(input, index):
        """The hottest path: the launch inline, the plan's general run only for a misaligned index."""
        handles = _streams_tls.handles
        stream = 0 if handles is None else handles[d]
        storage = new_storage(nbytes, device, allocator, stream)
        data_ptr = input._storage._block.ptr + input._offset * in_size
        index_ptr = index._storage._block.ptr + index._offset * index_size
        out_ptr = storage._block.ptr
        err = records.addresses[d]  # the calling thread's record: its error is raised in this thread only
        if (index_ptr | out_ptr) & 15:
            plan_run(stream, data_ptr, index_ptr, out_ptr, err)
        else:
            launch(grid, 1, 1, stream, data_ptr, index_ptr, out_ptr, err, n, size, dim_stride, base_stride, info)
        return new_tensor(storage, out_shape, out_strides, 0, dtype, out_layout)
    return run_contiguous


def _raise_now(device, stream):
    """Simulated device: wait for the kernel just queued and raise its IndexError at the call (Stream.synchronize
    raises what this thread's kernels recorded)."""
    Stream(device, _handle=stream).synchronize()


# ---------------------------------------------------------------------------------------------- CPU
def _check_host_indices(op, idx, dim, size):
    bad = (idx < 0) | (idx >= size)
    if bad.any():
        raise IndexError(message(op, int(idx[bad].flat[0]), dim, size))


def _gather_numpy(input, dim, index):
    out = empty(index._shape, input.dtype, CPU)
    if out.numel() == 0:
        return out
    src = numpy_view(input).reshape(input._shape or (1,))  # raw storage values: bfloat16 moves as its bits
    idx = numpy_view(index).reshape(index._shape or (1,))
    _check_host_indices(GATHER, idx, dim, src.shape[dim])
    src = src[tuple(slice(None) if d == dim else slice(0, n) for d, n in enumerate(idx.shape))]
    numpy_view(out)[...] = np.take_along_axis(src, idx, axis=dim).reshape(index._shape)
    return out


def _index_select_numpy(input, dim, index, out_shape):
    out = empty(out_shape, input.dtype, CPU)
    if out.numel() == 0:
        return out
    src = numpy_view(input).reshape(input._shape or (1,))
    idx = numpy_view(index).reshape(-1)
    _check_host_indices(INDEX_SELECT, idx, dim, src.shape[dim])
    numpy_view(out)[...] = np.take(src, idx, axis=dim).reshape(out_shape)
    return out
