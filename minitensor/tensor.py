"""`Tensor`: a strided view (shape, stride, offset in elements, dtype) of an `UntypedStorage`.

Views never copy; they share the storage. Operations are in `ops` (kernels for cuda tensors, numpy for
CPU tensors); this module holds metadata, views, indexing and conversions.
"""
import functools
import math
import numbers

import numpy as np

from . import dtypes, fields, ops, pointwise
from . import indexing
from . import random
from . import reductions
from .cuda import memory
from .cuda.streams import _tls as _streams_tls
from .device import CPU, as_device
from .fields import TensorFields
from .storage import UntypedStorage


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


def _infer_shape(shape, numel):
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


def _view_strides(shape, stride, new_shape):
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


def _shape_arg(size):
    """Accept f(2, 3), f((2, 3)) and f([2, 3])."""
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = size[0]
    return tuple(map(int, size))


class Tensor(TensorFields):
    """Tensor(storage, shape, stride, offset, dtype, layout=None): a view of `storage`; `layout` is its layout
    number (layout.py) when the caller has it. The fields are TensorFields' (fields.py)."""

    __slots__ = ()

    @classmethod
    def _empty(cls, shape, dtype, device):
        """A new contiguous tensor; `device` must already be normalised (see device.as_device)."""
        nbytes = math.prod(shape) * dtype.itemsize
        if device.type == "cuda":  # straight to the allocator: factories and ops call this per op
            index = device.index
            handles = _streams_tls.handles  # current_stream_handle(index), inline
            storage = UntypedStorage._allocate(nbytes, device, memory._only or memory.allocator(index),
                                               0 if handles is None else handles[index])
        else:
            storage = UntypedStorage(nbytes, device)
        return cls(storage, shape, contiguous_strides(shape), 0, dtype)

    @classmethod
    def _empty_pinned(cls, shape, dtype):
        """A new contiguous CPU tensor in pinned memory."""
        storage = UntypedStorage._pinned(math.prod(shape) * dtype.itemsize)
        return cls(storage, shape, contiguous_strides(shape), 0, dtype)

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self):
        return Size(self._shape)

    def size(self, dim=None):
        if dim is None:
            return Size(self._shape)
        return self._shape[normalize_dim(dim, len(self._shape))]

    def stride(self, dim=None):
        if dim is None:
            return self._stride
        return self._stride[normalize_dim(dim, len(self._shape))]

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

    def is_contiguous(self):
        if 0 in self._shape:
            return True
        expected = 1
        for size, stride in zip(reversed(self._shape), reversed(self._stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def is_pinned(self):
        """True when the storage is pinned host memory (see UntypedStorage.is_pinned); views of it are too."""
        return self._storage.is_pinned()

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def __len__(self):
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    # ------------------------------------------------------------------ views
    def _view(self, shape, stride, offset=None):
        return Tensor(self._storage, tuple(shape), tuple(stride), self._offset if offset is None else offset,
                      self.dtype)

    def as_strided(self, size, stride, storage_offset=None):
        return self._view(size, stride, storage_offset)

    def view(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], dtypes.dtype):
            return self._view_as_dtype(shape[0])
        shape = _infer_shape(_shape_arg(shape), self.numel())
        stride = _view_strides(self._shape, self._stride, shape)
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
        shape = _infer_shape(_shape_arg(shape), self.numel())
        stride = _view_strides(self._shape, self._stride, shape)
        if stride is not None:
            return self._view(shape, stride)
        return self.contiguous()._view(shape, contiguous_strides(shape))

    def view_as(self, other):
        return self.view(other._shape)

    def reshape_as(self, other):
        return self.reshape(other._shape)

    def transpose(self, dim0, dim1):
        n = len(self._shape)
        dim0, dim1 = normalize_dim(dim0, n), normalize_dim(dim1, n)
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
        dims = _shape_arg(dims)
        n = len(self._shape)
        if len(dims) != n:
            raise RuntimeError(f"permute(sparse_coo): number of dimensions in the tensor input does not match the "
                               f"length of the desired ordering of dimensions i.e. input.dim() = {n} is not equal "
                               f"to len(dims) = {len(dims)}")
        dims = [normalize_dim(d, n) for d in dims]
        if len(set(dims)) != n:
            raise RuntimeError("permute(): duplicate dims are not allowed.")
        return self._view([self._shape[d] for d in dims], [self._stride[d] for d in dims])

    def expand(self, *sizes):
        sizes = _shape_arg(sizes)
        n = len(self._shape)
        if len(sizes) < n:
            raise RuntimeError(f"expand: the number of sizes provided ({len(sizes)}) must be greater or equal to "
                               f"the number of dimensions in the tensor ({n})")
        shape, stride = [], []
        lead = len(sizes) - n
        for i, size in enumerate(sizes):
            if i < lead:
                if size < 0:
                    raise RuntimeError(f"expand: -1 is not allowed in a leading, non-existing dimension ({i})")
                shape.append(size)
                stride.append(0)
                continue
            own, own_stride = self._shape[i - lead], self._stride[i - lead]
            if size == -1:
                size = own
            if own == size:
                shape.append(size)
                stride.append(own_stride)
            elif own == 1:
                shape.append(size)
                stride.append(0)
            else:
                raise RuntimeError(f"The expanded size of the tensor ({size}) must match the existing size ({own}) "
                                   f"at non-singleton dimension {i}.  Target sizes: {list(sizes)}.  Tensor sizes: "
                                   f"{list(self._shape)}")
        return self._view(shape, stride)

    def expand_as(self, other):
        return self.expand(other._shape)

    def squeeze(self, dim=None):
        n = len(self._shape)
        if dim is None:
            keep = [i for i in range(n) if self._shape[i] != 1]
        else:
            dims = {normalize_dim(d, n) for d in (dim if isinstance(dim, (tuple, list)) else (dim,))}
            keep = [i for i in range(n) if i not in dims or self._shape[i] != 1]
        return self._view([self._shape[i] for i in keep], [self._stride[i] for i in keep])

    def unsqueeze(self, dim):
        n = len(self._shape)
        dim = normalize_dim(dim, n + 1)
        inner = self._stride[dim] * self._shape[dim] if dim < n else 1
        return self._view(self._shape[:dim] + (1,) + self._shape[dim:],
                          self._stride[:dim] + (inner,) + self._stride[dim:])

    def flatten(self, start_dim=0, end_dim=-1):
        n = len(self._shape)
        if n == 0:
            return self.reshape(1)
        start, end = normalize_dim(start_dim, n), normalize_dim(end_dim, n)
        if start > end:
            raise RuntimeError("flatten() has invalid args: start_dim cannot come after end_dim")
        shape = self._shape[:start] + (math.prod(self._shape[start:end + 1]),) + self._shape[end + 1:]
        return self.reshape(shape)

    def narrow(self, dim, start, length):
        n = len(self._shape)
        if n == 0:
            raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
        dim = normalize_dim(dim, n)
        size = self._shape[dim]
        if start < 0:
            start += size
        if not (0 <= start <= size and 0 <= length and start + length <= size):
            raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size ({size}).")
        shape = list(self._shape)
        shape[dim] = length
        return self._view(shape, self._stride, self._offset + start * self._stride[dim])

    def unbind(self, dim=0):
        return tuple(self.select(dim, i) for i in range(self.size(dim)))

    def select(self, dim, index):
        n = len(self._shape)
        if n == 0:
            raise IndexError("select() cannot be applied to a 0-dim tensor.")
        dim = normalize_dim(dim, n)
        size = self._shape[dim]
        if not -size <= index < size:
            raise IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")
        index %= size
        return self._view(self._shape[:dim] + self._shape[dim + 1:], self._stride[:dim] + self._stride[dim + 1:],
                          self._offset + index * self._stride[dim])

    def __getitem__(self, index):
        if not isinstance(index, tuple):
            index = (index,)
        specified = sum(1 for i in index if i is not None and i is not Ellipsis)
        if sum(1 for i in index if i is Ellipsis) > 1:
            raise IndexError("an index can only have a single ellipsis ('...')")
        if specified > len(self._shape):
            raise IndexError(f"too many indices for tensor of dimension {len(self._shape)}")
        shape, stride, offset = [], [], self._offset
        d = 0  # the dim of self the next index applies to
        for item in index:
            if item is None:
                shape.append(1)
                stride.append(self._stride[d] * self._shape[d] if d < len(self._shape) else 1)
            elif item is Ellipsis:
                skip = len(self._shape) - specified
                shape.extend(self._shape[d:d + skip])
                stride.extend(self._stride[d:d + skip])
                d += skip
            elif isinstance(item, slice):
                size = self._shape[d]
                start, stop, step = item.indices(size)
                if step <= 0:
                    raise ValueError("step must be greater than zero")
                length = max(0, -(-(stop - start) // step))
                if length:
                    offset += start * self._stride[d]
                shape.append(length)
                stride.append(self._stride[d] * step)
                d += 1
            elif isinstance(item, (numbers.Integral, np.integer)) and not isinstance(item, bool) or (
                    isinstance(item, Tensor) and item.dim() == 0 and not item.dtype.is_floating_point
                    and item.dtype is not dtypes.bool_):
                i = int(item)
                size = self._shape[d]
                if not -size <= i < size:
                    raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
                offset += (i % size) * self._stride[d]
                d += 1
            else:
                raise IndexError(f"minitensor supports indexing with integers, slices, None and '...' (basic "
                                 f"indexing); got {type(item).__name__}. Use index_select or gather for "
                                 "tensor indices.")
        shape.extend(self._shape[d:])
        stride.extend(self._stride[d:])
        return self._view(shape, stride, offset)

    def __setitem__(self, index, value):
        indexing.setitem(self, index, value)

    # gather / index_select (indexing.py): bound as methods, so t.gather(dim, index) is one call
    gather = indexing.gather
    index_select = indexing.index_select

    def __iter__(self):
        if not self._shape:
            raise TypeError("iteration over a 0-d tensor")
        return (self.select(0, i) for i in range(self._shape[0]))

    # ------------------------------------------------------------------ copies and conversions
    def contiguous(self):
        if self.is_contiguous():
            return self
        out = Tensor._empty(self._shape, self.dtype, self.device)
        ops.copy_(out, self)
        return out

    def clone(self):
        """A copy with the same strides when self is dense and non-overlapping (a permutation of a
        contiguous layout, like a transpose), else contiguous: torch's preserve_format."""
        out = Tensor._empty(self._shape, self.dtype, self.device)
        if not self.is_contiguous() and self._is_dense():
            out = Tensor(out._storage, self._shape, self._stride, 0, self.dtype)
        ops.copy_(out, self)
        return out

    def _is_dense(self):
        """True when the layout is a permutation of a contiguous one: it covers exactly numel() elements
        from offset 0, so a fresh buffer can take the same strides."""
        dims = sorted((d for d in range(len(self._shape)) if self._shape[d] != 1), key=lambda d: self._stride[d])
        expected = 1
        for d in dims:
            if self._stride[d] != expected:
                return False
            expected *= self._shape[d]
        return True

    def copy_(self, src, non_blocking=False):
        ops.copy_(self, src, non_blocking)
        return self

    def pin_memory(self):
        """This tensor if its memory is pinned, else a copy in pinned memory with the same strides (torch's
        _pin_memory: the storage covers the strided extent from offset 0)."""
        if self.device.type != "cpu":
            raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
        if self.is_pinned():
            return self
        extent = 1 + sum((n - 1) * s for n, s in zip(self._shape, self._stride)) if self.numel() else 0
        storage = UntypedStorage._pinned(extent * self.dtype.itemsize)
        out = Tensor(storage, self._shape, self._stride, 0, self.dtype)
        ops.copy_(out, self)
        return out

    def fill_(self, value):
        ops.fill_(self, value)
        return self

    def zero_(self):
        return self.fill_(0)

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, copy = _parse_to(args, kwargs)
        device = self.device if device is None else as_device(device)
        dtype = self.dtype if dtype is None else dtype
        if device == self.device and dtype is self.dtype and not copy:
            return self
        if non_blocking and device.type == "cpu" and self.device.type == "cuda":
            out = Tensor._empty_pinned(self._shape, dtype)  # as torch: so the copy can stay asynchronous
        else:
            out = Tensor._empty(self._shape, dtype, device)
        ops.copy_(out, self, non_blocking)
        return out

    def cpu(self):
        return self.to(CPU)

    def cuda(self, device=None, non_blocking=False):
        from . import cuda
        return self.to(cuda._device(device), non_blocking=non_blocking)

    def type(self, dtype=None):
        if dtype is None:
            return f"minitensor.{'cuda.' if self.is_cuda else ''}{self.dtype.name}"
        return self.to(dtype)

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
        return ops.numpy_view(self)

    def __array__(self, dtype=None, copy=None):
        from .interop import to_numpy_array
        return to_numpy_array(self, dtype, copy)

    # ------------------------------------------------------------------ interop (interop.py, dlpack.py)
    @property
    def __cuda_array_interface__(self):
        from .interop import cuda_array_interface
        return cuda_array_interface(self)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        from .dlpack import to_dlpack
        return to_dlpack(self, stream, max_version, dl_device, copy)

    def __dlpack_device__(self):
        from .dlpack import dlpack_device
        return dlpack_device(self)

    def _host_values(self):
        """A numpy array of the values on the host; bfloat16 comes back as float32."""
        t = self if self.device.type == "cpu" else self.cpu()
        return ops.numpy_values(t)

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

    def __repr__(self):
        return ops.format_tensor(self)

    def __reduce_ex__(self, protocol):
        """pickle and copy.deepcopy: this view of its storage. The storage goes through pickle's memo, so
        views of one storage stay views of one storage within one pickle or deepcopy."""
        return Tensor, (self._storage, self._shape, self._stride, self._offset, self.dtype)

    # ------------------------------------------------------------------ streams
    def record_stream(self, stream):
        """Mark the memory as used by `stream`: it is not reused until that stream's work queued so far
        is done, even after the tensor is freed."""
        if self.device.type != "cuda":
            raise RuntimeError("record_stream expects a cuda tensor")
        storage = self._storage
        if storage._allocator is not None:  # external memory (DLPack, CAI): its owner frees it, as in torch
            storage._allocator.record_stream(storage._block, stream.cuda_stream)

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

    __add__ = pointwise.binary_method("add")
    __radd__ = pointwise.binary_method("add", reflected=True)
    __sub__ = pointwise.binary_method("sub")
    __rsub__ = pointwise.binary_method("sub", reflected=True)
    __mul__ = pointwise.binary_method("mul")
    __rmul__ = pointwise.binary_method("mul", reflected=True)
    __truediv__ = pointwise.binary_method("div")
    __rtruediv__ = pointwise.binary_method("div", reflected=True)
    __floordiv__ = pointwise.binary_method("floor_divide")
    __rfloordiv__ = pointwise.binary_method("floor_divide", reflected=True)
    __mod__ = pointwise.binary_method("remainder")
    __rmod__ = pointwise.binary_method("remainder", reflected=True)
    def __pow__(self, other): return pointwise.power(self, other)
    __rpow__ = pointwise.binary_method("pow", reflected=True)
    __and__ = pointwise.binary_method("bitwise_and")
    __rand__ = pointwise.binary_method("bitwise_and", reflected=True)
    __or__ = pointwise.binary_method("bitwise_or")
    __ror__ = pointwise.binary_method("bitwise_or", reflected=True)
    __xor__ = pointwise.binary_method("bitwise_xor")
    __rxor__ = pointwise.binary_method("bitwise_xor", reflected=True)
    __neg__ = pointwise.unary_method("neg")
    __abs__ = pointwise.unary_method("abs")
    __invert__ = pointwise.unary_method("bitwise_not")
    def __iadd__(self, other): return pointwise.binary("add", self, other, out=self)
    def __isub__(self, other): return pointwise.binary("sub", self, other, out=self)
    def __imul__(self, other): return pointwise.binary("mul", self, other, out=self)
    def __itruediv__(self, other): return pointwise.binary("div", self, other, out=self)
    def __ifloordiv__(self, other): return pointwise.binary("floor_divide", self, other, out=self)
    def __imod__(self, other): return pointwise.binary("remainder", self, other, out=self)
    def __ipow__(self, other): return pointwise.power(self, other, out=self)
    def __iand__(self, other): return pointwise.binary("bitwise_and", self, other, out=self)
    def __ior__(self, other): return pointwise.binary("bitwise_or", self, other, out=self)
    def __ixor__(self, other): return pointwise.binary("bitwise_xor", self, other, out=self)

    # Comparisons with a number or a tensor are elementwise; with anything else they are NotImplemented (so
    # `t == None` is False, as in torch), decided on the first, checked call of each signature.
    __eq__ = pointwise.binary_method("eq", comparison=True)
    __ne__ = pointwise.binary_method("ne", comparison=True)
    __lt__ = pointwise.binary_method("lt", comparison=True)
    __le__ = pointwise.binary_method("le", comparison=True)
    __gt__ = pointwise.binary_method("gt", comparison=True)
    __ge__ = pointwise.binary_method("ge", comparison=True)
    __hash__ = object.__hash__  # by identity, as torch: __eq__ is elementwise

    # random numbers (random.py): bound as methods, so t.uniform_() is one call
    uniform_ = random.uniform_
    normal_ = random.normal_
    bernoulli = random.bernoulli
    bernoulli_ = random.bernoulli_
    random_ = random.random_

    # reductions and comparisons (reductions.py): bound as methods, so t.sum(dim) is one call
    sum = reductions.sum
    mean = reductions.mean
    max = reductions.max
    min = reductions.min
    all = reductions.all
    any = reductions.any
    equal = reductions.equal
    isclose = reductions.isclose
    allclose = reductions.allclose


def _add_pointwise_methods():
    """Methods that are a named op and its in-place form (`t.mul(u)`, `t.mul_(u)`)."""
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

    for name in pointwise.BINARY_METHODS:
        setattr(Tensor, name, binary_method(name, False))
        setattr(Tensor, name + "_", binary_method(name, True))
    for name in pointwise.UNARY_METHODS:
        setattr(Tensor, name, unary_method(name, False))
        setattr(Tensor, name + "_", unary_method(name, True))
    for alias, name in pointwise.ALIASES.items():
        setattr(Tensor, alias, getattr(Tensor, name))
        setattr(Tensor, alias + "_", getattr(Tensor, name + "_"))


_add_pointwise_methods()
fields.register(Tensor, UntypedStorage)


class Size(tuple):
    """torch.Size: a tuple of ints with a torch-like repr."""

    def __repr__(self):
        return f"minitensor.Size({list(self)})"

    def numel(self):
        return math.prod(self)


def _parse_to(args, kwargs):
    """Tensor.to's overloads: to(dtype), to(device[, dtype]), to(tensor), and the keywords."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    copy = kwargs.pop("copy", False)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    args = list(args)
    if args and isinstance(args[0], Tensor):
        other = args.pop(0)
        device, dtype = other.device, other.dtype
    elif args and not isinstance(args[0], dtypes.dtype):
        device = args.pop(0)
    if args and isinstance(args[0], dtypes.dtype):
        dtype = args.pop(0)
    if args and isinstance(args[0], bool):
        non_blocking = args.pop(0)
    if args and isinstance(args[0], bool):
        copy = args.pop(0)
    if args:
        raise TypeError(f"to() received an invalid combination of arguments: {args!r}")
    return device, dtype, non_blocking, copy
