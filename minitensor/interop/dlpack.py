"""DLPack: `Tensor.__dlpack__`/`__dlpack_device__` (export) and `from_dlpack` (import), with no copy.

The C structs and the PyCapsule calls go through ctypes. A capsule is named "dltensor" (legacy) or
"dltensor_versioned" (DLPack 1.x, which adds flags such as read-only); the consumer renames it "used_..."
and from then on owns the producer's deleter, which it calls exactly once, when the last tensor over the
memory dies. A capsule nobody consumed calls the deleter from its own destructor.
"""
import ctypes
import enum
import math
import os

import numpy as np

from ..base import cext, dtypes
from ..base.device import CPU
from ..core import fields
from ..core.shapes import contiguous_strides
from ..core.storage import UntypedStorage
from ..cuda.devices import cuda_device
from ..cuda.streams import current_stream_handle
from .checks import check_address, described_nbytes, device_of_memory
from .streams import driver_stream, order_after, protocol_stream


class DLDeviceType(enum.IntEnum):
    kDLCPU = 1
    kDLCUDA = 2
    kDLCUDAHost = 3  # pinned host memory: CPU-addressable


class DLDataTypeCode(enum.IntEnum):
    kDLInt = 0
    kDLUInt = 1
    kDLFloat = 2
    kDLBfloat = 4
    kDLComplex = 5
    kDLBool = 6


DLPACK_VERSION = (1, 0)
MAX_NDIM = 64  # numpy 2's limit: more is a broken producer, whose shape array would be read past its end
FLAG_READ_ONLY = 1 << 0
FLAG_IS_COPIED = 1 << 1

_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # void (*)(DLManagedTensor[Versioned] *)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


_CODES = {
    dtypes.bool_: (DLDataTypeCode.kDLBool, 8),
    dtypes.uint8: (DLDataTypeCode.kDLUInt, 8),
    dtypes.int8: (DLDataTypeCode.kDLInt, 8),
    dtypes.int16: (DLDataTypeCode.kDLInt, 16),
    dtypes.int32: (DLDataTypeCode.kDLInt, 32),
    dtypes.int64: (DLDataTypeCode.kDLInt, 64),
    dtypes.float16: (DLDataTypeCode.kDLFloat, 16),
    dtypes.bfloat16: (DLDataTypeCode.kDLBfloat, 16),
    dtypes.float32: (DLDataTypeCode.kDLFloat, 32),
    dtypes.float64: (DLDataTypeCode.kDLFloat, 64),
    dtypes.uint16: (DLDataTypeCode.kDLUInt, 16),
    dtypes.uint32: (DLDataTypeCode.kDLUInt, 32),
    dtypes.uint64: (DLDataTypeCode.kDLUInt, 64),
    dtypes.complex64: (DLDataTypeCode.kDLComplex, 64),
    dtypes.complex128: (DLDataTypeCode.kDLComplex, 128),
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}

# ---------------------------------------------------------------------------------------------- PyCapsule C API
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"
_USED = {_LEGACY: b"used_dltensor", _VERSIONED: b"used_dltensor_versioned"}
_STRUCTS = {_LEGACY: DLManagedTensor, _VERSIONED: DLManagedTensorVersioned}
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)  # gets the dying capsule as a raw PyObject *


def _pythonapi(name, restype, *argtypes):
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _pythonapi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_capsule_is_valid = _pythonapi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_get_pointer = _pythonapi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_capsule_get_name = _pythonapi("PyCapsule_GetName", ctypes.c_char_p, ctypes.py_object)
_capsule_set_name = _pythonapi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# Inside a capsule destructor the capsule's refcount is 0: only raw pointers, never py_object, may touch it.
_raw_is_valid = _pythonapi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_raw_get_pointer = _pythonapi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)
_err_occurred = _pythonapi("PyErr_Occurred", ctypes.c_void_p)  # a pythonapi call raises a pending exception


def capsule_destructor():
    """The address of the capsules' destructor: the C one (_dlpack_capsule.c), built on first use; without a C
    compiler, the ctypes callback below."""
    global _destructor
    if _destructor is None:
        try:
            _destructor = cext.load(_DESTRUCTOR_SOURCE, "_minitensor_dlpack_capsule").destructor_address()
        except RuntimeError:  # no compiler
            _destructor = ctypes.cast(_destroy_capsule_c, ctypes.c_void_p).value
    return _destructor


def _destroy_capsule(capsule, structs=_STRUCTS, is_valid=_raw_is_valid, get_pointer=_raw_get_pointer,
                     err_occurred=_err_occurred):
    """The destructor without a C compiler: a capsule that was never consumed still owns its tensor, so run
    the deleter. (The defaults keep what it needs at interpreter shutdown.)

    A C consumer may drop the capsule with its own exception pending (numpy refusing a cuda tensor does).
    Python code cannot run, nor return, with an exception pending, and a ctypes callback cannot hand one
    back: the exception is taken up first and raised again last, so that ctypes prints it as unraisable.
    The consumer then fails with a SystemError, its reason printed rather than lost, and nothing leaks.
    The C destructor hands the exception back instead.
    """
    pending = None
    try:
        err_occurred()
    except BaseException as e:
        pending = e
    for name, struct in structs.items():
        if is_valid(capsule, name):
            ptr = get_pointer(capsule, name)
            deleter = struct.from_address(ptr).deleter
            if deleter:
                deleter(ptr)
            break
    if pending is not None:
        raise pending


_destroy_capsule_c = _CAPSULE_DESTRUCTOR(_destroy_capsule)
_DESTRUCTOR_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dlpack_capsule.c")
_destructor = None  # see capsule_destructor()

# ---------------------------------------------------------------------------------------------- export
_exported = {}  # address of an exported DLManagedTensor[Versioned] -> what must live until its deleter runs


def _release(ptr, exported=_exported):
    """The deleter of minitensor's capsules: lets the tensor (and its memory) go."""
    exported.pop(ptr, None)


_release_c = _DELETER(_release)


def dlpack_device(t):
    """Tensor.__dlpack_device__: (kDLCUDA, index) for cuda, (kDLCPU, 0) for CPU (kDLCUDAHost when pinned,
    as torch reports it)."""
    if t.device.type == "cuda":
        return DLDeviceType.kDLCUDA, t.device.index
    return (DLDeviceType.kDLCUDAHost if t.is_pinned() else DLDeviceType.kDLCPU), 0


def to_dlpack(t, stream=None, max_version=None, dl_device=None, copy=None):
    """Tensor.__dlpack__: a capsule over t's memory (or over a copy: `copy=True`, or a `dl_device` other
    than t's). Versioned when the consumer takes max_version >= (1, 0), legacy otherwise.

    `stream` is the consumer's stream on a cuda tensor's device: None or 1 the legacy default stream, 2 the
    per-thread default stream, -1 no synchronisation; the consumer's stream is made to wait for the work
    queued so far on the current stream.
    """
    if stream is not None and type(stream) is not int:
        raise TypeError(f"stream must be ``int`` or ``none``, got {type(stream).__name__}")
    versioned = max_version is not None and max_version[0] >= 1
    target = t.device if dl_device is None else _device_of(tuple(dl_device))
    copied = copy is True or target != t.device
    if copied:
        if copy is False:
            raise BufferError(f"__dlpack__: exporting a {t.device} tensor to {target} needs a copy, and copy=False "
                              "forbids it")
        t = t.clone() if target == t.device else t.to(target)
    if t.device.type == "cuda" and stream != -1:
        index = t.device.index
        order_after(current_stream_handle(index), driver_stream(1 if stream is None else stream), t.device)
    read_only = _is_read_only(t._storage)
    if read_only and not versioned:
        raise BufferError("Cannot export a read-only tensor through a legacy DLPack capsule, which cannot say it "
                          "is read-only: ask for max_version >= (1, 0), or copy the tensor first")
    return _capsule(t, versioned, (FLAG_READ_ONLY if read_only else 0) | (FLAG_IS_COPIED if copied else 0))


def _capsule(t, versioned, flags):
    ndim = len(t._shape)
    shape = (ctypes.c_int64 * ndim)(*t._shape)
    strides = (ctypes.c_int64 * ndim)(*t._stride)
    device_type, device_id = dlpack_device(t)
    code, bits = _CODES[t.dtype]
    dl_tensor = DLTensor(data=t.data_ptr() or None, device=DLDevice(device_type, device_id), ndim=ndim,
                         dtype=DLDataType(code, bits, 1), shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)),
                         strides=ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64)), byte_offset=0)
    if versioned:
        managed = DLManagedTensorVersioned(version=DLPackVersion(*DLPACK_VERSION), manager_ctx=None,
                                           deleter=_release_c, flags=flags, dl_tensor=dl_tensor)
    else:
        managed = DLManagedTensor(dl_tensor=dl_tensor, manager_ctx=None, deleter=_release_c)
    ptr = ctypes.addressof(managed)
    _exported[ptr] = (managed, shape, strides, t)
    return _capsule_new(ptr, _VERSIONED if versioned else _LEGACY, capsule_destructor())


def _device_of(dl_device):
    device_type, device_id = dl_device
    if device_type in (DLDeviceType.kDLCPU, DLDeviceType.kDLCUDAHost):
        return CPU
    if device_type == DLDeviceType.kDLCUDA:
        return cuda_device(int(device_id))
    raise BufferError(f"DLPack device type {device_type} is not supported: minitensor has kDLCPU (1), kDLCUDA (2) "
                      "and kDLCUDAHost (3)")


def _is_read_only(storage):
    return storage._array is not None and not storage._array.flags.writeable


# ---------------------------------------------------------------------------------------------- import
def from_dlpack(obj):
    """mt.from_dlpack: a tensor sharing the memory of `obj` (any object with __dlpack__, or a capsule).

    The producer is asked for a versioned capsule and the current stream of its device, as the protocol
    says (1 for the legacy default stream); producers too old for max_version get a second, legacy call.
    """
    if type(obj).__name__ == "PyCapsule":
        return _from_capsule(obj)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"from_dlpack expects an object with __dlpack__ or a DLPack capsule, got "
                        f"{type(obj).__name__}")
    device = _device_of(tuple(obj.__dlpack_device__()))
    kwargs = {"max_version": DLPACK_VERSION}
    if device.type == "cuda":
        kwargs["stream"] = protocol_stream(current_stream_handle(device.index))
    try:
        capsule = obj.__dlpack__(**kwargs)
    except TypeError:  # a producer from before DLPack 1.0
        del kwargs["max_version"]
        capsule = obj.__dlpack__(**kwargs)
    return _from_capsule(capsule)


class _Consumed:
    """Owns a consumed capsule's tensor: the storage over its memory keeps this alive, and when both go
    the producer's deleter runs, once."""

    __slots__ = ("ptr", "deleter")

    def __init__(self, ptr, deleter):
        self.ptr = ptr
        self.deleter = deleter

    def __del__(self):
        if self.deleter:
            self.deleter(self.ptr)


def _from_capsule(capsule):
    name = next((n for n in _STRUCTS if _capsule_is_valid(capsule, n)), None)
    if name is None:
        found = _capsule_get_name(capsule)
        if found in _USED.values():
            raise BufferError("this DLPack capsule was already consumed: a capsule can be consumed only once")
        raise BufferError(f"expected a DLPack capsule named 'dltensor' or 'dltensor_versioned', got {found!r}")
    ptr = _capsule_get_pointer(capsule, name)
    managed = _STRUCTS[name].from_address(ptr)
    flags = 0
    if name == _VERSIONED:
        if managed.version.major != DLPACK_VERSION[0]:
            raise BufferError(f"DLPack {managed.version.major}.{managed.version.minor} is not supported: "
                              f"minitensor reads DLPack {DLPACK_VERSION[0]}.x")
        flags = managed.flags
    dl = managed.dl_tensor
    device = _device_of((dl.device.device_type, dl.device.device_id))
    if flags & FLAG_READ_ONLY and device.type == "cuda":
        raise BufferError("the DLPack tensor is read-only, and minitensor cannot keep a cuda tensor read-only: "
                          "export a copy (copy=True) instead")
    dtype = _dtype_of(dl.dtype)
    shape, stride, data, nbytes = _checked_layout(dl, dtype, device)
    owner = _Consumed(ptr, managed.deleter)
    _capsule_set_name(capsule, _USED[name])  # from here on, `owner` runs the deleter
    if device.type == "cuda":
        storage = UntypedStorage._from_external(data, nbytes, device, owner)
    else:
        raw = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(data), np.uint8) if nbytes else \
            np.empty(0, np.uint8)
        raw.flags.writeable = not (flags & FLAG_READ_ONLY)
        storage = UntypedStorage._from_array(raw, owner)
    return fields.tensor(storage, shape, stride, 0, dtype)


def _checked_layout(dl, dtype, device):
    """(shape, stride, data pointer, nbytes) of a DLTensor, refused with BufferError (and the capsule left
    unconsumed) when its numbers describe no memory a tensor may use (checks.py): reading `ndim` entries of
    `shape` is all the trust a C struct gets."""
    if not 0 <= dl.ndim <= MAX_NDIM:
        raise BufferError(f"the DLPack tensor has ndim {dl.ndim}: expected 0 to {MAX_NDIM}")
    if dl.ndim and not dl.shape:
        raise BufferError(f"the DLPack tensor has a null shape for ndim {dl.ndim}")
    shape = tuple(dl.shape[i] for i in range(dl.ndim))
    stride = tuple(dl.strides[i] for i in range(dl.ndim)) if dl.strides else contiguous_strides(shape)
    if any(s < 0 for s in stride):
        raise BufferError(f"the DLPack tensor has strides {stride}, and tensors with negative strides are not "
                          "supported: copy it first")
    nbytes = described_nbytes(shape, stride, dtype.itemsize, "the DLPack tensor")
    data = (dl.data or 0) + dl.byte_offset
    check_address(data, nbytes, math.prod(shape), "the DLPack tensor")
    if device.type == "cuda" and nbytes:
        index = device_of_memory(data, nbytes, "the DLPack tensor")
        if index not in (None, device.index):
            raise BufferError(f"the DLPack tensor says it is on {device}, but its memory at {data:#x} is "
                              f"cuda:{index}'s")
    return shape, stride, data, nbytes


def _dtype_of(dl_dtype):
    dtype = _DTYPES.get((dl_dtype.code, dl_dtype.bits)) if dl_dtype.lanes == 1 else None
    if dtype is None:
        try:
            kind = DLDataTypeCode(dl_dtype.code).name
        except ValueError:
            kind = f"code {dl_dtype.code}"
        raise TypeError(f"DLPack dtype ({kind}, bits={dl_dtype.bits}, lanes={dl_dtype.lanes}) is not supported: "
                        f"minitensor has {', '.join(d.name for d in _CODES)}, one lane each")
    return dtype
