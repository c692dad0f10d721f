"""TypedStorage (`Tensor.storage()`): a typed view of an UntypedStorage, its element access, copies and casts,
pickling, and mt.save / mt.load of storages with the tensors that view them, both ways with torch.

The deprecation warning torch gives (and minitensor mirrors, once per process) is checked in one test and
ignored in the others, so the suite stays free of warnings.
"""
import copy
import io
import pickle
import warnings
import zipfile

import numpy as np
import pytest

import minitensor as mt
from minitensor.core import typed_storage

pytestmark = pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")

DTYPES = [mt.bool, mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, mt.float16, mt.bfloat16, mt.float32, mt.float64]
CASTS = {"double": mt.float64, "float": mt.float32, "half": mt.float16, "bfloat16": mt.bfloat16, "long": mt.int64,
         "int": mt.int32, "short": mt.int16, "char": mt.int8, "byte": mt.uint8, "bool": mt.bool}
TORCH_NAMES = {mt.bool: "Bool", mt.uint8: "Byte", mt.int8: "Char", mt.int16: "Short", mt.int32: "Int",
               mt.int64: "Long", mt.float16: "Half", mt.bfloat16: "BFloat16", mt.float32: "Float",
               mt.float64: "Double"}
rng = np.random.default_rng(7)


def random_values(n, dtype):
    """n random values that `dtype` holds exactly (float values are multiples of 1/4 below 64)."""
    if dtype is mt.bool:
        return (rng.random(n) < 0.5).tolist()
    if dtype.is_floating_point:
        return (rng.integers(-256, 256, n) / 4).tolist()
    info = np.iinfo(dtype.np)
    return rng.integers(info.min, info.max, n, endpoint=True).tolist()


def random_tensor(n, dtype, device):
    return mt.tensor(random_values(n, dtype), dtype=dtype, device=device)


def roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    mt.save(obj, buf)
    buf.seek(0)
    return mt.load(buf, **load_kwargs)


# ---------------------------------------------------------------------------------------------- the view
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_storage_is_the_whole_storage_and_shares_memory(device, dtype):
    base = random_tensor(7, dtype, device)
    view = base[1::2]  # a strided view with an offset: its storage is still all 7 elements
    s = view.storage()
    assert type(s) is mt.TypedStorage and s.dtype is dtype and s.device == base.device
    assert s.size() == len(s) == 7 and s.nbytes() == 7 * dtype.itemsize and s.element_size() == dtype.itemsize
    assert s.data_ptr() == base.data_ptr() and s.untyped() is view.untyped_storage()
    assert s.is_cuda == (device == "cuda") and not s.is_pinned()
    assert s.tolist() == base.tolist() and list(s) == base.tolist()
    assert [s[i] for i in range(-7, 7)] == base.tolist() * 2
    value = random_values(1, dtype)[0]
    s[3] = value  # a write through the storage shows in the tensor, and the reverse
    assert view[1].item() == value
    view[2] = s[0]
    assert s[5] == base[0].item()


def test_type_names_and_conversions_of_the_seed():
    """test_type_conversions: x.storage().float(), .cuda().double(), .cuda().float().cpu().int()."""
    y = mt.randn(5, 5).storage()
    assert y.float().type() == "minitensor.FloatStorage"
    assert y.cuda().double().type() == "minitensor.cuda.DoubleStorage"
    assert y.cuda().float().type() == "minitensor.cuda.FloatStorage"
    assert y.cuda().float().cpu().type() == "minitensor.FloatStorage"
    assert y.cuda().float().cpu().int().type() == "minitensor.IntStorage"
    for dtype, name in TORCH_NAMES.items():
        assert mt.TypedStorage(2, dtype=dtype).type() == f"minitensor.{name}Storage"
        assert mt.TypedStorage(2, dtype=dtype, device="cuda").type() == f"minitensor.cuda.{name}Storage"


@pytest.mark.parametrize("source", [mt.float64, mt.int32, mt.bool, mt.bfloat16], ids=lambda d: d.name)
def test_casts_make_new_storages_with_the_values_cast(device, source):
    values = [-2.75, -1.5, 0.0, 0.25, 1.0, 3.5, 100.75] if source.is_floating_point else random_values(7, source)
    s = mt.tensor(values, dtype=source, device=device).storage()
    for method, dtype in CASTS.items():
        out = getattr(s, method)()
        assert type(out) is mt.TypedStorage and out.dtype is dtype and out.device == s.device
        assert out.data_ptr() != s.data_ptr()  # a copy, even for the same dtype
        assert out.tolist() == mt.tensor(values, dtype=source).to(dtype).tolist()
    if source is mt.float64:  # the same casts numpy makes for values in range: truncation toward zero
        assert s.int().tolist() == np.array(values).astype(np.int32).tolist()
        assert s.bool().tolist() == (np.array(values) != 0).tolist()


def test_casts_with_torch():
    torch = pytest.importorskip("torch")
    values = [-2.75, -1.5, 0.0, 0.25, 1.0, 3.5, 100.75, 300.5]
    mine, theirs = mt.tensor(values, dtype=mt.float64).storage(), torch.tensor(values, dtype=torch.float64).storage()
    for method in CASTS:
        assert getattr(mine, method)().tolist() == getattr(theirs, method)().tolist(), method


def test_devices_cpu_cuda_to(device):
    s = random_tensor(5, mt.float32, device).storage()
    on_cpu, on_cuda = s.cpu(), s.cuda()
    assert on_cpu.device == mt.device("cpu") and on_cuda.device == mt.device("cuda:0")
    assert on_cpu.tolist() == on_cuda.tolist() == s.tolist()
    same = on_cpu if device == "cpu" else on_cuda  # already there: the same memory, as in torch
    assert same.data_ptr() == s.data_ptr() and same.untyped() is s.untyped()
    other = on_cuda if device == "cpu" else on_cpu
    assert other.data_ptr() != s.data_ptr()
    assert s.to(device="cuda").device == mt.device("cuda:0") and s.to(device=mt.device("cpu")).device.type == "cpu"
    assert s.cuda(0).device == mt.device("cuda:0")
    if device == "cpu":
        pinned = s.pin_memory()
        assert pinned.is_pinned() and pinned.dtype is mt.float32 and pinned.tolist() == s.tolist()


def test_element_errors():
    s = mt.arange(3, dtype=mt.float32).storage()
    with pytest.raises(IndexError, match="index 3 out of range for storage of size 3"):
        s[3]
    with pytest.raises(IndexError, match="index -4 out of range for storage of size 3"):
        s[-4]
    with pytest.raises(RuntimeError, match="slices of a storage are not supported"):
        s[1:2]
    with pytest.raises(RuntimeError, match="can't index a .*TypedStorage.* with <class 'str'>"):
        s["x"]
    with pytest.raises(TypeError, match="can't index a .*TypedStorage.* with <class 'bool'>"):
        s[True]
    with pytest.raises(RuntimeError, match="cannot set item with value type"):
        s[0] = s
    with pytest.raises(IndexError):
        s[5] = 1.0
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8_t without overflow"):
        mt.TypedStorage(2, dtype=mt.int8).fill_(300)
    assert s.tolist() == [0.0, 1.0, 2.0]


def test_setitem_slices_and_fill(device):
    t = random_tensor(6, mt.int32, device)
    s = t.storage()
    s[1:4] = 7
    s[-1] = -5
    expected = t.tolist()
    assert expected[1:4] == [7, 7, 7] and expected[5] == -5 and s.tolist() == expected
    assert s.fill_(3) is s and t.tolist() == [3] * 6
    empty = mt.empty(0, device=device).storage()
    assert empty.fill_(1.0).tolist() == [] and len(empty) == 0


def test_copy_copies_bytes_and_clone_copies_memory(device):
    src = mt.TypedStorage([1, 2, 3], dtype=mt.int32, device=device)
    for target in ("cpu", "cuda"):
        dst = mt.TypedStorage(3, dtype=mt.float32, device=target)
        assert dst.copy_(src) is dst
        assert dst.untyped().cpu()._array.tobytes() == src.untyped().cpu()._array.tobytes()  # bytes, not values
        dst.copy_(src.untyped())
    with pytest.raises(RuntimeError, match="size does not match, self was 8 bytes but src was 12 bytes"):
        mt.TypedStorage(2, dtype=mt.int32).copy_(src)
    with pytest.raises(TypeError, match="must be a TypedStorage or UntypedStorage, not Tensor"):
        src.copy_(mt.zeros(3))
    twin = src.clone()
    assert twin.data_ptr() != src.data_ptr() and twin.device == src.device and twin.tolist() == [1, 2, 3]
    twin[0] = 9
    assert src[0] == 1


def test_constructors(device):
    assert mt.TypedStorage().dtype is mt.float32 and len(mt.TypedStorage()) == 0
    s = mt.TypedStorage(4, dtype=mt.int16, device=device)
    assert s.size() == 4 and s.nbytes() == 8 and s.device == mt.device(device if device == "cpu" else "cuda:0")
    assert mt.TypedStorage([1, 2.5, True], device=device).tolist() == [1.0, 2.5, 1.0]
    assert mt.TypedStorage((1, 2.5, np.int64(3)), dtype=mt.int32).tolist() == [1, 2, 3]  # truncated, as torch
    assert mt.TypedStorage(range(3), dtype=mt.bfloat16, device=device).tolist() == [0.0, 1.0, 2.0]
    raw = mt.UntypedStorage(7, device)
    wrapped = mt.TypedStorage(wrap_storage=raw, dtype=mt.float32)
    assert wrapped.untyped() is raw and wrapped.size() == 1  # whole elements only
    with pytest.raises(RuntimeError, match="Argument 'dtype' must be specified"):
        mt.TypedStorage(wrap_storage=raw)
    with pytest.raises(TypeError, match="Argument 'wrap_storage' must be UntypedStorage"):
        mt.TypedStorage(wrap_storage=wrapped, dtype=mt.float32)
    with pytest.raises(RuntimeError, match="No positional arguments should be given when using 'wrap_storage'"):
        mt.TypedStorage(3, wrap_storage=raw, dtype=mt.float32)
    with pytest.raises(RuntimeError, match="Too many positional arguments"):
        mt.TypedStorage(1, 2)
    with pytest.raises(TypeError, match="Argument type not recognized: <class 'float'>"):
        mt.TypedStorage(2.5)
    with pytest.raises(TypeError, match="Argument 'dtype' must be minitensor.dtype"):
        mt.TypedStorage(2, dtype="float32")
    with pytest.raises(RuntimeError, match="size must be a non-negative int, got -1"):
        mt.TypedStorage(-1)
    with pytest.raises(TypeError, match="items must be numbers .* got str"):
        mt.TypedStorage([1, "2"])
    with pytest.raises(RuntimeError, match="value cannot be converted to type int8 without overflow"):
        mt.TypedStorage([300], dtype=mt.int8)


def test_repr_is_torchs():
    s = mt.tensor([1.5, -2.0], dtype=mt.float32).storage()
    assert repr(s) == " 1.5\n -2.0\n[minitensor.TypedStorage(dtype=minitensor.float32, device=cpu) of size 2]"
    assert repr(mt.TypedStorage(0)) == " \n[minitensor.TypedStorage(dtype=minitensor.float32, device=cpu) of size 0]"
    assert repr(s.cuda().bool()).endswith(" True\n True\n[minitensor.TypedStorage(dtype=minitensor.bool, "
                                          "device=cuda:0) of size 2]")


def test_repr_matches_torch():
    torch = pytest.importorskip("torch")
    for dtype in DTYPES:
        values = random_values(3, dtype)
        mine = repr(mt.tensor(values, dtype=dtype).storage())
        theirs = repr(torch.tensor(values, dtype=getattr(torch, dtype.name)).storage())
        assert mine == theirs.replace("torch.storage.", "minitensor.").replace("torch.", "minitensor."), dtype


def test_deprecation_warning_once_as_torch(monkeypatch):
    monkeypatch.setattr(typed_storage, "_warned", False)
    t = mt.zeros(2)
    with pytest.warns(UserWarning, match="TypedStorage is deprecated") as record:
        t.storage()
    assert record[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.storage()  # once per process
        mt.TypedStorage(2)
    monkeypatch.setattr(typed_storage, "_warned", False)
    with pytest.warns(UserWarning, match="TypedStorage is deprecated"):
        mt.TypedStorage(2)


def test_deprecation_matches_torch():
    torch = pytest.importorskip("torch")
    assert typed_storage.DEPRECATION.startswith("TypedStorage is deprecated")
    torch.storage._reset_warn_typed_storage_removal()
    with pytest.warns(UserWarning) as record:
        torch.zeros(2).storage()
    assert str(record[0].message) == typed_storage.DEPRECATION


# ---------------------------------------------------------------------------------------------- pickle
def test_pickle_and_deepcopy_keep_sharing(device):
    x = random_tensor(6, mt.float64, device)
    for again in (pickle.loads(pickle.dumps([x, x.storage()])), copy.deepcopy([x, x.storage()])):
        tensor, storage = again
        assert type(storage) is mt.TypedStorage and storage.dtype is mt.float64 and storage.device == x.device
        assert storage.untyped() is tensor.untyped_storage() and storage.tolist() == x.tolist()
        storage[2] = 1000.5  # outside random_values' range: the original keeps its value
        assert tensor[2].item() == 1000.5 and x[2].item() != 1000.5
    alone = pickle.loads(pickle.dumps(x.storage()))
    assert alone.tolist() == x.tolist() and alone.data_ptr() != x.data_ptr()


# ---------------------------------------------------------------------------------------------- mt.save / mt.load
def test_seed_serialization_array_with_storage():
    """test_serialization_array_with_storage: [x, y, x, y.storage()] on cuda comes back with its sharing."""
    x = mt.randn(5, 5).cuda()
    y = mt.zeros(2, 5, dtype=mt.int32).cuda()
    q = [x, y, x, y.storage()]
    q_copy = roundtrip(q)
    assert q_copy[0].tolist() == x.tolist() and q_copy[1].tolist() == y.tolist() and q_copy[3].tolist() == [0] * 10
    q_copy[0].fill_(5)
    assert q_copy[0] is q_copy[2] and q_copy[2].tolist() == [[5.0] * 5] * 5
    assert q_copy[0].type() == "minitensor.cuda.FloatTensor" and q_copy[1].type() == "minitensor.cuda.IntTensor"
    assert isinstance(q_copy[3], mt.TypedStorage) and isinstance(q_copy[3].untyped(), mt.UntypedStorage)
    assert q_copy[3].type() == "minitensor.cuda.IntStorage"
    q_copy[1].fill_(10)
    assert q_copy[3].tolist() == mt.TypedStorage(10, dtype=mt.int32, device="cuda").fill_(10).tolist()


@pytest.mark.parametrize("dtype", [mt.float32, mt.int64, mt.bool, mt.bfloat16], ids=lambda d: d.name)
def test_saved_storage_keeps_aliasing(device, dtype):
    x = random_tensor(12, dtype, device).view(3, 4)
    q = roundtrip({"x": x, "storage": x.storage(), "view": x[1:, ::2], "again": x.t().storage()})
    s = q["storage"]
    assert type(s) is mt.TypedStorage and s.dtype is dtype and s.device == x.device and s.size() == 12
    assert s is q["again"] and s.untyped() is q["x"].untyped_storage() is q["view"].untyped_storage()
    assert q["x"].storage().data_ptr() == s.data_ptr() and s.tolist() == x.reshape(-1).tolist()
    value = random_values(1, dtype)[0]
    s.fill_(value)  # writing through the loaded storage shows in the loaded tensors
    assert q["x"].reshape(-1).tolist() == [value] * 12 and q["view"].tolist() == [[value] * 2] * 2


def test_storage_saved_alone_and_empty(device):
    s = roundtrip(mt.TypedStorage([3, 1, 2], dtype=mt.int16, device=device))
    assert type(s) is mt.TypedStorage and s.dtype is mt.int16 and s.tolist() == [3, 1, 2]
    e = roundtrip([mt.empty(0, dtype=mt.float64, device=device).storage()])[0]
    assert e.dtype is mt.float64 and e.size() == 0 and e.device.type == device


@pytest.mark.parametrize("source", ["cpu", "cuda"])
def test_map_location(source):
    x = random_tensor(4, mt.float32, source)
    buf = io.BytesIO()
    mt.save([x, x.storage()], buf)
    for map_location, expected in (("cpu", "cpu"), ("cuda", "cuda:0"), (mt.device("cuda:0"), "cuda:0"),
                                   ({"cuda:0": "cpu", "cpu": "cuda:0"}, "cuda:0" if source == "cpu" else "cpu"),
                                   (lambda storage, tag: storage, "cpu")):
        buf.seek(0)
        tensor, storage = mt.load(buf, map_location=map_location)
        assert str(storage.device) == expected and storage.untyped() is tensor.untyped_storage()
        storage[0] = 42.0
        assert tensor[0].item() == 42.0 and tensor[1:].tolist() == x[1:].tolist()


def test_what_is_written_for_a_storage():
    """The persistent id torch.save writes: ('storage', torch.<Dtype>Storage, key, location, numel)."""
    x = mt.arange(6, dtype=mt.int32, device="cuda")
    buf = io.BytesIO()
    mt.save([x, x[2:].storage()], buf)
    assert pickled_structure(buf.getvalue()) == [
        ("_rebuild_tensor_v2", ("storage", "torch.IntStorage", "0", "cuda:0", 6), 0, (6,), (1,)),
        ("storage", "torch.IntStorage", "0", "cuda:0", 6)]


def test_different_views_of_one_storage_are_refused():
    x = mt.arange(4, dtype=mt.float32)
    for obj in ([x, x.view(mt.int32).storage()], [x.storage(), x.view(mt.int32).storage()],
                [x.untyped_storage(), x.storage()]):
        with pytest.raises(RuntimeError, match="Cannot save multiple tensors or storages that view the same data "
                                               "as different types"):
            mt.save(obj, io.BytesIO())
    odd = mt.TypedStorage(wrap_storage=mt.UntypedStorage(7), dtype=mt.float32)
    with pytest.raises(RuntimeError, match="float32 TypedStorage over 7 bytes: not a whole number of 4-byte"):
        mt.save(odd, io.BytesIO())


# ---------------------------------------------------------------------------------------------- with torch
def pickled_structure(archive):
    """data.pkl of a checkpoint, read with pickle: storages as their persistent ids, tensors as
    (rebuild, pid, offset, size, stride), so two writers' files compare by what they say."""
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))

    class Reader(pickle.Unpickler):
        def find_class(self, module, name):
            if name.startswith("_rebuild_tensor"):
                return lambda storage, offset, size, stride, *rest: (name, storage, offset, size, stride)
            if name == "OrderedDict":
                return dict
            return f"{module}.{name}"

        def persistent_load(self, pid):
            return pid

    return Reader(io.BytesIO(data)).load()


def test_torch_writes_the_same_persistent_ids():
    torch = pytest.importorskip("torch")
    values = random_values(6, mt.float32)
    ours, theirs = io.BytesIO(), io.BytesIO()
    x = mt.tensor(values)
    mt.save([x, x[2:].storage(), x[1:]], ours)
    y = torch.tensor(values)
    torch.save([y, y[2:].storage(), y[1:]], theirs)
    assert pickled_structure(ours.getvalue()) == pickled_structure(theirs.getvalue())


@pytest.mark.parametrize("dtype", [mt.float32, mt.int16, mt.bfloat16, mt.bool], ids=lambda d: d.name)
def test_torch_loads_what_mt_saves(tmp_path, device, dtype):
    torch = pytest.importorskip("torch")
    x = random_tensor(10, dtype, device).view(2, 5)
    mt.save([x, x.storage(), x[1]], tmp_path / "mt.pt")
    t, s, row = torch.load(tmp_path / "mt.pt", weights_only=True, map_location="cpu")
    assert isinstance(s, torch.storage.TypedStorage) and isinstance(s._untyped_storage, torch.UntypedStorage)
    assert s.dtype == getattr(torch, dtype.name) and s.size() == 10 and s.tolist() == x.reshape(-1).tolist()
    assert t.untyped_storage().data_ptr() == s.data_ptr() == row.untyped_storage().data_ptr()
    value = random_values(1, dtype)[0]
    s.fill_(value)
    assert t.tolist() == [[value] * 5] * 2 and row.tolist() == [value] * 5


@pytest.mark.parametrize("map_location", ["cpu", "cuda"])
def test_mt_loads_what_torch_saves(tmp_path, map_location):
    torch = pytest.importorskip("torch")
    y = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32)
    torch.save([y, y.storage(), y[:, 1:], y.double().storage()], tmp_path / "torch.pt")
    t, s, view, doubles = mt.load(tmp_path / "torch.pt", map_location=map_location)
    assert type(s) is mt.TypedStorage and s.dtype is mt.int32 and s.device.type == map_location
    assert s.type() == ("minitensor.IntStorage" if map_location == "cpu" else "minitensor.cuda.IntStorage")
    assert s.untyped() is t.untyped_storage() is view.untyped_storage() and s.tolist() == [1, 2, 3, 4, 5, 6]
    assert doubles.dtype is mt.float64 and doubles.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    s[4] = -7
    assert t.tolist() == [[1, 2, 3], [4, -7, 6]] and view.tolist() == [[2, 3], [-7, 6]]
