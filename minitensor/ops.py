"""Operations on tensors: argument checks and torch's typing rules here, the work in Triton kernels
(cuda tensors, `minitensor.kernels`) or numpy (CPU tensors).

Kernels launch on the current stream of the tensor's device. On the host, bfloat16 values are stored as
raw bits and computed in float32, as the kernels do for both half types.
"""
import math
import numbers

import numpy as np

from . import dtypes
from . import tensor as _tensor
from .cuda import memory
from .cuda.streams import current_stream_handle
from .device import CPU
from .storage import UntypedStorage

_BINARY_NAMES = {"add": 0, "sub": 1, "mul": 2, "div": 3}
_NUMPY_BINARY = {0: np.add, 1: np.subtract, 2: np.multiply, 3: np.true_divide, 4: np.logical_or,
                 5: np.logical_and}
_TORCH_NAMES = {"bool": "Bool", "uint8": "Byte", "int8": "Char", "int16": "Short", "int32": "Int", "int64": "Long",
                "float16": "Half", "bfloat16": "BFloat16", "float32": "Float", "float64": "Double"}
_kernels = None


def kernels():
    """minitensor.kernels.elementwise, imported on first use: it imports Triton, which `import minitensor`
    should not pay for."""
    global _kernels
    if _kernels is None:
        from .kernels import elementwise
        _kernels = elementwise
    return _kernels


def _stream(t):
    return current_stream_handle(t.device.index)


def _key(x):
    """What an operand contributes to an op's signature: layout for a tensor, type for a number."""
    if type(x) is _tensor.Tensor:
        return x.dtype, x._shape, x._stride, x.device.index  # index is None for the CPU
    return type(x)


# ---------------------------------------------------------------------------------------------- host arrays
def numpy_view(t):
    """The numpy array over a CPU tensor's memory (bfloat16 as uint16 bits)."""
    if t.numel() == 0:
        return np.empty(t._shape, t.dtype.np)
    itemsize = t.dtype.itemsize
    return np.ndarray(t._shape, t.dtype.np, buffer=t._storage._array, offset=t._offset * itemsize,
                      strides=tuple(s * itemsize for s in t._stride))


def numpy_values(t):
    """A CPU tensor's values as numpy; bfloat16 converted to float32."""
    view = numpy_view(t)
    return dtypes.bf16_bits_to_f32(view) if t.dtype is dtypes.bfloat16 else view


def to_storage_values(values, dtype):
    """Values (any numpy dtype) converted to `dtype`'s host representation."""
    values = np.asarray(values)
    with np.errstate(invalid="ignore", over="ignore"):
        if dtype is dtypes.bfloat16:
            return dtypes.f32_to_bf16_bits(values.astype(np.float32))
        if dtype is dtypes.bool_:
            return values != 0
        if values.dtype.kind == "f" and dtype.category == 1:  # float -> int truncates toward zero
            values = np.trunc(values)
            if not dtype.is_signed:  # negative floats to unsigned wrap through int64, as torch's CPU does
                values = values.astype(np.int64)
        return values.astype(dtype.np)


# ---------------------------------------------------------------------------------------------- fill / copy
def _scalar_for(dtype, value):
    """A Python number converted to what a `dtype` element holds (wrapping like a C cast for ints)."""
    if isinstance(value, np.generic):
        value = value.item()
    if not isinstance(value, numbers.Number) or isinstance(value, complex):
        raise TypeError(f"expected a real Python number for a {dtype} tensor, got {type(value).__name__}")
    if dtype is dtypes.bool_:
        return bool(value)
    if dtype.is_floating_point:
        return float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise RuntimeError(f"value cannot be converted to type {dtype.name} without overflow")
        value = int(value)
    bits = dtype.itemsize * 8
    value &= (1 << bits) - 1
    if dtype.is_signed and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def fill_(t, value):
    Tensor = _tensor.Tensor
    if isinstance(value, Tensor):
        if value.dim() != 0:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                               f"{value.dim()} dimensions.")
        value = value.item()
    value = _scalar_for(t.dtype, value)
    if t.device.type == "cpu":
        numpy_view(t)[...] = to_storage_values(np.array(value), t.dtype)
    elif 0 in t._shape:
        return
    else:
        plan = kernels().fill_plan(t.dtype, t._shape, t._stride, t.device.index)
        plan.run(_stream(t), (t.data_ptr(),), (value,))


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


def copy_(dst, src, non_blocking=False):
    """dst[...] = src, broadcasting src and casting to dst's dtype, between any two devices."""
    Tensor = _tensor.Tensor
    if not isinstance(src, Tensor):
        raise TypeError(f"copy_(): argument 'src' must be a Tensor, not {type(src).__name__}")
    if broadcast_shapes(dst._shape, src._shape) != dst._shape:
        raise RuntimeError(f"output with shape {list(dst._shape)} doesn't match the broadcast shape "
                           f"{list(broadcast_shapes(dst._shape, src._shape))}")
    if dst.numel() == 0:
        return
    if src.device != dst.device:
        src = _to_device(src, dst.device, dst.dtype)
    src = src.expand(dst._shape)
    if dst.device.type == "cpu":
        numpy_view(dst)[...] = to_storage_values(numpy_values(src), dst.dtype)
    else:
        plan = kernels().copy_plan(src.dtype, dst.dtype, dst._shape, src._stride, dst._stride, dst.device.index)
        plan.run(_stream(dst), (src.data_ptr(), dst.data_ptr()), ())


def _to_device(src, device, dtype):
    """A contiguous copy of src on `device`. The cast is done on whichever side is cheaper: before the
    transfer when it shrinks the data, after otherwise (the caller's copy casts)."""
    from . import cuda
    from .backends import active_driver
    Tensor = _tensor.Tensor
    if dtype.itemsize < src.dtype.itemsize:
        src = src.to(dtype)
    src = src.contiguous()
    out = Tensor._empty(src._shape, src.dtype, device)
    nbytes = src.numel() * src.dtype.itemsize
    if nbytes == 0:
        return out
    driver = active_driver()
    if src.device.type == "cuda" and device.type == "cuda":
        # the source's pending work is on its own device's stream: finish it, then copy on the target's
        cuda.current_stream(src.device).synchronize()
    side = device if device.type == "cuda" else src.device
    with cuda.device(side.index):
        stream = cuda.current_stream(side)
        driver.memcpy_async(out.data_ptr(), src.data_ptr(), nbytes, stream.cuda_stream)
        if device.type == "cpu":
            stream.synchronize()
    return out


# ---------------------------------------------------------------------------------------------- arithmetic
def _check_number(x):
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, complex) or not isinstance(x, numbers.Number):
        raise TypeError(f"unsupported operand type: {type(x).__name__} (minitensor supports tensors and real "
                        "Python numbers)")
    return x


_binary_runs = {}  # signature -> run(a, b, out) for cuda ops already checked once


def binary(name, a, b, out=None, alpha=1):
    """`a (op) b` with broadcasting, Python scalars and torch's promotion; into `out` when given (also the
    in-place forms, where out is a). Checks and typing run once per signature; later calls with the same
    dtypes, shapes, strides and devices go straight to the kernel."""
    key = None
    if alpha == 1:
        key = (name, _key(a), _key(b), None if out is None else _key(out))
        run = _binary_runs.get(key)
        if run is not None:
            return run(a, b, out)
    return _binary_checked(name, a, b, out, alpha, key)


def _binary_checked(name, a, b, out, alpha, key):
    Tensor = _tensor.Tensor
    op = _BINARY_NAMES[name]
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"{name}(): expected at least one Tensor operand")
    a = a if isinstance(a, Tensor) else _check_number(a)
    b = b if isinstance(b, Tensor) else _check_number(b)
    if alpha != 1:
        b = _apply_alpha(b, alpha, a)
    result = dtypes.result_type(a, b)
    if op == 1 and (result is dtypes.bool_ or any(isinstance(x, bool) or _dtype_of(x) is dtypes.bool_
                                                  for x in (a, b))):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying "
                           "to invert a mask, use the `~` or `logical_not()` operator instead.")
    if op == 3 and not result.is_floating_point:
        result = dtypes.default_float
    device = _common_device(a, b, out)
    shape = broadcast_shapes(*(x._shape for x in (a, b) if isinstance(x, Tensor)))
    if out is not None:
        if not dtypes.can_cast(result, out.dtype):
            raise RuntimeError(f"result type {_TORCH_NAMES[result.name]} can't be cast to the desired output type "
                               f"{_TORCH_NAMES[out.dtype.name]}")
        if out._shape != shape:
            raise RuntimeError(f"output with shape {list(out._shape)} doesn't match the broadcast shape "
                               f"{list(shape)}")
    if result is dtypes.bool_:
        op = {0: 4, 2: 5}.get(op, op)  # bool add is or, bool mul is and, as in torch
    compute = dtypes.float32 if result in (dtypes.float16, dtypes.bfloat16) else result
    out_dtype = result if out is None else out.dtype
    if device.type == "cpu":
        if out is None:
            out = Tensor._empty(shape, result, device)
        if out.numel():
            _binary_numpy(op, _operand(a, shape, result), _operand(b, shape, result), out, compute)
        return out
    run = _cuda_binary_run(op, a, b, shape, result, compute, out_dtype, device, out)
    if key is not None and all(not isinstance(x, Tensor) or x.device == device for x in (a, b)):
        _binary_runs[key] = run
    return run(a, b, out)


def _dtype_of(x):
    return x.dtype if isinstance(x, _tensor.Tensor) else None


def _cuda_binary_run(op, a, b, shape, result, compute, out_dtype, device, out):
    """The checked-once fast path of a cuda binary op, for operands laid out as a, b and out are."""
    Tensor = _tensor.Tensor

    def on_device(x):
        return isinstance(x, Tensor) and x.device == device
    empty = math.prod(shape) == 0
    out_strides = _tensor.contiguous_strides(shape) if out is None else out._stride
    plan = None if empty else kernels().binary_plan(
        op, a.dtype if on_device(a) else None, b.dtype if on_device(b) else None, out_dtype, shape,
        a.expand(shape)._stride if on_device(a) else None, b.expand(shape)._stride if on_device(b) else None,
        out_strides, compute, device.index)
    index = device.index
    nbytes = math.prod(shape) * out_dtype.itemsize
    allocator = memory.allocator(index)

    def operand(x):
        """(pointer, scalar) of an operand: a device tensor by address, anything else by value."""
        if on_device(x):
            return x.data_ptr(), 0
        return 0, _scalar_for(result, x.item() if isinstance(x, Tensor) else x)

    if not empty and out is None and on_device(a) and on_device(b):
        # the common case, two device tensors into a new output, without the generic operand handling
        a_size, b_size = a.dtype.itemsize, b.dtype.itemsize
        plan_run = plan.run

        def run_tensors(a, b, out):
            stream = current_stream_handle(index)
            storage = UntypedStorage._allocate(nbytes, device, allocator, stream)
            plan_run(stream, (a._storage._block.ptr + a._offset * a_size, b._storage._block.ptr + b._offset * b_size,
                              storage._block.ptr), (0, 0))
            return Tensor(storage, shape, out_strides, 0, out_dtype)
        return run_tensors

    def run(a, b, out):
        stream = current_stream_handle(index)
        if out is None:
            out = Tensor(UntypedStorage._allocate(nbytes, device, allocator, stream), shape, out_strides, 0,
                         out_dtype)
        if not empty:
            pa, sa = operand(a)
            pb, sb = operand(b)
            plan.run(stream, (pa, pb, out.data_ptr()), (sa, sb))
        return out
    return run


def _apply_alpha(b, alpha, a):
    Tensor = _tensor.Tensor
    kinds = [x.dtype for x in (a, b) if isinstance(x, Tensor)]
    if isinstance(alpha, float) and all(not k.is_floating_point for k in kinds):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    return binary("mul", b, alpha) if isinstance(b, Tensor) else b * alpha


def _common_device(a, b, out):
    """The device the op runs on. A 0-d CPU tensor may join a cuda op, as in torch (it becomes a scalar)."""
    Tensor = _tensor.Tensor
    tensors = [x for x in (a, b, out) if isinstance(x, Tensor)]
    devices = {x.device for x in tensors if not (x.device.type == "cpu" and x.dim() == 0 and x is not out)}
    if not devices:
        return CPU
    if len(devices) > 1:
        first, second = sorted(devices, key=str)[:2]
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{first} and {second}!")
    return devices.pop()


def _operand(x, shape, result):
    """Tensors expanded to the output shape; Python numbers become numbers of the result's category."""
    if isinstance(x, _tensor.Tensor):
        return x.expand(shape)
    return _scalar_for(result, x)


def _binary_numpy(op, a, b, out, compute):
    Tensor = _tensor.Tensor
    np_compute = np.float32 if compute is dtypes.bfloat16 else compute.np

    def values(x):
        if isinstance(x, Tensor):
            return numpy_values(x).astype(np_compute, copy=False)
        return np.array(x).astype(np_compute)
    with np.errstate(all="ignore"):
        r = _NUMPY_BINARY[op](values(a), values(b))
        if compute is not dtypes.bool_:
            r = np.asarray(r).astype(np_compute, copy=False)
    numpy_view(out)[...] = to_storage_values(r, out.dtype)


# ---------------------------------------------------------------------------------------------- repr
def format_tensor(t):
    values = t._host_values()
    if t.numel() == 0:
        body = "[]" if t.dim() == 1 else f"[], size={tuple(t._shape)}"
    elif t.dtype.is_floating_point:
        values = values.astype(np.float64)
        finite = values[np.isfinite(values)]
        integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
        big = finite.size and (np.abs(finite).max() >= 1e8 or 0 < np.abs(finite[finite != 0]).min(initial=1) < 1e-4)
        if big:
            fmt = "{:.4e}".format
        elif integral:
            fmt = lambda v: f"{v:.0f}." if np.isfinite(v) else str(v)
        else:
            fmt = "{:.4f}".format
        body = np.array2string(values, separator=", ", formatter={"float_kind": fmt}, prefix="tensor(",
                               threshold=1000)
    else:
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=1000)
    extras = []
    if t.device.type == "cuda":
        extras.append(f"device='{t.device}'")
    if t.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_) or (t.numel() == 0 and t.dtype is not dtypes.float32):
        extras.append(f"dtype={t.dtype}")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"
