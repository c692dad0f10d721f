"""TCPStore: torch's key-value store served over TCP by the master process (rank 0) to every rank.

The master serves from its process (tcp_server.py) on the address its host name resolves to, over the wire
format of tcp_protocol.py. Every TCPStore, the master's included, is a client; its threads share its
connections, each used by one request at a time. A client greets with the job's token (the `job_token`
argument, else MINITENSOR_JOB_TOKEN from the environment, which the launcher sets); a master with a token
refuses a peer without the same one, and the peer raises DistStoreError saying so.
"""
import datetime
import operator
import os
import socket
import threading
import time
import weakref

from . import tcp_protocol as protocol
from .errors import DistNetworkError, DistStoreError
from .store import DEFAULT_TIMEOUT, Store, timeout_seconds
from .tcp_server import Server

_REPLY_GRACE_S = 30.0  # beyond a request's own wait: a live server answers well within it, a vanished one never
_MAX_RETRY_PAUSE_S = 1.0
_MIN_ATTEMPT_S = 1.0  # one connection attempt and greeting, even when the timeout is nearly spent


def _ms(seconds):
    return f"{round(seconds * 1000)}ms"


def _open(host, port, join, token, timeout_s):
    """One connection, greeted; OSError when nothing answers or the server has no room now, DistStoreError when
    it refuses this client, DistNetworkError when something else answers."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        protocol.send(sock, [b"hello", protocol.MAGIC, b"join" if join else b"use", token])
        reply = protocol.receive(sock, protocol.GREETING_REPLY, timeout_s, timeout_s)
    except BaseException:
        sock.close()
        raise
    if reply == [b"ok"]:
        return sock
    sock.close()
    if reply[:1] == [b"busy"]:
        raise ConnectionRefusedError(reply[1].decode(errors="replace") if len(reply) > 1 else "busy")
    if reply[:1] == [b"error"] and len(reply) == 2:
        raise DistStoreError(f"TCPStore at ({host}, {port}) refused this client: {reply[1].decode(errors='replace')}")
    raise DistNetworkError(f"({host}, {port}) answered the TCPStore greeting with {reply!r}: it is not a "
                           f"minitensor TCPStore server")


def _connect(host, port, join, token, timeout_s):
    """The first connection to the server, retried until `timeout_s` passes: the master may not listen yet."""
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        try:
            return _open(host, port, join, token, max(deadline - time.monotonic(), _MIN_ATTEMPT_S))
        except (OSError, protocol.ProtocolError) as error:
            if time.monotonic() + pause > deadline:
                raise DistNetworkError(f"The client socket has timed out after {_ms(timeout_s)} while trying to "
                                       f"connect to ({host}, {port}). Last error: {error}") from None
        time.sleep(pause)
        pause = min(2 * pause, _MAX_RETRY_PAUSE_S)


def _close(idle, server):
    for sock in idle:
        sock.close()
    if server is not None:
        server.close()


def _key(key):
    encoded = key.encode()
    if len(encoded) > protocol.MAX_KEY_BYTES:
        raise ValueError(f"TCPStore keys are at most {protocol.MAX_KEY_BYTES} bytes (UTF-8), got one of "
                         f"{len(encoded)}")
    return encoded


def _keys(keys):
    if len(keys) > protocol.MAX_KEYS:
        raise ValueError(f"a TCPStore wait or check names at most {protocol.MAX_KEYS} keys, got {len(keys)}")
    return [_key(key) for key in keys]


def _value(value):
    if len(value) > protocol.MAX_VALUE_BYTES:
        raise ValueError(f"TCPStore values are at most {protocol.MAX_VALUE_BYTES} bytes, got one of {len(value)}")
    return value


def _job_token(job_token):
    token = os.environ.get(protocol.JOB_TOKEN_ENV, "") if job_token is None else job_token
    if not isinstance(token, str):
        raise TypeError(f"TCPStore(): job_token must be a str or None, got {type(token).__name__}")
    if len(token.encode()) > protocol.MAX_TOKEN_BYTES:
        raise ValueError(f"TCPStore(): a job token is at most {protocol.MAX_TOKEN_BYTES} bytes, got "
                         f"{len(token.encode())}")
    return token


class TCPStore(Store):
    """torch.distributed.TCPStore. The master (`is_master=True`) serves the keys from this process, listening on
    the address `host_name` resolves to; port 0 picks a free port, which `.port` tells. With `world_size` and
    `wait_for_workers`, the master's constructor returns only once `world_size` stores (its own included) have
    connected, so it doubles as a start barrier. `job_token` (default: MINITENSOR_JOB_TOKEN, else none) is the
    secret a master requires of every peer and a client presents.

    Unlike torch's, a store used by several threads at once opens a connection per concurrent request, so a
    thread blocked in `get` does not hold up another thread's `set` on the same store object."""

    def __init__(self, host_name: str, port: int, world_size: "int | None" = None, is_master: bool = False,
                 timeout: datetime.timedelta = DEFAULT_TIMEOUT, wait_for_workers: bool = True, *,
                 job_token: "str | None" = None) -> None:
        super().__init__(timeout)
        port = _check_arguments(host_name, port, world_size, is_master)
        token = _job_token(job_token)
        self.host = host_name
        self._token = token.encode()
        self._server = Server(host_name, port, token, world_size) if is_master else None
        self.port = self._server.port if is_master else port
        self._address = self._server.address[0] if is_master else host_name
        self._lock = threading.Lock()
        joins = world_size is not None and wait_for_workers
        timeout_s = timeout_seconds(timeout)
        try:  # the connections not in use
            self._idle = [_connect(self._address, self.port, joins, self._token, timeout_s)]
        except BaseException:
            _close([], self._server)
            raise
        finalizer = weakref.finalize(self, _close, self._idle, self._server)
        if is_master and joins:
            try:
                self._server.wait_for_workers(world_size, timeout_s)
            except BaseException:
                finalizer()
                raise

    def _request(self, parts, wait_s=0.0, shape=(0, 0)):
        """(status, values) of one request's reply, on an idle connection or a new one: `shape` is how many
        values an "ok" reply has (at least, at most); a timeout's values are the keys still missing. A lost,
        silent or garbled server is a DistNetworkError, an error reply a DistStoreError."""
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        try:
            sock = sock or _open(self._address, self.port, False, self._token, _REPLY_GRACE_S)
            sock.settimeout(_REPLY_GRACE_S)
            protocol.send(sock, parts)
            reply = protocol.receive(sock, protocol.REPLY, wait_s + _REPLY_GRACE_S, _REPLY_GRACE_S)
            _check_reply(reply, shape)
        except (OSError, protocol.ProtocolError) as error:
            if sock is not None:
                sock.close()  # a reply may be half read: the connection cannot be trusted again
            raise DistNetworkError(f"TCPStore at ({self.host}, {self.port}): {error}") from None
        with self._lock:
            self._idle.append(sock)
        if reply[0] == b"error":
            raise DistStoreError(reply[1].decode(errors="replace"))
        return reply[0], reply[1:]

    def _set(self, key, value):
        self._request([b"set", _key(key), _value(value)])

    def _get(self, key, timeout_s):
        status, values = self._request([b"get", _key(key), repr(timeout_s).encode()], timeout_s, (1, 1))
        if status == b"timeout":
            raise DistStoreError(f"wait timeout after {_ms(timeout_s)}, keys: {key}")
        return values[0]

    def _add(self, key, amount):
        return _integer(self._request([b"add", _key(key), str(amount).encode()], shape=(1, 1))[1][0])

    def _compare_set(self, key, expected, desired):
        return self._request([b"compare_set", _key(key), _value(expected), _value(desired)], shape=(1, 1))[1][0]

    def _wait(self, keys, timeout_s):
        status, missing = self._request([b"wait", repr(timeout_s).encode(), *_keys(keys)], timeout_s)
        if status == b"timeout":
            raise DistStoreError(f"wait timeout after {_ms(timeout_s)}, keys: "
                                 f"{', '.join(key.decode(errors='replace') for key in missing)}")

    def _check(self, keys):
        return self._request([b"check", *_keys(keys)], shape=(1, 1))[1][0] == b"1"

    def _delete_key(self, key):
        return self._request([b"delete_key", _key(key)], shape=(1, 1))[1][0] == b"1"

    def _num_keys(self):
        return _integer(self._request([b"num_keys"], shape=(1, 1))[1][0])


def _check_reply(reply, shape):
    """ProtocolError unless `reply` is an error with its message, a timeout, or "ok" with `shape` values."""
    status = reply[0] if reply else None
    low, high = {b"ok": shape, b"error": (1, 1), b"timeout": (0, protocol.MAX_KEYS)}.get(status, (1, 0))
    if not low <= len(reply) - 1 <= high:
        raise protocol.ProtocolError(f"a reply of {len(reply)} parts starting {reply[:1]!r} is not the TCPStore "
                                     f"protocol")


def _integer(digits):
    try:
        return int(digits)
    except ValueError:
        raise DistNetworkError(f"the TCPStore master answered {digits[:40]!r} where a number was due") from None


def _check_arguments(host_name, port, world_size, is_master):
    """The port as an int, after torch's checks of the constructor's arguments."""
    if not isinstance(host_name, str):
        raise TypeError(f"TCPStore(): host_name must be a str, got {type(host_name).__name__}")
    port = operator.index(port)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
    if port == 0 and not is_master:
        raise ValueError("TCPStore(): a client needs the master's port, got 0 (only the master may pick one)")
    if world_size is not None and operator.index(world_size) < 1:
        raise ValueError(f"TCPStore(): world_size must be None or at least 1, got {world_size}")
    return port
