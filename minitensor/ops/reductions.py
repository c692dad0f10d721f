"""Reductions `sum mean min max all any` over the whole tensor or over dims, and `equal`, `isclose`,
`allclose`, with torch's typing: integer and bool sums give int64, half types accumulate in float32,
mean wants a floating type, all/any give bool (uint8 for uint8, as torch).

Checks, typing, the output shape and the kernel plan are worked out once per signature (op, arguments,
dtype, shape, strides, device) and kept, so a repeated call is a dict lookup, an allocation and a launch.
CPU tensors reduce with numpy.
"""
import builtins
import collections
import math

import numpy as np

from ..base import dtypes
from ..base.device import CPU
from ..core import fields
from ..core.alloc import empty
from ..core.fields import allocate
from ..core.host_arrays import numpy_values, numpy_view, to_storage_values
from ..core.layout import layout_number, layout_of
from ..core.shapes import broadcast_shapes, contiguous_strides, normalize_dim
from ..cuda import memory
from ..cuda.streams import current_stream_handle
from .complex_views import view_as_complex, view_as_real
from .pointwise import binary, unary
from .runs import kernels
from .typing import not_implemented_for, refuse_registered


class return_types:
    """torch.return_types: the (values, indices) of max and min over a dim, which unpack like tuples."""

    class max(collections.namedtuple("max", ("values", "indices"))):
        __slots__ = ()

        def __repr__(self):
            return f"minitensor.return_types.max(\nvalues={self.values!r},\nindices={self.indices!r})"

    class min(collections.namedtuple("min", ("values", "indices"))):
        __slots__ = ()

        def __repr__(self):
            return f"minitensor.return_types.min(\nvalues={self.values!r},\nindices={self.indices!r})"


# ---------------------------------------------------------------------------------------------- public API
def sum(input, dim=None, keepdim=False, *, dtype=None):
    try:  # the fast path: this signature was checked before (a miss, a list dim or a non-tensor: the slow path)
        run = _runs[_signature("sum", input, dim, keepdim, dtype)]
    except (KeyError, TypeError, AttributeError):
        return _reduce("sum", input, dim, keepdim, dtype)
    return run(input)


def mean(input, dim=None, keepdim=False, *, dtype=None):
    return _reduce("mean", input, dim, keepdim, dtype)


def all(input, dim=None, keepdim=False):
    return _reduce("all", input, dim, keepdim, None)


def any(input, dim=None, keepdim=False):
    return _reduce("any", input, dim, keepdim, None)


def max(input, dim=None, keepdim=False):
    """The largest element; over `dim`, (values, indices); with a tensor, the elementwise maximum."""
    if isinstance(dim, fields.TensorFields):
        return binary("maximum", input, dim)
    return _reduce("max", input, dim, keepdim, None)


def min(input, dim=None, keepdim=False):
    if isinstance(dim, fields.TensorFields):
        return binary("minimum", input, dim)
    return _reduce("min", input, dim, keepdim, None)


# ---------------------------------------------------------------------------------------------- reductions
_runs = {}  # signature -> run(x), checked once


def _signature(name, x, dim, keepdim, dtype):
    """What a checked run is kept under: the arguments and their types, since True, 1 and 1.0 (and tuples of them)
    are equal keys to a dict but not the same argument to torch, which refuses a float dim or an int keepdim."""
    dim_types = tuple(map(type, dim)) if type(dim) is tuple else type(dim)
    return name, dim, dim_types, keepdim, type(keepdim), dtype, x._layout or layout_of(x)


def _reduce(name, x, dim, keepdim, dtype):
    if type(dim) is list:
        dim = tuple(dim)
    try:
        key = _signature(name, x, dim, keepdim, dtype)
        run = _runs.get(key)
    except (AttributeError, TypeError):  # not a tensor, or an unhashable dim: the checks say which
        key, run = None, None
    if run is None:
        run = _checked(name, x, dim, keepdim, dtype)
        if key is not None:
            _runs[key] = run
    return run(x)


def _dims(name, x, dim):
    """The reduced dims as a sorted tuple, and whether indices come back (min/max over one dim)."""
    ndim = x.dim()
    if name in ("max", "min"):
        if dim is None:
            return tuple(range(ndim)), False
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"{name}(): argument 'dim' must be int, not {type(dim).__name__}")
        dim = normalize_dim(int(dim), ndim)
        return ((dim,) if ndim else ()), True  # a 0-d tensor has its one element at index 0
    if dim is None or dim == ():
        return tuple(range(ndim)), False
    dims = dim if isinstance(dim, tuple) else (dim,)
    seen = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"{name}(): argument 'dim' must be int or tuple of ints, not {type(d).__name__}")
        d = normalize_dim(int(d), ndim)
        if d in seen:
            raise RuntimeError(f"dim {d} appears multiple times in the list of dims")
        seen.append(d)
    return tuple(sorted(d for d in seen if d < ndim)), False


def _types(name, x, dtype):
    """(input dtype the kernel reads, output dtype) with torch's rules and errors."""
    if dtype is not None:
        dtype = dtypes.dtype_arg(dtype, name)
    source = x.dtype if dtype is None else dtype
    if name == "sum":
        out = source if source.category >= dtypes.FLOAT or dtype is not None else dtypes.int64
        if out in dtypes.SHELL_UINTS:
            raise not_implemented_for(f"sum_{x.device.type}", out)
        return source, out
    if name == "mean":
        if source.category < dtypes.FLOAT:
            which = "Input" if dtype is None else "Optional"
            raise RuntimeError(f"mean(): could not infer output dtype. {which} dtype must be either a floating "
                               f"point or complex dtype. Got: {dtypes.TORCH_NAMES[source.name]}")
        return source, source
    if name in ("all", "any"):
        return x.dtype, dtypes.uint8 if x.dtype is dtypes.uint8 else dtypes.bool_
    return x.dtype, x.dtype


def _checked(name, x, dim, keepdim, dtype):
    """run(x) for tensors laid out as x is, after every check."""
    if not isinstance(x, fields.TensorFields):
        raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
    in_dtype, out_dtype = _types(name, x, dtype)  # before the dims, as torch: mean of an int tensor says so first
    _check_support(name, x.dtype, x.device, dim)
    dims, arg = _dims(name, x, dim)
    if not isinstance(keepdim, (bool, np.bool_)):
        raise TypeError(f"{name}(): argument 'keepdim' must be bool, not {type(keepdim).__name__}")
    shape = x._shape
    if name in ("max", "min"):
        if not arg and x.numel() == 0:
            raise RuntimeError(f"{name}(): Expected reduction dim to be specified for input.numel() == 0. "
                               f"Specify the reduction dim with the 'dim' argument.")
        if arg and dims and shape[dims[0]] == 0:
            raise IndexError(f"{name}(): Expected reduction dim {dims[0]} to have non-zero size.")
    keepdim = builtins.bool(keepdim)
    out_shape = tuple(1 if d in dims else s for d, s in enumerate(shape) if keepdim or d not in dims)
    count = math.prod(shape[d] for d in dims)
    refuse_registered(x.device, name)
    if in_dtype.is_complex and name in ("sum", "mean"):
        return _complex_run(name, dims, keepdim, in_dtype)
    if x.dtype.is_complex:  # all, any: of the nonzero elements
        return lambda x: _reduce(name, binary("ne", x, 0), dim, keepdim, None)
    if x.device.type == "cpu":
        return _numpy_run(name, dims, arg, keepdim, in_dtype, out_dtype, out_shape, count)
    return _cuda_run(name, x, dims, arg, in_dtype, out_dtype, out_shape)


def _check_support(name, dtype, device, dim):
    """torch's errors for max and min of uint16/32/64 and complex tensors, which it has no kernels for."""
    if name not in ("max", "min") or not (dtype.is_complex or dtype in dtypes.SHELL_UINTS):
        return
    if dim is None:
        raise not_implemented_for(f"{name}_all", dtype)
    if dtype.is_complex:
        raise RuntimeError(f"{name}(): does not support complex input")
    raise not_implemented_for(f"{name}_{device.type}", dtype)


def _complex_run(name, dims, keepdim, in_dtype):
    """sum and mean of complex tensors: the same reduction of their float view (ops/complex_views.py), whose
    trailing (real, imag) dim is kept."""
    def run(x):
        if x.dtype is not in_dtype:
            x = x.to(in_dtype)
        if not dims:  # a 0-d tensor: its value
            return x.clone()
        return view_as_complex(_reduce(name, view_as_real(x), dims, keepdim, None))
    return run


def _numpy_run(name, dims, arg, keepdim, in_dtype, out_dtype, out_shape, count):
    acc = np.float64 if in_dtype is dtypes.float64 else np.float32 if in_dtype.is_floating_point else np.int64

    def run(x):
        if in_dtype is not x.dtype:
            x = x.to(in_dtype)
        values = numpy_values(x)
        with np.errstate(all="ignore"):
            if name in ("sum", "mean"):
                r = np.sum(values, axis=dims, dtype=acc, keepdims=keepdim)
                if name == "mean":
                    r = r / acc(count)
            elif name in ("all", "any"):
                r = (np.all if name == "all" else np.any)(values, axis=dims, keepdims=keepdim)
            elif not arg or x.dim() == 0:
                r = (np.max if name == "max" else np.min)(values, axis=dims, keepdims=keepdim)
            else:
                r = (np.max if name == "max" else np.min)(values, axis=dims[0], keepdims=keepdim)
                index = (np.argmax if name == "max" else np.argmin)(values, axis=dims[0], keepdims=keepdim)
        out = empty(out_shape, out_dtype, CPU)
        numpy_view(out)[...] = to_storage_values(r, out_dtype)
        if not arg:
            return out
        indices = empty(out_shape, dtypes.int64, CPU)
        numpy_view(indices)[...] = index if x.dim() else 0
        return getattr(return_types, name)(out, indices)
    return run


def _cuda_run(name, x, dims, arg, in_dtype, out_dtype, out_shape):
    """The checked-once fast path on a cuda device. The input is read in place, after a cast for sum's and
    mean's dtype=, and through a contiguous copy when its kept or reduced dims do not collapse to four."""
    plans = kernels().reduce_plans
    op = {"max": plans.MAX, "min": plans.MIN, "all": plans.MIN, "any": plans.MAX}.get(name, plans.SUM)
    device, index = x.device, x.device.index
    shape, strides = x._shape, x._stride
    cast = in_dtype is not x.dtype
    if cast:
        strides = contiguous_strides(shape)
    plan = plans.reduce_plan(op, in_dtype, out_dtype, shape, strides, frozenset(dims), index, arg,
                             name in ("all", "any"), name == "mean")
    order = None
    if plan is None:
        order = [d for d in range(len(shape)) if d not in dims] + list(dims)
        permuted = tuple(shape[d] for d in order)
        plan = plans.reduce_plan(op, in_dtype, out_dtype, permuted, contiguous_strides(permuted),
                                 frozenset(range(len(shape) - len(dims), len(shape))), index, arg,
                                 name in ("all", "any"), name == "mean")
    out_strides = contiguous_strides(out_shape)
    out_layout = layout_number(out_dtype, out_shape, out_strides, index)
    out_bytes = math.prod(out_shape) * out_dtype.itemsize
    idx_bytes = math.prod(out_shape) * 8 if arg else 0
    scratch_bytes = plan.scratch_bytes
    launch = plan.run if math.prod(out_shape) else None
    allocator = memory.allocator(index)
    result_type = getattr(return_types, name) if arg else None
    itemsize = x.dtype.itemsize

    if not (cast or arg or scratch_bytes) and order is None and launch is not None:
        new_storage, new_tensor = allocate, fields.tensor  # closure cells: cheaper to reach than globals
        kernel, grid_x, grid_y, tail = plan.single

        def run_direct(x):
            """The common case without the generic handling: the input read in place, one launch."""
            stream = current_stream_handle(index)
            out = new_storage(out_bytes, device, allocator, stream)
            ptr = x._storage._block.ptr + x._offset * itemsize
            if ptr & 15:
                launch(stream, ptr, out._block.ptr, 0, 0)
            else:
                kernel(grid_x, grid_y, 1, stream, ptr, 0, out._block.ptr, 0, *tail)
            return new_tensor(out, out_shape, out_strides, 0, out_dtype, out_layout)
        return run_direct

    def run(x):
        stream = current_stream_handle(index)
        if cast:
            x = x.to(in_dtype)
        if order is not None:
            x = x.permute(order).contiguous()
        out = allocate(out_bytes, device, allocator, stream)
        idx = allocate(idx_bytes, device, allocator, stream) if arg else None
        if launch is not None:
            scratch = allocate(scratch_bytes, device, allocator, stream) if scratch_bytes else None
            launch(stream, x._storage._block.ptr + x._offset * x.dtype.itemsize, out._block.ptr,
                   idx._block.ptr if arg else 0, scratch._block.ptr if scratch_bytes else 0)
        values = fields.tensor(out, out_shape, out_strides, 0, out_dtype, out_layout)
        if not arg:
            return values
        return result_type(values, fields.tensor(idx, out_shape, out_strides, 0, dtypes.int64))
    return run


# ---------------------------------------------------------------------------------------------- comparisons
def equal(input, other):
    """True when both have the same shape and equal values (compared in their promoted type; NaN is not
    equal to itself)."""
    Tensor = fields.TensorFields
    if not isinstance(input, Tensor) or not isinstance(other, Tensor):
        raise TypeError(f"equal(): arguments must be Tensors, not {type(input).__name__} and "
                        f"{type(other).__name__}")
    if input.device != other.device:
        raise RuntimeError(f"Cannot compare two tensors on different devices. Got: {input.device} and "
                           f"{other.device}")
    if input._shape != other._shape:
        return False
    compute = dtypes.promote_types(input.dtype, other.dtype)
    if compute.is_complex:
        return builtins.bool(binary("eq", input, other).all().item())
    return builtins.bool(_isclose(input, other, compute, 0.0, 0.0, False).all().item())


def isclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    """|input - other| <= atol + rtol * |other| elementwise (or equal, or both NaN with equal_nan), as torch
    computes it: integer differences in their own type, tolerances in float32 (float64 for float64)."""
    Tensor = fields.TensorFields
    if not isinstance(input, Tensor) or not isinstance(other, Tensor):
        raise TypeError(f"isclose(): arguments must be Tensors, not {type(input).__name__} and "
                        f"{type(other).__name__}")
    if input.dtype is not other.dtype:
        names = dtypes.TORCH_NAMES
        raise RuntimeError(f"{names[input.dtype.name]} did not match {names[other.dtype.name]}")
    rtol, atol = _tolerance("rtol", rtol), _tolerance("atol", atol)
    if not isinstance(equal_nan, (bool, np.bool_)):
        raise TypeError(f"isclose(): argument 'equal_nan' must be bool, not {type(equal_nan).__name__}")
    if input.device != other.device:
        first, second = sorted((str(input.device), str(other.device)))
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{first} and {second}!")
    return _isclose(input, other, input.dtype, rtol, atol, builtins.bool(equal_nan))


def _tolerance(name, value):
    """isclose's rtol or atol as a float >= 0, with torch's errors."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, (int, float)):
        raise TypeError(f"isclose(): argument '{name}' must be float, not {type(value).__name__}")
    value = float(value)
    if not value >= 0:  # NaN too
        raise RuntimeError(f"{name} must be greater than or equal to zero, but got {value:g}")
    return value


def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
    return builtins.bool(isclose(input, other, rtol, atol, equal_nan).all().item())


def _isclose(a, b, compute, rtol, atol, equal_nan):
    """The bool tensor isclose(a, b) with a and b compared in `compute`; no checks."""
    if compute.is_complex:
        return _complex_isclose(a, b, rtol, atol, equal_nan)
    shape = broadcast_shapes(a._shape, b._shape)
    tolerant = not (rtol == 0 and atol == 0)
    equal_nan = equal_nan and compute.is_floating_point
    out = empty(shape, dtypes.bool_, a.device)
    if out.numel() == 0:
        return out
    refuse_registered(a.device, "isclose")
    if a.device.type == "cpu":
        numpy_view(out)[...] = _isclose_numpy(numpy_values(a.expand(shape)), numpy_values(b.expand(shape)),
                                              compute, rtol, atol, tolerant, equal_nan)
        return out
    if compute in (dtypes.float16, dtypes.bfloat16):
        compute = dtypes.float32
    a, b = a.expand(shape).contiguous(), b.expand(shape).contiguous()
    run = kernels().reduce_plans.isclose_plan(a.dtype, b.dtype, compute, out.numel(), tolerant, equal_nan,
                                              a.device.index)
    run(current_stream_handle(a.device.index), a.data_ptr(), b.data_ptr(), out.data_ptr(), rtol, atol)
    return out


def _complex_isclose(a, b, rtol, atol, equal_nan):
    """isclose of complex tensors as torch composes it from pointwise ops: equal, or both NaN (in either part) with
    equal_nan, or |a - b| finite and <= atol + |rtol * b| (complex abs, in the component type)."""
    close = binary("eq", a, b)
    if equal_nan:
        close = binary("logical_or", close, binary("logical_and", binary("ne", a, a), binary("ne", b, b)))
    if rtol == 0 and atol == 0:
        return close
    error = unary("abs", binary("sub", a, b))
    allowed = binary("add", unary("abs", binary("mul", b, rtol)), atol)
    within = binary("logical_and", binary("lt", error, math.inf), binary("le", error, allowed))
    return binary("logical_or", close, within)


def _isclose_numpy(a, b, compute, rtol, atol, tolerant, equal_nan):
    np_compute = np.float32 if compute in (dtypes.float16, dtypes.bfloat16) else compute.np
    a, b = a.astype(np_compute), b.astype(np_compute)
    with np.errstate(all="ignore"):
        close = a == b
        if equal_nan:
            close |= np.isnan(a) & np.isnan(b)
        if tolerant:
            wide = np.float64 if compute is dtypes.float64 else np.float32
            diff = a.astype(wide) - b.astype(wide) if compute is dtypes.bool_ or compute.is_floating_point else a - b
            diff = np.abs(diff).astype(wide)
            bound = wide(atol) + np.abs(wide(rtol) * b.astype(wide))
            close |= np.isfinite(diff) & (diff <= bound)
    return close
