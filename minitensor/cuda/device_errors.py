"""Errors found by kernels on a device, raised on the host in the thread whose op launched the kernel.

A gather, index_select or index_put_ kernel that meets an out-of-range index masks it and writes the bad index
and an info word (which op, dim, size) into an error record: two int64 words of pinned host memory that kernels
write through the same address (unified addressing). Each thread has its own record per device, and an op
passes the calling thread's. A record per device (or per stream: threads share the default stream) would hand one
thread's error to whichever thread synchronises first.

The rule, on both backends: the IndexError is raised in the thread that launched the kernel, by its first
synchronising call after the kernel ran (`mt.cuda.synchronize`, `Stream.synchronize`, `Event.synchronize`,
blocking copies, and through them `.item()`, `.cpu()`), as torch's device-side asserts surface late, and the
device stays usable. On the simulated device the op itself waits for its kernel and raises. Another thread's
calls never raise it, even when they wait for that kernel (a result handed to another thread keeps its error
with the thread that launched it). Reading the records is a host memory read, so the check costs nothing
measurable.

Records come from pinned chunks of `RECORDS_PER_CHUNK`, allocated as threads first need them and kept for the
process. A thread's records go back to the pool when the thread ends; an error still in them was never raised,
and a RuntimeWarning says what it was. The pool hands out the records given back longest ago first, but a
kernel still running when its thread ends can write into records that a later thread holds: a thread that
launches gathers should synchronise before it ends. Lanes write a record
without atomics: when one thread's bad launches race (on several streams), the index reported may come from
one and the dim from another.
"""
import collections
import ctypes
import threading
import warnings

from ..backends import active_driver

GATHER, INDEX_SELECT, INDEX_PUT = 1, 2, 3  # the ops that write records, as the info word names them
_OP_NAMES = {GATHER: "gather", INDEX_SELECT: "index_select", INDEX_PUT: "index_put_"}
RECORD_BYTES = 16  # the bad index, then the info word
RECORDS_PER_CHUNK = 256  # records per pinned allocation (4 KiB)
_free = collections.deque()  # records no thread holds, (ctypes array, address), the longest free first
_free_lock = threading.Lock()


class _Owner:
    """Held only by a thread's _ThreadRecords: the thread's end drops it, and it gives the records back."""

    __slots__ = ("records", "thread")

    def __init__(self, records, thread):
        self.records, self.thread = records, thread

    def __del__(self):
        try:
            unraised = []
            for d, (record, _) in enumerate(self.records):
                if record[1]:
                    unraised.append(_describe(d, record[0], record[1]))
                    record[0] = record[1] = 0
            with _free_lock:
                _free.extend(self.records)
            for text in unraised:
                warnings.warn(f"{text}, in thread {self.thread!r}, which ended before a synchronising call raised "
                              "it", RuntimeWarning)
        except Exception:  # interpreter shutdown (the module half gone), or warnings turned into errors
            pass


class _TakenOnFirstUse:
    """A thread's first read of its `records` or `addresses` (its first gather or synchronising call) takes its
    records from the pool and sets both as the thread's own attributes, which answer every later read (this is a
    non-data descriptor): so the hot path reads an attribute, and importing minitensor touches no driver."""

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, tls, owner=None):
        if tls is None:
            return self
        records = _take(active_driver().device_count())
        tls.records = [record for record, _ in records]
        tls.addresses = [address for _, address in records]
        tls.owner = _Owner(records, threading.current_thread().name)
        return getattr(tls, self.name)


class _ThreadRecords(threading.local):
    """This thread's error record per device index: `addresses`, what its kernels are given, and `records`,
    the same memory as ctypes arrays for the host to read."""

    records = _TakenOnFirstUse()
    addresses = _TakenOnFirstUse()


thread_records = _ThreadRecords()  # the hot path reads `thread_records.addresses[device]`


def _take(count):
    """`count` zeroed records from the pool, which grows by a chunk when it runs short."""
    with _free_lock:
        while len(_free) < count:
            base = active_driver().host_alloc(RECORD_BYTES * RECORDS_PER_CHUNK)
            ctypes.memset(base, 0, RECORD_BYTES * RECORDS_PER_CHUNK)
            for address in range(base, base + RECORD_BYTES * RECORDS_PER_CHUNK, RECORD_BYTES):
                _free.append(((ctypes.c_int64 * 2).from_address(address), address))
        return [_free.popleft() for _ in range(count)]


def record_address(device):
    """The address of the calling thread's record on device `device`, for its kernels to write to."""
    return thread_records.addresses[device]


def info_word(op, dim, size):
    """What a kernel writes beside a bad index: the op, the dim (up to 2^14 - 1) and the dim's size."""
    return size << 16 | min(dim, 0x3FFF) << 2 | op


def message(op, value, dim, size):
    """torch's words for an out-of-range index of gather, index_select or index_put_."""
    text = f"index {value} is out of bounds for dimension {dim} with size {size}"
    return "index out of range in self: " + text if op == INDEX_SELECT else text


def _describe(device, value, info):
    op = info & 3
    return (f"{message(op, value, (info >> 2) & 0x3FFF, info >> 16)} (found by the {_OP_NAMES[op]} kernel on "
            f"cuda:{device})")


def raise_pending(device=None):
    """Raise the IndexError that a completed kernel of the calling thread recorded on device `device` (an
    index; every device when None), and clear the record."""
    records = thread_records.records
    for d in range(len(records)) if device is None else (device,):
        record = records[d]
        if record[1]:
            value, info = record[0], record[1]
            record[0] = record[1] = 0
            raise IndexError(_describe(d, value, info))
