"""Complex tensors as views of their component floats, as torch has them: `view_as_real` (a trailing dim of 2),
`view_as_complex`, `real` and `imag` (strided views, no copy), and `conj`.

A complex element is two floats of its dtype's `component` type, (real, imag), so the float view of a complex
tensor doubles its strides and offset and adds a last dim of 2 with stride 1. Reductions of complex tensors
reduce this view (ops/reductions.py).
"""
from ..base import dtypes
from ..core import fields
from . import pointwise


def _complex_input(x, function):
    if not isinstance(x, fields.TensorFields):
        raise TypeError(f"{function}(): argument 'input' must be Tensor, not {type(x).__name__}")
    return x.dtype.is_complex


def view_as_real(input):
    """The complex tensor's floats: shape + (2,), (real, imag) along the new last dim; shares its memory."""
    if not _complex_input(input, "view_as_real"):
        raise RuntimeError("view_as_real is only supported for complex tensors")
    return fields.tensor(input._storage, input._shape + (2,), tuple(2 * s for s in input._stride) + (1,),
                         2 * input._offset, input.dtype.component)


def view_as_complex(input):
    """A float32 or float64 tensor whose last dim is (real, imag) pairs as a complex tensor over the same
    memory, with torch's checks of the layout."""
    if not isinstance(input, fields.TensorFields):
        raise TypeError(f"view_as_complex(): argument 'input' must be Tensor, not {type(input).__name__}")
    if input.dtype not in (dtypes.float32, dtypes.float64):
        if input.dtype is dtypes.float16:
            raise RuntimeError("view_as_complex of a float16 tensor would be complex32 (torch's ComplexHalf), "
                               "which minitensor does not have: convert it to float32 first")
        raise RuntimeError(f"view_as_complex is only supported for half, float and double tensors, but got a "
                           f"tensor of scalar type: {dtypes.TORCH_NAMES[input.dtype.name]}")
    if input.dim() == 0:
        raise RuntimeError("Input tensor must have one or more dimensions")
    if input._shape[-1] != 2:
        raise RuntimeError("Tensor must have a last dimension of size 2")
    if input._stride[-1] != 1:
        raise RuntimeError("Tensor must have a last dimension with stride 1")
    if any(s % 2 for s in input._stride[:-1]):
        raise RuntimeError("Tensor must have a stride divisible by 2 for all but last dimension")
    if input._offset % 2:
        raise RuntimeError("Tensor must have a storage_offset divisible by 2")
    return fields.tensor(input._storage, input._shape[:-1], tuple(s // 2 for s in input._stride[:-1]),
                         input._offset // 2, input.dtype.to_complex())


def real(input):
    """The real parts of a complex tensor as a float view (a real tensor: itself, as in torch)."""
    if not _complex_input(input, "real"):
        return input
    return fields.tensor(input._storage, input._shape, tuple(2 * s for s in input._stride), 2 * input._offset,
                         input.dtype.component)


def imag(input):
    """The imaginary parts of a complex tensor as a float view."""
    if not _complex_input(input, "imag"):
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return fields.tensor(input._storage, input._shape, tuple(2 * s for s in input._stride), 2 * input._offset + 1,
                         input.dtype.component)


def conj(input):
    """The complex conjugate: a new tensor (torch returns a lazily conjugated view; minitensor has no conjugate
    bit, so the values are computed at once). A real tensor is its own conjugate: itself."""
    if not _complex_input(input, "conj"):
        return input
    return pointwise.unary("conj", input)


def is_complex(input):
    """Whether the tensor's dtype is complex64 or complex128."""
    _complex_input(input, "is_complex")
    return input.dtype.is_complex


def gather_pairs(gather, input, dim, index):
    """`gather(input, dim, index)` of a complex128 tensor, whose 16-byte elements the index kernels do not move, as
    the gather of its float pairs (`dim` >= 0)."""
    if input.dim() == 0:
        return gather_pairs(gather, input.unsqueeze(0), 0, index.reshape(-1)).reshape(index._shape)
    pairs = index.unsqueeze(-1).expand(*index._shape, 2)
    return view_as_complex(gather(view_as_real(input), dim, pairs))


def index_select_pairs(index_select, input, dim, index):
    """`index_select(input, dim, index)` of a complex128 tensor as that of its float pairs (`dim` >= 0)."""
    if input.dim() == 0:
        return index_select_pairs(index_select, input.unsqueeze(0), 0, index).reshape(())
    return view_as_complex(index_select(view_as_real(input), dim, index))
