"""The zip container of a checkpoint, in the layout torch writes and reads.

Records are stored uncompressed under one top-level folder (the prefix). Each record's data starts at a
multiple of 64 bytes from the start of the archive, padded with a local-header extra field ("FB" + "Z"
bytes, as torch's writer does), so a record can be mapped into memory and viewed in place. The CRC of a
record is only known once its bytes went by, so it follows them in a data descriptor (flag bit 3), as in
torch's files: the archive is written in one pass and needs no seeking. Zip64 fields are written when a
size or offset does not fit in 32 bits.

The reader finds records from the central directory, then each record's data from its local header, and
checks that everything it points at lies inside the file, that each local header names its record, and that
the records it reads add up to no more bytes than the file holds (records that share bytes would let a small
file load as many copies of them). Problems raise RuntimeError saying what was wrong; the reader never trusts
a length it has not checked against the file's size.
"""
import os
import struct

from . import crc32

ALIGNMENT = 64
_ZIP64_LIMIT = 0xFFFFFFFF  # sizes and offsets from here on need zip64 fields
_MAX_ENTRIES = 0xFFFF

_LOCAL = struct.Struct("<IHHHHHIIIHH")
_DESCRIPTOR32 = struct.Struct("<IIII")
_DESCRIPTOR64 = struct.Struct("<IIQQ")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_END = struct.Struct("<IHHHHIIH")
_END64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")
_LOCAL_SIG, _DESCRIPTOR_SIG, _CENTRAL_SIG = 0x04034B50, 0x08074B50, 0x02014B50
_END_SIG, _END64_SIG, _LOCATOR64_SIG = 0x06054B50, 0x06064B50, 0x07064B50
_FLAGS = 0x0808  # bit 3: sizes and CRC in a data descriptor; bit 11: names are UTF-8
_DOS_DATE = (0 << 9) | (1 << 5) | 1  # 1980-01-01, the earliest date a zip can hold

# torch's legacy (pre-1.6) format starts with a protocol-2 pickle of this magic number
_LEGACY_MAGIC = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19"


class ZipWriter:
    """Writes records to a binary file object from its current position; `finish()` writes the directory."""

    def __init__(self, file, prefix):
        self._file = file
        self._prefix = prefix
        self._pos = 0  # bytes written so far: offsets are relative to the start of the archive
        self._entries = []  # (name bytes, crc, size, local header offset)

    def write_record(self, name, data):
        record = self.record(name, len(data))
        record.write(data)
        record.close()

    def record(self, name, nbytes):
        """Start a record of exactly `nbytes` bytes: `write` its bytes in any number of pieces, then
        `close` it."""
        return _Record(self, name, nbytes)

    def finish(self):
        start = self._pos
        for name, crc, size, offset in self._entries:
            self._write(_central_header(name, crc, size, offset))
        size = self._pos - start
        count = len(self._entries)
        if count >= _MAX_ENTRIES or size >= _ZIP64_LIMIT or start >= _ZIP64_LIMIT:
            end64 = self._pos
            self._write(_END64.pack(_END64_SIG, _END64.size - 12, 45, 45, 0, 0, count, count, size, start))
            self._write(_LOCATOR64.pack(_LOCATOR64_SIG, 0, end64, 1))
        self._write(_END.pack(_END_SIG, 0, 0, min(count, _MAX_ENTRIES), min(count, _MAX_ENTRIES),
                              min(size, _ZIP64_LIMIT), min(start, _ZIP64_LIMIT), 0))

    def _write(self, data):
        """Write all of `data`: a raw file's write may take only part of it."""
        view = memoryview(data).cast("B")
        while view:
            written = self._file.write(view)
            if written is None:  # file objects that return nothing wrote everything
                written = len(view)
            self._pos += written
            view = view[written:]


class _Record:
    def __init__(self, writer, name, nbytes):
        self._writer = writer
        self._name = f"{writer._prefix}/{name}".encode("utf-8")
        self._size = nbytes
        self._left = nbytes
        self._crc = 0
        self._offset = writer._pos
        self._zip64 = nbytes >= _ZIP64_LIMIT or self._offset >= _ZIP64_LIMIT
        writer._write(self._local_header())

    def _local_header(self):
        extra = b""
        if self._zip64:
            extra = struct.pack("<HHQQ", 1, 16, self._size, self._size)
        start = self._offset + _LOCAL.size + len(self._name) + len(extra) + 4
        padding = -start % ALIGNMENT
        extra += b"FB" + struct.pack("<H", padding) + b"Z" * padding
        sizes = 0xFFFFFFFF if self._zip64 else 0
        return _LOCAL.pack(_LOCAL_SIG, 45 if self._zip64 else 20, _FLAGS, 0, 0, _DOS_DATE, 0, sizes, sizes,
                           len(self._name), len(extra)) + self._name + extra

    def write(self, data):
        view = memoryview(data).cast("B")
        if len(view) > self._left:
            raise ValueError(f"record {self._name.decode()} was declared as {self._size} bytes; writing "
                             f"{len(view)} more bytes would exceed it by {len(view) - self._left}")
        self._crc = crc32.crc32(view, self._crc, alongside=lambda: self._writer._write(view))
        self._left -= len(view)

    def close(self):
        if self._left:
            raise ValueError(f"record {self._name.decode()} was declared as {self._size} bytes but only "
                             f"{self._size - self._left} were written")
        descriptor = _DESCRIPTOR64 if self._zip64 else _DESCRIPTOR32
        self._writer._write(descriptor.pack(_DESCRIPTOR_SIG, self._crc, self._size, self._size))
        self._writer._entries.append((self._name, self._crc, self._size, self._offset))


def _central_header(name, crc, size, offset):
    big_size, big_offset = size >= _ZIP64_LIMIT, offset >= _ZIP64_LIMIT
    extra = b""
    if big_size or big_offset:
        values = ([size, size] if big_size else []) + ([offset] if big_offset else [])
        extra = struct.pack(f"<HH{len(values)}Q", 1, 8 * len(values), *values)
    version = 45 if extra else 20
    size32 = 0xFFFFFFFF if big_size else size
    return _CENTRAL.pack(_CENTRAL_SIG, version, version, _FLAGS, 0, 0, _DOS_DATE, crc, size32, size32, len(name),
                         len(extra), 0, 0, 0, 0, 0xFFFFFFFF if big_offset else offset) + name + extra


class ZipReader:
    """The records of a zip archive that starts at a binary file object's current position and runs to
    the end of the file. `prefix` is the top-level folder; record names are given without it."""

    def __init__(self, file):
        self._file = file
        self._base = file.tell()
        self._size = file.seek(0, os.SEEK_END) - self._base
        self._spans = {}
        self._claimed = 0  # bytes of the records whose spans were taken
        self._check_kind()
        entries, self._directory_start = self._read_directory()
        self.prefix = entries[0][0].split("/", 1)[0] if entries else ""
        self._headers = {}
        for name, raw_name, offset, size in entries:
            folder, _, short = name.partition("/")
            if folder != self.prefix or not short:
                raise self._error(f"record {name!r} is not under the archive's folder {self.prefix!r}/ "
                                  "(a checkpoint keeps every record in one top-level folder)")
            if short in self._headers:
                raise self._error(f"record {name!r} appears twice")
            self._headers[short] = (offset, size, raw_name)

    def names(self):
        return list(self._headers)

    def __contains__(self, name):
        return name in self._headers

    def size(self, name):
        return self._entry(name)[1]

    def span(self, name):
        """(offset of the record's data from the start of the file, size)."""
        span = self._spans.get(name)
        if span is None:
            offset, size, raw_name = self._entry(name)
            header = self._read_at(offset, _LOCAL.size + len(raw_name), f"the local header of {name}")
            fields = _LOCAL.unpack_from(header)
            if fields[0] != _LOCAL_SIG:
                raise self._error(f"the local header of record {name} at byte {offset} has a bad signature")
            if fields[9] != len(raw_name) or header[_LOCAL.size:] != raw_name:
                raise self._error(f"the local header at byte {offset} names {header[_LOCAL.size:]!r}, not record "
                                  f"{raw_name!r}, which the central directory places there")
            data = offset + _LOCAL.size + fields[9] + fields[10]
            if data + size > self._directory_start:
                raise self._error(f"record {name} ({size} bytes from byte {data}) runs past the record area, "
                                  f"which ends at byte {self._directory_start}")
            self._claimed += size
            if self._claimed > self._size:
                raise self._error(f"its records overlap: with record {name} ({size} bytes from byte {data}) the "
                                  f"records read hold {self._claimed} bytes, more than the file's {self._size}")
            span = self._spans[name] = (self._base + data, size)
        return span

    def read(self, name):
        offset, size = self.span(name)
        self._file.seek(offset)
        data = self._file.read(size)
        if len(data) != size:
            raise self._error(f"record {name} is truncated: expected {size} bytes, read {len(data)}")
        return data

    def readinto(self, name, buffer):
        """Fill `buffer` (exactly the record's size) with the record's bytes."""
        offset, size = self.span(name)
        view = memoryview(buffer).cast("B")
        if len(view) != size:
            raise ValueError(f"record {name} has {size} bytes; the buffer has {len(view)}")
        self._file.seek(offset)
        while view:
            n = self._file.readinto(view)
            if not n:
                raise self._error(f"record {name} is truncated: {len(view)} of its {size} bytes are missing")
            view = view[n:]

    # -------------------------------------------------------------------------------------- parsing
    def _entry(self, name):
        try:
            return self._headers[name]
        except KeyError:
            raise self._error(f"it has no record {self.prefix}/{name}") from None

    def _error(self, what):
        return RuntimeError(f"invalid checkpoint file: {what}")

    def _read_at(self, offset, n, what):
        if offset < 0 or offset + n > self._size:
            raise self._error(f"{what} ({n} bytes at byte {offset}) lies outside the file of {self._size} bytes")
        self._file.seek(self._base + offset)
        data = self._file.read(n)
        if len(data) != n:
            raise self._error(f"{what} is truncated")
        return data

    def _check_kind(self):
        head = self._read_at(0, min(self._size, len(_LEGACY_MAGIC)), "the start of the file")
        if head.startswith(b"PK\x03\x04"):
            return
        if not head:
            raise self._error("it is empty")
        if head == _LEGACY_MAGIC:
            raise self._error("it is in torch's legacy format (written by torch < 1.6 or with "
                              "_use_new_zipfile_serialization=False), which minitensor does not read; load it "
                              "with torch and save it again with a current torch.save")
        raise self._error(f"it is not a zip archive (it starts with {head[:4]!r}, a zip starts with b'PK\\x03\\x04')")

    def _find_end(self):
        """Offset of the end-of-central-directory record: the last signature whose comment length
        reaches exactly to the end of the file."""
        tail_start = max(0, self._size - _END.size - 0xFFFF)
        tail = self._read_at(tail_start, self._size - tail_start, "the end of the archive")
        pos = len(tail)
        while True:
            pos = tail.rfind(b"PK\x05\x06", 0, pos)
            if pos < 0:
                raise self._error("no end-of-central-directory record (the file is truncated or not a zip)")
            if pos + _END.size <= len(tail) and pos + _END.size + _END.unpack_from(tail, pos)[7] == len(tail):
                return tail_start + pos, _END.unpack_from(tail, pos)

    def _read_directory(self):
        end_pos, end = self._find_end()
        _, disk, cd_disk, _, count, cd_size, cd_offset, _ = end
        if disk or cd_disk:
            raise self._error("it spans several disks")
        if end_pos >= _LOCATOR64.size:
            locator = _LOCATOR64.unpack(self._read_at(end_pos - _LOCATOR64.size, _LOCATOR64.size, "the zip64 locator"))
            if locator[0] == _LOCATOR64_SIG:
                end64 = _END64.unpack(self._read_at(locator[2], _END64.size, "the zip64 end record"))
                if end64[0] != _END64_SIG:
                    raise self._error("the zip64 end record has a bad signature")
                count, cd_size, cd_offset = end64[7], end64[8], end64[9]
        if cd_offset + cd_size > end_pos:
            raise self._error(f"the central directory ({cd_size} bytes at byte {cd_offset}) overlaps the end "
                              f"record at byte {end_pos}")
        directory = self._read_at(cd_offset, cd_size, "the central directory")
        entries, pos = [], 0
        for _ in range(count):
            if pos + _CENTRAL.size > len(directory):
                raise self._error(f"the central directory lists {count} records but holds {len(entries)}")
            fields = _CENTRAL.unpack_from(directory, pos)
            if fields[0] != _CENTRAL_SIG:
                raise self._error(f"central directory entry {len(entries)} has a bad signature")
            flags, method, csize, usize = fields[3], fields[4], fields[8], fields[9]
            name_len, extra_len, comment_len, offset = fields[10], fields[11], fields[12], fields[16]
            name_end = pos + _CENTRAL.size + name_len
            if name_end + extra_len + comment_len > len(directory):
                raise self._error(f"central directory entry {len(entries)} runs past the directory")
            raw_name = bytes(directory[pos + _CENTRAL.size:name_end])
            try:
                name = raw_name.decode("utf-8" if flags & 0x800 else "cp437")
            except UnicodeDecodeError:
                raise self._error(f"record name {raw_name!r} is not valid UTF-8") from None
            usize, csize, offset = _zip64_values(directory[name_end:name_end + extra_len], usize, csize, offset,
                                                 self._error, name)
            if flags & 1:
                raise self._error(f"record {name} is encrypted")
            if method != 0 or csize != usize:
                raise self._error(f"record {name} is compressed (method {method}); checkpoints store records "
                                  "uncompressed")
            if offset + _LOCAL.size + usize > cd_offset:
                raise self._error(f"record {name} ({usize} bytes at byte {offset}) runs into the central directory")
            entries.append((name, raw_name, offset, usize))
            pos = name_end + extra_len + comment_len
        return entries, cd_offset


def _zip64_values(extra, usize, csize, offset, error, name):
    """Replace the 32-bit fields that are 0xFFFFFFFF with the values of the zip64 extra field."""
    wanted = [v == 0xFFFFFFFF for v in (usize, csize, offset)]
    if not any(wanted):
        return usize, csize, offset
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<HH", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{min(length, len(extra) - pos - 4) // 8}Q", extra, pos + 4))
            result = []
            for field, need in zip((usize, csize, offset), wanted):
                if need:
                    if not values:
                        break
                    field = values.pop(0)
                result.append(field)
            else:
                return tuple(result)
            break
        pos += 4 + length
    raise error(f"record {name} has 32-bit fields marked as zip64 but no zip64 field holding them")
