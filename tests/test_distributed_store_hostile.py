"""TCPStore against peers that are not well-behaved ranks: fields out of range or of the wrong form, peers that
connect and say nothing, more connections than the master serves, a process that cannot start threads, a peer
without the job's token; where the master listens; and timeouts of `timedelta.max`. Every socket is on
127.0.0.1; every wait has a bound."""
import contextlib
import datetime
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest

import minitensor as mt
import minitensor.distributed as dist
from minitensor.distributed import tcp_protocol as protocol
from minitensor.distributed import tcp_server
from minitensor.distributed.errors import DistNetworkError, DistStoreError
from minitensor.distributed.file_store import FileStore
from minitensor.distributed.rendezvous import rendezvous
from minitensor.distributed.store import PrefixStore
from minitensor.distributed.tcp_store import TCPStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "distributed_scripts")
SHORT = datetime.timedelta(seconds=0.5)
LONG = datetime.timedelta(seconds=30)
FOREVER = datetime.timedelta.max


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def no_thread_dies():
    """Fails if a thread ends with an uncaught exception meanwhile (a serving thread killed by a request)."""
    died = []
    previous, threading.excepthook = threading.excepthook, died.append
    try:
        yield
    finally:
        threading.excepthook = previous
    assert not died, [f"{d.thread.name}: {d.exc_type.__name__}: {d.exc_value}" for d in died]


def greeted(port, token=b""):
    """A raw connection that has greeted the master (as a client that does not join)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    protocol.send(sock, [b"hello", protocol.MAGIC, b"use", token])
    assert protocol.receive(sock, protocol.REPLY, 20, 20) == [b"ok"]
    return sock


def closed_by_peer(sock):
    """Whether the other side hung up (within the socket's timeout), reading whatever it sent before."""
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    return True


def server_threads(port):
    return [thread for thread in threading.enumerate() if thread.name == f"TCPStore client of :{port}"]


def eventually(condition, within_s=20.0):
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def master():
    return TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)


# ------------------------------------------------------------------------------------------- every field checked
BAD_REQUESTS = [  # (request, what the error names)
    ([b"get", b"k", b"1e10"], "a timeout of b'1e10'"),
    ([b"get", b"k", b"inf"], "a timeout of b'inf'"),
    ([b"get", b"k", b"nan"], "a timeout of b'nan'"),
    ([b"get", b"k", b"-1"], "a timeout of b'-1'"),
    ([b"get", b"k", b"1e309"], "a timeout of b'1e309'"),
    ([b"get", b"k", b""], "a timeout of b''"),
    ([b"get", b"k", b"0x10"], "a timeout of b'0x10'"),
    ([b"wait", b"infinity", b"k"], "a timeout of b'infinity'"),
    ([b"add", b"n", b"1.5"], "an amount of b'1.5'"),
    ([b"add", b"n", b"9223372036854775808"], "64-bit integer"),
    ([b"add", b"n", b"9" * 5000], "64-bit integer"),
    ([b"add", b"n", b" 1"], "an amount of b' 1'"),
    ([b"set", b"\xff\xfe", b"v"], "not UTF-8"),
    ([b"set", b"k" * (protocol.MAX_KEY_BYTES + 1), b"v"], f"a key of {protocol.MAX_KEY_BYTES + 1} bytes"),
    ([b"check", *[b"k"] * (protocol.MAX_KEYS + 1)], f"check of {protocol.MAX_KEYS + 1} keys"),
    ([b"set", b"k"], "set takes 2 arguments, got 1"),
    ([b"num_keys", b"extra"], "num_keys takes 0 arguments, got 1"),
    ([b"wait"], "wait takes 1 or more arguments, got 0"),
    ([], "an empty request"),
    ([b"frobnicate", b"k"], "unknown TCPStore command b'frobnicate'"),
]


def test_every_bad_field_gets_an_error_reply_and_the_connection_goes_on(master):
    """Before, a timeout of 1e10 or inf killed the serving thread (OverflowError, a traceback on the master and
    no reply), nan blocked it for good, and a key that is not UTF-8 cost the connection."""
    with no_thread_dies():
        sock = greeted(master.port)
        for request, named in BAD_REQUESTS:
            protocol.send(sock, request)
            status, message = protocol.receive(sock, protocol.REPLY, 20, 20)
            assert status == b"error" and named in message.decode(), (request[:3], message)
        protocol.send(sock, [b"num_keys"])  # the same connection still serves
        assert protocol.receive(sock, protocol.REPLY, 20, 20) == [b"ok", b"0"]
        sock.close()
        master.set("k", "v")
        assert TCPStore("127.0.0.1", master.port, timeout=LONG).get("k") == b"v"


@pytest.mark.parametrize("header", [struct.pack("!I", protocol.REQUEST.parts + 1),
                                    struct.pack("!II", 1, protocol.MAX_VALUE_BYTES + 1),
                                    struct.pack("!I", 2**32 - 1)])
def test_a_frame_beyond_the_limits_is_dropped_without_reading_it(master, header):
    sock = greeted(master.port)
    sock.sendall(header)
    assert closed_by_peer(sock)  # at once: the claimed bytes are never waited for
    assert master.num_keys() == 0


def test_the_client_checks_what_the_server_would_refuse(master):
    with pytest.raises(ValueError, match=f"keys are at most {protocol.MAX_KEY_BYTES} bytes"):
        master.set("k" * (protocol.MAX_KEY_BYTES + 1), "v")
    with pytest.raises(ValueError, match=f"names at most {protocol.MAX_KEYS} keys"):
        master.check(["k"] * (protocol.MAX_KEYS + 1))
    with pytest.raises(OverflowError, match="64-bit integer"):
        master.add("n", 2**63)
    assert master.add("n", 2**63 - 1) == 2**63 - 1


# ------------------------------------------------------------------------------------------------ silent peers
def test_a_peer_that_never_greets_is_dropped(monkeypatch, master):
    monkeypatch.setattr(tcp_server, "GREETING_S", 0.2)
    with socket.create_connection(("127.0.0.1", master.port), timeout=20) as silent:
        assert closed_by_peer(silent)  # before: held a thread and a connection for ever
    with socket.create_connection(("127.0.0.1", master.port), timeout=20) as slow:
        slow.sendall(struct.pack("!I", 4)[:3])  # a greeting begun, never finished
        assert closed_by_peer(slow)


def test_a_request_that_stops_halfway_is_dropped(monkeypatch, master):
    monkeypatch.setattr(tcp_server, "STALL_S", 0.2)
    sock = greeted(master.port)
    sock.sendall(struct.pack("!II", 2, 3) + b"se")  # [b"set", ...] cut short
    assert closed_by_peer(sock)
    assert master.num_keys() == 0


def test_an_idle_greeted_connection_stays(monkeypatch, master):
    """A client keeps its connection open between requests: that is not silence."""
    monkeypatch.setattr(tcp_server, "STALL_S", 0.2)
    client = TCPStore("127.0.0.1", master.port, timeout=LONG)
    time.sleep(0.5)
    client.set("k", "v")
    assert client.get("k") == b"v"


# ------------------------------------------------------------------------------------------ bounded connections
def test_connections_are_bounded_and_ungreeted_ones_make_room(monkeypatch):
    monkeypatch.setattr(tcp_server, "BASE_CONNECTIONS", 4)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)  # its own connection is one of the 4
    silent = [socket.create_connection(("127.0.0.1", master.port), timeout=20) for _ in range(10)]
    client = TCPStore("127.0.0.1", master.port, timeout=LONG)  # evicts the oldest silent one still there
    client.set("k", "v")
    assert master.get("k") == b"v"
    assert all(closed_by_peer(sock) for sock in silent[:8])  # the oldest went to make room, in order
    assert eventually(lambda: len(server_threads(master.port)) <= 4), len(server_threads(master.port))
    for sock in silent:
        sock.close()


def test_a_full_master_turns_newcomers_away_and_serves_again_once_one_goes(monkeypatch):
    monkeypatch.setattr(tcp_server, "BASE_CONNECTIONS", 2)
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    first = TCPStore("127.0.0.1", master.port, timeout=LONG)
    with pytest.raises(DistNetworkError, match="while trying to connect"):
        TCPStore("127.0.0.1", master.port, timeout=SHORT)
    del first  # its connection closes: a slot is free
    later = TCPStore("127.0.0.1", master.port, timeout=LONG)
    later.set("k", "v")
    assert master.get("k") == b"v"


def test_a_thread_that_cannot_start_costs_one_connection_not_the_server():
    """Before, the RuntimeError killed the accept thread: the master never accepted again."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.run([sys.executable, os.path.join(SCRIPTS, "store_no_threads.py")], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    result = json.loads(next(line for line in child.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result == {"thread_starts": False, "dropped": True, "after": "served"}


# ------------------------------------------------------------------------------------------------- job token
def test_a_peer_without_the_job_token_is_refused_and_never_counts():
    port, made = free_port(), []
    waiting = threading.Thread(target=lambda: made.append(TCPStore("127.0.0.1", port, 2, True, LONG,
                                                                   job_token="job-a")))
    waiting.start()
    with pytest.raises(DistStoreError, match="job token mismatch: .* presented no job token"):
        TCPStore("127.0.0.1", port, 2, timeout=LONG)
    with pytest.raises(DistStoreError, match="job token mismatch: .* does not match the master's .*"
                                             "MINITENSOR_JOB_TOKEN"):
        TCPStore("127.0.0.1", port, 2, timeout=LONG, job_token="job-b")
    assert waiting.is_alive() and not made  # neither refused peer counted as a rank
    member = TCPStore("127.0.0.1", port, 2, timeout=LONG, job_token="job-a")
    waiting.join(30)
    member.set("k", "v")
    assert made[0].get("k") == b"v"


def test_the_job_token_comes_from_the_environment(monkeypatch, master):
    monkeypatch.setenv("MINITENSOR_JOB_TOKEN", "from-the-launcher")
    guarded = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    TCPStore("127.0.0.1", guarded.port, timeout=LONG).set("k", "v")  # the same environment: admitted
    with pytest.raises(DistStoreError, match="presented no job token"):
        TCPStore("127.0.0.1", guarded.port, timeout=LONG, job_token="")
    TCPStore("127.0.0.1", master.port, timeout=LONG).set("k", "v")  # a master without a token admits anyone
    with pytest.raises(ValueError, match="a job token is at most 128 bytes"):
        TCPStore("127.0.0.1", guarded.port, timeout=LONG, job_token="x" * 129)


def launch(*args, token=None):
    environment = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    environment.pop("MINITENSOR_JOB_TOKEN", None)
    if token is not None:
        environment["MINITENSOR_JOB_TOKEN"] = token
    done = subprocess.run([sys.executable, "-m", "minitensor.distributed.run", "--mpiexec", "never", *map(str, args),
                           os.path.join(SCRIPTS, "store_job_token.py")], cwd=REPO, env=environment,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted((json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")),
                  key=lambda result: result["rank"])


def test_the_launcher_gives_its_ranks_one_random_token():
    ranks = launch("--nproc-per-node", 2)
    assert [r["rank"] for r in ranks] == [0, 1]
    token = ranks[0]["token"]
    assert len(token) == 32 and int(token, 16) >= 0 and ranks[1]["token"] == token
    assert "job token mismatch" in ranks[0]["outsider"]
    given = launch("--nproc-per-node", 1, token="shared-by-every-node")
    assert given[0]["token"] == "shared-by-every-node" and "job token mismatch" in given[0]["outsider"]


# ------------------------------------------------------------------------------------------ where it listens
def listening_on(port):
    """The addresses (hex, as /proc/net/tcp* writes them) that sockets listen on at `port`."""
    found = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(path) as table:
            for line in table.read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux's socket table")
def test_the_master_listens_on_its_address_only(master):
    """Before, it listened on every interface (0.0.0.0 / ::) whatever the master's address was."""
    assert listening_on(master.port) == ["0100007F"]  # 127.0.0.1


def test_localhost_and_an_unknown_host():
    local = TCPStore("localhost", 0, is_master=True, timeout=LONG)
    TCPStore("localhost", local.port, timeout=LONG).set("k", "v")
    assert local.get("k") == b"v"
    with pytest.raises(DistNetworkError, match="failed to listen on no-such-host.invalid"):
        TCPStore("no-such-host.invalid", 0, is_master=True, timeout=SHORT)


# ---------------------------------------------------------------------------------- timeouts of timedelta.max
def test_timedelta_max_waits_practically_forever(tmp_path):
    """Before, the constructor raised OverflowError (a socket timeout and a lock wait that long overflow)."""
    master = TCPStore("127.0.0.1", 0, 2, True, FOREVER, wait_for_workers=False)
    client = TCPStore("127.0.0.1", master.port, 2, timeout=FOREVER)
    assert master.timeout == FOREVER
    threading.Timer(0.2, lambda: master.set("late", "now")).start()
    assert client.get("late") == b"now"
    threading.Timer(0.2, lambda: master.set("p/later", "")).start()
    PrefixStore("p", client).wait(["later"], FOREVER)
    client.wait(["p/later"], FOREVER)
    store = FileStore(tmp_path / "store")
    store.set_timeout(FOREVER)
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_rendezvous_and_init_process_group_take_timedelta_max():
    store, rank, world_size = rendezvous(f"tcp://127.0.0.1:{free_port()}", 0, 1, timeout=FOREVER)
    assert (rank, world_size, store.timeout) == (0, 1, FOREVER)
    pytest.importorskip("mpi4py")
    dist.init_process_group("mpi", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=FOREVER)
    try:
        t = mt.ones(3, device="cuda")
        dist.all_reduce(t, group=dist.new_group([0]))
        assert t.cpu().numpy().tolist() == [1.0, 1.0, 1.0]
    finally:
        dist.destroy_process_group()
