"""`mt.save` and `mt.load`: checkpoints in torch's zip format, read and written without torch.

A checkpoint is a zip (`zipformat`) holding `data.pkl`, the pickled object in torch's vocabulary
(`torch_pickle` writes it, `unpickler` reads it), and one record `data/<key>` of raw bytes per storage.
`torch.load(f, weights_only=True)` reads what `save` writes, and `load` reads what `torch.save` writes.

Storage bytes move through two functions, `write_storage` and `read_storage`: a cuda storage is staged
through pinned host memory there, and only there.
"""
import ctypes
import io
import mmap as _mmap
import os
import sys
from typing import BinaryIO

import numpy as np

from ..base.atomicfile import atomic_write
from ..base.device import CPU, device as _device
from ..core.storage import UntypedStorage
from ..cuda import devices, staging
from ..cuda.device_errors import raise_pending
from ..cuda.devices import as_device
from ..cuda.streams import current_stream_handle
from . import torch_pickle
from .unpickler import loads
from .zipformat import ZipReader, ZipWriter


def save(obj: object, f: str | os.PathLike | BinaryIO) -> None:
    """Save `obj` (tensors, storages, and dicts, OrderedDicts, lists, tuples and sets of them and of plain
    values) to `f`, a path or a binary file object, as torch.save does.

    Views keep sharing their storage; each storage is written once, whole. A path naming a regular file (or
    none yet) is written through a temporary file in the same folder, renamed at the end, so a failed save
    leaves no partial file under the name and a file already there is kept until the new one is complete; the
    new file keeps the old one's mode, owner and extended attributes. A FIFO, device or pipe is written into,
    as torch.save writes it (base/atomicfile.py).
    """
    data, storages = torch_pickle.dumps(obj)  # before any file is touched: unsupported objects fail here
    if isinstance(f, (str, os.PathLike)):
        with atomic_write(f) as file:
            _write_archive(file, _archive_name(os.fspath(f)), data, storages)
    else:
        _write_archive(f, "archive", data, storages)


def _archive_name(path):
    """The records' folder, as torch names it: the file's name without its last extension."""
    name = os.path.basename(path)
    name = name.rpartition(".")[0] if "." in name else name
    return name if name and name.isascii() else "archive"


def _write_archive(file, prefix, data, storages):
    writer = ZipWriter(file, prefix)
    writer.write_record("data.pkl", data)
    writer.write_record("byteorder", sys.byteorder.encode())
    for key, storage in storages:
        record = writer.record(f"data/{key}", storage.nbytes())
        write_storage(record, storage)
        record.close()
    writer.write_record("version", b"3\n")
    writer.write_record(".data/serialization_id", f"{int.from_bytes(os.urandom(16), 'little'):040d}".encode())
    writer.finish()


def write_storage(record, storage):
    """Write one storage's bytes to its record (`record.write(buffer)`, any number of times).

    A cuda storage goes through pinned chunks (cuda/staging.py): the device copies the next chunks while one is
    written, and no host copy of the whole storage is made."""
    if storage.device.type != "cuda" or not storage.nbytes():  # the CPU, or a registered type's (via the host)
        record.write(storage.cpu()._array)
        return
    index = storage.device.index
    with devices.device(index):  # staging works on the current device
        staging.device_to_consumer(storage.data_ptr(), storage.nbytes(), index, current_stream_handle(index),
                                   lambda offset, chunk, n: record.write((ctypes.c_char * n).from_address(chunk)))
        raise_pending(index)


def load(f, map_location=None, weights_only=True, mmap=False):
    """Load an object saved by `save` or by `torch.save` from `f`, a path or a binary file object.

    Only tensors, storages, containers and plain values are built; any other global in the file is refused
    with a pickle.UnpicklingError, whatever `weights_only` says (it is accepted for torch's signature).
    `map_location` (None, a device or its string, a dict of location tags, or a callable
    `fn(storage, tag)`) places each storage as torch.load does. With `mmap=True` (a path only) CPU
    storages view the file's pages instead of being read; writes to them stay private to this process.
    """
    restore = _restorer(map_location)
    if isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as file:
            return _load(file, restore, mapped=True, share_mapping=mmap)
    if mmap:
        raise ValueError("f must be a file path in order to use the mmap argument")
    if not (hasattr(f, "seekable") and f.seekable()):
        f = io.BytesIO(f.read())
    return _load(f, restore, mapped=False, share_mapping=False)


def _load(file, restore, mapped, share_mapping):
    reader = ZipReader(file)
    byteorder = reader.read("byteorder").decode("ascii", "replace") if "byteorder" in reader else "little"
    if byteorder not in ("little", "big"):
        raise RuntimeError(f"Unknown endianness type: {byteorder!r} (the byteorder record must be 'little' or 'big')")
    mapping = _map(file, required=share_mapping) if mapped else None

    def load_storage(key, location, dtype, numel):
        name = f"data/{key}"
        nbytes = numel * dtype.itemsize
        if reader.size(name) != nbytes:
            raise RuntimeError(f"invalid checkpoint file: storage {key!r} is {numel} elements of {dtype.name} "
                               f"({nbytes} bytes) but its record {reader.prefix}/{name} holds "
                               f"{reader.size(name)} bytes")
        swap = dtype if byteorder != sys.byteorder and dtype.itemsize > 1 else None
        return restore(lambda device: read_storage(reader, name, device, mapping, share_mapping, swap), location)

    return loads(reader.read("data.pkl"), load_storage)


def _map(file, required):
    """The file's pages, mapped private (copy-on-write); None for a file that cannot be mapped (a special
    file, some network filesystems) unless mmap=True asked for it."""
    try:
        return _mmap.mmap(file.fileno(), 0, access=_mmap.ACCESS_COPY)
    except (OSError, ValueError):
        if required:
            raise
        return None


def read_storage(reader, name, device, mapping=None, share_mapping=False, swap_dtype=None):
    """A storage on `device` holding record `name`.

    `mapping` is the file's mmap (private, copy-on-write) when loading from a path. A cuda storage is
    copied straight from its pages, through pinned chunks (cuda/staging.py), so reading the file overlaps
    the host-to-device copies; a CPU storage views them when `share_mapping` (load's mmap=True), and is
    otherwise read into new host memory, as is every storage of a file object."""
    offset, size = reader.span(name)
    if mapping is not None and (share_mapping or device.type == "cuda"):
        array = np.frombuffer(mapping, np.uint8, size, offset) if size else np.empty(0, np.uint8)
    else:
        array = np.empty(size, np.uint8)
        reader.readinto(name, array)
    if swap_dtype is not None:  # a big-endian file on a little-endian host, or the reverse
        array.view(swap_dtype.np).byteswap(inplace=True)
    storage = UntypedStorage._from_array(array)  # a view of the mapping keeps the mapping alive
    return storage.to(device=device)


# ---------------------------------------------------------------------------------------------- map_location
def _restorer(map_location):
    """`restore(read, tag)`: the storage tagged `tag` in the file, placed per map_location, where
    `read(device)` reads it onto a device."""
    if map_location is None:
        return lambda read, tag: read(_file_device(tag))
    if isinstance(map_location, dict):
        def restore(read, tag):
            target = map_location.get(tag, tag)
            return read(_file_device(tag) if target is tag else _restore_device(target))
        return restore
    if callable(map_location) and not isinstance(map_location, _device):
        def restore(read, tag):
            storage = read(CPU)
            result = map_location(storage, tag)
            if result is None:
                device = _file_device(tag)
                result = storage.to(device=device)
            if not isinstance(result, UntypedStorage):
                raise TypeError(f"map_location must return a storage or None, got {type(result).__name__}")
            return result
        return restore
    device = _restore_device(map_location)  # checked now: a bad string fails before the file is read
    return lambda read, tag: read(device)


def _file_device(tag):
    """The device a storage's own location tag names."""
    try:
        parsed = _device(tag)
    except (RuntimeError, ValueError):  # ValueError: an index of more digits than Python converts
        shown = tag if len(tag) <= 80 else tag[:77] + "..."
        raise RuntimeError(f"don't know how to restore data location of a storage tagged with {shown!r}: "
                           "minitensor has 'cpu' and 'cuda' devices; pass map_location to choose one") from None
    return _restore_device(parsed)


def _restore_device(location):
    """A device from map_location (a string, mt.device or torch.device), with torch's errors for an
    invalid string and for a cuda device this machine does not have."""
    if isinstance(location, _device):
        d = location
    else:
        text = str(location)
        try:
            d = _device(text)
        except ValueError:  # an index of more digits than Python converts to an int
            shown = text if len(text) <= 80 else text[:77] + "..."
            raise RuntimeError(f"Could not parse device index in device string {shown!r}") from None
    if d.type != "cuda":
        return CPU if d.type == "cpu" else as_device(d)  # a registered type's: its index checked
    index = devices.current_device() if d.index is None else d.index
    count = devices.device_count()
    if index >= count:
        raise RuntimeError(f"Attempting to deserialize object on CUDA device {index} but "
                           f"minitensor.cuda.device_count() is {count}. Please use minitensor.load with "
                           "map_location to map your storages to an existing device.")
    return as_device(_device("cuda", index))

