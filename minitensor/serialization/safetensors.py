"""`mt.save_safetensors` / `mt.load_safetensors`: the safetensors format, which holds only tensors.

Layout: a little-endian u64 N, N bytes of JSON header, then the data buffer. The header maps each name to
`{"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}` (offsets into the buffer, end
exclusive), plus an optional `"__metadata__"` of string to string. Tensors are stored row-major and
little-endian, one after another with no gaps.

The writer lays a file out as the reference writer does (sorted by dtype alignment, largest first, then
by name; header padded with spaces to a multiple of 8), so its files are byte for byte those of the
`safetensors` package. The reader makes every check the reference reader makes and reports the failing
one by its name there (HeaderTooLarge, MetadataIncompleteBuffer, ...).
"""
import json
import os
import struct

import numpy as np

from ..base import dtypes
from ..base.atomicfile import atomic_write
from ..core.host_arrays import numpy_view
from ..core.shapes import contiguous_strides
from ..core.storage import UntypedStorage
from ..cuda.devices import as_device
from ..tensor import Tensor
from .limits import MAX_DIMS, shape_problem

MAX_HEADER_SIZE = 100_000_000
_U64_MAX = 2**64 - 1

# every dtype of the format, in the reference's order (increasing alignment), with its size in bytes
_FORMAT_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2,
                  "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8}
_RANK = {name: i for i, name in enumerate(_FORMAT_DTYPES)}
_NAMES = {dtypes.bool_: "BOOL", dtypes.uint8: "U8", dtypes.int8: "I8", dtypes.int16: "I16",
          dtypes.float16: "F16", dtypes.bfloat16: "BF16", dtypes.int32: "I32", dtypes.float32: "F32",
          dtypes.float64: "F64", dtypes.int64: "I64", dtypes.uint16: "U16", dtypes.uint32: "U32",
          dtypes.uint64: "U64", dtypes.complex64: "C64"}  # complex128 has no name in the format
_DTYPES = {name: d for d, name in _NAMES.items()}


class SafetensorError(RuntimeError):
    """A file minitensor cannot load as safetensors. Format errors start with the name the reference
    reader gives them (HeaderTooLarge, ...)."""


def save_safetensors(tensors: dict, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """Write a dict of name -> tensor to `path`, as mt.save writes a path (base/atomicfile.py): a regular file
    through a temporary renamed at the end, keeping the old file's mode and owner; a FIFO or device in place."""
    if not isinstance(tensors, dict):
        raise TypeError(f"save_safetensors expects a dict of str -> Tensor, got {type(tensors).__name__}")
    for name, t in tensors.items():
        if not isinstance(name, str) or not isinstance(t, Tensor):
            raise TypeError(f"save_safetensors expects a dict of str -> Tensor, got an item {name!r}: "
                            f"{type(t).__name__}")
        if name == "__metadata__":
            raise ValueError("'__metadata__' is reserved for the header's metadata; rename that tensor")
        if t.dtype not in _NAMES:
            raise TypeError(f"save_safetensors: tensor {name!r} is {t.dtype}, which the safetensors format has no "
                            f"name for (its complex type is complex64, C64)")
    if metadata is not None and not (isinstance(metadata, dict) and
                                     all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise TypeError("save_safetensors: metadata must be a dict of str -> str")
    order = sorted(tensors, key=lambda name: (-_RANK[_NAMES[tensors[name].dtype]], name))
    header = {} if metadata is None else {"__metadata__": metadata}
    offset = 0
    for name in order:
        t = tensors[name]
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t._shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with atomic_write(path) as file:
        file.write(struct.pack("<Q", len(text)))
        file.write(text)
        for name in order:
            file.write(_host_bytes(tensors[name]))


def _host_bytes(t):
    """The tensor's elements, row-major, as bytes on the host."""
    host = t.cpu() if t.device.type != "cpu" else t.contiguous()  # cpu() of a cuda tensor is contiguous
    return numpy_view(host).reshape(-1).view(np.uint8).data


def load_safetensors(path, device="cpu"):
    """A dict of name -> tensor from a safetensors file, in the file's order, on `device`."""
    device = as_device(device)
    with open(path, "rb") as file:
        size = file.seek(0, os.SEEK_END)
        file.seek(0)
        header_size, entries = _read_header(file, size)
        result = {}
        for name, dtype_name, shape, begin, end in entries:
            dtype = _DTYPES.get(dtype_name)
            if dtype is None:
                raise SafetensorError(f"tensor {_short(name)} has dtype {dtype_name}, which minitensor does not have")
            problem = shape_problem(shape, dtype.itemsize)
            if problem:
                raise SafetensorError(f"tensor {_short(name)}: {problem}")
            array = np.empty(end - begin, np.uint8)
            file.seek(8 + header_size + begin)
            view = memoryview(array)
            while view:
                n = file.readinto(view)
                if not n:
                    raise SafetensorError(f"MetadataIncompleteBuffer: tensor {_short(name)} is cut short by the end of "
                                          "the file")
                view = view[n:]
            t = Tensor(UntypedStorage._from_array(array), shape, contiguous_strides(shape), 0, dtype)
            result[name] = t if device.type == "cpu" else t.to(device)
    return result


def _read_header(file, size):
    """(header size, [(name, dtype name, shape, begin, end)] sorted by offset), checked against the file."""
    if size < 8:
        raise SafetensorError(f"HeaderTooSmall: the file has {size} bytes; it needs at least 8 for the header size")
    (n,) = struct.unpack("<Q", file.read(8))
    if n > MAX_HEADER_SIZE:
        raise SafetensorError(f"HeaderTooLarge: the header claims {n} bytes; at most {MAX_HEADER_SIZE} are allowed")
    if 8 + n > size:
        raise SafetensorError(f"InvalidHeaderLength: the header claims {n} bytes but the file has only "
                              f"{size - 8} after the size")
    raw = file.read(n)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorError(f"InvalidHeader: the header is not valid UTF-8 ({exc})") from None
    try:
        header = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise SafetensorError(f"InvalidHeaderDeserialization: the header is not valid JSON ({exc})") from None
    tensors = _parse_header(header)
    tensors.sort(key=lambda t: (t[3], t[4]))
    start = 0
    for name, dtype_name, shape, begin, end in tensors:
        if begin != start or end < begin:
            raise SafetensorError(f"InvalidOffset: tensor {_short(name)} has data_offsets [{begin}, {end}]; the next "
                                  f"tensor must start at {start}, where the previous one ends, with no gap or overlap")
        start = end
        nbytes = _checked_nbytes(shape, _FORMAT_DTYPES[dtype_name])
        if nbytes is None:
            raise SafetensorError(f"ValidationOverflow: tensor {_short(name)} of shape {list(shape)} overflows 64 bits")
        if end - begin != nbytes:
            raise SafetensorError(f"TensorInvalidInfo: tensor {_short(name)} ({dtype_name}, shape {list(shape)}) needs "
                                  f"{nbytes} bytes but its data_offsets span {end - begin}")
    if 8 + n + start != size:
        raise SafetensorError(f"MetadataIncompleteBuffer: the tensors cover {start} bytes of data but the file "
                              f"holds {size - 8 - n}")
    return n, tensors


def _checked_nbytes(shape, itemsize):
    """The tensor's byte size, or None where the reference's checked u64 product (left to right, then times the
    item size) overflows: [2**63, 2**63, 0] overflows before it reaches the 0."""
    n = 1
    for dim in (*shape, itemsize):
        n *= dim
        if n > _U64_MAX:
            return None
    return n


def _parse_header(header):
    """Check the JSON's structure as the reference's deserialiser does; the tensor entries."""
    def bad(what):
        return SafetensorError(f"InvalidHeaderDeserialization: {what}")

    if not isinstance(header, dict):
        raise bad(f"the header must be a JSON object, got {type(header).__name__}")
    metadata = header.get("__metadata__")
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise bad("__metadata__ must map strings to strings")
    tensors = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise bad(f"tensor {_short(name)} needs 'dtype', 'shape' and 'data_offsets'")
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if type(dtype_name) is not str or dtype_name not in _FORMAT_DTYPES:
            raise bad(f"tensor {_short(name)} has unknown dtype {_short(dtype_name)}")
        if not isinstance(shape, list) or not all(_is_u64(s) for s in shape):
            raise bad(f"tensor {_short(name)} has shape {_short(shape)}; it must be a list of non-negative integers")
        if len(shape) > MAX_DIMS:  # minitensor's limit, checked before the shape is multiplied out
            raise SafetensorError(f"tensor {_short(name)}: {shape_problem(shape, 1)}")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_u64(o) for o in offsets)):
            raise bad(f"tensor {_short(name)} has data_offsets {_short(offsets)}; they must be two non-negative "
                      "integers")
        tensors.append((name, dtype_name, tuple(shape), offsets[0], offsets[1]))
    return tensors


def _short(value):
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_u64(value):
    return type(value) is int and 0 <= value <= _U64_MAX
