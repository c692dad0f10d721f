"""TCPStore: torch's key-value store served over TCP by the master process (rank 0) to every rank.

The master serves on daemon threads: one accepts, one per connection answers that client's requests in order.
A `get` or `wait` blocks its connection's thread on a condition variable until the keys are set or the timeout
passes, so waiting costs no polling and no traffic. Messages are a count of parts, then each part's length and
bytes; a request is [command, *arguments], a reply [status, *values] with status b"ok", b"timeout" (the values
are the keys still missing) or b"error" (the value is the message). Every TCPStore, the master's included, is a
client; its threads share its connections, each used by one request at a time.
"""
import operator
import socket
import struct
import threading
import time
import weakref

from .errors import DistNetworkError, DistStoreError
from .store import DEFAULT_TIMEOUT, Store, added, compare_set_outcome

_MAGIC = b"minitensor-tcpstore-1"
_LENGTH = struct.Struct("!I")
_MAX_PARTS = 1 << 20  # more is not this protocol (e.g. an HTTP client): the connection is dropped
_REPLY_GRACE_S = 30.0  # beyond a request's own wait: a live server answers well within it, a vanished one never
_MAX_RETRY_PAUSE_S = 1.0
_MIN_ATTEMPT_S = 1.0  # one connection attempt and greeting, even when the timeout is nearly spent
_CLOSE_GRACE_S = 5.0  # for replies being sent when the server closes: a client that stopped reading gets no more


def _send(sock, parts):
    sock.sendall(b"".join([_LENGTH.pack(len(parts)), *(_LENGTH.pack(len(part)) + part for part in parts)]))


def _recv_exact(sock, size):
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("Failed to recv, got 0 bytes. Connection was likely closed. "
                                  "Did the remote server shutdown or crash?")
        data += chunk
    return bytes(data)


def _recv(sock):
    (count,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    if count > _MAX_PARTS:
        raise ConnectionError(f"a message of {count} parts is not the TCPStore protocol")
    return [_recv_exact(sock, _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))[0]) for _ in range(count)]


def _ms(seconds):
    return f"{round(seconds * 1000)}ms"


class _Table:
    """The server's keys, and the condition variable that wakes blocked `get`s and `wait`s when one is set."""

    def __init__(self):
        self.values = {}
        self.joined = 0
        self.closed = False
        self.changed = threading.Condition()
        self.commands = {b"set": self.set, b"get": self.get, b"add": self.add, b"compare_set": self.compare_set,
                         b"wait": self.wait, b"check": self.check, b"delete_key": self.delete_key,
                         b"num_keys": self.num_keys}

    def handle(self, request):
        command = self.commands.get(request[0])
        return command(*request[1:]) if command else [b"error", b"unknown TCPStore command " + request[0]]

    def _store(self, key, value):
        self.values[key] = value
        self.changed.notify_all()

    def _missing_after(self, keys, timeout):
        """Waits (holding `changed`) until every key is set, the timeout passes or the server closes."""
        self.changed.wait_for(lambda: self.closed or all(key in self.values for key in keys), float(timeout))
        return [key for key in keys if key not in self.values]

    def set(self, key, value):
        with self.changed:
            self._store(key, value)
        return [b"ok"]

    def get(self, key, timeout):
        with self.changed:
            return [b"timeout", key] if self._missing_after([key], timeout) else [b"ok", self.values[key]]

    def add(self, key, amount):
        with self.changed:
            try:
                value = added(self.values.get(key), key.decode(), int(amount))
            except DistStoreError as error:
                return [b"error", str(error).encode()]
            self._store(key, value)
            return [b"ok", value]

    def compare_set(self, key, expected, desired):
        with self.changed:
            stored, answer = compare_set_outcome(self.values.get(key), expected, desired)
            if stored is not None:
                self._store(key, stored)
            return [b"ok", answer]

    def wait(self, timeout, *keys):
        with self.changed:
            missing = self._missing_after(keys, timeout)
        return [b"timeout", *missing] if missing else [b"ok"]

    def check(self, *keys):
        with self.changed:
            return [b"ok", b"1" if all(key in self.values for key in keys) else b"0"]

    def delete_key(self, key):
        with self.changed:
            return [b"ok", b"0" if self.values.pop(key, None) is None else b"1"]

    def num_keys(self):
        with self.changed:
            return [b"ok", str(len(self.values)).encode()]


class _Server:
    """The master's listening socket and its threads. It lives as long as the master's TCPStore object."""

    def __init__(self, port):
        try:
            self._listener = _listen(port)
        except OSError as error:
            raise DistNetworkError(f"The server socket has failed to listen on any local network address. "
                                   f"port: {port}, message: {error.strerror}") from None
        self.port = self._listener.getsockname()[1]
        self.table = _Table()
        self._connections = set()
        self._lock = threading.Lock()
        self._answering = 0  # requests being handled and replied to, which close() lets finish
        self._all_answered = threading.Condition(self._lock)
        threading.Thread(target=self._accept, name=f"TCPStore server :{self.port}", daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self.table.closed:  # the listener was shut down
                    return
                time.sleep(0.1)  # e.g. out of file descriptors for now: the server goes on
                continue
            with self._lock:
                if self.table.closed:
                    connection.close()
                    return
                self._connections.add(connection)
            threading.Thread(target=self._serve, args=(connection,), name=f"TCPStore client of :{self.port}",
                             daemon=True).start()

    def _serve(self, connection):
        """Answers one client until it goes. A peer that breaks the protocol loses its connection, nothing more."""
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._greet(_recv(connection)):
                _send(connection, [b"ok"])
                while True:
                    self._answer(connection, _recv(connection))
        except (OSError, LookupError, TypeError, ValueError):
            pass
        finally:
            with self._lock:
                self._connections.discard(connection)
            connection.close()

    def _answer(self, connection, request):
        with self._lock:
            self._answering += 1
        try:
            _send(connection, self.table.handle(request))
        finally:
            with self._lock:
                self._answering -= 1
                self._all_answered.notify_all()

    def _greet(self, hello):
        """Whether `hello` is a TCPStore client's; one that joins counts towards `wait_for_workers`."""
        if hello[:2] != [b"hello", _MAGIC]:
            return False
        if hello[2:] == [b"join"]:
            with self.table.changed:
                self.table.joined += 1
                self.table.changed.notify_all()
        return True

    def wait_for_workers(self, world_size, timeout_s):
        table = self.table
        with table.changed:
            if not table.changed.wait_for(lambda: table.joined >= world_size, timeout_s):
                raise DistStoreError(f"Timed out after {timeout_s:g} seconds waiting for clients. "
                                     f"{table.joined}/{world_size} clients joined.")

    def close(self):
        """Stops accepting, wakes the blocked waits, lets the replies being sent finish (a rank that ends once the
        others' keys are set must not cut off the reply to the last set) and ends every connection, so the port is
        free again."""
        with self.table.changed:
            self.table.closed = True
            self.table.changed.notify_all()
        with self._lock:
            self._all_answered.wait_for(lambda: self._answering == 0, _CLOSE_GRACE_S)
            sockets = [self._listener, *self._connections]
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # not connected (the listener on some systems) or already gone
                pass
        self._listener.close()


def _listen(port):
    """Listens on every local address, as torch's server does, IPv6 too where the system has it."""
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", port))


def _open(host, port, join, timeout_s):
    """One connection, greeted; OSError when nothing answers, DistNetworkError when something else does."""
    sock = socket.create_connection((host, port), timeout=timeout_s)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _send(sock, [b"hello", _MAGIC, *([b"join"] if join else [])])
        reply = _recv(sock)
    except BaseException:
        sock.close()
        raise
    if reply != [b"ok"]:
        sock.close()
        raise DistNetworkError(f"({host}, {port}) answered the TCPStore greeting with {reply!r}: it is not a "
                               f"minitensor TCPStore server")
    return sock


def _connect(host, port, join, timeout_s):
    """The first connection to the server, retried until `timeout_s` passes: the master may not listen yet."""
    deadline = time.monotonic() + timeout_s
    pause = 0.01
    while True:
        try:
            return _open(host, port, join, max(deadline - time.monotonic(), _MIN_ATTEMPT_S))
        except OSError as error:
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


class TCPStore(Store):
    """torch.distributed.TCPStore. The master (`is_master=True`) serves the keys from this process; port 0
    picks a free port, which `.port` tells. With `world_size` and `wait_for_workers`, the master's constructor
    returns only once `world_size` stores (its own included) have connected, so it doubles as a start barrier.

    Unlike torch's, a store used by several threads at once opens a connection per concurrent request, so a
    thread blocked in `get` does not hold up another thread's `set` on the same store object."""

    def __init__(self, host_name, port, world_size=None, is_master=False, timeout=DEFAULT_TIMEOUT,
                 wait_for_workers=True):
        super().__init__(timeout)
        port = _check_arguments(host_name, port, world_size, is_master)
        self.host = host_name
        self._server = _Server(port) if is_master else None
        self.port = self._server.port if is_master else port
        # the master reaches its own server through the loopback address, which it always listens on
        self._address = "127.0.0.1" if is_master else host_name
        self._lock = threading.Lock()
        joins = world_size is not None and wait_for_workers
        try:
            self._idle = [_connect(self._address, self.port, joins, timeout.total_seconds())]  # connections not in use
        except BaseException:
            _close([], self._server)
            raise
        finalizer = weakref.finalize(self, _close, self._idle, self._server)
        if is_master and joins:
            try:
                self._server.wait_for_workers(world_size, timeout.total_seconds())
            except BaseException:
                finalizer()
                raise

    def _request(self, parts, wait_s=0.0):
        """(status, values) of one request, on an idle connection or a new one; a lost or silent server is a
        DistNetworkError."""
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        try:
            sock = sock or _open(self._address, self.port, False, _REPLY_GRACE_S)
            sock.settimeout(wait_s + _REPLY_GRACE_S)
            _send(sock, parts)
            status, *values = _recv(sock)
        except OSError as error:
            if sock is not None:
                sock.close()  # a reply may be half read: the connection cannot be trusted again
            raise DistNetworkError(f"TCPStore at ({self.host}, {self.port}): {error}") from None
        with self._lock:
            self._idle.append(sock)
        if status == b"error":
            raise DistStoreError(values[0].decode())
        return status, values

    def _set(self, key, value):
        self._request([b"set", key.encode(), value])

    def _get(self, key, timeout_s):
        status, values = self._request([b"get", key.encode(), repr(timeout_s).encode()], timeout_s)
        if status == b"timeout":
            raise DistStoreError(f"wait timeout after {_ms(timeout_s)}, keys: {key}")
        return values[0]

    def _add(self, key, amount):
        return int(self._request([b"add", key.encode(), str(amount).encode()])[1][0])

    def _compare_set(self, key, expected, desired):
        return self._request([b"compare_set", key.encode(), expected, desired])[1][0]

    def _wait(self, keys, timeout_s):
        status, missing = self._request([b"wait", repr(timeout_s).encode(), *(key.encode() for key in keys)],
                                        timeout_s)
        if status == b"timeout":
            raise DistStoreError(f"wait timeout after {_ms(timeout_s)}, keys: "
                                 f"{', '.join(key.decode() for key in missing)}")

    def _check(self, keys):
        return self._request([b"check", *(key.encode() for key in keys)])[1][0] == b"1"

    def _delete_key(self, key):
        return self._request([b"delete_key", key.encode()])[1][0] == b"1"

    def _num_keys(self):
        return int(self._request([b"num_keys"])[1][0])


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
