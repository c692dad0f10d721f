"""The TCPStore wire format, and the checks that make every field a peer sends safe to act on.

A message is a count of parts, then each part's length and bytes (big-endian u32s). A connection opens with the
greeting [b"hello", MAGIC, b"join" or b"use", job token]; then each request is [command, *arguments] and each
reply [status, *values], status b"ok", b"timeout" (the values are the keys still missing), b"error" (the value
is the message) or, for a greeting the server has no room for, b"busy". Anything may arrive on the master's port,
so `receive` holds every message to limits before reading it (a count or a length beyond them is a
`ProtocolError`, never a large allocation) and `parse_request` checks each argument's form and range before the
store acts on it (a `BadRequest`, which the server answers with an error reply).
"""
import math
import re
import socket
import struct
import time
import typing

from .store import MAX_TIMEOUT_S

MAGIC = b"minitensor-tcpstore-2"
JOB_TOKEN_ENV = "MINITENSOR_JOB_TOKEN"
MAX_KEY_BYTES = 1 << 16
MAX_VALUE_BYTES = 1 << 30
MAX_KEYS = 1 << 14  # in one wait or check
MAX_TOKEN_BYTES = 128
MAX_WAIT_S = MAX_TIMEOUT_S  # the longest wait a peer may ask for
_LENGTH = struct.Struct("!I")
_TIMEOUT = re.compile(rb"[0-9.eE+-]{1,32}")
_INTEGER = re.compile(rb"-?[0-9]{1,19}")


class ProtocolError(ValueError):
    """A message that breaks the framing or its limits: the stream cannot be read further."""


class BadRequest(ValueError):
    """A well-framed request whose command or arguments are not valid; the server answers it with an error."""


class Limits(typing.NamedTuple):
    """The most a message may hold: parts, bytes in one part, bytes in all parts together."""

    parts: int
    part_bytes: int
    total_bytes: int


GREETING = Limits(4, 256, 1024)
GREETING_REPLY = Limits(2, 4096, 8192)  # [b"ok"], or a refusal with its reason
REQUEST = Limits(MAX_KEYS + 2, MAX_VALUE_BYTES, 2 * MAX_VALUE_BYTES + MAX_KEY_BYTES + 64)
REPLY = REQUEST


def send(sock: socket.socket, parts: "list[bytes]") -> None:
    """Sends one message of byte strings, within the socket's timeout."""
    sock.sendall(b"".join([_LENGTH.pack(len(parts)), *(_LENGTH.pack(len(part)) + part for part in parts)]))


def _exact(sock, size, stall_s, deadline):
    """`size` bytes, each recv within `stall_s` seconds and all by `deadline` (time.monotonic(), or None)."""
    data = bytearray()
    while len(data) < size:
        wait_s = stall_s if deadline is None else min(stall_s, deadline - time.monotonic())
        if wait_s <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(wait_s)
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("Failed to recv, got 0 bytes. Connection was likely closed. "
                                  "Did the remote server shutdown or crash?")
        data += chunk
    return bytes(data)


def receive(sock: socket.socket, limits: Limits, first_s: "float | None", stall_s: float,
            deadline: "float | None" = None) -> "list[bytes]":
    """One message within `limits`. Its first byte may take `first_s` seconds (None: forever, an idle
    connection); after it, each recv must bring data within `stall_s` seconds and the whole message must have
    come by `deadline`, so a peer that stops halfway is dropped. OSError for a silent or lost peer."""
    sock.settimeout(first_s)
    if not sock.recv(1, socket.MSG_PEEK):
        raise ConnectionError("Failed to recv, got 0 bytes. Connection was likely closed.")
    (count,) = _LENGTH.unpack(_exact(sock, _LENGTH.size, stall_s, deadline))
    if count > limits.parts:
        raise ProtocolError(f"a message of {count} parts, more than the {limits.parts} allowed")
    parts, total = [], 0
    for _ in range(count):
        (size,) = _LENGTH.unpack(_exact(sock, _LENGTH.size, stall_s, deadline))
        total += size
        if size > limits.part_bytes or total > limits.total_bytes:
            raise ProtocolError(f"a message part of {size} bytes (at most {limits.part_bytes}, "
                                f"{limits.total_bytes} in all)")
        parts.append(_exact(sock, size, stall_s, deadline))
    return parts


def key(part: bytes) -> bytes:
    """A key as its UTF-8 bytes, at most MAX_KEY_BYTES long."""
    if len(part) > MAX_KEY_BYTES:
        raise BadRequest(f"a key of {len(part)} bytes, more than the {MAX_KEY_BYTES} allowed")
    try:
        part.decode()
    except UnicodeDecodeError:
        raise BadRequest(f"a key that is not UTF-8: {part[:64]!r}") from None
    return part


def timeout(part: bytes) -> float:
    """Seconds to wait: a decimal number from 0 to MAX_WAIT_S (not inf, not nan)."""
    try:
        seconds = float(part) if _TIMEOUT.fullmatch(part) else math.nan
    except ValueError:  # e.g. b"1e" or b"+-"
        seconds = math.nan
    if not 0 <= seconds <= MAX_WAIT_S:
        raise BadRequest(f"a timeout of {part[:40]!r}: expected a number of seconds from 0 to {MAX_WAIT_S:g}")
    return seconds


def amount(part: bytes) -> int:
    """An `add` amount: decimal digits of an int64."""
    value = int(part) if _INTEGER.fullmatch(part) else None
    if value is None or not -2**63 <= value < 2**63:
        raise BadRequest(f"an amount of {part[:40]!r}: expected the decimal digits of a 64-bit integer")
    return value


def value(part: bytes) -> bytes:
    """A value: any bytes (the framing limits its length)."""
    return part


_ARGUMENTS = {  # each command's arguments; a list is any number of keys after the fixed ones
    b"set": (key, value), b"get": (key, timeout), b"add": (key, amount), b"compare_set": (key, value, value),
    b"wait": (timeout, [key]), b"check": ([key],), b"delete_key": (key,), b"num_keys": (),
}


def parse_request(request: "list[bytes]") -> "tuple[bytes, list]":
    """(command, checked arguments) of a request; BadRequest naming what is wrong."""
    if not request:
        raise BadRequest("an empty request: expected [command, *arguments]")
    command, parts = request[0], request[1:]
    if command not in _ARGUMENTS:
        raise BadRequest(f"unknown TCPStore command {command[:40]!r}")
    shape = _ARGUMENTS[command]
    fixed = [check for check in shape if not isinstance(check, list)]
    variadic = len(fixed) < len(shape)
    if len(parts) < len(fixed) or (not variadic and len(parts) > len(fixed)):
        raise BadRequest(f"{command.decode()} takes {len(fixed)}{' or more' if variadic else ''} arguments, "
                         f"got {len(parts)}")
    arguments = [check(part) for check, part in zip(fixed, parts)]
    if variadic:
        if len(parts) - len(fixed) > MAX_KEYS:
            raise BadRequest(f"{command.decode()} of {len(parts) - len(fixed)} keys, more than the {MAX_KEYS} allowed")
        arguments.append([key(part) for part in parts[len(fixed):]])
    return command, arguments
