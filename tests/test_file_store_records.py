"""FileStore's records check themselves: a writer killed inside a `set` (or stopped by a full disk) leaves a torn
record, which readers skip without taking its value for whole and without losing the records after it."""
import json
import os
import signal
import subprocess
import sys

import pytest

from minitensor.distributed import file_store
from minitensor.distributed.file_store import FileStore

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITER = os.path.join(REPO, "tests", "distributed_scripts", "store_file_torn_writer.py")


def run_writer(path, mode):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, WRITER, str(path), mode], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def keys_of(path, names):
    """{name: value or None} as a process that opens the store now reads it."""
    store = FileStore(path)
    return {name: store.get(name) if store.check([name]) else None for name in names}


def test_a_writer_killed_inside_a_record(tmp_path):
    """Before, a later opener read the 1000 bytes that reached the file as the whole value of "big", and the
    record's claimed length swallowed every record appended after it."""
    path = tmp_path / "store"
    writer = run_writer(path, "killed")
    assert writer.returncode == -signal.SIGXFSZ, writer.stderr  # killed by the kernel, inside the write
    assert 1000 < os.path.getsize(path) < 100_000  # the torn record is there
    assert keys_of(path, ["before", "big"]) == {"before": b"kept", "big": None}
    FileStore(path).set("after", "written after the torn record")
    assert keys_of(path, ["before", "big", "after"]) == {"before": b"kept", "big": None,
                                                          "after": b"written after the torn record"}
    assert FileStore(path).num_keys() == 2


def test_a_write_refused_part_way(tmp_path):
    """The writer that sees the error keeps a view without the key, and goes on."""
    writer = run_writer(tmp_path / "store", "refused")
    assert writer.returncode == 0, writer.stderr
    result = json.loads(next(line for line in writer.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert "File too large" in result["outcome"] and result["big"] == "missing"
    assert result["after"] == "also kept"
    assert keys_of(tmp_path / "store", ["before", "big", "after"]) == {"before": b"kept", "big": None,
                                                                       "after": b"also kept"}


def test_every_cut_of_a_record_is_skipped(tmp_path):
    """A record cut after any of its bytes, then a whole one: readers see the whole one only."""
    torn = file_store._record(file_store._SET, "/torn", b"a value \x89MTstore with the marker in it")
    whole = file_store._record(file_store._SET, "/next", b"whole")
    for cut in range(1, len(torn)):
        path = tmp_path / f"cut{cut}"
        FileStore(path).set("first", "1")
        with open(path, "ab") as file:
            file.write(torn[:cut])
        assert keys_of(path, ["first", "torn"]) == {"first": b"1", "torn": None}, cut
        with open(path, "ab") as file:
            file.write(whole)
        assert keys_of(path, ["first", "torn", "next"]) == {"first": b"1", "torn": None, "next": b"whole"}, cut


# a byte of the marker, the CRC, the kind, the key's length, the value's length, the key, the value
@pytest.mark.parametrize("where", [0, 9, 12, 14, 20, 21, -1])
def test_a_damaged_byte_loses_its_record_only(tmp_path, where):
    path = tmp_path / "store"
    store = FileStore(path)
    for name in ("a", "b", "c"):
        store.set(name, f"value of {name}")
    data = bytearray(path.read_bytes())
    record = file_store._record(file_store._SET, "/b", b"value of b")
    at = data.index(record) + (where % len(record))
    data[at] ^= 0x40
    path.write_bytes(bytes(data))
    assert keys_of(path, ["a", "b", "c"]) == {"a": b"value of a", "b": None, "c": b"value of c"}
