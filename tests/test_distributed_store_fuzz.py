"""A fuzzer of the TCPStore wire format: mutated and random frames (greetings and requests, fixed seed, a bounded
number of cases) sent to a real master on 127.0.0.1. The master must answer each with well-formed replies or
hang up, never lose a serving thread to an exception, and keep serving a valid client throughout."""
import datetime
import random
import selectors
import socket
import struct
import threading
import time

from minitensor.distributed import tcp_protocol as protocol
from minitensor.distributed.tcp_store import TCPStore

SEED = 20240611
BATCHES, PER_BATCH = 8, 40
TOKEN = b"fuzz-job-token"
LONG = datetime.timedelta(seconds=30)
QUIET_S = 1.0  # a connection silent this long is taken as blocked in a wait, and checked once the master closes
ODD_FIELDS = [b"1e10", b"inf", b"-inf", b"nan", b"-1", b"1e309", b"", b"0x10", b"1" * 40, b"\xff\xfe", b"-0",
              b"9223372036854775808", b"1.5", b" 1", b"\x00", b"0" * 70000, b"e", b"+-", b"1e", b"..."]


def frame(parts):
    return b"".join([struct.pack("!I", len(parts)), *(struct.pack("!I", len(p)) + p for p in parts)])


TEMPLATES = [[b"set", b"k", b"value"], [b"get", b"present", b"0"], [b"get", b"absent", b"0.01"], [b"add", b"n", b"5"],
             [b"compare_set", b"present", b"v", b"w"], [b"wait", b"0", b"present"], [b"wait", b"0.01", b"absent"],
             [b"check", b"k", b"present"], [b"delete_key", b"gone"], [b"num_keys"]]


def requests(rng):
    """A valid request, to mutate (one that waits, waits a moment at most)."""
    request = list(rng.choice(TEMPLATES))
    if request[0] == b"set":
        request[1:] = [rng.choice([b"present", b"k", "é".encode(), b"n"]), rng.randbytes(rng.randrange(8))]
    return request


def every_odd_field():
    """Each odd field in each argument of each template: the grammar's corners, beside the random cases."""
    return [template[:at] + [odd] + template[at + 1:] for template in TEMPLATES
            for at in range(1, len(template)) for odd in ODD_FIELDS]


def mutate_parts(parts, rng):
    parts = list(parts)
    for _ in range(rng.randrange(1, 3)):
        choice = rng.randrange(4)
        if choice == 0 and parts:
            parts[rng.randrange(len(parts))] = rng.choice(ODD_FIELDS)
        elif choice == 1:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(ODD_FIELDS))
        elif choice == 2 and parts:
            del parts[rng.randrange(len(parts))]
        else:
            parts = parts[:1] + [rng.randbytes(rng.randrange(1, 12)) for _ in range(rng.randrange(4))]
    return parts


def mutate_bytes(data, rng):
    data = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        choice = rng.randrange(4)
        at = rng.randrange(len(data) + 1)
        if choice == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rng.randrange(8)
        elif choice == 1:
            data[at:at] = rng.randbytes(rng.randrange(1, 9))
        elif choice == 2:
            del data[at:]
        else:  # a length or count field of any size
            data[at:at + 4] = struct.pack("!I", rng.choice([0, 1, 2, 5, 2**16, 2**31, 2**32 - 1,
                                                            rng.randrange(2**32)]))
    return bytes(data)


def case(rng):
    """The bytes one fuzzing connection sends."""
    greeting = [b"hello", protocol.MAGIC, rng.choice([b"use", b"join"]), TOKEN]
    kind = rng.randrange(10)
    if kind == 0:  # not this protocol at all
        return rng.randbytes(rng.randrange(1, 64))
    if kind == 1:  # a greeting that is wrong, then a request
        return frame(mutate_parts(greeting, rng)) + frame(requests(rng))
    if kind == 2:
        return mutate_bytes(frame(greeting), rng) + frame(requests(rng))
    body = [frame(requests(rng)) for _ in range(rng.randrange(3))]
    bad = frame(mutate_parts(requests(rng), rng)) if kind < 7 else mutate_bytes(frame(requests(rng)), rng)
    body.insert(rng.randrange(len(body) + 1), bad)
    return frame(greeting) + b"".join(body)


def replies(data):
    """The complete messages in `data`, and whether bytes of an incomplete one follow."""
    messages, at = [], 0
    while at + 4 <= len(data):
        (count,) = struct.unpack_from("!I", data, at)
        parts, cursor = [], at + 4
        for _ in range(count):
            if cursor + 4 > len(data):
                return messages, True
            (size,) = struct.unpack_from("!I", data, cursor)
            parts.append(data[cursor + 4:cursor + 4 + size])
            cursor += 4 + size
        if cursor > len(data):
            return messages, True
        messages.append(parts)
        at = cursor
    return messages, at < len(data)


def check_answers(received, reset):
    """Well-formed replies (a reset connection may cut the last one short)."""
    messages, partial = replies(bytes(received))
    assert not partial or reset, bytes(received)[:200]
    for message in messages:
        assert message and message[0] in (b"ok", b"error", b"timeout", b"busy"), message[:2]
        if message[0] == b"error":
            assert len(message) == 2 and message[1], message


def send_all(port, payloads):
    """One connection per payload, each sent and half-closed: the master sees the end of what it was sent."""
    connections = []
    for payload in payloads:
        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the master hung up while we sent: allowed
            pass
        sock.setblocking(False)
        connections.append([sock, bytearray(), False])
    return connections


def drain(connections, quiet_s):
    """Reads each connection until the master closes it, or until none has sent anything for `quiet_s`; returns
    the ones still open."""
    selector = selectors.DefaultSelector()
    for connection in connections:
        selector.register(connection[0], selectors.EVENT_READ, connection)
    open_ = set(range(len(connections)))
    last = time.monotonic()
    while open_ and time.monotonic() - last < quiet_s:
        for key, _ in selector.select(0.05):
            sock, received, _ = connection = key.data
            try:
                chunk = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            except ConnectionResetError:
                chunk, connection[2] = b"", True
            last = time.monotonic()
            if chunk:
                received += chunk
                continue
            selector.unregister(sock)
            sock.close()
            check_answers(received, connection[2])
            open_.discard(connections.index(connection))
    selector.close()
    return [connections[index] for index in open_]


def test_the_master_survives_fuzzed_frames():
    rng = random.Random(SEED)
    died = []
    previous, threading.excepthook = threading.excepthook, died.append
    try:
        master = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG, job_token=TOKEN.decode())
        master.set("present", "v")
        client = TCPStore("127.0.0.1", master.port, timeout=LONG, job_token=TOKEN.decode())
        greeting = frame([b"hello", protocol.MAGIC, b"use", TOKEN])
        systematic = [greeting + frame(request) for request in every_odd_field()]
        blocked = []
        for batch in range(BATCHES):
            payloads = systematic[batch::BATCHES] + [case(rng) for _ in range(PER_BATCH)]
            blocked += drain(send_all(master.port, payloads), QUIET_S)
            client.set(f"alive/{batch}", str(batch))  # a valid client is served between batches
            assert master.get(f"alive/{batch}") == str(batch).encode() and client.add("count", 1) == batch + 1
        assert len(blocked) < len(systematic) // 4, len(blocked)  # most fuzzed connections ended at once
        del master, client  # the master closes: requests blocked in a wait are answered, connections end
        assert not drain(blocked, 20.0)
        assert not died, [f"{d.thread.name}: {d.exc_type.__name__}: {d.exc_value}" for d in died]
    finally:
        threading.excepthook = previous
