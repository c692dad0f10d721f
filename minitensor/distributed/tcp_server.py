"""The TCPStore master's server: the keys, and the threads that answer the ranks over TCP.

One daemon thread accepts; one per connection answers that client's requests in order. A `get` or `wait` blocks
its connection's thread on a condition variable until the keys are set or the timeout passes, so waiting costs
no polling and no traffic. The port is open to whoever reaches the address it listens on, so the server bounds
what a peer can take: at most BASE_CONNECTIONS + 4 per rank connections (at the limit, the oldest one that has not yet
greeted makes room, else the newcomer is turned away), a greeting within GREETING_S of connecting, each
message's bytes without a pause of STALL_S once it has begun, and a job token (when the master has one) before
any request. A thread that cannot start loses its connection, never the accept loop.
"""
import hmac
import socket
import threading
import time

from . import tcp_protocol as protocol
from .errors import DistNetworkError, DistStoreError
from .store import added, compare_set_outcome

GREETING_S = 10.0  # from connecting to a whole greeting
STALL_S = 30.0  # the longest pause inside a message, or while a reply is being taken
BASE_CONNECTIONS = 1024  # the connection limit is this plus 4 per rank of the job (its world_size)
_CLOSE_GRACE_S = 5.0  # for replies being sent when the server closes: a client that stopped reading gets no more
_RETRY_PAUSE_S = 0.05  # after the system refused a socket or a thread for now


class _Table:
    """The server's keys, and the condition variable that wakes blocked `get`s and `wait`s when one is set.
    Its methods take checked arguments (protocol.parse_request) and return the reply."""

    def __init__(self):
        self.values = {}
        self.joined = 0
        self.closed = False
        self.changed = threading.Condition()
        self.commands = {b"set": self.set, b"get": self.get, b"add": self.add, b"compare_set": self.compare_set,
                         b"wait": self.wait, b"check": self.check, b"delete_key": self.delete_key,
                         b"num_keys": self.num_keys}

    def handle(self, request):
        """The reply to a request; one that is not valid is answered with an error naming what is wrong."""
        try:
            command, arguments = protocol.parse_request(request)
        except protocol.BadRequest as error:
            return [b"error", f"bad TCPStore request: {error}".encode()]
        return self.commands[command](*arguments)

    def _store(self, key, value):
        self.values[key] = value
        self.changed.notify_all()

    def _missing_after(self, keys, timeout_s):
        """Waits (holding `changed`) until every key is set, the timeout passes or the server closes."""
        self.changed.wait_for(lambda: self.closed or all(key in self.values for key in keys), timeout_s)
        return [key for key in keys if key not in self.values]

    def set(self, key, value):
        with self.changed:
            self._store(key, value)
        return [b"ok"]

    def get(self, key, timeout_s):
        with self.changed:
            return [b"timeout", key] if self._missing_after([key], timeout_s) else [b"ok", self.values[key]]

    def add(self, key, amount):
        with self.changed:
            try:
                value = added(self.values.get(key), key.decode(), amount)
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

    def wait(self, timeout_s, keys):
        with self.changed:
            missing = self._missing_after(keys, timeout_s)
        return [b"timeout", *missing] if missing else [b"ok"]

    def check(self, keys):
        with self.changed:
            return [b"ok", b"1" if all(key in self.values for key in keys) else b"0"]

    def delete_key(self, key):
        with self.changed:
            return [b"ok", b"0" if self.values.pop(key, None) is None else b"1"]

    def num_keys(self):
        with self.changed:
            return [b"ok", str(len(self.values)).encode()]


class Server:
    """The master's listening socket and its threads. It lives as long as the master's TCPStore object."""

    def __init__(self, host: str, port: int, token: str, world_size: "int | None") -> None:
        try:
            self._listener = _listen(host, port)
        except OSError as error:
            raise DistNetworkError(f"The server socket has failed to listen on {host}. port: {port}, message: "
                                   f"{error.strerror or error}") from None
        self.address = _reachable(self._listener.getsockname())
        self.port = self.address[1]
        self.table = _Table()
        self._token = token.encode()
        self._limit = BASE_CONNECTIONS + 4 * (world_size or 0)
        self._pending = {}  # connections not yet greeted, oldest first
        self._greeted = set()
        self._lock = threading.Lock()
        self._answering = 0  # requests being handled and replied to, which close() lets finish
        self._all_answered = threading.Condition(self._lock)
        try:
            threading.Thread(target=self._accept, name=f"TCPStore server :{self.port}", daemon=True).start()
        except BaseException:  # e.g. no thread can start now: the port is not left taken
            self._listener.close()
            raise

    def _accept(self):
        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                if self.table.closed:  # the listener was shut down
                    return
                time.sleep(_RETRY_PAUSE_S)  # e.g. out of file descriptors for now: the server goes on
                continue
            with self._lock:
                if self.table.closed:
                    connection.close()
                    return
                admitted = self._make_room()
                if admitted:
                    self._pending[connection] = None
            if not admitted:
                _turn_away(connection, self._limit)
                continue
            try:
                threading.Thread(target=self._serve, args=(connection,), name=f"TCPStore client of :{self.port}",
                                 daemon=True).start()
            except RuntimeError:  # "can't start new thread": this peer is dropped, the next may find one
                self._forget(connection)
                connection.close()
                time.sleep(_RETRY_PAUSE_S)

    def _make_room(self):
        """Whether a new connection fits (holding the lock): at the limit, the oldest ungreeted one goes."""
        if len(self._pending) + len(self._greeted) < self._limit:
            return True
        if not self._pending:
            return False
        oldest = next(iter(self._pending))
        del self._pending[oldest]
        _shut(oldest)  # its thread sees the end of the stream and closes it
        return True

    def _forget(self, connection):
        with self._lock:
            self._pending.pop(connection, None)
            self._greeted.discard(connection)

    def _serve(self, connection):
        """Answers one client until it goes. A peer that breaks the protocol loses its connection, nothing more."""
        try:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._admit(connection):
                while True:
                    request = protocol.receive(connection, protocol.REQUEST, None, STALL_S)
                    self._answer(connection, request)
        except (OSError, protocol.ProtocolError):  # gone, silent, or not speaking this protocol: dropped
            pass
        finally:
            self._forget(connection)
            connection.close()

    def _admit(self, connection):
        """Reads the greeting; whether the peer is a TCPStore client of this job (else it was told why not).
        One that joins counts towards `wait_for_workers`."""
        hello = protocol.receive(connection, protocol.GREETING, GREETING_S, GREETING_S,
                                 time.monotonic() + GREETING_S)
        refusal = self._refusal(hello)
        connection.settimeout(STALL_S)
        if refusal:
            protocol.send(connection, [b"error", refusal.encode()])
            return False
        with self._lock:
            if connection not in self._pending:  # it made room for a newer one meanwhile
                return False
            del self._pending[connection]
            self._greeted.add(connection)
        if hello[2] == b"join":
            with self.table.changed:
                self.table.joined += 1
                self.table.changed.notify_all()
        protocol.send(connection, [b"ok"])
        return True

    def _refusal(self, hello):
        """Why the greeting `hello` is refused, or "" for a client of this job."""
        if len(hello) != 4 or hello[:2] != [b"hello", protocol.MAGIC] or hello[2] not in (b"join", b"use"):
            return (f"not a {protocol.MAGIC.decode()} greeting ({len(hello)} parts, starting "
                    f"{hello[:2]!r}): the peer is not a TCPStore client of this minitensor version")
        if not self._token or hmac.compare_digest(hello[3], self._token):
            return ""
        how = "presented no job token" if not hello[3] else "presented a job token that does not match the master's"
        return (f"job token mismatch: this TCPStore serves one job, and the peer {how} "
                f"({protocol.JOB_TOKEN_ENV}: the launcher gives each of its ranks the job's token; the ranks of a "
                f"multi-node job need the same {protocol.JOB_TOKEN_ENV} on every node)")

    def _answer(self, connection, request):
        with self._lock:
            self._answering += 1
        try:
            protocol.send(connection, self.table.handle(request))
        finally:
            with self._lock:
                self._answering -= 1
                self._all_answered.notify_all()

    def wait_for_workers(self, world_size: int, timeout_s: float) -> None:
        """Blocks until `world_size` clients that join have greeted, else DistStoreError after `timeout_s`."""
        table = self.table
        with table.changed:
            if not table.changed.wait_for(lambda: table.joined >= world_size, timeout_s):
                raise DistStoreError(f"Timed out after {timeout_s:g} seconds waiting for clients. "
                                     f"{table.joined}/{world_size} clients joined.")

    def close(self) -> None:
        """Stops accepting, wakes the blocked waits, lets the replies being sent finish (a rank that ends once the
        others' keys are set must not cut off the reply to the last set) and ends every connection, so the port is
        free again."""
        with self.table.changed:
            self.table.closed = True
            self.table.changed.notify_all()
        with self._lock:
            self._all_answered.wait_for(lambda: self._answering == 0, _CLOSE_GRACE_S)
            sockets = [self._listener, *self._pending, *self._greeted]
        for sock in sockets:
            _shut(sock)
        self._listener.close()


def _shut(sock):
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # not connected (the listener on some systems) or already gone
        pass


def _turn_away(connection, limit):
    """Tells a peer the server has no room (without waiting on it), and hangs up."""
    try:
        connection.setblocking(False)
        protocol.send(connection, [b"busy", f"the TCPStore master serves {limit} connections already".encode()])
    except OSError:
        pass
    connection.close()


def _listen(host, port):
    """Listens on the address `host` names (the first the resolver gives): loopback for a job on one node,
    rather than every interface as torch does; a wildcard name ("0.0.0.0", "::") still means every one."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return socket.create_server(address, family=family)


def _reachable(address):
    """(host, port) the master's own client connects to: the listening address, loopback for a wildcard."""
    host, port = address[:2]
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), port
