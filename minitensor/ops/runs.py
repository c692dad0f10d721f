"""The checked-once fast paths of pointwise ops on cuda tensors: for operands laid out as the first call's were,
`run(*operands, out)` allocates the output and launches the kernel (kernels/plans.py), nothing else.

The contiguous closures are the hottest code in minitensor: they read the fields every op needs directly
(`t._storage._block.ptr`, `t._offset`, and the current stream from `streams._tls.handles`), one closure per
arity with the launch inline. These fields are a contract with core/fields.py, cuda/streams.py and the
allocator's Block, named in docs/architecture.md and tested in tests/test_fields.py.
"""
import math
import types

from ..backends import prepare_first_op
from ..core import fields
from ..core.fields import TensorFields, allocate
from ..core.host_arrays import scalar_for
from ..core.layout import layout_number
from ..core.shapes import contiguous_strides, expanded
from ..cuda import memory
from ..cuda.streams import _tls as _streams_tls, current_stream_handle

_kernels = None


def kernels():
    """The kernels layer's plan modules (plans, reduce_plans, index_plans, index_put_plans, random_plans,
    matmul_plans) and its launcher, which every op on a cuda tensor goes through. Imported at the first such op:
    they start the backend, which `import minitensor` should not pay for."""
    global _kernels
    if _kernels is None:
        from ..kernels import (index_plans, index_put_plans, launcher, matmul_plans, plans,  # lazy: import cost
                               random_plans, reduce_plans)
        _kernels = types.SimpleNamespace(plans=plans, reduce_plans=reduce_plans, index_plans=index_plans,
                                         index_put_plans=index_put_plans, random_plans=random_plans,
                                         matmul_plans=matmul_plans, launcher=launcher)
    return _kernels


# While a GPU's first context is created, load what the first op needs next: these modules and the C launcher.
prepare_first_op(lambda: kernels().launcher.native())


def number_converter(compute, result, stored):
    """convert(x) for a number operand of an op computing in `compute`, on both devices: an int wraps to the
    compute type's width, or, where torch stores the number (`stored`: where's and clamp's numbers, pow's
    exponent), it is first checked against the result type (core/host_arrays.py). A 0-d CPU tensor joining a cuda
    op gives its value; None (a clamp bound not given) gives 0."""
    def convert(x):
        if x is None:
            return 0
        if isinstance(x, TensorFields):
            return scalar_for(compute, x.item())
        return scalar_for(compute, x, result if stored else None)
    return convert


def cuda_run(kernel, operands, shape, result, compute, out_dtype, device, out, stored=()):
    """The checked-once fast path of a cuda op, for operands laid out as these are: run(*operands, out).
    `stored`: the positions of the number operands checked against the result type (number_converter)."""
    family, op = kernel
    on_device = [isinstance(x, TensorFields) and x.device == device for x in operands]
    empty = math.prod(shape) == 0
    out_strides = contiguous_strides(shape) if out is None else out._stride
    index = device.index
    nbytes = math.prod(shape) * out_dtype.itemsize
    allocator = memory.allocator(index)
    out_layout = layout_number(out_dtype, shape, out_strides, index)
    plan = None if empty else _plan(family, op, operands, on_device, shape, out_dtype, out_strides, compute, index)

    if not empty and all(on_device) and plan.contiguous:
        return _contiguous_run(family, plan, [x.dtype.itemsize for x in operands], nbytes, device, allocator, shape,
                               out_strides, out_dtype, out_layout)

    converters = [number_converter(compute, result, i in stored) for i in range(len(operands))]
    has_scalars = family != "unary"

    def run(*args):
        *xs, out = args
        stream = current_stream_handle(index)
        if out is None:
            out = fields.tensor(allocate(nbytes, device, allocator, stream), shape, out_strides, 0, out_dtype,
                                out_layout)
        if not empty:
            pointers = [x.data_ptr() if dev else 0 for x, dev in zip(xs, on_device)]
            pointers.append(out.data_ptr())
            scalars = ([0 if dev else convert(x) for x, dev, convert in zip(xs, on_device, converters)]
                       if has_scalars else ())
            plan.run(stream, pointers, scalars)
        return out
    return run


def _contiguous_run(family, plan, itemsizes, nbytes, device, allocator, shape, out_strides, out_dtype, out_layout):
    """The hottest paths: contiguous device tensors, into `out` or a new output, one closure per arity with
    the launch inline (a misaligned pointer takes the plan's general run)."""
    launch, grid, n = plan.contiguous
    plan_run = plan.run
    index = device.index
    new_storage, new_tensor = allocate, fields.tensor  # closure cells: cheaper to reach than globals
    o_size = out_dtype.itemsize

    if family == "unary":
        x_size, = itemsizes

        def run_unary(x, out):
            handles = _streams_tls.handles
            stream = 0 if handles is None else handles[index]
            px = x._storage._block.ptr + x._offset * x_size
            if out is None:
                storage = new_storage(nbytes, device, allocator, stream)
                out = new_tensor(storage, shape, out_strides, 0, out_dtype, out_layout)
                po = storage._block.ptr
            else:
                po = out._storage._block.ptr + out._offset * o_size
            if (px | po) & 15:
                plan_run(stream, (px, po), ())
            else:
                launch(grid, 1, 1, stream, px, po, n)
            return out
        return run_unary

    if family == "binary":
        a_size, b_size = itemsizes

        def run_binary(a, b, out):
            handles = _streams_tls.handles
            stream = 0 if handles is None else handles[index]
            pa = a._storage._block.ptr + a._offset * a_size
            pb = b._storage._block.ptr + b._offset * b_size
            if out is None:
                storage = new_storage(nbytes, device, allocator, stream)
                out = new_tensor(storage, shape, out_strides, 0, out_dtype, out_layout)
                po = storage._block.ptr
            else:
                po = out._storage._block.ptr + out._offset * o_size
            if (pa | pb | po) & 15:
                plan_run(stream, (pa, pb, po), (0, 0))
            else:
                launch(grid, 1, 1, stream, pa, pb, po, 0, 0, n)
            return out
        return run_binary

    a_size, b_size, c_size = itemsizes

    def run_ternary(a, b, c, out):
        handles = _streams_tls.handles
        stream = 0 if handles is None else handles[index]
        pa = a._storage._block.ptr + a._offset * a_size
        pb = b._storage._block.ptr + b._offset * b_size
        pc = c._storage._block.ptr + c._offset * c_size
        if out is None:
            storage = new_storage(nbytes, device, allocator, stream)
            out = new_tensor(storage, shape, out_strides, 0, out_dtype, out_layout)
            po = storage._block.ptr
        else:
            po = out._storage._block.ptr + out._offset * o_size
        if (pa | pb | pc | po) & 15:
            plan_run(stream, (pa, pb, pc, po), (0, 0, 0))
        else:
            launch(grid, 1, 1, stream, pa, pb, pc, po, 0, 0, 0, n)
        return out
    return run_ternary


def _plan(family, op, operands, on_device, shape, out_dtype, out_strides, compute, index):
    plans = kernels().plans
    operand_dtypes = [x.dtype if dev else plans.ABSENT if x is None else None for x, dev in zip(operands, on_device)]
    strides = [expanded(x._shape, x._stride, shape)[1] if dev else None for x, dev in zip(operands, on_device)]
    if family == "unary":
        return plans.unary_plan(op, operand_dtypes[0], out_dtype, shape, strides[0], out_strides, compute, index)
    if family == "binary":
        return plans.binary_plan(op, *operand_dtypes, out_dtype, shape, *strides, out_strides, compute, index)
    return plans.ternary_plan(op, *operand_dtypes, out_dtype, shape, *strides, out_strides, compute, index)
