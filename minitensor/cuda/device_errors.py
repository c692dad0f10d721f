"""Errors found by kernels on a device, raised on the host by the next synchronising call.

A gather or index_select kernel that meets an out-of-range index masks it and writes the bad index and an info
word (which op, dim, size) into its device's record: two int64 words of pinned host memory that kernels write
through the same address (unified addressing), allocated on first use and never freed. The synchronising calls
(`mt.cuda.synchronize`, `Stream.synchronize`, `Event.synchronize`, blocking copies) run `raise_pending` after
their wait, so the IndexError surfaces there, as torch's device-side asserts do, and the device stays usable.
Reading the record is a host memory read, so the check costs nothing measurable. Lanes write it without atomics:
when several bad launches race (different streams), the index reported may come from one and the dim from
another.
"""
import ctypes
import threading

from ..backends import active_driver

GATHER, INDEX_SELECT = 1, 2  # the ops that write records, as the info word names them
_records = {}  # device index -> its record
_records_lock = threading.Lock()


def record_address(device):
    """The address of device `device`'s record, for kernels to write to."""
    record = _records.get(device)
    if record is None:
        with _records_lock:
            record = _records.get(device)
            if record is None:
                record = (ctypes.c_int64 * 2).from_address(active_driver().host_alloc(16))
                record[0] = record[1] = 0
                _records[device] = record
    return ctypes.addressof(record)


def info_word(op, dim, size):
    """What a kernel writes beside a bad index: the op, the dim (up to 2^14 - 1) and the dim's size."""
    return size << 16 | min(dim, 0x3FFF) << 2 | op


def message(op, value, dim, size):
    """torch's words for an out-of-range index of gather or index_select."""
    text = f"index {value} is out of bounds for dimension {dim} with size {size}"
    return text if op == GATHER else "index out of range in self: " + text


def raise_pending(device=None):
    """Raise the IndexError a completed kernel recorded on device `device` (an index; every device when None),
    and clear the record."""
    for d, record in (list(_records.items()) if device is None else ((device, _records.get(device)),)):
        if record is not None and record[1]:
            value, info = record[0], record[1]
            record[0] = record[1] = 0
            op = info & 3
            raise IndexError(f"{message(op, value, (info >> 2) & 0x3FFF, info >> 16)} (found by the "
                             f"{'gather' if op == GATHER else 'index_select'} kernel on cuda:{d})")
