"""`Tensor`: a strided view (shape, stride, offset in elements, dtype) of an `UntypedStorage`.

Views never copy; they share the storage. Operations are in `ops` (kernels for cuda tensors, numpy for
CPU tensors); this module holds metadata, views, indexing and conversions.
"""
import math

from .base import dtypes
from .base.device import CPU
from .core import fields, shapes
from .core.shapes import Size
from .core.to_arguments import parse_to
from .core.alloc import empty, empty_pinned
from .core.fields import TensorFields
from .core.host_arrays import numpy_values, numpy_view
from .core.storage import UntypedStorage
from .core.typed_storage import tensor_storage
from .cuda.devices import as_device, cuda_device
from .cuda.streams import checked_stream
from .interop import cuda_array_interface, dlpack_device, to_dlpack, to_numpy_array
from .ops import complex_views, index_put, indexing, matmul as products, pointwise, random, reductions
from .ops.copy import copy_, fill_
from .ops.format import format_tensor


class Tensor(TensorFields):
    """Tensor(storage, shape, stride, offset, dtype, layout=None): a view of `storage`; `layout` is its layout
    number (core/layout.py) when the caller has it. The fields are TensorFields' (core/fields.py); the
    arithmetic of views is core/shapes.py's."""

    __slots__ = ()

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self):
        return Size(self._shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._shape)
        return self._shape[shapes.normalize_dim(dim, len(self._shape))]

    def stride(self, dim=None):
        if dim is None:
            return self._stride
        return self._stride[shapes.normalize_dim(dim, len(self._shape))]

    def storage_offset(self):
        return self._offset

    @property
    def is_cuda(self):
        return self.device.type == "cuda"

    @property
    def ndim(self):
        return len(self._shape)

    def dim(self):
        return len(self._shape)

    def numel(self):
        return math.prod(self._shape)

    def element_size(self):
        return self.dtype.itemsize

    @property
    def itemsize(self):
        return self.dtype.itemsize

    @property
    def nbytes(self):
        return self.numel() * self.dtype.itemsize

    def data_ptr(self):
        base = self._storage.data_ptr()
        return base + self._offset * self.dtype.itemsize if base else 0

    def untyped_storage(self):
        return self._storage

    storage = tensor_storage  # a TypedStorage of this dtype over the whole storage (core/typed_storage.py)

    def is_contiguous(self):
        return shapes.is_contiguous(self._shape, self._stride)

    def is_pinned(self):
        """True when the storage is pinned host memory (see UntypedStorage.is_pinned); views of it are too."""
        return self._storage.is_pinned()

    def is_floating_point(self):
        return self.dtype.is_floating_point

    is_complex = complex_views.is_complex
    real = property(complex_views.real)  # views of a complex tensor's parts (ops/complex_views.py)
    imag = property(complex_views.imag)
    conj = complex_views.conj
    __complex__ = lambda self: complex(self._only_element())  # noqa: E731 (complex(t) of a one-element tensor)

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    # ------------------------------------------------------------------ views
    def _view(self, shape, stride, offset=None):
        return Tensor(self._storage, tuple(shape), tuple(stride), self._offset if offset is None else offset,
                      self.dtype)

    def as_strided(self, size, stride, storage_offset=None):
        """A view with these numbers, checked against the storage as torch checks them (core/shapes.py)."""
        offset = self._offset if storage_offset is None else storage_offset
        return self._view(*shapes.as_strided(size, stride, offset, self.dtype.itemsize, self._storage._nbytes))

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], dtypes.dtype):
            return self._view_as_dtype(shape[0])
        shape = shapes.infer_shape(shapes.shape_arg(shape), self.numel())
        stride = shapes.view_strides(self._shape, self._stride, shape)
        if stride is None:
            raise RuntimeError("view size is not compatible with input tensor's size and stride (at least one "
                               "dimension spans across two contiguous subspaces). Use .reshape(...) instead.")
        return self._view(shape, stride)

    def _view_as_dtype(self, dtype):
        if dtype.itemsize != self.dtype.itemsize:
            raise RuntimeError(f"view(dtype) needs the same element size: {self.dtype} has {self.dtype.itemsize} "
                               f"bytes, {dtype} has {dtype.itemsize}")
        return Tensor(self._storage, self._shape, self._stride, self._offset, dtype)

    def reshape(self, *shape):
        shape = shapes.infer_shape(shapes.shape_arg(shape), self.numel())
        stride = shapes.view_strides(self._shape, self._stride, shape)
        if stride is not None:
            return self._view(shape, stride)
        return self.contiguous()._view(shape, shapes.contiguous_strides(shape))

    def view_as(self, other):
        return self.view(other._shape)

    def reshape_as(self, other):
        return self.reshape(other._shape)

    def transpose(self, dim0, dim1):
        n = len(self._shape)
        dim0, dim1 = shapes.normalize_dim(dim0, n), shapes.normalize_dim(dim1, n)
        if n == 0:
            return self._view((), ())
        shape, stride = list(self._shape), list(self._stride)
        shape[dim0], shape[dim1] = shape[dim1], shape[dim0]
        stride[dim0], stride[dim1] = stride[dim1], stride[dim0]
        return self._view(shape, stride)

    swapaxes = transpose

    def t(self):
        if len(self._shape) > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is {len(self._shape)}D")
        return self.transpose(0, 1) if len(self._shape) == 2 else self._view(self._shape, self._stride)

    @property
    def T(self):
        return self.permute(*reversed(range(len(self._shape))))

    def permute(self, *dims):
        return self._view(*shapes.permuted(self._shape, self._stride, shapes.shape_arg(dims)))

    def expand(self, *sizes):
        return self._view(*shapes.expanded(self._shape, self._stride, shapes.shape_arg(sizes)))

    def expand_as(self, other):
        return self.expand(other._shape)

    def squeeze(self, dim=None):
        return self._view(*shapes.squeezed(self._shape, self._stride, dim))

    def unsqueeze(self, dim):
        n = len(self._shape)
        dim = shapes.normalize_dim(dim, n + 1)
        inner = self._stride[dim] * self._shape[dim] if dim < n else 1
        return self._view(self._shape[:dim] + (1,) + self._shape[dim:],
                          self._stride[:dim] + (inner,) + self._stride[dim:])

    def flatten(self, start_dim=0, end_dim=-1):
        n = len(self._shape)
        if n == 0:
            return self.reshape(1)
        start, end = shapes.normalize_dim(start_dim, n), shapes.normalize_dim(end_dim, n)
        if start > end:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        shape = self._shape[:start] + (math.prod(self._shape[start:end + 1]),) + self._shape[end + 1:]
        return self.reshape(shape)

    def narrow(self, dim, start, length):
        return self._view(*shapes.narrowed(self._shape, self._stride, self._offset, dim, start, length))

    def unbind(self, dim=0):
        return tuple(self.select(dim, i) for i in range(self.size(dim)))

    def select(self, dim, index):
        return self._view(*shapes.selected(self._shape, self._stride, self._offset, dim, index))

    def __getitem__(self, index):
        return self._view(*shapes.indexed(self._shape, self._stride, self._offset, index))

    def __setitem__(self, index, value):
        indexing.setitem(self, index, value)

    # gather / index_select (ops/indexing.py): bound as methods, so t.gather(dim, index) is one call
    gather = indexing.gather
    index_select = indexing.index_select
    index_put_ = index_put.index_put_  # ops/index_put.py
    index_put = index_put.index_put

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self.select(0, i) for i in range(self._shape[0]))

    # ------------------------------------------------------------------ copies and conversions
    def contiguous(self):
        if self.is_contiguous():
            return self
        out = empty(self._shape, self.dtype, self.device)
        copy_(out, self)
        return out

    def clone(self):
        """A copy with the same strides when self is dense and non-overlapping (a permutation of a
        contiguous layout, like a transpose), else contiguous: torch's preserve_format."""
        out = empty(self._shape, self.dtype, self.device)
        if not self.is_contiguous() and shapes.is_dense(self._shape, self._stride):
            out = Tensor(out._storage, self._shape, self._stride, 0, self.dtype)
        copy_(out, self)
        return out

    def copy_(self, src, non_blocking=False):
        copy_(self, src, non_blocking)
        return self

    def pin_memory(self):
        """This tensor if its memory is pinned, else a copy in pinned memory with the same strides (torch's
        _pin_memory: the storage covers the strided extent from offset 0)."""
        if self.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
        if self.is_pinned():
            return self
        nbytes, start = shapes.extent(self._shape, self._stride) * self.itemsize, self._offset * self.itemsize
        storage = UntypedStorage._pinned(nbytes)
        storage._array[...] = self._storage._array[start:start + nbytes]  # the bytes: an expanded view too
        return Tensor(storage, self._shape, self._stride, 0, self.dtype)

    def fill_(self, value):
        fill_(self, value)
        return self

    def zero_(self):
        return self.fill_(0)

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, copy = parse_to(args, kwargs)
        device = self.device if device is None else as_device(device)
        dtype = self.dtype if dtype is None else dtype
        if device == self.device and dtype is self.dtype and not copy:
            return self
        if non_blocking and device.type == "cpu" and self.device.type == "cuda":
            out = empty_pinned(self._shape, dtype)  # as torch: so the copy can stay asynchronous
        else:
            out = empty(self._shape, dtype, device)
        copy_(out, self, non_blocking)
        return out

    def cpu(self):
        return self.to(CPU)

    def cuda(self, device=None, non_blocking=False):
        return self.to(cuda_device(device), non_blocking=non_blocking)

    def type(self, dtype=None, non_blocking=False):
        """Without an argument the type's name ("minitensor.cuda.FloatTensor"); with a dtype or such a name
        (torch's spelling too), this tensor converted to it."""
        if dtype is None:
            return dtypes.tensor_type_name(self.dtype, self.is_cuda)
        if isinstance(dtype, str):
            dtype, cuda = dtypes.from_tensor_type_name(dtype)
            return self.to(cuda_device(None) if cuda else CPU, dtype, non_blocking=non_blocking)
        return self.to(dtype, non_blocking=non_blocking)

    def get_device(self):
        """The cuda device's index, -1 on the CPU."""
        return self.device.index if self.is_cuda else -1

    def logical_not(self): return pointwise.logical_not(self)
    def logical_not_(self): return pointwise.logical_not(self, out=self)
    def square(self): return pointwise.square(self)
    def square_(self): return pointwise.square(self, out=self)

    def float(self): return self.to(dtypes.float32)
    def double(self): return self.to(dtypes.float64)
    def half(self): return self.to(dtypes.float16)
    def bfloat16(self): return self.to(dtypes.bfloat16)
    def int(self): return self.to(dtypes.int32)
    def long(self): return self.to(dtypes.int64)
    def short(self): return self.to(dtypes.int16)
    def char(self): return self.to(dtypes.int8)
    def byte(self): return self.to(dtypes.uint8)
    def bool(self): return self.to(dtypes.bool_)

    def numpy(self, *, force=False):
        if self.device.type != "cpu":
            if not force:
                raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to "
                                "copy the tensor to host memory first.")
            return self.cpu().numpy()
        if self.dtype is dtypes.bfloat16:
            raise TypeError("Got unsupported ScalarType BFloat16")
        return numpy_view(self)

    # ------------------------------------------------------------------ interop (minitensor/interop/)
    __array__ = to_numpy_array
    __dlpack__ = to_dlpack
    __dlpack_device__ = dlpack_device
    __cuda_array_interface__ = property(cuda_array_interface)

    def _host_values(self):
        """A numpy array of the values on the host; bfloat16 comes back as float32."""
        return numpy_values(self if self.device.type == "cpu" else self.cpu())

    def tolist(self):
        return self._host_values().tolist()

    def item(self):
        n = self.numel()
        if n != 1:
            raise RuntimeError(f"a Tensor with {n} elements cannot be converted to Scalar")
        return self._host_values().reshape(()).item()

    def __bool__(self):
        if self.numel() != 1:
            raise RuntimeError(f"Boolean value of Tensor with {'no values' if self.numel() == 0 else 'more than one value'}"
                               " is ambiguous")
        return bool(self.item())

    def __int__(self):
        return int(self._only_element())

    def __float__(self):
        return float(self._only_element())

    def _only_element(self):
        if self.numel() != 1:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self.item()

    def __index__(self):
        if self.dtype.is_floating_point or self.dtype is dtypes.bool_ or self.numel() != 1:
            raise TypeError("only integer tensors of a single element can be converted to an index")
        return int(self.item())

    __repr__ = format_tensor

    def __reduce_ex__(self, protocol):
        """pickle and copy.deepcopy: this view of its storage. The storage goes through pickle's memo, so
        views of one storage stay views of one storage within one pickle or deepcopy."""
        return Tensor, (self._storage, self._shape, self._stride, self._offset, self.dtype)

    # ------------------------------------------------------------------ streams
    def record_stream(self, stream):
        """Mark the memory as used by `stream`: it is not reused until that stream's work queued so far
        is done, even after the tensor is freed."""
        if self.device.type == "cpu":
            raise RuntimeError("record_stream expects a cuda tensor (or one on a registered device type)")
        handle = checked_stream(stream, "record_stream(): argument 'stream'").cuda_stream
        storage = self._storage
        if storage._allocator is not None:  # external memory (DLPack, CAI): its owner frees it, as in torch
            storage._allocator.record_stream(storage._block, handle)

    # ------------------------------------------------------------------ pointwise ops
    def add(self, other, *, alpha=1): return pointwise.binary("add", self, other, alpha=alpha)
    def sub(self, other, *, alpha=1): return pointwise.binary("sub", self, other, alpha=alpha)
    def add_(self, other, *, alpha=1): return pointwise.binary("add", self, other, out=self, alpha=alpha)
    def sub_(self, other, *, alpha=1): return pointwise.binary("sub", self, other, out=self, alpha=alpha)
    subtract = sub

    def where(self, condition, other): return pointwise.where(condition, self, other)
    def clamp(self, min=None, max=None): return pointwise.clamp(self, min, max)
    def clamp_(self, min=None, max=None): return pointwise.clamp(self, min, max, out=self)
    clip, clip_ = clamp, clamp_

    # the arithmetic and bitwise operators (`+`, `+=`, reflected forms, `**`, ...) are set below from _OPERATORS
    __neg__ = pointwise.unary_method("neg")
    __abs__ = pointwise.unary_method("abs")
    __invert__ = pointwise.unary_method("bitwise_not")

    # Comparisons with a number or a tensor are elementwise; with anything else they are NotImplemented (so
    # `t == None` is False, as in torch), decided on the first, checked call of each signature.
    __eq__ = pointwise.binary_method("eq", comparison=True)
    __ne__ = pointwise.binary_method("ne", comparison=True)
    __lt__ = pointwise.binary_method("lt", comparison=True)
    __le__ = pointwise.binary_method("le", comparison=True)
    __gt__ = pointwise.binary_method("gt", comparison=True)
    __ge__ = pointwise.binary_method("ge", comparison=True)
    __hash__ = object.__hash__  # by identity, as torch: __eq__ is elementwise

    # random numbers (ops/random.py): bound as methods, so t.uniform_() is one call
    uniform_ = random.uniform_
    normal_ = random.normal_
    bernoulli = random.bernoulli
    bernoulli_ = random.bernoulli_
    random_ = random.random_

    # reductions and comparisons (ops/reductions.py): bound as methods, so t.sum(dim) is one call
    sum = reductions.sum
    mean = reductions.mean
    max = reductions.max
    min = reductions.min
    all = reductions.all
    any = reductions.any
    equal = reductions.equal
    isclose = reductions.isclose
    allclose = reductions.allclose


# operator -> op, for __op__, its reflected form __rop__ and its in-place form __iop__
_OPERATORS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
              "mod": "remainder", "pow": "pow", "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor"}


def _add_pointwise_methods():
    """The operators, the methods that are a named op and its in-place form (`t.mul(u)`, `t.mul_(u)`), and the
    matrix products (`@`, `t.mm(u)`, ..., ops/matmul.py)."""
    def binary_method(name, in_place):
        if name == "pow":
            return (lambda self, other: pointwise.power(self, other, out=self)) if in_place else pointwise.power
        if in_place:
            return lambda self, other: pointwise.binary(name, self, other, out=self)
        return pointwise.binary_method(name)

    def unary_method(name, in_place):
        if in_place:
            return lambda self: pointwise.unary(name, self, out=self)
        return pointwise.unary_method(name)

    for operator, name in _OPERATORS.items():
        setattr(Tensor, f"__{operator}__", binary_method(name, False))
        setattr(Tensor, f"__r{operator}__", pointwise.binary_method(name, reflected=True))
        setattr(Tensor, f"__i{operator}__", binary_method(name, True))
    for name in pointwise.BINARY_METHODS:
        setattr(Tensor, name, binary_method(name, False))
        setattr(Tensor, name + "_", binary_method(name, True))
    for name in pointwise.UNARY_METHODS:
        setattr(Tensor, name, unary_method(name, False))
        setattr(Tensor, name + "_", unary_method(name, True))
    for name in products.METHODS:
        setattr(Tensor, name, getattr(products, name))
    Tensor.__matmul__ = products.matmul
    Tensor.__rmatmul__ = lambda self, other: products.matmul(other, self)
    for alias, name in pointwise.ALIASES.items():
        setattr(Tensor, alias, getattr(Tensor, name))
        setattr(Tensor, alias + "_", getattr(Tensor, name + "_"))


_add_pointwise_methods()
fields.register(Tensor, UntypedStorage)

