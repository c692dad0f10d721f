"""minitensor.distributed's stores (TCPStore, FileStore, PrefixStore) and rendezvous, against torch's where
installed. Several processes run as children with a hard timeout, so a hang fails instead of blocking."""
import datetime
import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from minitensor.distributed.errors import DistError, DistNetworkError, DistStoreError
from minitensor.distributed.file_store import FileStore
from minitensor.distributed.rendezvous import rendezvous
from minitensor.distributed.store import PrefixStore, Store
from minitensor.distributed import tcp_server
from minitensor.distributed.tcp_store import TCPStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "tests", "distributed_scripts")
SHORT = datetime.timedelta(seconds=0.5)
LONG = datetime.timedelta(seconds=30)


def free_port():
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def spawn(script, *args):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, os.path.join(SCRIPTS, script), *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result_of(child):
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


@pytest.fixture
def master():
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    yield store


@pytest.fixture(params=["tcp", "file", "prefix"])
def store(request, tmp_path):
    """Each kind of store, seen from a second handle where the kind has one (a client, a second opener)."""
    if request.param == "tcp":
        server = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
        yield TCPStore("127.0.0.1", server.port, timeout=LONG)
    elif request.param == "file":
        FileStore(tmp_path / "store")  # another user of the file: keys set through it must not break ours
        yield FileStore(tmp_path / "store")
    else:
        yield PrefixStore("group", TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG))


def test_errors_are_torchs_hierarchy():
    assert issubclass(DistError, RuntimeError)
    assert all(issubclass(kind, DistError) for kind in (DistNetworkError, DistStoreError))


def test_set_get_bytes_and_str(store):
    store.set("text", "héllo")
    store.set("raw", bytes(range(256)))
    store.set("empty", b"")
    assert store.get("text") == "héllo".encode()
    assert store.get("raw") == bytes(range(256))
    assert store.get("empty") == b""
    store.set("text", bytearray(b"again"))
    assert store.get("text") == b"again"


def test_add_counts_and_reads_as_digits(store):
    assert store.add("n", 5) == 5
    assert store.add("n", -7) == -2
    assert store.get("n") == b"-2"
    store.set("word", "seven")
    with pytest.raises(DistStoreError, match="word' holds b'seven', not an integer"):
        store.add("word", 1)
    assert store.get("word") == b"seven"


def test_compare_set_follows_torch(store):
    assert store.compare_set("k", "", "first") == b"first"  # unset and expected empty: set
    assert store.compare_set("unset", "x", "y") == b"x"  # unset, expected not empty: unchanged
    assert not store.check(["unset"])
    assert store.compare_set("k", "first", "second") == b"second"
    assert store.compare_set("k", "wrong", "third") == b"second"
    assert store.get("k") == b"second"


def test_check_delete_num_keys(store):
    before = store.num_keys()
    store.set("a", "1")
    store.set("b", "2")
    assert store.num_keys() == before + 2
    assert store.check(["a", "b"]) and not store.check(["a", "c"])
    assert store.delete_key("a") is True
    assert store.delete_key("a") is False
    assert store.num_keys() == before + 1
    assert not store.check(["a"])


def test_get_and_wait_time_out_naming_the_keys(store):
    store.set_timeout(SHORT)
    store.set("there", "1")
    start = time.monotonic()
    with pytest.raises(DistStoreError, match="missing") as info:
        store.get("missing")
    assert "500" in str(info.value) and 0.45 < time.monotonic() - start < 5
    with pytest.raises(DistStoreError) as info:
        store.wait(["there", "gone1", "gone2"], datetime.timedelta(seconds=0.2))
    message = str(info.value)
    assert "gone1" in message and "gone2" in message and "there" not in message and "after 200" in message
    store.wait(["there"])


def test_blocking_get_is_released_by_a_later_set(store):
    got = {}

    def reader():
        start = time.monotonic()
        got["value"], got["waited"] = store.get("late"), time.monotonic() - start

    thread = threading.Thread(target=reader)
    thread.start()
    time.sleep(0.2)
    assert "value" not in got
    store.set("late", "now")
    thread.join(10)
    assert got["value"] == b"now" and got["waited"] >= 0.15


def test_arguments_are_checked(store):
    with pytest.raises(TypeError, match="value must be str or bytes, got int"):
        store.set("k", 3)
    with pytest.raises(TypeError, match="key must be a str, got int"):
        store.get(3)
    with pytest.raises(TypeError, match="keys must be a list of str, got str"):
        store.wait("k")
    with pytest.raises(TypeError, match="timeout must be a datetime.timedelta, got int"):
        store.set_timeout(5)
    with pytest.raises(ValueError, match="must not be negative"):
        store.wait(["k"], datetime.timedelta(seconds=-1))
    store.set_timeout(datetime.timedelta(seconds=7))
    assert store.timeout == datetime.timedelta(seconds=7)


def test_store_is_abstract():
    with pytest.raises(TypeError):
        Store()


def test_same_results_as_torch(master):
    torch_dist = pytest.importorskip("torch.distributed")
    theirs = torch_dist.TCPStore("127.0.0.1", 0, 1, True, LONG)
    mine = TCPStore("127.0.0.1", master.port, timeout=LONG)
    steps = [("set", "a", "x"), ("get", "a"), ("add", "n", 3), ("add", "n", -10), ("get", "n"),
             ("compare_set", "a", "x", "y"), ("compare_set", "a", "x", "z"), ("compare_set", "b", "", "new"),
             ("compare_set", "c", "q", "w"), ("check", ["a", "b"]), ("check", ["c"]), ("delete_key", "a"),
             ("delete_key", "a"), ("check", ["a"]), ("set", "bin", b"\x00\xff"), ("get", "bin")]
    for method, *args in steps:
        assert getattr(mine, method)(*args) == getattr(theirs, method)(*args), (method, args)


def test_master_waits_for_workers():
    port, stores, errors = free_port(), [], []

    def make(is_master):
        try:
            stores.append(TCPStore("127.0.0.1", port, 3, is_master, LONG))
        except Exception as error:  # reported by the assert below
            errors.append(error)

    master = threading.Thread(target=make, args=(True,))
    master.start()
    time.sleep(0.2)
    clients = [threading.Thread(target=make, args=(False,)) for _ in range(2)]
    assert master.is_alive()  # still waiting: only its own store has joined
    for thread in clients:
        thread.start()
    for thread in [master, *clients]:
        thread.join(20)
    assert not errors and len(stores) == 3
    stores[0].set("shared", "yes")
    assert {store.get("shared") for store in stores} == {b"yes"}


def test_master_times_out_when_workers_are_missing():
    start = time.monotonic()
    with pytest.raises(DistStoreError, match=r"Timed out after 0.5 seconds waiting for clients. 1/3 clients joined."):
        TCPStore("127.0.0.1", 0, 3, True, SHORT)
    assert time.monotonic() - start < 5


def test_client_without_server_times_out():
    start = time.monotonic()
    with pytest.raises(DistNetworkError, match=r"timed out after 500ms while trying to connect to \(127.0.0.1, "):
        TCPStore("127.0.0.1", free_port(), timeout=SHORT)
    assert time.monotonic() - start < 5


def test_port_in_use_and_bad_ports(master):
    with pytest.raises(DistNetworkError, match=f"failed to listen .* port: {master.port}"):
        TCPStore("127.0.0.1", master.port, is_master=True, timeout=SHORT)
    with pytest.raises(ValueError, match="port must have value from 0 to 65535 but was 70000."):
        TCPStore("127.0.0.1", 70000, timeout=SHORT)
    with pytest.raises(ValueError, match="a client needs the master's port"):
        TCPStore("127.0.0.1", 0, timeout=SHORT)


def test_a_non_store_peer_is_refused(master):
    with socket.create_connection(("127.0.0.1", master.port)) as intruder:
        intruder.sendall(b"GET / HTTP/1.1\r\n\r\n")
        try:
            assert intruder.recv(10) == b""  # the server hangs up on it...
        except ConnectionResetError:
            pass
    assert TCPStore("127.0.0.1", master.port, timeout=LONG).num_keys() == 0  # ...and goes on serving


def test_server_closes_with_its_store():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)
    client = TCPStore("127.0.0.1", master.port, timeout=LONG)
    port = master.port
    del master
    with pytest.raises(DistNetworkError, match=f"TCPStore at \\(127.0.0.1, {port}\\)"):
        client.get("anything")
    with pytest.raises(DistNetworkError, match="Connection refused"):  # at once, not after the timeout
        client.set("anything", "")
    assert TCPStore("127.0.0.1", port, is_master=True, timeout=LONG).port == port  # the port is free again


def test_a_reply_in_flight_outlives_the_masters_close(monkeypatch):
    """The master going away just as it answers a set must still send that answer: rank 0 waiting for keys the
    other ranks set, then ending, must not cut off the last setter's reply (the serving thread here pauses
    between storing the key and replying, as a descheduled one would)."""
    stored = threading.Event()
    original = tcp_server._Table.set

    def set_then_pause(table, key, value):
        reply = original(table, key, value)
        stored.set()
        time.sleep(0.3)
        return reply
    monkeypatch.setattr(tcp_server._Table, "set", set_then_pause)
    masters = [TCPStore("127.0.0.1", 0, is_master=True, timeout=LONG)]
    client = TCPStore("127.0.0.1", masters[0].port, timeout=LONG)
    closer = threading.Thread(target=lambda: stored.wait(30) and masters.clear())  # the last reference: it closes
    closer.start()
    client.set("done/1", "")
    closer.join(30)
    assert not masters


def test_one_client_shared_by_threads(master):
    client = TCPStore("127.0.0.1", master.port, timeout=LONG)
    threads = [threading.Thread(target=lambda: [client.add("count", 1) for _ in range(100)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert master.get("count") == b"400"


def test_tcp_clients_in_other_processes():
    master = TCPStore("127.0.0.1", 0, 3, True, LONG, wait_for_workers=False)
    children = [spawn("store_tcp_client.py", master.port, name) for name in ("one", "two")]
    time.sleep(0.3)
    master.set("go", "released")
    master.wait(["from/one", "from/two"])
    assert master.get("counter") == b"100"  # 2 x 50 adds, none lost
    master.set("counter_checked", "")
    results = [result_of(child) for child in children]
    assert all(r["released"] == "released" and r["increasing"] and r["counter"] == 100 for r in results)
    assert results[0]["leader"] == results[1]["leader"] in ("one", "two")
    assert master.get("from/one") == b"\x00\xffone"


def test_file_store_across_processes(tmp_path):
    path = tmp_path / "shared"
    results = [result_of(child) for child in [spawn("store_file_worker.py", path, rank) for rank in (0, 1)]]
    assert [r["other"] for r in results] == ["hello from 1", "hello from 0"]
    assert [r["counter"] for r in results] == [100, 100]
    assert sorted(r["won"] for r in results) == [False, True]
    assert results[0]["leader"] == results[1]["leader"]
    assert not path.exists()  # the last of world_size=2 users removed it


def test_file_store_lifetime(tmp_path):
    kept, counted = tmp_path / "kept", tmp_path / "counted"
    store = FileStore(kept)
    store.set("k", "v")
    del store
    assert kept.exists() and FileStore(kept).get("k") == b"v"  # world_size -1: the file stays
    first, second = FileStore(counted, 2), FileStore(counted, 2)
    del first
    assert counted.exists() and second.check([]) is True
    del second
    assert not counted.exists()
    with pytest.raises(DistStoreError, match="FileStore cannot use .*: No such file or directory"):
        FileStore(tmp_path / "no" / "such" / "folder")
    with pytest.raises(ValueError, match="world_size must be -1 .* got 0"):
        FileStore(tmp_path / "zero", 0)


def test_prefix_store_isolates_keys(master):
    first, second = PrefixStore("first", master), PrefixStore("second", master)
    first.set("key", "1")
    second.set("key", "2")
    assert (first.get("key"), second.get("key"), master.get("first/key")) == (b"1", b"2", b"1")
    nested = PrefixStore("inner", first)
    nested.add("count", 4)
    assert master.get("first/inner/count") == b"4" and not second.check(["inner/count"])
    assert first.underlying_store is master
    first.set_timeout(SHORT)
    assert master.timeout == SHORT
    with pytest.raises(DistStoreError, match="first/absent"):
        first.get("absent")


# ------------------------------------------------------------------------------------------- rendezvous
ENV = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def rendezvous_in_threads(init_method, world_size, **kwargs):
    """{rank: (store, rank, world_size)} of `world_size` threads that each call rendezvous."""
    results = {}

    def meet(rank):
        results[rank] = rendezvous(init_method, rank=rank, world_size=world_size, timeout=LONG, **kwargs)

    threads = [threading.Thread(target=meet, args=(rank,)) for rank in range(world_size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def check_group(results, world_size):
    assert sorted(results) == list(range(world_size))
    for rank, (store, got_rank, got_size) in results.items():
        assert (got_rank, got_size) == (rank, world_size)
        store.set(f"hello/{rank}", str(rank))
    assert [results[0][0].get(f"hello/{rank}") for rank in range(world_size)] == [b"0", b"1", b"2"][:world_size]


def test_env_rendezvous(clean_env):
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    clean_env.setenv("MASTER_PORT", str(free_port()))
    results = rendezvous_in_threads("env://", 3)
    check_group(results, 3)
    assert isinstance(results[0][0], TCPStore)


def test_env_rendezvous_reads_rank_and_size(clean_env):
    for name, value in zip(ENV, ("127.0.0.1", str(free_port()), "0", "1")):
        clean_env.setenv(name, value)
    store, rank, world_size = rendezvous("env://", timeout=LONG)
    assert (rank, world_size) == (0, 1)
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_tcp_rendezvous():
    check_group(rendezvous_in_threads(f"tcp://127.0.0.1:{free_port()}", 2), 2)


def test_tcp_rendezvous_with_rank_in_the_url():
    port = free_port()
    results = {}
    threads = [threading.Thread(target=lambda r=r: results.update(
        {r: rendezvous(f"tcp://127.0.0.1:{port}?rank={r}&world_size=2", timeout=LONG)})) for r in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    check_group(results, 2)


def test_file_rendezvous(tmp_path):
    results = rendezvous_in_threads(f"file://{tmp_path / 'rdzv'}", 2)
    check_group(results, 2)
    assert results[1][0].timeout == LONG


def test_rendezvous_times_out_when_a_rank_never_comes(clean_env):
    clean_env.setenv("MASTER_ADDR", "127.0.0.1")
    clean_env.setenv("MASTER_PORT", str(free_port()))
    start = time.monotonic()
    with pytest.raises(DistStoreError, match="1/2 clients joined"):
        rendezvous("env://", rank=0, world_size=2, timeout=SHORT)
    with pytest.raises(DistNetworkError, match="timed out after 500ms"):
        rendezvous("env://", rank=1, world_size=2, timeout=SHORT)
    assert time.monotonic() - start < 10


BAD_METHODS = [  # (init_method, rank, world_size, environment, exception)
    ("env://", -1, -1, {}, ValueError),
    ("env://", -1, -1, {"RANK": "0"}, ValueError),
    ("env://", -1, -1, {"RANK": "0", "WORLD_SIZE": "2"}, ValueError),
    ("env://", 0, 2, {"MASTER_ADDR": "127.0.0.1"}, ValueError),
    ("tcp://127.0.0.1", 0, 2, {}, ValueError),
    ("tcp://127.0.0.1:29999", -1, -1, {}, ValueError),
    ("tcp://127.0.0.1:29999?rank=0", -1, -1, {}, ValueError),
    ("file://", 0, 1, {}, ValueError),
    ("file:///tmp/x", -1, -1, {}, ValueError),
    ("file:///tmp/x?rank=0", -1, -1, {}, ValueError),
    ("tcp://127.0.0.1:29999?rank=0&world_size=2", 1, 2, {}, AssertionError),
    ("nccl://x", 0, 1, {}, RuntimeError),
    (b"env://", 0, 1, {}, RuntimeError),
    ("env://", "0", 1, {}, RuntimeError),
    ("env://", 0, 1.0, {}, RuntimeError),
]


def raised(call):
    try:
        call()
    except Exception as error:
        return type(error), str(error)
    raise AssertionError("no error")


@pytest.mark.parametrize("init_method, rank, world_size, env, kind", BAD_METHODS)
def test_bad_init_methods_raise_torchs_errors(clean_env, init_method, rank, world_size, env, kind):
    for name, value in env.items():
        clean_env.setenv(name, value)
    mine = raised(lambda: rendezvous(init_method, rank, world_size, timeout=SHORT))
    assert mine[0] is kind
    torch_rendezvous = pytest.importorskip("torch.distributed.rendezvous")
    if isinstance(init_method, bytes):  # torch accepts bytes here, then fails further in; we refuse at once
        return
    theirs = raised(lambda: next(torch_rendezvous.rendezvous(init_method, rank, world_size, timeout=SHORT)))
    assert mine == (theirs[0], theirs[1].replace("torch.distributed", "minitensor.distributed"))


def test_rank_outside_the_group_is_refused():
    with pytest.raises(ValueError, match="rank 2 and world_size 2: expected"):
        rendezvous(f"tcp://127.0.0.1:{free_port()}", rank=2, world_size=2, timeout=SHORT)
    with pytest.raises(ValueError, match="rank 0 and world_size 0"):
        rendezvous("file:///tmp/unused", rank=0, world_size=0, timeout=SHORT)
