"""Zero-copy exchange through the CUDA Array Interface (v3), both ways, and numpy's `__array__`. DLPack is in
dlpack.py, the protocols' stream numbers in streams.py.
"""
import numpy as np

from ..base import dtypes
from ..core import fields
from ..core.shapes import contiguous_strides, extent
from ..core.storage import UntypedStorage
from ..cuda.devices import cuda_device
from ..cuda.streams import current_stream_handle
from .streams import driver_stream, order_after, protocol_stream

# numpy's little-endian type codes; bfloat16 has none
_TYPESTR = {d: d.np.newbyteorder("<").str for d in dtypes.ALL if d is not dtypes.bfloat16}


# ---------------------------------------------------------------------------------------------- CUDA Array Interface
def cuda_array_interface(t):
    """Tensor.__cuda_array_interface__: version 3, with the stream the data was last used on (the
    current stream of its device), which the consumer must synchronise with."""
    if t.device.type != "cuda":
        raise AttributeError(f"Can't get __cuda_array_interface__ on non-CUDA tensor type: {t.type()} If CUDA "
                             "data is required use tensor.cuda() to copy tensor to device memory.")
    typestr = _TYPESTR.get(t.dtype)
    if typestr is None:
        raise TypeError(f"__cuda_array_interface__ has no type code for {t.dtype}: numpy has no bfloat16. "
                        "Use DLPack (which has one), or view the bits as int16 with t.view(minitensor.int16)")
    itemsize = t.dtype.itemsize
    return {
        "shape": tuple(t._shape),
        "typestr": typestr,
        "data": (t.data_ptr() if t.numel() else 0, False),
        "strides": None if t.is_contiguous() else tuple(s * itemsize for s in t._stride),
        "version": 3,
        "stream": protocol_stream(current_stream_handle(t.device.index)),
    }


def from_cuda_array_interface(obj, desc):
    """A cuda tensor over the memory `desc` (obj's __cuda_array_interface__) describes, with no copy.

    The pointer is taken to be on the current device, the one whose context is current, as the protocol
    assumes. `obj` is kept alive as long as the storage; the current stream waits for desc's stream.
    """
    version = desc.get("version")
    if version not in (0, 1, 2, 3):
        raise BufferError(f"__cuda_array_interface__ version {version!r} is not supported (expected 0 to 3)")
    if desc.get("mask") is not None:
        raise BufferError("__cuda_array_interface__ with a mask is not supported: minitensor has no masked "
                          "tensors")
    dtype = _dtype_of_typestr(desc["typestr"])
    shape = tuple(int(n) for n in desc["shape"])
    ptr, readonly = desc["data"]
    if readonly:
        raise BufferError("__cuda_array_interface__ describes read-only memory, and minitensor cannot keep a cuda "
                          "tensor read-only: copy the array first (e.g. obj.copy()) to get writable memory")
    strides = desc.get("strides")
    stride = contiguous_strides(shape) if strides is None else _element_strides(strides, dtype.itemsize)
    if len(stride) != len(shape):
        raise BufferError(f"__cuda_array_interface__ has {len(shape)} dims in shape {shape} but "
                          f"{len(stride)} in strides {tuple(strides)}")
    device = cuda_device()
    stream = desc.get("stream") if version >= 3 else None
    if stream is not None:
        order_after(driver_stream(int(stream)), current_stream_handle(device.index), device)
    storage = UntypedStorage._from_external(ptr or 0, extent(shape, stride) * dtype.itemsize, device, obj)
    return fields.tensor(storage, shape, stride, 0, dtype)


def is_void(typestr):
    return isinstance(typestr, str) and typestr[1:2] == "V"


def _dtype_of_typestr(typestr):
    try:
        np_dtype = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"__cuda_array_interface__ typestr {typestr!r} is not a numpy type code") from None
    if not np_dtype.isnative:
        raise TypeError(f"__cuda_array_interface__ typestr {typestr!r} is big-endian; cuda memory is little-endian")
    return dtypes.from_numpy(np_dtype)


def _element_strides(byte_strides, itemsize):
    """Byte strides as element strides, refusing what a minitensor view cannot express."""
    byte_strides = tuple(int(s) for s in byte_strides)
    if any(s < 0 for s in byte_strides):
        raise BufferError(f"strides {byte_strides} contain a negative stride, and tensors with negative strides "
                          "are not supported: copy the array first")
    if any(s % itemsize for s in byte_strides):
        raise BufferError(f"strides {byte_strides} (bytes) are not multiples of the element size {itemsize}")
    return tuple(s // itemsize for s in byte_strides)


# ---------------------------------------------------------------------------------------------- numpy
def to_numpy_array(t, dtype=None, copy=None):
    """Tensor.__array__ with numpy 2's copy keyword: None copies only for a dtype change, False never."""
    array = t.numpy()
    if dtype is not None and np.dtype(dtype) != array.dtype:
        if copy is False:
            raise ValueError(f"Unable to avoid copy while creating an array as requested: {t.dtype} tensor "
                             f"asked for as {np.dtype(dtype)}")
        return array.astype(dtype)
    return array.copy() if copy else array
