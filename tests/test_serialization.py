"""Save, load and pickle: mt.save / mt.load in torch's zip format, safetensors, pickle and deepcopy.

Files written by real torch (and by the `safetensors` package) are committed under
tests/fixtures/serialization/ with `expected.json`, what each holds in the form `describe()` gives, so
interop with torch is checked on every machine; where torch is importable, mt.save's files are also read
back with torch.load(weights_only=True) and torch.save's with mt.load. Fuzzing runs on CPU tensors.
"""
import collections
import copy
import io
import json
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

import minitensor as mt
from minitensor.core.host_arrays import numpy_view
from minitensor.serialization import api as serialization, crc32, unpickler, zipformat
from minitensor.serialization.zipformat import ZipReader, ZipWriter

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "serialization")
with open(os.path.join(FIXTURES, "expected.json")) as _f:
    EXPECTED = json.load(_f)
DTYPES = [mt.bool, mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, mt.float16, mt.bfloat16, mt.float32, mt.float64]
rng = np.random.default_rng(2024)


# ---------------------------------------------------------------------------------------------- helpers
def describe(obj, groups):
    """A JSON-like picture of a loaded object (the twin of make_fixtures.describe): storages are numbered
    in first-seen order, so equal pictures mean the same sharing."""
    if isinstance(obj, mt.Tensor):
        return {"tensor": obj.dtype.name, "shape": list(obj.shape), "stride": list(obj.stride()),
                "offset": obj.storage_offset(), "storage": _group(obj.untyped_storage(), groups),
                "device": str(obj.device), "values": obj.tolist()}
    if isinstance(obj, (mt.UntypedStorage, mt.TypedStorage)):
        untyped = obj if isinstance(obj, mt.UntypedStorage) else obj.untyped()
        return {"storage": _group(untyped, groups), "nbytes": untyped.nbytes()}
    if isinstance(obj, collections.OrderedDict):
        return {"OrderedDict": [[describe(k, groups), describe(v, groups)] for k, v in obj.items()]}
    if isinstance(obj, dict):
        return {"dict": [[describe(k, groups), describe(v, groups)] for k, v in obj.items()]}
    if isinstance(obj, list):
        return [describe(x, groups) for x in obj]
    if isinstance(obj, tuple):
        return {"tuple": [describe(x, groups) for x in obj]}
    if isinstance(obj, bytes):
        return {"bytes": obj.hex()}
    return obj


def _group(storage, groups):
    if storage.nbytes() == 0:
        return None
    return groups.setdefault(id(storage), len(groups))


def picture(obj):
    return describe(obj, {})


def random_tensor(shape, dtype, device="cpu"):
    """Random values covering each dtype's range (bfloat16 from its raw bits, NaN-free)."""
    shape = tuple(shape)
    if dtype is mt.bool:
        values = rng.random(shape) < 0.5
    elif dtype is mt.bfloat16:
        bits = rng.integers(0, 2**16, shape, dtype=np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] = 0x3F80  # no inf/NaN: NaN != NaN would fail comparisons
        t = mt.from_numpy(bits.view(np.int16)).view(mt.bfloat16)
        return t if device == "cpu" else t.to(device)
    elif dtype.is_floating_point:
        values = (rng.standard_normal(shape) * 100).astype(dtype.np)
    else:
        info = np.iinfo(dtype.np)
        values = rng.integers(info.min, info.max, shape, dtype=dtype.np, endpoint=True)
    return mt.tensor(np.asarray(values), dtype=dtype, device=device)


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    mt.save(obj, buf)
    buf.seek(0)
    return mt.load(buf, **load_kwargs)


def same(a, b):
    """Equal dtype, shape, device and bits."""
    assert a.dtype is b.dtype and a.shape == b.shape and a.device == b.device
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    host = [np.ascontiguousarray(serialization_values(t)).view(bits) for t in (a, b)]
    np.testing.assert_array_equal(host[0], host[1])


def serialization_values(t):
    return numpy_view(t.cpu())


def fixture(name):
    return os.path.join(FIXTURES, name)


def archive(records, prefix="archive"):
    """A checkpoint zip assembled from raw records, for hand-made (malformed) files."""
    buf = io.BytesIO()
    writer = ZipWriter(buf, prefix)
    for name, data in records.items():
        writer.write_record(name, data)
    writer.finish()
    return buf.getvalue()


def storage_pid(key="0", cls=b"ctorch\nFloatStorage\n", numel=4):
    return b"(X\x07\x00\x00\x00storage" + cls + _str(key) + _str("cpu") + b"K" + bytes([numel]) + b"tQ"


def _str(s):
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def tensor_pickle(size, stride, offset, numel=4):
    """A pickle of one float32 tensor over a storage of `numel` elements, with any size/stride/offset."""
    def ints(values):
        return b"(" + b"".join(b"J" + struct.pack("<i", v) for v in values) + b"t"
    return (b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(" + storage_pid(numel=numel) + b"J" +
            struct.pack("<i", offset) + ints(size) + ints(stride) + b"\x89ccollections\nOrderedDict\n)RtR.")


def load_bytes(data, **kwargs):
    return mt.load(io.BytesIO(data), **kwargs)


# ---------------------------------------------------------------------------------------------- fixtures from torch
TORCH_FILES = sorted(name for name in EXPECTED if name.endswith(".pt"))


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("name", TORCH_FILES)
def test_loads_files_written_by_torch(name, mmap):
    assert picture(mt.load(fixture(name), map_location="cpu", mmap=mmap)) == EXPECTED[name]


def test_torch_file_views_share_one_storage():
    base, rows, t, row, tail, expanded, permuted, small, small_row = mt.load(fixture("views.pt"))
    for view in (rows, t, row, tail, expanded):
        assert view.untyped_storage() is base.untyped_storage()
    assert expanded.stride() == (6, 0) and tail.storage_offset() == 5
    row.fill_(-1.0)  # a write through one view shows in the others
    assert base[2].tolist() == [-1.0] * 6 and t[:, 2].tolist() == [-1.0] * 6
    assert small_row.untyped_storage() is small.untyped_storage() and small_row.storage_offset() == 3


def test_seed_list_holding_tensors_and_a_storage():
    """test_serialization_array_with_storage: [x, y, x, y.storage()] keeps its identities and sharing."""
    x, y, x2, y_storage = mt.load(fixture("storage_list.pt"))
    assert x is x2 and x.dtype is mt.float32 and y.dtype is mt.int32
    assert isinstance(y_storage, mt.TypedStorage) and y_storage.untyped() is y.untyped_storage()
    assert y_storage.dtype is mt.int32 and y_storage.type() == "minitensor.IntStorage"
    y.fill_(10)
    assert y_storage.tolist() == [10] * 10


def test_seed_list_with_empty_tensor_on_cuda():
    """test_serialization_array_with_empty: a cuda tensor and an empty one come back as they were."""
    x = [random_tensor((4, 4), mt.float32, "cuda"), mt.empty(0, device="cuda")]
    y = roundtrip(x)
    for original, loaded in zip(x, y):
        same(original, loaded)
        assert type(loaded) is mt.Tensor and loaded.device == mt.device("cuda:0")


def test_parameters_state_dicts_and_tensor_attributes():
    p, frozen = mt.load(fixture("parameter.pt"))
    assert type(p) is mt.Tensor and p.tolist() == [[0, 1], [2, 3], [4, 5]] and frozen.tolist() == [0, 0]
    sd = mt.load(fixture("state_dict.pt"))
    assert type(sd) is collections.OrderedDict and list(sd) == ["weight", "bias"]
    assert sd._metadata == {"": {"version": 1}}  # the attribute torch's state_dict carries, set by BUILD
    assert mt.load(fixture("attrs.pt")).tolist() == [1.0, 1.0, 1.0]


def test_archive_prefix_is_read_from_the_file():
    with zipfile.ZipFile(fixture("prefix.pt")) as z:
        assert z.namelist()[0].startswith("my.weights/")
    assert mt.load(fixture("prefix.pt"))["w"].tolist() == [0, 1, 2]


def test_mt_save_names_the_prefix_like_torch(tmp_path):
    for name, prefix in [("model.pt", "model"), ("my.weights.pt", "my.weights"), ("noext", "noext"),
                         ("ünï.pt", "archive")]:
        mt.save([mt.ones(1)], tmp_path / name)
        with zipfile.ZipFile(tmp_path / name) as z:
            assert {n.split("/")[0] for n in z.namelist()} == {prefix}
    buf = io.BytesIO()
    mt.save(mt.ones(1), buf)
    assert zipfile.ZipFile(buf).namelist()[0] == "archive/data.pkl"


def test_unsupported_dtype_and_legacy_format_are_refused_clearly():
    loaded = mt.load(fixture("uint16.pt"))  # torch writes uint16 as an UntypedStorage and _rebuild_tensor_v3
    assert loaded.dtype is mt.uint16 and loaded.tolist() == [1, 2]
    with pytest.raises(pickle.UnpicklingError, match=r"torch\.float8_e4m3fn.*minitensor does not have"):
        load_bytes(archive({"data.pkl": b"\x80\x02ctorch\nfloat8_e4m3fn\n.", "data/0": bytes(4)}))
    with pytest.raises(RuntimeError, match="legacy format"):
        mt.load(fixture("legacy.pt"))


def test_malicious_pickle_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match=r"Unsupported global: GLOBAL (posix|os)\.system"):
        mt.load(fixture("malicious.pt"))
    assert not (tmp_path / "minitensor_pwned").exists()


@pytest.mark.parametrize("payload, match", [
    (b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00trueR.", r"GLOBAL os\.system"),
    (b"\x80\x02cbuiltins\neval\nX\x01\x00\x00\x001\x85R.", r"GLOBAL builtins\.eval"),
    (b"\x80\x02c__builtin__\ngetattr\n.", r"GLOBAL builtins\.getattr"),
    (b"\x80\x04\x8c\x02os\x8c\x06system\x93.", r"GLOBAL os\.system"),  # STACK_GLOBAL
    (b"\x80\x02ctorch\nfloat32\n}X\x08\x00\x00\x00itemsizeK\x10sb.", r"BUILD can only set attributes of an "
                                                                      r"OrderedDict"),
    (b"\x80\x02ctorch\nfloat32\n)R.", r"REDUCE can only call"),
    (b"\x80\x02ccollections\nOrderedDict\n)R}" + _str("__class__") + b"K\x01sb.", None),  # only sets __dict__
])
def test_restricted_unpickler(payload, match):
    data = archive({"data.pkl": payload, "version": b"3\n"})
    if match is None:
        assert type(load_bytes(data)) is collections.OrderedDict
        return
    with pytest.raises(pickle.UnpicklingError, match=match):
        load_bytes(data)
    assert mt.float32.itemsize == 4


@pytest.mark.parametrize("size, stride, offset, ok", [
    ((4,), (1,), 0, True), ((2, 2), (2, 1), 0, True), ((2,), (1,), 2, True), ((4,), (0,), 3, True),
    ((0, 100), (1000, 1000), 10**6, True),  # empty: nothing is read
    ((5,), (1,), 0, False), ((2,), (1,), 3, False), ((2, 2), (3, 1), 0, False), ((2,), (4,), 0, False),
    ((2**31 - 1,), (1,), 0, False),
])
def test_tensor_bounds_are_checked_against_the_storage(size, stride, offset, ok):
    data = archive({"data.pkl": tensor_pickle(size, stride, offset), "data/0": bytes(16)})
    if ok:
        t = load_bytes(data)
        assert t.shape == size and t.stride() == stride and t.tolist() is not None
    else:
        with pytest.raises(pickle.UnpicklingError, match="reaches byte"):
            load_bytes(data)


@pytest.mark.parametrize("size, stride, offset, match", [
    ((-1,), (1,), 0, "non-negative ints"), ((2,), (-1,), 1, "non-negative ints"),
    ((2,), (1,), -1, "storage offset must be a non-negative int"), ((2, 2), (1,), 0, "differ in length"),
])
def test_invalid_tensor_metadata(size, stride, offset, match):
    data = archive({"data.pkl": tensor_pickle(size, stride, offset), "data/0": bytes(16)})
    with pytest.raises(pickle.UnpicklingError, match=match):
        load_bytes(data)


def test_storage_record_must_match_its_declared_size():
    data = archive({"data.pkl": tensor_pickle((4,), (1,), 0), "data/0": bytes(12)})
    with pytest.raises(RuntimeError, match=r"4 elements of float32 \(16 bytes\) but its record archive/data/0 "
                                           r"holds 12 bytes"):
        load_bytes(data)
    with pytest.raises(RuntimeError, match="no record archive/data/0"):
        load_bytes(archive({"data.pkl": tensor_pickle((4,), (1,), 0)}))


# ---------------------------------------------------------------------------------------------- map_location
def test_cuda_tagged_file_loads_to_cuda_and_maps_elsewhere():
    expected = EXPECTED["cuda_tagged.pt"]
    on_cuda = mt.load(fixture("cuda_tagged.pt"))
    assert [t.device for t in on_cuda] == [mt.device("cuda:0")] * 2
    assert [t.tolist() for t in on_cuda] == [e["values"] for e in expected]
    for map_location in ("cpu", mt.device("cpu"), {"cuda:0": "cpu"}, lambda storage, tag: storage):
        assert picture(mt.load(fixture("cuda_tagged.pt"), map_location=map_location)) == expected


def test_map_location_moves_cpu_storages_and_keeps_sharing():
    base = random_tensor((3, 4), mt.float32)
    a, b = roundtrip([base, base[1:]], map_location="cuda")
    assert a.device == b.device == mt.device("cuda:0")
    assert a.untyped_storage() is b.untyped_storage() and b.storage_offset() == 4
    same(a, base.to("cuda"))
    seen = []
    a, = roundtrip([base], map_location=lambda storage, tag: seen.append((storage.device, tag)))  # None: default
    assert seen == [(mt.device("cpu"), "cpu")] and a.device == mt.device("cpu")
    with pytest.raises(TypeError, match="must return a storage or None"):
        roundtrip([base], map_location=lambda storage, tag: "cpu")


@pytest.mark.parametrize("map_location, match", [
    ("cuda0", r"Invalid device string: 'cuda0'"),
    (mt.device("cuda:7"), r"CUDA device 7 but minitensor.cuda.device_count\(\) is {count}"),
    ("cuda:7", r"map_location to map your storages to an existing device"),
    ({"cpu": "cuda0"}, r"Invalid device string: 'cuda0'"),
    ({"cpu": "cuda:9"}, r"CUDA device 9"),
])
def test_invalid_map_location(tmp_path, map_location, match):
    """test_load_nonexistent_device / the seed's torch.load(fname, "cuda0")."""
    path = tmp_path / "p.pt"
    mt.save([mt.ones(10, 10)], path)
    with pytest.raises(RuntimeError, match=match.replace("{count}", str(mt.cuda.device_count()))):
        mt.load(path, map_location)


def test_location_tags_from_the_file_are_checked():
    data = archive({"data.pkl": tensor_pickle((4,), (1,), 0).replace(_str("cpu"), _str("cuda:3")),
                    "data/0": bytes(16)})
    with pytest.raises(RuntimeError, match="CUDA device 3"):
        load_bytes(data)
    assert load_bytes(data, map_location={"cuda:3": "cpu"}).device == mt.device("cpu")
    data = data.replace(_str("cuda:3"), _str("mps:0!"))
    with pytest.raises(RuntimeError, match="don't know how to restore data location.*'mps:0!'"):
        load_bytes(data)


# ---------------------------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_every_dtype_round_trips_on_cpu(dtype):
    tensors = [random_tensor(shape, dtype) for shape in [(), (1,), (7,), (3, 5), (2, 3, 4), (0,), (2, 0, 3)]]
    for original, loaded in zip(tensors, roundtrip(tensors)):
        same(original, loaded)
        assert loaded.stride() == original.stride()


def test_cuda_round_trip_keeps_device_dtype_and_views():
    base = random_tensor((4, 6), mt.bfloat16, "cuda")
    flags = random_tensor((5,), mt.bool, "cuda")
    obj = {"base": base, "view": base[1:3, ::2], "t": base.t(), "flags": flags, "n": 3}
    loaded = roundtrip(obj)
    assert loaded["view"].untyped_storage() is loaded["base"].untyped_storage()
    assert loaded["view"].stride() == (6, 2) and loaded["view"].storage_offset() == 6
    for key in ("base", "view", "t", "flags"):
        same(loaded[key], obj[key])
    cpu = roundtrip(obj, map_location="cpu")
    assert cpu["base"].device == mt.device("cpu") and cpu["view"].tolist() == obj["view"].tolist()


def test_views_and_non_contiguous_tensors_share_their_storage():
    base = random_tensor((4, 5, 6), mt.float32)
    views = [base, base.permute(2, 0, 1), base[1:, ::2, 3], base[:, 1:2].expand(4, 3, 6), base[3, 4, 5],
             base.reshape(-1)[7:19].view(3, 4), base[:, :, 0:0]]
    loaded = roundtrip(views)
    for original, again in zip(views, loaded):
        same(original, again)
        assert again.stride() == original.stride() and again.storage_offset() == original.storage_offset()
    storages = {id(t.untyped_storage()) for t in loaded}
    assert len(storages) == 1
    loaded[2].fill_(0.5)
    assert loaded[0][1:, ::2, 3].tolist() == loaded[2].tolist()


def test_one_storage_viewed_as_several_dtypes():
    """Written as torch.storage.UntypedStorage with _rebuild_tensor_v3; torch.save refuses this case."""
    ints = random_tensor((8,), mt.int32)
    floats = ints.view(mt.float32)
    storage = ints.untyped_storage()
    odd = mt.Tensor(mt.empty(7, dtype=mt.uint8).untyped_storage(), (1,), (1,), 1, mt.int16)  # 7 bytes % 2
    a, b, s, c = roundtrip([ints, floats[2:], storage, odd])
    assert a.untyped_storage() is b.untyped_storage() is s and s.nbytes() == 32
    same(a, ints)
    same(b, floats[2:])
    same(c, odd)


def test_nested_containers_identity_and_cycles():
    t = random_tensor((3,), mt.int64)
    shared = [1, 2]
    cyclic = [t]
    cyclic.append(cyclic)
    obj = collections.OrderedDict(a={"x": t, "y": (t, shared, shared)}, cyc=cyclic, s={1, "two"},
                                  b=b"\x00\xff" * 3, ba=bytearray(b"ab"), e=b"", big=-(2**100), f=float("inf"),
                                  c=complex(1, -2), none=None, u="ünïcode \U0001F600", d=mt.device("cuda:0"),
                                  dt=mt.bfloat16, size=mt.Size([2, 3]), k={(1, 2): "tuple key", 3.5: True})
    obj.note = "an attribute"
    loaded = roundtrip(obj)
    assert type(loaded) is collections.OrderedDict and list(loaded) == list(obj) and loaded.note == "an attribute"
    x, y = loaded["a"]["x"], loaded["a"]["y"]
    assert y[0] is x and y[1] is y[2] and y[1] == [1, 2]
    assert loaded["cyc"][1] is loaded["cyc"] and loaded["cyc"][0] is x
    for key in ("s", "b", "ba", "e", "big", "f", "c", "none", "u", "d", "dt", "size", "k"):
        assert loaded[key] == obj[key] and type(loaded[key]) is type(obj[key])


def test_unsupported_objects_fail_before_any_file_is_written(tmp_path):
    with pytest.raises(TypeError, match="got an object of type numpy.ndarray"):
        mt.save({"a": np.ones(2)}, tmp_path / "x.pt")
    t = (1,)
    holder = [t]
    with pytest.raises(TypeError, match="defaultdict"):
        mt.save(collections.defaultdict(list, a=holder), tmp_path / "x.pt")
    assert os.listdir(tmp_path) == []


def test_file_objects_at_an_offset_and_unseekable_streams():
    t = random_tensor((5,), mt.float64)
    buf = io.BytesIO(b"header bytes")
    buf.seek(0, io.SEEK_END)
    mt.save([t], buf)
    buf.seek(len(b"header bytes"))
    same(mt.load(buf)[0], t)

    class WriteOnly:
        def __init__(self):
            self.chunks = []

        def write(self, data):
            self.chunks.append(bytes(data))

    class ReadOnly(io.RawIOBase):
        def __init__(self, data):
            self._inner = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, b):
            return self._inner.readinto(b)

    stream = WriteOnly()
    mt.save([t], stream)
    same(mt.load(ReadOnly(b"".join(stream.chunks)))[0], t)


def test_big_endian_files_are_byte_swapped():
    t = random_tensor((6,), mt.int32)
    buf = io.BytesIO()
    mt.save(t, buf)
    with zipfile.ZipFile(buf) as z:
        records = {n.split("/", 1)[1]: z.read(n) for n in z.namelist()}
    records["byteorder"] = b"big"
    records["data/0"] = np.frombuffer(records["data/0"], "<i4").astype(">i4").tobytes()
    same(load_bytes(archive(records)), t)
    records["byteorder"] = b"middle"
    with pytest.raises(RuntimeError, match="Unknown endianness type"):
        load_bytes(archive(records))


# ---------------------------------------------------------------------------------------------- the file
def test_records_are_64_byte_aligned_and_the_zip_is_valid():
    tensors = [random_tensor((n,), mt.uint8) for n in (1, 3, 64, 65, 200)]
    buf = io.BytesIO()
    mt.save(tensors, buf)
    with zipfile.ZipFile(buf) as z:
        assert z.testzip() is None  # every CRC checks
        names = z.namelist()
    assert names[:2] == ["archive/data.pkl", "archive/byteorder"]
    assert names[-2:] == ["archive/version", "archive/.data/serialization_id"]
    buf.seek(0)
    reader = ZipReader(buf)
    assert reader.read("version") == b"3\n" and len(reader.read(".data/serialization_id")) == 40
    for key in range(len(tensors)):
        offset, size = reader.span(f"data/{key}")
        assert offset % 64 == 0 and size == tensors[key].nbytes


def test_zip64_fields(monkeypatch):
    """Sizes and offsets past 4 GiB need zip64 fields: forced here with a small limit, then read back by
    Python's zipfile and by mt.load."""
    monkeypatch.setattr(zipformat, "_ZIP64_LIMIT", 100)
    monkeypatch.setattr(zipformat, "_MAX_ENTRIES", 3)
    tensors = [random_tensor((n,), mt.float32) for n in (10, 40, 3)]
    buf = io.BytesIO()
    mt.save(tensors, buf)
    with zipfile.ZipFile(buf) as z:
        assert z.testzip() is None and len(z.namelist()) == 7
    buf.seek(0)
    for original, loaded in zip(tensors, mt.load(buf)):
        same(original, loaded)


def test_mmap_load_views_the_file(tmp_path):
    t = random_tensor((64,), mt.float32)
    path = tmp_path / "m.pt"
    mt.save({"t": t, "head": t[:4]}, path)
    loaded, copied = mt.load(path, mmap=True), mt.load(path)
    same(loaded["t"], t)
    assert loaded["head"].untyped_storage() is loaded["t"].untyped_storage()
    with open(path, "rb") as f:
        offset, _ = ZipReader(f).span("data/0")
    with open(path, "r+b") as f:  # change the file: the mapped tensor sees it (its pages are the file's)
        f.seek(offset)
        f.write(np.float32(1234.5).tobytes())
    assert loaded["t"][0].item() == 1234.5 and loaded["head"][0].item() == 1234.5
    assert copied["t"][0].item() == t[0].item()  # without mmap the storage is the process's own memory
    loaded["t"][1] = -1.0  # a write stays private (copy-on-write), as with torch's default MAP_PRIVATE
    assert mt.load(path)["t"][1].item() == t[1].item()
    assert mt.load(path, mmap=True, map_location="cuda")["t"].device == mt.device("cuda:0")
    with pytest.raises(ValueError, match="f must be a file path in order to use the mmap argument"):
        mt.load(io.BytesIO(path.read_bytes()), mmap=True)


def test_failed_save_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.pt"
    mt.save({"old": mt.ones(3)}, path)
    old_bytes = path.read_bytes()

    def broken(record, storage):
        record.write(storage._array[:2])
        raise OSError("disk full")

    monkeypatch.setattr(serialization, "write_storage", broken)
    with pytest.raises(OSError, match="disk full"):
        mt.save({"new": mt.zeros(3)}, path)
    with pytest.raises(OSError, match="disk full"):
        mt.save({"new": mt.zeros(3)}, tmp_path / "fresh.pt")
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"] and path.read_bytes() == old_bytes
    with pytest.raises(RuntimeError, match="Parent directory .*missing does not exist"):
        mt.save({"x": 1}, tmp_path / "missing" / "x.pt")


def test_save_through_a_symlink_replaces_the_target(tmp_path):
    target = tmp_path / "real.pt"
    mt.save(1, target)
    link = tmp_path / "link.pt"
    link.symlink_to(target)
    mt.save(2, link)
    assert link.is_symlink() and mt.load(target) == 2


# ---------------------------------------------------------------------------------------------- corrupt files
def _small_checkpoint():
    base = mt.arange(12, dtype=mt.float32).view(3, 4)
    buf = io.BytesIO()
    mt.save({"a": base, "v": base[1:, 1::2], "i": mt.tensor([1, 2], dtype=mt.int16), "s": [1, "x", (2.5,)]}, buf)
    return buf.getvalue()


def _exercise(obj):
    """Touch every element of every tensor in a loaded object (they must lie inside their storages)."""
    stack, seen = [obj], set()
    while stack:
        x = stack.pop()
        if isinstance(x, mt.Tensor):
            x.tolist()
        elif isinstance(x, (list, tuple, set, frozenset, dict)) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.values() if isinstance(x, dict) else x)


def _load_corrupt(data):
    try:
        _exercise(load_bytes(data, map_location="cpu"))
    except (RuntimeError, pickle.UnpicklingError):
        pass


def test_truncated_files_give_clear_errors():
    data = _small_checkpoint()
    for n in range(len(data)):
        with pytest.raises((RuntimeError, pickle.UnpicklingError)):
            load_bytes(data[:n])
    with pytest.raises(RuntimeError, match="it is empty"):
        load_bytes(b"")
    with pytest.raises(RuntimeError, match="not a zip archive"):
        load_bytes(b"hello world, not a checkpoint")


def test_fuzzed_files_only_raise_clean_errors():
    """Thousands of mutated small checkpoints: each loads (and its tensors can be read) or raises
    RuntimeError / UnpicklingError; nothing else, no crash, no hang."""
    data = _small_checkpoint()
    fuzz = np.random.default_rng(11)
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        info = z.getinfo("archive/data.pkl")
    pickle_start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    pkl = slice(pickle_start, pickle_start + info.file_size)
    raw = np.frombuffer(data, np.uint8)
    for i in range(3000):
        mutated = raw.copy()
        where = pkl if i % 2 else slice(0, len(data))  # half the mutations aim at the pickle
        span = np.arange(len(data))[where]
        kind = i % 5
        if kind < 3:  # flip 1-3 bits
            for pos in fuzz.choice(span, kind + 1):
                mutated[pos] ^= 1 << int(fuzz.integers(8))
        elif kind == 3:  # overwrite a byte with an interesting value
            mutated[fuzz.choice(span)] = fuzz.choice([0, 1, 0x7F, 0x80, 0xFF, ord("("), ord("t"), ord("R")])
        else:  # cut a piece out of the middle
            start = int(fuzz.choice(span))
            mutated = np.concatenate([mutated[:start], mutated[start + int(fuzz.integers(1, 16)):]])
        _load_corrupt(mutated.tobytes())


def test_fuzzed_pickles_only_raise_unpickling_errors():
    """Random opcode soup straight into the restricted unpickler."""
    fuzz = np.random.default_rng(5)
    ops = list(b"()tR\x85\x86\x87]ae}su\x8f\x90\x91N\x88\x89JKMG\x8aXqhrj0\x94\x95Q.b")

    def load_storage(key, location, dtype, numel):
        return mt.UntypedStorage(min(numel, 64) * dtype.itemsize)  # tensors are checked against the real size

    for _ in range(2000):
        body = bytes(fuzz.choice(ops, int(fuzz.integers(1, 24)))) + fuzz.bytes(int(fuzz.integers(0, 8)))
        try:
            unpickler.loads(b"\x80\x02" + body, load_storage)
        except pickle.UnpicklingError:
            pass


# ---------------------------------------------------------------------------------------------- pickle, deepcopy
@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_keeps_views_and_shared_storage(protocol):
    base = random_tensor((4, 5), mt.float16)
    obj = [base, base.t(), base[1:3, 2:], base.untyped_storage()]
    loaded = pickle.loads(pickle.dumps(obj, protocol=protocol))
    assert len({id(t.untyped_storage()) for t in loaded[:3]}) == 1 and loaded[3] is loaded[0].untyped_storage()
    for original, again in zip(obj[:3], loaded[:3]):
        same(original, again)
        assert again.stride() == original.stride() and again.storage_offset() == original.storage_offset()
    loaded[0].fill_(2.0)
    assert base.tolist() != loaded[0].tolist()  # an independent copy


def test_pickle_protocol_5_out_of_band_buffers():
    t = random_tensor((16,), mt.int64)
    buffers = []
    data = pickle.dumps(t, protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == 1 and len(data) < 200
    same(pickle.loads(data, buffers=buffers), t)


def test_deepcopy_keeps_sharing_device_and_dtype():
    base = random_tensor((3, 4), mt.int32, "cuda")
    a, b, s = copy.deepcopy([base, base[1:], base.untyped_storage()])
    assert a.device == mt.device("cuda:0") and a.dtype is mt.int32
    assert a.untyped_storage() is b.untyped_storage() is s is not base.untyped_storage()
    same(a, base)
    same(b, base[1:])
    cpu = random_tensor((2, 3), mt.bool)
    twin = copy.deepcopy(cpu)
    same(twin, cpu)
    assert twin.untyped_storage() is not cpu.untyped_storage()
    storage = copy.deepcopy(cpu.untyped_storage())
    assert bytes(storage._array) == bytes(cpu.untyped_storage()._array)


# ---------------------------------------------------------------------------------------------- safetensors
SAFETENSORS_FIXTURE = {"b": ([[0, 1, 2], [3, 4, 5]], mt.int64), "a": ([1.5, -2.0], mt.float32),
                       "h": ([[1.0, 2.0]], mt.bfloat16), "m": ([True, False, True], mt.bool),
                       "s": (7, mt.int16)}


def test_safetensors_written_by_the_reference_package_load():
    loaded = mt.load_safetensors(fixture("tensors.safetensors"))
    assert picture(loaded) == EXPECTED["tensors.safetensors"]
    assert list(loaded) == ["b", "a", "z", "h", "s", "m"]  # the file's order: by alignment, then name


def test_save_safetensors_matches_the_reference_writer_byte_for_byte(tmp_path):
    tensors = {name: mt.tensor(values, dtype=dtype) for name, (values, dtype) in SAFETENSORS_FIXTURE.items()}
    tensors["z"] = mt.empty(0, 4)
    mt.save_safetensors(tensors, tmp_path / "t.safetensors", metadata={"format": "pt", "note": "fixture"})
    assert (tmp_path / "t.safetensors").read_bytes() == open(fixture("tensors.safetensors"), "rb").read()


def test_safetensors_round_trip_with_views_and_cuda(tmp_path):
    base = random_tensor((4, 6), mt.float64)
    tensors = {f"t.{d.name}": random_tensor((2, 3), d) for d in DTYPES}
    tensors.update({"view": base[1:, ::2], "transposed": base.t(), "scalar": random_tensor((), mt.int8)})
    mt.save_safetensors(tensors, tmp_path / "r.safetensors")
    loaded = mt.load_safetensors(tmp_path / "r.safetensors")
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        same(loaded[name], t)
        assert loaded[name].is_contiguous()
    cuda = mt.load_safetensors(tmp_path / "r.safetensors", device="cuda")
    assert cuda["view"].device == mt.device("cuda:0") and cuda["view"].tolist() == base[1:, ::2].tolist()
    with pytest.raises(TypeError, match="dict of str -> Tensor"):
        mt.save_safetensors({"x": 1}, tmp_path / "bad.safetensors")
    assert not (tmp_path / "bad.safetensors").exists()


def test_fuzzed_safetensors_only_raise_clean_errors(tmp_path):
    raw = np.frombuffer(open(fixture("tensors.safetensors"), "rb").read(), np.uint8)
    fuzz = np.random.default_rng(3)
    path = tmp_path / "f.safetensors"
    for i in range(400):
        mutated = raw.copy()
        for pos in fuzz.integers(0, len(raw) if i % 2 else 8 + 400, 1 + i % 3):  # half aim at the header
            mutated[pos] ^= 1 << int(fuzz.integers(8))
        path.write_bytes(mutated.tobytes())
        try:
            loaded = mt.load_safetensors(path)
        except RuntimeError:
            continue
        for t in loaded.values():
            t.tolist()


def _safetensors_file(header, data=b"", n=None):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if n is None else n) + text + data


BAD_SAFETENSORS = [
    (b"1234567", "HeaderTooSmall"),
    (struct.pack("<Q", 100_000_001) + b"{}", "HeaderTooLarge"),
    (struct.pack("<Q", 2**64 - 1), "HeaderTooLarge"),
    (_safetensors_file(b"{}", n=50), "InvalidHeaderLength"),
    (_safetensors_file(b"{\xff}"), "InvalidHeader: "),
    (_safetensors_file(b"{not json"), "InvalidHeaderDeserialization"),
    (_safetensors_file(b"[" * 100000 + b"]" * 100000), "InvalidHeaderDeserialization"),
    (_safetensors_file([1, 2]), "InvalidHeaderDeserialization"),
    (_safetensors_file({"x": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "unknown dtype"),
    (_safetensors_file({"x": {"dtype": ["U8"], "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "unknown dtype"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, b"\0"), "shape"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [1.0], "data_offsets": [0, 1]}}, b"\0"), "shape"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0]}}, b"\0"), "data_offsets"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [1]}}, b"\0"), "needs 'dtype'"),
    (_safetensors_file({"__metadata__": {"a": 1}}), "__metadata__"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}}, b"\0\0"), "InvalidOffset"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                        "y": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0"), "InvalidOffset"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 1]}}, b"\0"), "TensorInvalidInfo"),
    (_safetensors_file({"x": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 4]}}, b"\0" * 4),
     "ValidationOverflow"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0\0"),
     "MetadataIncompleteBuffer"),
    (_safetensors_file({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]}}, b"\0"),
     "MetadataIncompleteBuffer"),
    (_safetensors_file({"x": {"dtype": "F8_E5M2", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
     "dtype F8_E5M2, which minitensor does not have"),
]


@pytest.mark.parametrize("content, match", BAD_SAFETENSORS, ids=[m.split(":")[0][:24] for _, m in BAD_SAFETENSORS])
def test_safetensors_reader_validation(tmp_path, content, match):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(RuntimeError, match=match):
        mt.load_safetensors(path)


# ---------------------------------------------------------------------------------------------- pieces
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_crc32_combine_and_parallel_pieces(monkeypatch):
    import zlib
    for n1, n2 in [(0, 5), (5, 0), (1, 1), (100, 3333), (7, 1 << 20)]:
        a, b = rng.bytes(n1), rng.bytes(n2)
        assert crc32.combine(zlib.crc32(a), zlib.crc32(b), n2) == zlib.crc32(a + b)
    monkeypatch.setattr(crc32, "_PIECE", 1000)
    data = memoryview(rng.bytes(10_001))
    ran = []
    assert crc32.crc32(data, 77, alongside=lambda: ran.append(1)) == zlib.crc32(data, 77) and ran == [1]
    if hasattr(os, "fork"):  # a forked child has none of the parent's pool threads: it must not hang
        pid = os.fork()
        if pid == 0:
            os._exit(0 if crc32.crc32(data) == zlib.crc32(data) else 1)
        assert os.waitpid(pid, 0)[1] == 0


# ---------------------------------------------------------------------------------------------- torch itself
def test_torch_reads_what_mt_saves_and_mt_reads_what_torch_saves(tmp_path):
    torch = pytest.importorskip("torch", reason="torch is not installed: the committed fixtures cover interop")
    names = {mt.bool: torch.bool, mt.bfloat16: torch.bfloat16}
    tensors = {d.name: random_tensor((3, 4), d) for d in DTYPES}
    base = tensors["float32"]
    obj = {"t": tensors, "views": [base[1:], base.t(), base[:, ::2]], "mixed": [base, base.view(mt.int32)],
           "storage": base.untyped_storage(), "meta": collections.OrderedDict(step=3, name="x", b=b"\x01")}
    mt.save(obj, tmp_path / "mt.pt")
    loaded = torch.load(tmp_path / "mt.pt", weights_only=True)
    assert loaded["meta"] == obj["meta"]
    for name, t in tensors.items():
        expected = torch.from_numpy(serialization_values(t).copy())
        got = loaded["t"][name]
        assert got.dtype == names.get(t.dtype, getattr(torch, name))
        assert torch.equal(got.view(expected.dtype) if t.dtype is mt.bfloat16 else got, expected)
    views = loaded["views"]
    assert views[0].untyped_storage().data_ptr() == loaded["t"]["float32"].untyped_storage().data_ptr()
    assert views[1].stride() == (1, 4) and torch.equal(views[2], loaded["t"]["float32"][:, ::2])
    assert torch.equal(loaded["mixed"][1], loaded["mixed"][0].view(torch.int32))
    mmapped = torch.load(tmp_path / "mt.pt", weights_only=True, mmap=True)
    assert torch.equal(mmapped["t"]["int64"], loaded["t"]["int64"])
    if torch.cuda.is_available():
        cuda = roundtrip_file(tmp_path, {"c": random_tensor((5,), mt.float32, "cuda")})
        assert torch.load(cuda, weights_only=True)["c"].device == torch.device("cuda:0")

    source = {"x": torch.randn(4, 5), "v": None, "p": torch.nn.Parameter(torch.ones(2))}
    source["v"] = source["x"][1:, ::2]
    torch.save(source, tmp_path / "torch.pt")
    back = mt.load(tmp_path / "torch.pt")
    assert back["v"].untyped_storage() is back["x"].untyped_storage()
    assert back["v"].tolist() == source["v"].tolist() and back["p"].tolist() == [1.0, 1.0]


def roundtrip_file(tmp_path, obj):
    path = tmp_path / "cuda.pt"
    mt.save(obj, path)
    return path
