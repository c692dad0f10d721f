"""Zero-copy exchange through the CUDA Array Interface (v3), both ways, and numpy's `__array__`. DLPack is in
dlpack.py, the protocols' stream numbers in streams.py.
"""
import math
import operator

import numpy as np

from ..base import dtypes
from ..core import fields
from ..core.shapes import contiguous_strides, int_tuple
from ..core.storage import UntypedStorage
from ..cuda.devices import cuda_device
from ..cuda.streams import current_stream_handle
from .checks import check_address, described_nbytes, device_of_memory
from .streams import driver_stream, order_after, protocol_stream

_CAI = "__cuda_array_interface__"

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

    The memory must lie inside one allocation the driver knows (checks.py); the tensor is on the device that
    holds it, as in torch (the current device for pinned host memory and empty arrays). `obj` is kept alive
    as long as the storage; that device's current stream waits for desc's stream.
    """
    missing = next((key for key in ("shape", "typestr", "data") if key not in desc), None)
    if missing is not None:
        raise BufferError(f"{_CAI} has no '{missing}'")
    version = desc.get("version")
    if version not in (0, 1, 2, 3):
        raise BufferError(f"{_CAI} version {version!r} is not supported (expected 0 to 3)")
    if desc.get("mask") is not None:
        raise BufferError(f"{_CAI} with a mask is not supported: minitensor has no masked tensors")
    dtype = _dtype_of_typestr(desc["typestr"])
    shape = int_tuple(desc["shape"], f"{_CAI} shape")
    ptr, readonly = _data(desc["data"])
    if readonly:
        raise BufferError(f"{_CAI} describes read-only memory, and minitensor cannot keep a cuda tensor read-only: "
                          "copy the array first (e.g. obj.copy()) to get writable memory")
    strides = desc.get("strides")
    stride = contiguous_strides(shape) if strides is None else _element_strides(strides, dtype.itemsize)
    if len(stride) != len(shape):
        raise BufferError(f"{_CAI} has {len(shape)} dims in shape {shape} but {len(stride)} in strides "
                          f"{tuple(strides)}")
    nbytes = described_nbytes(shape, stride, dtype.itemsize, _CAI)
    check_address(ptr, nbytes, math.prod(shape), _CAI)
    index = device_of_memory(ptr, nbytes, _CAI) if nbytes else None
    device = cuda_device(index)
    stream = desc.get("stream") if version >= 3 else None
    if stream is not None:
        order_after(driver_stream(int(stream)), current_stream_handle(device.index), device)
    storage = UntypedStorage._from_external(ptr, nbytes, device, obj)
    return fields.tensor(storage, shape, stride, 0, dtype)


def _data(data):
    """The (pointer, read_only) pair of a CAI's 'data', the pointer an int."""
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"{_CAI} 'data' must be a (pointer, read_only) pair, not {type(data).__name__}")
    ptr, readonly = data
    if ptr is None:
        ptr = 0
    if isinstance(ptr, bool) or not hasattr(type(ptr), "__index__"):
        raise TypeError(f"{_CAI} data pointer must be an int, not {type(ptr).__name__}")
    return operator.index(ptr), readonly


def is_void(typestr):
    return isinstance(typestr, str) and typestr[1:2] == "V"


def _dtype_of_typestr(typestr):
    if not isinstance(typestr, str):  # np.dtype(None) would be float64
        raise TypeError(f"{_CAI} typestr {typestr!r} is not a numpy type code")
    try:
        np_dtype = np.dtype(typestr)
    except TypeError:
        raise TypeError(f"{_CAI} typestr {typestr!r} is not a numpy type code") from None
    if not np_dtype.isnative:
        raise TypeError(f"{_CAI} typestr {typestr!r} is big-endian; cuda memory is little-endian")
    return dtypes.from_numpy(np_dtype)


def _element_strides(byte_strides, itemsize):
    """Byte strides as element strides, refusing what a minitensor view cannot express."""
    byte_strides = int_tuple(byte_strides, f"{_CAI} strides")
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
