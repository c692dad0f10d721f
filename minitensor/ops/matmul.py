"""Matrix products with torch's shape rules and errors: `matmul` (`@`), `mm`, `bmm`, `mv`, `dot`, `addmm`,
`baddbmm` and `linear`.

Every form becomes one batched product C[b] = alpha * A[b] @ B[b] + beta * bias[b] over 3-D views (batch, rows,
cols), read through their strides: transposes and slices cost no copy; broadcast batch dims collapse into one
batch dim where their strides allow, and are copied where they do not. On cuda the product is the Triton kernel
of kernels/matmul.py, in float16, bfloat16, float32 (ieee or tf32, per mt.backends.cuda.matmul) and float64, and
complex64/complex128 as four real products over the real and imaginary views; torch's GPU has no integer
products, so neither has minitensor's. On the CPU, numpy computes it (float16 and
bfloat16 in float32, rounded once, as torch's CPU kernels do).

`a @ b` of two cuda matrices (or batches of one size) is checked once per (layouts, flag setting): `_fast`
keeps, for each, the closure that allocates the result and launches, so a repeated product costs a dict
lookup, an allocation and a launch.
"""
import math

import numpy as np

from ..backends import cuda as flags
from ..base import dtypes
from ..core import fields
from ..core.alloc import empty
from ..core.fields import allocate
from ..core.layout import layout_of
from ..core.host_arrays import numpy_values, numpy_view, to_storage_values
from ..core.shapes import broadcast_shapes
from ..cuda import memory
from ..cuda.streams import _tls as _streams_tls, current_stream_handle
from .complex_views import imag, real
from .copy import copy_
from .runs import kernels
from .typing import common_device, not_implemented_for

_fast = {}  # (layout of a, layout of b, flag setting) -> run(a, b): `a @ b`, checked once
METHODS = ("matmul", "mm", "bmm", "mv", "dot", "addmm", "baddbmm")  # what Tensor binds as methods
_MAX_GRID_Y = 65535
_CUDA_TYPES = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64, dtypes.complex64, dtypes.complex128)
_CPU_REFUSED = (dtypes.bool_, dtypes.uint16, dtypes.uint32, dtypes.uint64)
# how torch's dtype mismatch message names each dtype (caffe2's TypeMeta names)
_META_NAMES = {"bool": "bool", "uint8": "unsigned char", "int8": "signed char", "int16": "short int",
               "int32": "int", "int64": "long int", "float16": "c10::Half", "bfloat16": "c10::BFloat16",
               "float32": "float", "float64": "double", "uint16": "unsigned short", "uint32": "unsigned int",
               "uint64": "unsigned long", "complex64": "c10::complex<float>", "complex128": "c10::complex<double>"}


def _tensor(x, name, what):
    if not isinstance(x, fields.TensorFields):
        raise TypeError(f"{name}(): argument '{what}' must be Tensor, not {type(x).__name__}")
    return x


def _check_types(a, b, device):
    if a.dtype is not b.dtype:
        raise RuntimeError(f"expected m1 and m2 to have the same dtype, but got: {_META_NAMES[a.dtype.name]} != "
                           f"{_META_NAMES[b.dtype.name]}")
    supported = a.dtype in _CUDA_TYPES if device.type == "cuda" else a.dtype not in _CPU_REFUSED
    if not supported:
        raise not_implemented_for("addmm_cuda" if device.type == "cuda" else "addmm_impl_cpu_", a.dtype)


def mm(a, b, *, out=None):
    _tensor(a, "mm", "input"), _tensor(b, "mm", "mat2")
    if a.dim() != 2:
        raise RuntimeError("self must be a matrix")
    if b.dim() != 2:
        raise RuntimeError("mat2 must be a matrix")
    if out is None:
        return matmul(a, b)  # its kept fast path
    return _batched(a.unsqueeze(0), b.unsqueeze(0), None, 1, 0, out, (a._shape[0], b._shape[1]))


def bmm(a, b, *, out=None):
    _tensor(a, "bmm", "input"), _tensor(b, "bmm", "mat2")
    for x, name in ((a, "batch1"), (b, "batch2")):
        if x.dim() != 3:
            raise RuntimeError(f"{name} must be a 3D tensor")
    return _batched(a, b, None, 1, 0, out, (a._shape[0], a._shape[1], b._shape[2]))


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """beta * input + alpha * mat1 @ mat2, input broadcast to the product's shape (ignored when beta is 0)."""
    _tensor(input, "addmm", "input"), _tensor(mat1, "addmm", "mat1"), _tensor(mat2, "addmm", "mat2")
    if mat1.dim() != 2 or mat2.dim() != 2:
        raise RuntimeError(f"{'mat1' if mat1.dim() != 2 else 'mat2'} must be a matrix, got "
                           f"{(mat1 if mat1.dim() != 2 else mat2).dim()}-D tensor")
    shape = (mat1._shape[0], mat2._shape[1])
    bias = input.expand(shape).unsqueeze(0) if beta != 0 else None
    return _batched(mat1.unsqueeze(0), mat2.unsqueeze(0), bias, alpha, beta, out, shape)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    _tensor(input, "baddbmm", "input"), _tensor(batch1, "baddbmm", "batch1"), _tensor(batch2, "baddbmm", "batch2")
    for x, name in ((batch1, "batch1"), (batch2, "batch2")):
        if x.dim() != 3:
            raise RuntimeError(f"{name} must be a 3D tensor")
    shape = (batch1._shape[0], batch1._shape[1], batch2._shape[2])
    bias = input.expand(shape) if beta != 0 else None
    return _batched(batch1, batch2, bias, alpha, beta, out, shape)


def mv(a, v, *, out=None):
    _tensor(a, "mv", "input"), _tensor(v, "mv", "vec")
    if a.dim() != 2 or v.dim() != 1 or a._shape[1] != v._shape[0]:
        raise RuntimeError(f"size mismatch, got input ({a._shape[0] if a.dim() else 0}), mat "
                           f"({'x'.join(map(str, a._shape))}), vec ({'x'.join(map(str, v._shape))})")
    return _batched(a.unsqueeze(0), v.view(-1, 1).unsqueeze(0), None, 1, 0, out, (a._shape[0],))


def dot(a, b, *, out=None):
    _tensor(a, "dot", "input"), _tensor(b, "dot", "tensor")
    if a.dim() != 1 or b.dim() != 1:
        raise RuntimeError(f"1D tensors expected, but got {a.dim()}D and {b.dim()}D tensors")
    if a._shape != b._shape:
        raise RuntimeError(f"inconsistent tensor size, expected tensor [{a._shape[0]}] and src [{b._shape[0]}] to "
                           f"have the same number of elements, but got {a._shape[0]} and {b._shape[0]} elements "
                           f"respectively")
    return _batched(a.view(1, 1, -1), b.view(1, -1, 1), None, 1, 0, out, ())


def matmul(a, b, *, out=None):
    """torch.matmul: dot, mv, mm, or a batched product with broadcast batch dims; a 1-D operand counts as a row
    (first) or a column (second) that the result then drops."""
    if out is None:
        try:
            run = _fast.get((a._layout or layout_of(a), b._layout or layout_of(b), flags.version()))
        except AttributeError:  # not tensors: the checked path says what is wrong
            run = None
        if run is not None:
            return run(a, b)
    result = _matmul_checked(a, b, out)
    if out is None and a.device.type == "cuda" and 2 <= a.dim() == b.dim() <= 3 and not a.dtype.is_complex:
        _remember_fast(a, b, result)
    return result


def _matmul_checked(a, b, out):
    _tensor(a, "matmul", "input"), _tensor(b, "matmul", "other")
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {a.dim()}D and "
                           f"{b.dim()}D")
    if a.dim() == 1 and b.dim() == 1:
        return dot(a, b, out=out)
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    batch = broadcast_shapes(a2._shape[:-2], b2._shape[:-2])
    m, k, n = a2._shape[-2], a2._shape[-1], b2._shape[-1]
    if b2._shape[-2] != k:
        raise _mismatch(a2, b2) if len(batch) == 0 else RuntimeError(
            f"Expected size for first two dimensions of batch2 tensor to be: [{max(1, math.prod(batch))}, {k}] but "
            f"got: [{max(1, math.prod(batch))}, {b2._shape[-2]}].")
    shape = batch + ((m,) if a.dim() > 1 else ()) + ((n,) if b.dim() > 1 else ())
    a3 = a2.expand(batch + (m, k)).reshape(math.prod(batch), m, k)
    b3 = b2.expand(batch + (k, n)).reshape(math.prod(batch), k, n)
    return _batched(a3, b3, None, 1, 0, out, shape)


def _remember_fast(a, b, c):
    """Keep the closure for products laid out as a @ b = c (3-D, or 2-D seen as one batch), if they need no
    split-K and no batch chunks: it copies tf32 operands K-contiguous where they are not (`_k_major`), allocates,
    checks the pointers' alignment, launches."""
    a3, b3, c3 = (x.unsqueeze(0) if x.dim() == 2 else x for x in (a, b, c))
    (batch, m, k), n, index = a3._shape, b3._shape[2], c.device.index
    plans = kernels().matmul_plans
    precision = plans.precision_class(a.dtype.name)
    if batch > _MAX_GRID_Y or plans.split_k(precision, batch, m, n, k, index) > 1 or c.numel() == 0:
        return
    copies = False
    if precision == "tf32":  # the strides of the K-contiguous copies each call makes, if it makes any
        major = _k_major(a3, b3)
        copies = major[0] is not a3 or major[1] is not b3
        a3, b3 = major
    strides = a3._stride + b3._stride + c3._stride + (0, 0, 0)
    plan = _plan(a3, b3, c3, None, False, precision, (0, 0, 0, 0), strides)  # run() checks a's and b's alignment
    launch, scratch_bytes = plan.run, plan.scratch_bytes
    device, dtype, shape, c_strides, layout = c.device, c.dtype, c._shape, c._stride, c._layout or layout_of(c)
    nbytes, allocator, new_tensor = c.numel() * dtype.itemsize, memory.allocator(index), fields.tensor

    def run(a, b):
        if copies:
            a, b = _k_major(a, b)
        pa, pb = a.data_ptr(), b.data_ptr()
        if (pa | pb) & 15:
            return _matmul_checked(a, b, None)
        handles = _streams_tls.handles
        stream = 0 if handles is None else handles[index]
        storage = allocate(nbytes, device, allocator, stream)
        scratch = allocate(scratch_bytes, device, allocator, stream) if scratch_bytes else None
        pc = storage._block.ptr
        launch(stream, pa, pb, pc, pc, strides, 1.0, 0.0, scratch._block.ptr if scratch_bytes else 0)
        return new_tensor(storage, shape, c_strides, 0, dtype, layout)
    _fast[(a._layout or layout_of(a), b._layout or layout_of(b), flags.version())] = run


def linear(input, weight, bias=None):
    """input @ weight.T + bias (torch.nn.functional.linear)."""
    _tensor(input, "linear", "input"), _tensor(weight, "linear", "weight")
    product = matmul(input, weight.t() if weight.dim() == 2 else weight)
    return product if bias is None else product.add_(bias)


def _mismatch(a, b):
    return RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({a._shape[-2]}x{a._shape[-1]} and "
                        f"{b._shape[-2]}x{b._shape[-1]})")


def _batched(a, b, bias, alpha, beta, out, shape):
    """C = alpha * a @ b + beta * bias for 3-D a (B, m, k), b (B, k, n), bias (B, m, n) or None, viewed as
    `shape` (its elements in (B, m, n) order)."""
    if a._shape[2] != b._shape[1]:
        raise _mismatch(a, b)
    if a._shape[0] != b._shape[0]:
        raise RuntimeError(f"Expected size for first two dimensions of batch2 tensor to be: [{a._shape[0]}, "
                           f"{a._shape[2]}] but got: [{b._shape[0]}, {b._shape[1]}].")
    device = common_device([x for x in (a, b, bias) if x is not None], out)
    _check_types(a, b, device)
    if out is not None and out.dtype is not a.dtype:
        raise RuntimeError(f"Expected out tensor to have dtype {_META_NAMES[a.dtype.name]}, but got "
                           f"{_META_NAMES[out.dtype.name]} instead")
    if out is not None and out._shape != tuple(shape):
        raise RuntimeError(f"Expected out tensor to have shape {list(shape)}, but got {list(out._shape)} instead")
    result = empty(tuple(shape), a.dtype, device) if out is None or _shares_memory(out, a, b, bias) else out
    c = result.view(a._shape[0], a._shape[1], b._shape[2])
    if c.numel():
        (_numpy_product if device.type == "cpu" else _cuda_product)(a, b, bias, alpha, beta, c)
    if out is not None and result is not out:
        copy_(out, result)
        return out
    return result


def _shares_memory(out, *inputs):
    return any(x is not None and x._storage is out._storage for x in inputs)


def _numpy_product(a, b, bias, alpha, beta, c):
    half = a.dtype in (dtypes.float16, dtypes.bfloat16)

    def values(t):
        v = numpy_values(t)
        return v.astype(np.float32) if half else v

    with np.errstate(over="ignore", invalid="ignore"):
        product = np.matmul(values(a), values(b))
        if alpha != 1:
            product = product * alpha
        if bias is not None:
            product = product + beta * values(bias)
    numpy_view(c)[...] = to_storage_values(product, c.dtype)


def _complex_product(a, b, bias, alpha, beta, c):
    """C = alpha * A @ B + beta * bias for complex tensors: (Ar Br - Ai Bi) + i (Ar Bi + Ai Br), each product
    a real one over the strided real and imaginary views, the second of each pair adding into the first's
    result (its bias, read before its program writes it); then the complex scaling and bias, pointwise."""
    c_re, c_im = real(c), imag(c)
    _cuda_product(real(a), real(b), None, 1, 0, c_re)
    _cuda_product(imag(a), imag(b), c_re, -1, 1, c_re)
    _cuda_product(real(a), imag(b), None, 1, 0, c_im)
    _cuda_product(imag(a), real(b), c_im, 1, 1, c_im)
    if alpha != 1:
        c.mul_(alpha)
    if bias is not None:
        c.add_(bias * beta)


def _cuda_product(a, b, bias, alpha, beta, c):
    if a.dtype.is_complex:
        return _complex_product(a, b, bias, alpha, beta, c)
    if a._shape[0] > _MAX_GRID_Y:  # the batch is grid axis 1, at most 65535 programs: in chunks
        for start in range(0, a._shape[0], _MAX_GRID_Y):
            part = slice(start, start + _MAX_GRID_Y)
            _cuda_product(a[part], b[part], None if bias is None else bias[part], alpha, beta, c[part])
        return
    plans = kernels().matmul_plans
    (batch, m, k), n, index = a._shape, b._shape[2], c.device.index
    precision = plans.precision_class(a.dtype.name)
    if precision == "tf32":
        a, b = _k_major(a, b)
    target = c
    if plans.split_k(precision, batch, m, n, k, index) > 1:  # partial sums meet in a float32 (float64) workspace
        target = empty(c._shape, dtypes.float64 if a.dtype is dtypes.float64 else dtypes.float32, c.device)
    bias_ptr = target.data_ptr() if bias is None else bias.data_ptr()
    pointers = (a.data_ptr(), b.data_ptr(), target.data_ptr(), bias_ptr)
    strides = a._stride + b._stride + target._stride + (bias._stride if bias is not None else (0, 0, 0))
    plan = _plan(a, b, target, bias, alpha != 1, precision, pointers, strides)
    stream = current_stream_handle(index)
    scratch = allocate(plan.scratch_bytes, c.device, memory.allocator(index), stream) if plan.scratch_bytes else None
    plan.run(stream, *pointers, strides, float(alpha), float(beta), scratch._block.ptr if scratch else 0)
    if target is not c:
        copy_(c, target)


def _k_major(a, b):
    """tf32 tensor cores read both operands K-contiguous (16-bit ones also take them transposed): copying an operand
    that is not costs a few percent of a large product, and its transposition in shared memory costs far more."""
    if a._stride[-1] != 1:
        a = a.contiguous()
    if b._stride[-2] != 1:
        b = b.transpose(-1, -2).contiguous().transpose(-1, -2)
    return a, b


def _plan(a, b, c, bias, scaled, precision, pointers, strides):
    """The kernel's MatmulPlan for 3-D operands (pointers: a, b, c, bias; strides: theirs, in that order)."""
    (batch, m, k), n = a._shape, b._shape[2]
    extent = max(x.numel() * x.dtype.itemsize for x in (a, b, c))
    return kernels().matmul_plans.matmul_plan(
        a.dtype.triton, c.dtype.triton, precision, flags.fp16_accumulation(), batch, m, n, k,
        None if bias is None else bias.dtype.triton, scaled, extent >= 2**31, _aligned(pointers, (m, n, k) + strides),
        _unit_strides(a, b), _tma_layout(a, b, c), c.device.index)


def _aligned(pointers, ints):
    """The kernel's parameters that are multiples of 16: 16-byte aligned pointers, then M, N, K and strides."""
    return tuple(i for i, p in enumerate(pointers) if p % 16 == 0) + tuple(
        len(pointers) + i for i, v in enumerate(ints) if v % 16 == 0)


def _tma_layout(a, b, c):
    """Whether tensor descriptors could describe the product's C, and A's and B's batches: C's column stride is 1,
    and a batch of more than one has no broadcast (0) batch stride."""
    return c._stride[2] == 1 and (a._shape[0] == 1 or 0 not in (a._stride[0], b._stride[0], c._stride[0]))


def _unit_strides(a, b):
    """Which of A's (row, col) and B's (row, col) strides are 1, for the kernel's A_M1, A_K1, B_K1, B_N1."""
    return a._stride[1] == 1, a._stride[2] == 1, b._stride[1] == 1, b._stride[2] == 1
