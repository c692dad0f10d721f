"""FileStore: torch's key-value store in a file that every process of the group opens (a shared filesystem).

The file is a log: each change appends one record (set or delete, key, value) under an exclusive `flock`, after
reading the records other processes appended since, so `add` and `compare_set` are atomic across processes.
Records check themselves: a marker, the kind, the key's and the value's lengths and a CRC-32 of all of them. A
writer killed inside a record (or stopped by a full disk) leaves it torn; readers skip it, like anything else
that does not check, up to the next marker, so they neither take a truncated value for whole nor lose the
records written after it (no record is being written while a reader holds its lock).
Each process keeps the keys it has read and its position in the file, and reads only what is new. `get` and
`wait` read again with a growing pause (1 ms to 50 ms) until the keys appear or the timeout passes. As in
torch, each store counts itself in and out of the file; the last of `world_size` users to go removes it
(`world_size=-1` keeps it).
"""
import contextlib
import fcntl
import operator
import os
import struct
import threading
import time
import weakref
import zlib

from .errors import DistStoreError
from .store import DEFAULT_TIMEOUT, Store, added, compare_set_outcome

_MARKER = b"\x89MTstore"  # starts every record; a byte that is not ASCII makes text unlikely to hold it
_HEADER = struct.Struct("!cII")  # kind, key length, value length
_CRC = struct.Struct("!I")  # of the header, the key and the value
_SET, _DELETE = b"S", b"D"
_USER = "/"  # user keys are kept as "/key", so the two counters below never meet a user's key
_USERS, _FINISHED = "refcount", "cleanup"
_MAX_PAUSE_S = 0.05


def _record(kind, key, value=b""):
    body = _HEADER.pack(kind, len(key.encode()), len(value)) + key.encode() + value
    return _MARKER + _CRC.pack(zlib.crc32(body)) + body


def _parse(data, at):
    """(kind, key, value, the offset after the record) of a whole record that checks at `at`, else None."""
    body_at = at + len(_MARKER) + _CRC.size
    if data[at:at + len(_MARKER)] != _MARKER or len(data) < body_at + _HEADER.size:
        return None
    kind, key_size, value_size = _HEADER.unpack_from(data, body_at)
    end = body_at + _HEADER.size + key_size + value_size
    if end > len(data) or kind not in (_SET, _DELETE):
        return None
    (crc,) = _CRC.unpack_from(data, at + len(_MARKER))
    if zlib.crc32(memoryview(data)[body_at:end]) != crc:
        return None
    key_at = body_at + _HEADER.size
    try:
        key = data[key_at:key_at + key_size].decode()
    except UnicodeDecodeError:
        return None
    return kind, key, data[key_at + key_size:end], end


class _Log:
    """One process's view of the file: the keys read so far and where reading stopped."""

    def __init__(self, path):
        self.path = path
        self.values = {}
        self._read_up_to = 0
        self._inode = None
        self._fd = None  # the open file while `locked` holds it
        self._lock = threading.Lock()  # the view is shared by the process's threads

    @contextlib.contextmanager
    def locked(self, exclusive=False, create=True):
        """The file locked (exclusively to append) and read up to its end, for the duration of the block."""
        flags = os.O_RDWR | os.O_APPEND | (os.O_CREAT if create else 0)
        with self._lock:
            fd = os.open(self.path, flags, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                self._fd = fd
                self._read_new(fd)
                yield self
            finally:
                self._fd = None
                os.close(fd)  # closing releases the flock

    def _read_new(self, fd):
        stat = os.fstat(fd)
        if stat.st_ino != self._inode or stat.st_size < self._read_up_to:  # a new file under the same name
            self.values, self._read_up_to, self._inode = {}, 0, stat.st_ino
        data = os.pread(fd, stat.st_size - self._read_up_to, self._read_up_to)
        at = 0
        while at < len(data):
            record = _parse(data, at)
            if record is None:  # torn or damaged: the next record starts at a later marker, if any
                found = data.find(_MARKER, at + 1)
                at = len(data) if found < 0 else found
                continue
            kind, key, value, at = record
            self._apply(kind, key, value)
        self._read_up_to = stat.st_size

    def _apply(self, kind, key, value):
        if kind == _SET:
            self.values[key] = value
        else:
            self.values.pop(key, None)

    def append(self, kind, key, value=b""):
        """Appends a record (holding the exclusive lock) and applies it to the view once it is all written; a
        write that fails part way leaves a torn record, which every reader skips."""
        record = memoryview(_record(kind, key, value))
        written = 0
        while written < len(record):  # a write to a file is whole unless a signal or a full disk cut it short
            written += os.write(self._fd, record[written:])
        self._read_up_to += len(record)
        self._apply(kind, key, value)

    def add(self, key, amount):
        value = added(self.values.get(key), key.removeprefix(_USER), amount)
        self.append(_SET, key, value)
        return int(value)


def _leave(log, world_size):
    """Counts a store out; the last of `world_size` removes the file, as torch's FileStore destructor does."""
    try:
        with log.locked(exclusive=True, create=False):
            finished = log.add(_FINISHED, 1)
            if log.add(_USERS, -1) == 0 and 0 <= world_size <= finished:
                os.remove(log.path)
    except OSError:  # the file is gone already: nobody is left to count
        pass


class FileStore(Store):
    """torch.distributed.FileStore(file_name, world_size=-1): a store in `file_name`, which every process of
    the group names; `world_size` users (when not -1) remove it as the last one goes."""

    def __init__(self, file_name, world_size=-1):
        super().__init__(DEFAULT_TIMEOUT)
        self.path = os.fspath(file_name)
        self.world_size = operator.index(world_size)
        if self.world_size == 0 or self.world_size < -1:
            raise ValueError(f"FileStore(): world_size must be -1 (unknown) or at least 1, got {world_size}")
        self._log = _Log(self.path)
        with self._locked(exclusive=True) as log:
            log.add(_USERS, 1)
        weakref.finalize(self, _leave, self._log, self.world_size)

    @contextlib.contextmanager
    def _locked(self, exclusive=False):
        try:
            with self._log.locked(exclusive) as log:
                yield log
        except OSError as error:
            raise DistStoreError(f"FileStore cannot use {self.path}: {error.strerror}") from None

    def _await(self, keys, timeout_s):
        """({key: value} once every key is set, []) or ({}, the keys still missing after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        pause = 0.001
        while True:
            with self._locked() as log:
                missing = [key for key in keys if _USER + key not in log.values]
                if not missing:
                    return {key: log.values[_USER + key] for key in keys}, []
            if time.monotonic() >= deadline:
                return {}, missing
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(2 * pause, _MAX_PAUSE_S)

    def _set(self, key, value):
        with self._locked(exclusive=True) as log:
            log.append(_SET, _USER + key, value)

    def _get(self, key, timeout_s):
        found, missing = self._await([key], timeout_s)
        if missing:
            raise DistStoreError(f"Timeout waiting for key: {key} after {round(timeout_s * 1000)} ms")
        return found[key]

    def _add(self, key, amount):
        with self._locked(exclusive=True) as log:
            return log.add(_USER + key, amount)

    def _compare_set(self, key, expected, desired):
        with self._locked(exclusive=True) as log:
            stored, answer = compare_set_outcome(log.values.get(_USER + key), expected, desired)
            if stored is not None:
                log.append(_SET, _USER + key, stored)
            return answer

    def _wait(self, keys, timeout_s):
        _, missing = self._await(keys, timeout_s)
        if missing:
            raise DistStoreError(f"Wait timeout after {round(timeout_s * 1000)} ms, keys: {', '.join(missing)}")

    def _check(self, keys):
        with self._locked() as log:
            return all(_USER + key in log.values for key in keys)

    def _delete_key(self, key):
        with self._locked(exclusive=True) as log:
            present = _USER + key in log.values
            if present:
                log.append(_DELETE, _USER + key)
            return present

    def _num_keys(self):
        with self._locked() as log:
            return sum(key.startswith(_USER) for key in log.values)
