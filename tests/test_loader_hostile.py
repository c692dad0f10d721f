"""Hostile checkpoints: mt.load refuses what would crash, hang or exhaust memory with a clean error naming the
limit (docs/serialization.md, "Limits"), and a killed mt.save leaves nothing behind once the next save runs.

Files that crashed the process or ballooned its memory before their limit existed are loaded in a child
process capped in memory (`load_in_child`), so a regression fails the test instead of killing the test run.
"""
import io
import json
import os
import pickle
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
import zlib

import pytest

import minitensor as mt
from helpers import REPO
from minitensor.base import atomicfile
from minitensor.serialization import limits, zipformat
from minitensor.serialization.zipformat import ZipWriter
from test_serialization import archive

DEPTH = limits.MAX_DEPTH


# ---------------------------------------------------------------------------------------------- pickle pieces
def checkpoint(body, storages=None):
    """A checkpoint whose data.pkl is PROTO 2, `body`, STOP, with storage records {key: bytes}."""
    records = {"data.pkl": b"\x80\x02" + body + b".", "version": b"3\n"}
    records.update({f"data/{key}": data for key, data in (storages or {}).items()})
    return archive(records)


def glob(module, name):
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def text(s):
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def binint(v):
    return b"J" + struct.pack("<i", v)


def long1(v):
    data = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def int_tuple(values):
    return b"(" + b"".join(binint(v) if v < 2**31 else long1(v) for v in values) + b"t"


def storage_pid(numel=4, key="0"):
    return b"(" + text("storage") + glob("torch", "FloatStorage") + text(key) + text("cpu") + binint(numel) + b"tQ"


def tensor(size, stride, offset=0, numel=4, key="0"):
    """_rebuild_tensor_v2 of a float32 storage of `numel` elements (record data/<key>)."""
    return (glob("torch._utils", "_rebuild_tensor_v2") + b"(" + storage_pid(numel, key) + binint(offset) +
            int_tuple(size) + int_tuple(stride) + b"\x89" + glob("collections", "OrderedDict") + b")RtR")


def load_bytes(data, **kwargs):
    return mt.load(io.BytesIO(data), **kwargs)


def load_in_child(tmp_path, files, memory=1 << 30, timeout=180):
    """Load each of `files` {name: bytes} with mt.load in one fresh interpreter capped at `memory` bytes of
    address space: {name: (outcome, seconds)}, outcome 'loaded' or 'ExcType: message'. A crash or any other
    exception fails, naming the file it happened on."""
    paths = []
    for name, data in files.items():
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        paths.append(str(path))
    code = textwrap.dedent(f"""
        import json, pickle, resource, sys, time
        resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
        import minitensor as mt
        for path in sys.argv[1:]:
            print(json.dumps(["started", path]), flush=True)
            start = time.perf_counter()
            try:
                mt.load(path, map_location="cpu")
                outcome = "loaded"
            except (pickle.UnpicklingError, ValueError, RuntimeError) as exc:
                outcome = f"{{type(exc).__name__}}: {{exc}}"
            print(json.dumps([path, outcome, time.perf_counter() - start]), flush=True)
    """)
    # one OpenBLAS thread: numpy's OpenBLAS reserves buffers per thread at import, which on a many-core machine
    # (32 cores) passes the cap before the loader runs
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), MINITENSOR_BACKEND="sim",
               OPENBLAS_NUM_THREADS="1")
    try:
        p = subprocess.run([sys.executable, "-c", code, *paths], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the loader hung: {exc.stdout.decode()[-500:] if exc.stdout else ''}") from None
    lines = [json.loads(line) for line in p.stdout.splitlines()]
    assert p.returncode == 0, (f"the loader died (exit {p.returncode}) on {lines[-1][1] if lines else '?'}:\n"
                               f"{p.stderr[-2000:]}")
    return {os.path.basename(line[0])[:-3]: (line[1], line[2]) for line in lines if line[0] != "started"}


# ---------------------------------------------------------------------------------------------- 1: nesting
def nested(kind, depth):
    """A pickle body pushing one object `depth` containers deep."""
    if kind == "TUPLE1":  # () wrapped by TUPLE1 again and again
        return b")" + b"\x85" * (depth - 1)
    if kind == "TUPLE":  # MARK ... TUPLE inside MARK ... TUPLE
        return b"(" * depth + b"t" * depth
    if kind == "APPEND":  # outer lists first, each APPEND puts the top list into the one below
        return b"]" * depth + b"a" * (depth - 1)
    if kind == "SETITEM":
        return b"}" + b"K\x01}" * (depth - 1) + b"s" * (depth - 1)
    if kind == "FROZENSET":
        return b"(" * depth + b"\x91" * depth
    raise AssertionError(kind)


def test_deep_tuple_key_is_refused_instead_of_crashing(tmp_path):
    """A 200 KB pickle nesting 200,000 tuples and using the result as a dict key: hashing it recursed in C
    until the process died (SIGSEGV)."""
    body = b"}" + nested("TUPLE1", 200_000) + b"Ns"
    result = load_in_child(tmp_path, {"deep": checkpoint(body)})
    outcome, seconds = result["deep"]
    assert outcome.startswith("UnpicklingError") and f"nested more than {DEPTH} containers deep" in outcome, outcome
    assert seconds < 10


@pytest.mark.parametrize("kind", ["TUPLE1", "TUPLE", "APPEND", "SETITEM", "FROZENSET"])
def test_nesting_depth_limit(kind):
    data = checkpoint(nested(kind, DEPTH))
    obj = load_bytes(data)
    for _ in range(DEPTH - 1):
        obj = next(iter(obj.values())) if isinstance(obj, dict) else next(iter(obj))
    assert len(obj) == 0
    with pytest.raises(pickle.UnpicklingError, match=f"nested more than {DEPTH} containers deep"):
        load_bytes(checkpoint(nested(kind, DEPTH + 1)))


def test_nesting_is_tracked_through_reduce_and_build():
    """builtins.set(...) holds its items one level down; BUILD puts an OrderedDict's attributes one level down.
    Wrapping either result to just past the limit is refused."""
    items = nested("TUPLE1", DEPTH - 3)
    a_set = glob("builtins", "set") + b"(]" + items + b"atR"  # set([items]): height DEPTH - 2
    attrs = glob("collections", "OrderedDict") + b")R}" + text("_metadata") + items + b"sb"  # also DEPTH - 2
    for body, size in ((a_set, 1), (attrs, 0)):
        assert len(load_bytes(checkpoint(body + b"\x85\x85"))[0][0]) == size
        with pytest.raises(pickle.UnpicklingError, match="containers deep"):
            load_bytes(checkpoint(body + b"\x85\x85\x85"))


def test_deep_structures_saved_by_mt_load():
    x = []
    for _ in range(400):
        x = [x, (x,)]
    buf = io.BytesIO()
    mt.save(x, buf)
    loaded = load_bytes(buf.getvalue())
    for _ in range(400):
        assert loaded[1][0] is loaded[0]
        loaded = loaded[0]
    assert loaded == []


# ---------------------------------------------------------------------------------------------- 2, 3: amplification
def bget(i):
    return b"h" + bytes([i])


def kept(global_, value, rep, n):
    """Memoize `global_` (memo 0) and `value` (memo 1), then append `rep` n times to a list: each rep REDUCEs
    or hashes the memoized objects again."""
    return global_ + b"q\x00" + value + b"q\x010" + b"0" + b"](" + rep * n + b"e"


_ITEMS = b"".join(binint(i) for i in range(50_000))  # 50,000 distinct ints (250 KB)
_INTS = b"](" + _ITEMS + b"e"
AMPLIFIERS = {  # ~1 MB pickles that copied or hashed one memoized object ~100,000 times
    "bytearray": kept(glob("builtins", "bytearray"), b"B" + struct.pack("<I", 100_000) + bytes(100_000),
                      bget(0) + bget(1) + b"\x85R", 150_000),
    "set": kept(glob("builtins", "set"), _INTS, bget(0) + bget(1) + b"\x85R", 120_000),
    "frozenset": kept(glob("builtins", "frozenset"), _INTS, bget(0) + bget(1) + b"\x85R", 120_000),
    "Size": kept(glob("torch", "Size"), _INTS, bget(0) + bget(1) + b"\x85R", 120_000),
    "encode": kept(glob("_codecs", "encode") + text("latin1") + b"q\x020", text("x" * 100_000),
                   bget(0) + bget(1) + bget(2) + b"\x86R", 100_000),
    "BUILD": kept(glob("collections", "OrderedDict") + b")R",
                  b"}(" + b"".join(text(f"k{i}") + b"N" for i in range(50_000)) + b"u",
                  bget(0) + bget(1) + b"b", 100_000),
    "hash": kept(b"N", b"(" + _ITEMS + b"t", b"}" + bget(1) + b"Ns", 150_000),
    "tuple bomb": b")q\x00" + (bget(0) + bget(0) + b"\x86q\x00") * 100 + b"}" + bget(0) + b"Ns",
    "hash flood": b"}(" + b"".join(long1(k * (2**61 - 1) + 5) + b"N" for k in range(1, 60_001)) + b"u",
}


@pytest.mark.parametrize("name", list(AMPLIFIERS))
def test_memo_amplification_is_refused_in_bounded_time_and_memory(tmp_path, name):
    """Each file is about 1 MB; before the budget they grew past any memory (killed here at 1 GiB) or ran for
    minutes. Now each stops with an UnpicklingError naming the limit, within a few seconds."""
    data = checkpoint(AMPLIFIERS[name])
    assert len(data) < 1_100_000
    outcome, seconds = load_in_child(tmp_path, {"f": data})["f"]
    limit = "more than 16 keys with one hash" if name == "hash flood" else "budget of"
    assert outcome.startswith("UnpicklingError") and limit in outcome, outcome
    assert seconds < 10, seconds


def test_many_tensors_with_huge_sizes_fail_fast():
    """A memoized size tuple of 100,000 dims rebuilt 300 times: each rebuild took ~15 ms before the dims limit."""
    body = (glob("torch._utils", "_rebuild_tensor_v2") + b"q\x00" + storage_pid(1) + b"q\x01" +
            b"(" + b"K\x01" * 100_000 + b"tq\x02" + glob("collections", "OrderedDict") + b"q\x03" + b"0000" +
            b"](" + (bget(0) + b"(" + bget(1) + b"K\x00" + bget(2) + bget(2) + b"\x89" + bget(3) + b")RtR") * 300 +
            b"e")
    start = time.perf_counter()
    with pytest.raises(pickle.UnpicklingError, match=f"at most {limits.MAX_DIMS} dimensions, got 100000"):
        load_bytes(checkpoint(body, {"0": bytes(4)}))
    assert time.perf_counter() - start < 1


def test_equal_hash_keys_limit():
    M = 2**61 - 1  # an int's hash is its value modulo M
    keys = lambda n: b"".join(long1(k * M + 5) + b"N" for k in range(8, 8 + n))  # past int64  # noqa: E731
    assert len(load_bytes(checkpoint(b"}(" + keys(limits.MAX_EQUAL_HASHES) + b"u"))) == limits.MAX_EQUAL_HASHES
    with pytest.raises(pickle.UnpicklingError, match=f"more than {limits.MAX_EQUAL_HASHES} keys with one hash "
                                                     r"\(5\) into one dict"):
        load_bytes(checkpoint(b"}(" + keys(limits.MAX_EQUAL_HASHES + 1) + b"u"))
    one_hash = [-1] + [-(2 + k * M) for k in range(5)]  # the most int64 keys that share a hash: -2
    assert {hash(k) for k in one_hash} == {-2} and min(one_hash) >= -2**63
    loaded = load_bytes(checkpoint(b"}(" + b"".join(long1(k) + b"N" for k in one_hash) + b"u"))
    assert sorted(loaded) == sorted(one_hash)  # int64 keys are not counted


def test_large_ordinary_objects_stay_inside_the_budget():
    """What torch and mt.save write charges a few elements per byte at most: big sets, bytes, tuple keys and
    Sizes, each shared many times, load."""
    big = {"set": set(range(200_000)), "bytes": bytes(range(256)) * 4000, "ba": bytearray(b"x" * 1_000_000),
           "tuples": {(i, i + 1.5): i for i in range(50_000)}, "keyed": [{(i, 2.5)} for i in range(9999)],
           "size": mt.Size(range(64)), "sets": [{1.5, (2, 3)}] * 1000}
    big["again"] = [big["set"], big["tuples"], big["size"]] * 100
    buf = io.BytesIO()
    mt.save(big, buf)
    loaded = load_bytes(buf.getvalue())
    assert loaded["set"] == big["set"] and loaded["tuples"] == big["tuples"] and loaded["ba"] == big["ba"]
    assert loaded["again"][-1] == big["size"] and loaded["keyed"] == big["keyed"]


# ---------------------------------------------------------------------------------------------- 4: values
@pytest.mark.parametrize("body, match", [
    (glob("torch", "device") + text("cuda") + long1(2**70) + b"\x86R", "device index must be in"),
    (glob("torch", "device") + text("cuda") + binint(limits.MAX_DEVICE_INDEX + 1) + b"\x86R",
     "device index must be in"),
    (glob("torch", "device") + text("cuda:99999999999999999999") + b"\x85R", "device index must be in"),
    (glob("torch", "device") + text("cuda:" + "9" * 5000) + b"\x85R", "torch.device needs a device string"),
    (glob("torch", "device") + text("mps") + b"\x85R", "torch.device needs a device string"),
    (tensor([1] * 65, [1] * 65), f"at most {limits.MAX_DIMS} dimensions, got 65"),
    (tensor([2**40, 2**40], [0, 0]), r"spans 4835703278458516698824704 bytes .*more than 2\^63 - 1"),
    (tensor([0, 2**62, 2], [1, 1, 1]), r"spans 36893488147419103232 bytes .*non-zero dims counted"),
])
def test_values_that_would_fail_on_use_are_refused(body, match):
    with pytest.raises(pickle.UnpicklingError, match=match):
        load_bytes(checkpoint(body, {"0": bytes(16)}))


def test_values_at_the_limits_load_and_work():
    d = load_bytes(checkpoint(glob("torch", "device") + text("cuda") + binint(limits.MAX_DEVICE_INDEX) + b"\x86R"))
    assert d == mt.device("cuda", limits.MAX_DEVICE_INDEX)
    t = load_bytes(checkpoint(tensor([1] * 64, [1] * 64), {"0": bytes(16)}))
    assert t.dim() == 64 and (t + 1).sum().item() == 1
    t = load_bytes(checkpoint(tensor([2**30, 2**30], [0, 0]), {"0": bytes(16)}))  # expanded: 2^62 bytes, no copy
    assert t.shape == (2**30, 2**30) and t[5, 7].item() == 0
    t = load_bytes(checkpoint(tensor([0, 2**61 - 1], [1, 1]), {"0": bytes(16)}))
    assert t.shape == (0, 2**61 - 1) and (t + 1).tolist() == []


def test_huge_location_tags_give_clean_errors():
    body = tensor([4], [1]).replace(text("cpu"), text("cuda:" + "9" * 5000))
    with pytest.raises(RuntimeError, match="don't know how to restore data location"):
        load_bytes(checkpoint(body, {"0": bytes(16)}))


# ---------------------------------------------------------------------------------------------- neighbours: files
def _ten_tensors_of(numel):
    return b"\x80\x02](" + b"".join(tensor([numel], [1], numel=numel, key=str(k)) for k in range(10)) + b"e."


def test_zip_entries_naming_one_record_are_refused():
    """Ten central-directory entries pointing at one 1 MiB record: ten storages (10 MiB) from a 1 MiB file."""
    numel = 1 << 18
    buf = io.BytesIO()
    writer = ZipWriter(buf, "archive")
    writer.write_record("data.pkl", _ten_tensors_of(numel))
    writer.write_record("data/0", bytes(4 * numel))
    writer.write_record("version", b"3\n")
    _, crc, size, offset = writer._entries[1]
    writer._entries += [(f"archive/data/{k}".encode(), crc, size, offset) for k in range(1, 10)]
    writer.finish()
    with pytest.raises(RuntimeError, match="the local header at byte .* names b'archive/data/0', not record "
                                           "b'archive/data/1'"):
        load_bytes(buf.getvalue())


def test_zip_records_sharing_bytes_are_refused():
    """Ten records whose local headers follow each other, each one's extra field covering the next headers, so
    all ten have the same 1 MiB of data: a zip tool reads ten records, mt.load must not make ten storages."""
    numel = 1 << 18
    pkl = _ten_tensors_of(numel)
    head = zipformat._LOCAL.pack(zipformat._LOCAL_SIG, 20, 0, 0, 0, 0, 0, len(pkl), len(pkl), 16, 0)
    out = head + b"archive/data.pkl" + pkl
    chain = b""
    for k in range(10):  # data/9's header first: its extra field holds data/8's header, and so on
        name = f"archive/data/{k}".encode()
        chain = zipformat._LOCAL.pack(zipformat._LOCAL_SIG, 20, 0, 0, 0, 0, 0, 4 * numel, 4 * numel, len(name),
                                      len(chain)) + name + chain
    offsets = {}
    pos = len(out)
    for k in reversed(range(10)):
        offsets[k] = pos
        pos += zipformat._LOCAL.size + len(f"archive/data/{k}")
    out += chain + bytes(4 * numel)
    start = len(out)
    directory = zipformat._central_header(b"archive/data.pkl", zlib.crc32(pkl), len(pkl), 0)
    crc = zlib.crc32(bytes(4 * numel))
    directory += b"".join(zipformat._central_header(f"archive/data/{k}".encode(), crc, 4 * numel, offsets[k])
                          for k in range(10))
    out += directory + zipformat._END.pack(zipformat._END_SIG, 0, 0, 11, 11, len(directory), start, 0)
    try:  # zip tools without an overlap check read ten records (Python's zipfile did before its 2024 fix)
        with zipfile.ZipFile(io.BytesIO(out)) as z:
            assert z.read("archive/data/9") == z.read("archive/data/0") == bytes(4 * numel)
    except zipfile.BadZipFile as e:  # a zipfile with the fix (3.12.3 on the GPU machines) refuses it too
        assert "Overlapped entries" in str(e)
    with pytest.raises(RuntimeError, match="its records overlap"):
        load_bytes(out)


def _safetensors(header, data=b""):
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


@pytest.mark.parametrize("shape, match", [
    ([1] * 65, f"at most {limits.MAX_DIMS} dimensions, got 65"),
    ([2**64 - 1] * 300_000, f"at most {limits.MAX_DIMS} dimensions, got 300000"),  # took seconds to multiply
    ([2**63, 2**63, 0], "ValidationOverflow"),  # the reference multiplies left to right, checked
    ([0, 2**64 - 1], r"spans 18446744073709551615 bytes"),  # the reference loads it; numpy cannot make it
])
def test_safetensors_shapes(tmp_path, shape, match):
    path = tmp_path / "x.safetensors"
    path.write_bytes(_safetensors({"x": {"dtype": "U8", "shape": shape, "data_offsets": [0, 0]}}))
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match=match):
        mt.load_safetensors(path)
    assert time.perf_counter() - start < 2


# ---------------------------------------------------------------------------------------------- 5: killed saves
_SLOW_SAVE = """
import sys, time
import minitensor as mt
from minitensor.serialization import api

def slowly(record, storage):  # 1 MiB at a time with pauses, so that the parent kills it mid-save
    data = storage._array
    for i in range(0, len(data), 1 << 20):
        record.write(data[i:i + (1 << 20)])
        time.sleep(0.01)

api.write_storage = slowly
x = mt.full((16 << 20,), 7.0)  # 64 MiB
print("saving", flush=True)
mt.save({"x": x}, sys.argv[1])
print("saved", flush=True)
"""


def temporaries(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


def kill_mid_save(path):
    """Start a save of a 64 MiB tensor to `path` in a child and SIGKILL it once 8 MiB of its temporary file are
    written; returns the temporary it left."""
    before = set(temporaries(path.parent))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), MINITENSOR_BACKEND="sim")
    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(path)], env=env, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"saving\n"
        deadline = time.monotonic() + 60
        while True:
            new = [n for n in temporaries(path.parent) if n not in before]
            if new and os.path.getsize(path.parent / new[0]) > 8 << 20:
                break
            assert time.monotonic() < deadline and child.poll() is None, "the child finished before it was killed"
            time.sleep(0.002)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    return new[0], child.pid


def test_killed_saves_leave_the_old_file_and_the_next_save_removes_their_temporaries(tmp_path):
    path = tmp_path / "ckpt.pt"
    mt.save({"x": mt.ones(4)}, path)
    left = [kill_mid_save(path) for _ in range(3)]
    assert mt.load(path)["x"].tolist() == [1.0] * 4  # the target is the old, complete file
    # each save removed the temporaries of the killed saves before it: only the last one is left
    assert temporaries(tmp_path) == [left[-1][0]]
    kept = [os.path.basename(atomicfile.temporary_path(path, os.getpid())),  # a writer still running
            ".ckpt.pt.a1b2c3.tmp",  # not minitensor's naming
            f".ckpt.pt.mt-{'0' * 8 if atomicfile._HOST != '0' * 8 else '1' * 8}-{left[0][1]}-{'a' * 12}.tmp",  # a
            os.path.basename(atomicfile.temporary_path(tmp_path / "other.pt", left[0][1]))]  # host, target of others
    for name in kept:
        (tmp_path / name).write_bytes(b"partial")
    mt.save({"x": mt.zeros(2)}, path)
    assert mt.load(path)["x"].tolist() == [0.0, 0.0]
    assert temporaries(tmp_path) == sorted(kept)


@pytest.mark.parametrize("name", ["n" * 250 + ".pt", "é" * 126 + ".pt"])  # 253 and 255 bytes
def test_temporary_names_fit_long_file_names(tmp_path, name):
    """A temporary named `.<name>.<suffix>` would pass NAME_MAX (255 bytes): the name is cut, even inside a
    character, and a stale temporary with the cut name is still found."""
    path = tmp_path / name
    mt.save({"x": mt.ones(2)}, path)
    assert mt.load(path)["x"].tolist() == [1.0, 1.0] and temporaries(tmp_path) == []
    stale = atomicfile.temporary_path(str(path), 2**22 + 1)  # above Linux's largest pid: no such process
    open(stale, "wb").close()
    mt.save({"x": mt.ones(2)}, path)
    assert temporaries(tmp_path) == []


# ---------------------------------------------------------------------------------------------- neighbours: arguments
@pytest.mark.parametrize("map_location", ["cuda:" + "9" * 5000, {"cpu": "cuda:" + "9" * 5000}])
def test_map_location_with_a_huge_index_is_a_runtime_error(map_location):
    data = checkpoint(tensor([4], [1]), {"0": bytes(16)})
    with pytest.raises(RuntimeError, match=r"Could not parse device index in device string 'cuda:9999.*\.\.\.'"):
        load_bytes(data, map_location=map_location)
