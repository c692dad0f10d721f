"""Interop: __cuda_array_interface__ (v3), DLPack (legacy and versioned capsules) and numpy.

On CI the "cuda" device is the simulator: the interface dicts, minitensor's own round trips, numpy on the
CPU, fabricated producers (a CAI dict or DLPack structs over memory we own) and stream ordering through
mt.cuda.Gate. On a real GPU the same tests run, and so do the numba.cuda cases of torch's
test_numba_integration.py and the CuPy and torch exchanges in both directions.
"""
import ctypes
import gc
import re
import sys
import weakref

import numpy as np
import pytest

import minitensor as mt
from minitensor.interop import dlpack
from helpers import run_python

DEV = "cuda"
ON_GPU = mt.cuda.backend() == "nvidia"
# every dtype numpy (hence the CAI typestr) has, with its little-endian code
TYPESTR = {mt.bool: "|b1", mt.uint8: "|u1", mt.int8: "|i1", mt.int16: "<i2", mt.int32: "<i4", mt.int64: "<i8",
           mt.float16: "<f2", mt.float32: "<f4", mt.float64: "<f8"}
NP_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
rng = np.random.default_rng(7)
NUMPY_2_1 = np.lib.NumpyVersion(np.__version__) >= "2.1.0"  # DLPack 1.0, writable imports


@pytest.fixture(autouse=True)
def _idle_default_stream():
    """Each test starts and ends with an idle device and the default stream current."""
    mt.cuda.synchronize()
    yield
    mt.cuda.set_stream(mt.cuda.default_stream())
    mt.cuda.synchronize()


def random_array(shape, np_dtype):
    if np_dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(np_dtype).kind in "iu":
        return rng.integers(0, 100, shape).astype(np_dtype)
    return rng.standard_normal(shape).astype(np_dtype)


def host(t):
    return t.cpu().numpy()


@pytest.fixture
def gate():
    """A device-side wait the test opens; opened at teardown too, so a failing test cannot hang the rest."""
    g = mt.cuda.Gate()
    yield g
    g.open()


def filled_behind(gate):
    """16 zeros on DEV, and a stream that is blocked on `gate` and then fills them with 5.0."""
    src = mt.zeros(16, device=DEV)
    src.clone()  # loads the copy kernel the tests use: none can be loaded while the gate is closed
    s = mt.cuda.Stream()
    s.wait_stream(mt.cuda.current_stream())  # after the zeros
    with s:
        gate.wait()
        src.fill_(5.0)
    return src, s


def capsule_name(capsule):
    return repr(capsule).split('"')[1]


class CAIProducer:
    """Another library's array, as far as the CUDA array interface goes: a dict over memory it owns."""

    def __init__(self, tensor, **changes):
        self.tensor = tensor
        self.__cuda_array_interface__ = {**tensor.__cuda_array_interface__, **changes}


# ==============================================================================================
# __cuda_array_interface__: the producer side
# ==============================================================================================
@pytest.mark.parametrize("dtype", mt.dtypes.ALL, ids=str)
def test_cai_absent_on_cpu_tensors(dtype):
    t = mt.empty(10, dtype=dtype)
    assert not hasattr(t, "__cuda_array_interface__")
    with pytest.raises(AttributeError, match="non-CUDA tensor"):
        t.__cuda_array_interface__


@pytest.mark.parametrize("dtype", list(TYPESTR), ids=str)
def test_cai_contiguous_every_dtype(dtype):
    t = mt.empty(10, dtype=dtype, device=DEV)
    assert hasattr(t, "__cuda_array_interface__")
    cai = t.__cuda_array_interface__
    assert set(cai) == {"shape", "typestr", "data", "strides", "version", "stream"}
    assert cai["shape"] == (10,)
    assert cai["strides"] is None
    assert cai["typestr"] == TYPESTR[dtype] == np.dtype(dtype.np).newbyteorder("<").str
    assert cai["data"] == (t.data_ptr(), False)
    assert cai["version"] == 3
    assert cai["stream"] == 1  # the legacy default stream, never 0


@pytest.mark.parametrize("dtype", list(TYPESTR), ids=str)
def test_cai_strided_and_offset_views(dtype):
    shape = tuple(int(n) for n in rng.integers(3, 6, 3))
    t = mt.empty(shape, dtype=dtype, device=DEV)
    size, base = dtype.itemsize, t.data_ptr()
    cases = {
        "slice": t[1:, ::2],
        "transpose": t.transpose(0, 2),
        "select": t[:, 2],
        "expand": t[:, :1].expand(shape[0], 4, shape[2]),
    }
    for name, v in cases.items():
        cai = v.__cuda_array_interface__
        assert cai["shape"] == tuple(v.shape), name
        assert cai["strides"] == tuple(s * size for s in v.stride()), name
        assert cai["data"] == (base + v.storage_offset() * size, False), name
    offset = t[1:]  # contiguous, at an offset: no strides, shifted pointer
    assert offset.__cuda_array_interface__["strides"] is None
    assert offset.__cuda_array_interface__["data"][0] == base + shape[1] * shape[2] * size


def test_cai_zero_dim_and_empty():
    scalar = mt.empty((), dtype=mt.int32, device=DEV)
    cai = scalar.__cuda_array_interface__
    assert cai["shape"] == () and cai["strides"] is None and cai["data"] == (scalar.data_ptr(), False)
    empty = mt.empty(0, 3, device=DEV)
    cai = empty.__cuda_array_interface__
    assert cai["shape"] == (0, 3) and cai["data"] == (0, False)


def test_cai_bfloat16_has_no_typestr():
    t = mt.empty(4, dtype=mt.bfloat16, device=DEV)
    with pytest.raises(TypeError, match="bfloat16"):
        t.__cuda_array_interface__


def test_cai_stream_is_the_current_stream():
    t = mt.empty(4, device=DEV)
    s = mt.cuda.Stream()
    with s:
        assert t.__cuda_array_interface__["stream"] == s.cuda_stream
    assert t.__cuda_array_interface__["stream"] == 1


# ==============================================================================================
# __cuda_array_interface__: the consumer side (mt.as_tensor, mt.tensor)
# ==============================================================================================
@pytest.mark.parametrize("dtype", [mt.float32, mt.int16, mt.bool], ids=str)
def test_as_tensor_cai_is_zero_copy_and_writes_show_both_ways(dtype):
    values = random_array((3, 4), dtype.np)
    src = mt.tensor(values, device=DEV)
    v = mt.as_tensor(CAIProducer(src))
    assert v.device == src.device and v.dtype is dtype and v.shape == src.shape and v.is_contiguous()
    assert v.data_ptr() == src.data_ptr()
    assert v.__cuda_array_interface__ == src.__cuda_array_interface__
    np.testing.assert_array_equal(host(v), values)
    v[0] = 1
    values[0] = 1
    np.testing.assert_array_equal(host(src), values)
    src[2, 1:] = 0
    values[2, 1:] = 0
    np.testing.assert_array_equal(host(v), values)
    assert mt.as_tensor(CAIProducer(src), device="cuda").data_ptr() == src.data_ptr()


def test_as_tensor_cai_strided_view():
    values = random_array((4, 6), np.float32)
    src = mt.tensor(values, device=DEV)
    view = src[1:, ::2]
    v = mt.as_tensor(CAIProducer(view))
    assert v.shape == view.shape and v.stride() == view.stride() and v.data_ptr() == view.data_ptr()
    np.testing.assert_array_equal(host(v), values[1:, ::2])
    v.fill_(-1)
    values[1:, ::2] = -1
    np.testing.assert_array_equal(host(src), values)
    assert v.__cuda_array_interface__ == view.__cuda_array_interface__


def test_as_tensor_cai_keeps_the_producer_alive():
    values = random_array(64, np.float32)
    src = mt.tensor(values, device=DEV)
    producer = CAIProducer(src)
    alive = weakref.ref(src.untyped_storage())
    v = mt.as_tensor(producer)
    del src, producer
    gc.collect()
    assert alive() is not None
    other = mt.full((64,), 5.0, device=DEV)  # must not get the memory v still uses
    np.testing.assert_array_equal(host(v), values)
    np.testing.assert_array_equal(host(other), np.full(64, 5.0, np.float32))
    del v
    gc.collect()
    assert alive() is None


def test_as_tensor_and_tensor_copy_when_asked_for_another_device_or_dtype():
    values = random_array(5, np.int32)
    src = mt.tensor(values, device=DEV)
    on_cpu = mt.as_tensor(CAIProducer(src), device="cpu")
    as_long = mt.as_tensor(CAIProducer(src), dtype=mt.int64)
    copied = mt.tensor(CAIProducer(src))
    assert on_cpu.device == mt.device("cpu") and as_long.dtype is mt.int64
    assert copied.device == src.device and copied.data_ptr() != src.data_ptr()
    src.fill_(0)
    for t in (on_cpu, as_long, copied):
        np.testing.assert_array_equal(host(t), values)


def test_as_tensor_cai_inferred_strides_are_contiguous():
    src = mt.empty(2, 3, dtype=mt.uint8, device=DEV)
    producer = CAIProducer(src, version=2)
    del producer.__cuda_array_interface__["stream"], producer.__cuda_array_interface__["strides"]
    v = mt.as_tensor(producer)
    assert v.is_contiguous() and v.stride() == (3, 1) and v.dtype is mt.uint8


def test_as_tensor_cai_waits_for_the_producers_stream(gate):
    """The producer wrote on a stream that is still blocked: the consumer's reads must come after it."""
    src, s = filled_behind(gate)
    with s:
        cai_synced = src.__cuda_array_interface__
    assert cai_synced["stream"] == s.cuda_stream
    unsynced = mt.as_tensor(CAIProducer(src, stream=None)).clone()  # runs now: s is still blocked
    np.testing.assert_array_equal(host(unsynced), np.zeros(16, np.float32))
    synced = mt.as_tensor(CAIProducer(src, stream=cai_synced["stream"])).clone()  # waits for s
    gate.open()
    np.testing.assert_array_equal(host(synced), np.full(16, 5.0, np.float32))


@pytest.mark.parametrize("change, error, message", [
    ({"data": (1, True)}, BufferError, "read-only"),
    ({"mask": object()}, BufferError, "mask"),
    ({"typestr": ">f4"}, TypeError, "big-endian"),
    ({"typestr": "<M8[s]"}, TypeError, "datetime64"),
    ({"typestr": "nonsense"}, TypeError, "not a numpy type code"),
    ({"strides": (-4,)}, BufferError, "negative"),
    ({"strides": (6,)}, BufferError, "multiples of the element size 4"),
    ({"strides": (4, 4)}, BufferError, "1 dims"),
    ({"stream": 0}, ValueError, "stream 0 is ambiguous"),
    ({"version": 4}, BufferError, "version 4"),
], ids=lambda x: str(x)[:24])
def test_as_tensor_cai_errors(change, error, message):
    src = mt.empty(3, dtype=mt.float32, device=DEV)
    with pytest.raises(error, match=message):
        mt.as_tensor(CAIProducer(src, **change))


class RawCAI:
    """A CUDA array interface as a broken or hostile producer may give it: 4 float32 unless changed."""

    def __init__(self, **changes):
        self.__cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3,
                                         **changes}


@pytest.mark.parametrize("change, error, message", [
    ({"data": (0x1000, False)}, BufferError, "0x1000 is in no allocation"),
    ({"data": (0, False)}, BufferError, "null pointer for 4 elements"),
    ({"data": (-8, False)}, BufferError, "data pointer -8"),
    ({"data": (2**64, False)}, BufferError, "data pointer 18446744073709551616"),
    ({"data": ("0x1000", False)}, TypeError, "data pointer must be an int, not str"),
    ({"data": 5}, TypeError, "'data' must be a (pointer, read_only) pair, not int"),
    ({"shape": (-1,)}, BufferError, "negative dimension -1"),
    ({"shape": (2.5,)}, TypeError, "shape must be tuple of ints, but found element of type float at pos 0"),
    ({"shape": 4}, TypeError, "shape must be tuple of ints, not int"),
    ({"shape": (2**62, 2**62), "strides": (0, 0)}, BufferError, "numel: integer multiplication overflow"),
    ({"shape": (2, 2**62), "strides": (4, 2**63)}, BufferError, "Storage size calculation overflowed"),
    ({"strides": (2**62,)}, BufferError, "Storage size calculation overflowed"),
    ({"strides": (4.0,)}, TypeError, "strides must be tuple of ints"),
    ({"typestr": None}, TypeError, "typestr None is not a numpy type code"),
], ids=lambda x: str(x)[:32])
def test_as_tensor_cai_absurd_fields_are_refused(change, error, message):
    """Before: the tensor was made over whatever the dict said, and the first kernel crashed the process."""
    src = mt.zeros(4, device=DEV)
    change.setdefault("data", (src.data_ptr(), False))
    with pytest.raises(error, match=re.escape(message)):
        mt.as_tensor(RawCAI(**change))
    for key in ("shape", "typestr", "data"):
        producer = RawCAI(data=(src.data_ptr(), False))
        del producer.__cuda_array_interface__[key]
        with pytest.raises(BufferError, match=f"__cuda_array_interface__ has no '{key}'"):
            mt.as_tensor(producer)


def test_as_tensor_cai_memory_must_be_inside_one_allocation():
    src = mt.arange(64.0, device=DEV)
    ok = mt.as_tensor(RawCAI(data=(src.data_ptr() + 8, False), shape=(2, 3), strides=(16, 4)))
    np.testing.assert_array_equal(host(ok), [[2, 3, 4], [6, 7, 8]])
    assert mt.as_tensor(RawCAI(data=(0, False), shape=(0, 3))).shape == (0, 3)  # empty: no memory needed
    with pytest.raises(BufferError, match="beyond the allocation"):
        mt.as_tensor(RawCAI(data=(src.data_ptr(), False), shape=(2**29,)))  # 2 GiB from a 256-byte tensor
    host_array = np.zeros(4, np.float32)  # pageable host memory is no device's
    with pytest.raises(BufferError, match="is in no allocation"):
        mt.as_tensor(RawCAI(data=(host_array.ctypes.data, False)))
    pinned = mt.arange(4.0).pin_memory()  # pinned host memory is every device's, as in torch
    over_pinned = mt.as_tensor(RawCAI(data=(pinned.data_ptr(), False)))
    assert over_pinned.device == mt.device(DEV, mt.cuda.current_device())
    np.testing.assert_array_equal(host(over_pinned), [0, 1, 2, 3])


TWO_DEVICES_SCRIPT = """
    import ctypes
    import minitensor as mt
    from minitensor.interop import dlpack

    src = mt.arange(4.0, device="cuda:1")
    class Producer:
        __cuda_array_interface__ = src.__cuda_array_interface__
    t = mt.as_tensor(Producer())  # the current device is 0; the memory is device 1's
    print(t.device, t.data_ptr() == src.data_ptr(), t.tolist())

    capsule = src.__dlpack__(max_version=(1, 0))
    get = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    managed = dlpack.DLManagedTensorVersioned.from_address(get(capsule, b"dltensor_versioned"))
    managed.dl_tensor.device.device_id = 0  # a producer that names the wrong device
    try:
        mt.from_dlpack(capsule)
    except BufferError as e:
        print("refused:", e)
    managed.dl_tensor.device.device_id = 1
    print(mt.from_dlpack(capsule).device)
"""


def test_cai_and_dlpack_memory_of_another_device_on_two_simulated_devices():
    """CAI memory is on the device that holds it, as torch takes it (before: always the current device);
    a DLPack capsule that names another device than its memory's is refused."""
    lines = run_python(TWO_DEVICES_SCRIPT, {"MINITENSOR_BACKEND": "sim", "MINITENSOR_SIM_DEVICES": "2"}).splitlines()
    assert lines[0] == "cuda:1 True [0.0, 1.0, 2.0, 3.0]"
    assert lines[1].startswith("refused: the DLPack tensor says it is on cuda:0, but its memory at 0x") and \
        lines[1].endswith("is cuda:1's")
    assert lines[2] == "cuda:1"


# ==============================================================================================
# DLPack: minitensor's own capsules
# ==============================================================================================
def test_dlpack_device():
    assert mt.empty(2).__dlpack_device__() == (1, 0)
    assert mt.empty(2, device=DEV).__dlpack_device__() == (2, mt.cuda.current_device())


def test_versioned_when_asked_for_and_legacy_otherwise():
    t = mt.arange(6)
    legacy, old, versioned = t.__dlpack__(), t.__dlpack__(max_version=(0, 8)), t.__dlpack__(max_version=(1, 2))
    assert (capsule_name(legacy), capsule_name(old), capsule_name(versioned)) == \
        ("dltensor", "dltensor", "dltensor_versioned")
    managed = ctypes.cast(ctypes.pythonapi.PyCapsule_GetPointer, ctypes.CFUNCTYPE(
        ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p))(versioned, b"dltensor_versioned")
    struct = dlpack.DLManagedTensorVersioned.from_address(managed)
    assert (struct.version.major, struct.version.minor, struct.flags) == (1, 0, 0)
    assert (struct.dl_tensor.dtype.code, struct.dl_tensor.dtype.bits, struct.dl_tensor.dtype.lanes) == (0, 64, 1)
    for capsule, used in ((legacy, "used_dltensor"), (versioned, "used_dltensor_versioned")):
        u = mt.from_dlpack(capsule)
        assert capsule_name(capsule) == used and u.data_ptr() == t.data_ptr()
        with pytest.raises(BufferError, match="already consumed"):
            mt.from_dlpack(capsule)


@pytest.mark.parametrize("device", ["cpu", DEV])
@pytest.mark.parametrize("dtype", mt.dtypes.ALL, ids=str)
def test_dlpack_round_trip_through_minitensor(device, dtype):
    values = random_array((3, 5), np.float32 if dtype is mt.bfloat16 else dtype.np)
    t = mt.tensor(values, dtype=dtype, device=device)
    for view in (t, t[1:, ::2], t.t()):
        u = mt.from_dlpack(view)
        assert (u.device, u.dtype, u.shape, u.stride(), u.data_ptr()) == \
            (view.device, view.dtype, view.shape, view.stride(), view.data_ptr())
    u = mt.from_dlpack(t[:, 1:])
    u.fill_(1)
    if dtype is mt.bfloat16:
        values = mt.tensor(values, dtype=mt.bfloat16).float().numpy()
    values[:, 1:] = 1
    np.testing.assert_array_equal(t.float().cpu().numpy() if dtype is mt.bfloat16 else host(t), values)


@pytest.mark.parametrize("dtype, code", [(mt.bool, (6, 8)), (mt.bfloat16, (4, 16)), (mt.float16, (2, 16)),
                                         (mt.uint8, (1, 8)), (mt.int32, (0, 32))], ids=str)
def test_dlpack_dtype_codes(dtype, code):
    t = mt.empty(2, dtype=dtype)
    for max_version in (None, (1, 0)):
        capsule = t.__dlpack__(max_version=max_version)
        name = capsule_name(capsule).encode()
        get = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
            ("PyCapsule_GetPointer", ctypes.pythonapi))
        struct = (dlpack.DLManagedTensorVersioned if max_version else dlpack.DLManagedTensor).from_address(
            get(capsule, name))
        assert (struct.dl_tensor.dtype.code, struct.dl_tensor.dtype.bits) == code


def test_unconsumed_capsule_frees_its_tensor_once():
    t = mt.arange(10, device=DEV)
    storage = weakref.ref(t.untyped_storage())
    exported = len(dlpack._exported)
    legacy, versioned = t.__dlpack__(), t.__dlpack__(max_version=(1, 0))
    del t
    gc.collect()
    assert storage() is not None and len(dlpack._exported) == exported + 2
    del legacy
    assert len(dlpack._exported) == exported + 1
    del versioned
    gc.collect()
    assert storage() is None and len(dlpack._exported) == exported


def test_consumed_capsule_frees_its_tensor_when_the_consumer_dies():
    t = mt.arange(10)
    storage = weakref.ref(t.untyped_storage())
    exported = len(dlpack._exported)
    u = mt.from_dlpack(t.__dlpack__(max_version=(1, 0)))[2:]  # a view keeps it too
    del t
    gc.collect()
    assert storage() is not None and len(dlpack._exported) == exported + 1
    np.testing.assert_array_equal(u.numpy(), np.arange(2, 10))
    del u
    gc.collect()
    assert storage() is None and len(dlpack._exported) == exported


def test_dlpack_copy_and_dl_device():
    values = random_array(6, np.float32)
    t = mt.tensor(values, device=DEV)
    on_cpu = mt.from_dlpack(t.__dlpack__(max_version=(1, 0), dl_device=(1, 0)))
    copied = mt.from_dlpack(t.__dlpack__(max_version=(1, 0), copy=True))
    same = mt.from_dlpack(t.__dlpack__(max_version=(1, 0), dl_device=(2, t.device.index), copy=False))
    assert on_cpu.device == mt.device("cpu") and copied.data_ptr() != t.data_ptr() and same.data_ptr() == t.data_ptr()
    t.fill_(0)
    np.testing.assert_array_equal(on_cpu.numpy(), values)
    np.testing.assert_array_equal(host(copied), values)
    np.testing.assert_array_equal(host(same), np.zeros(6, np.float32))
    capsule = t.__dlpack__(max_version=(1, 0), copy=True)
    get = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    assert dlpack.DLManagedTensorVersioned.from_address(get(capsule, b"dltensor_versioned")).flags == \
        dlpack.FLAG_IS_COPIED


def test_dlpack_export_errors():
    t = mt.empty(3, device=DEV)
    with pytest.raises(TypeError, match="stream must be"):
        t.__dlpack__(stream="1")
    with pytest.raises(ValueError, match="stream 0 is ambiguous"):
        t.__dlpack__(stream=0)
    with pytest.raises(BufferError, match="copy=False forbids it"):
        t.__dlpack__(dl_device=(1, 0), copy=False)
    with pytest.raises(BufferError, match="device type 4 is not supported"):
        t.__dlpack__(dl_device=(4, 0))
    read_only = np.arange(3.0)
    read_only.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        mt.from_numpy(read_only).__dlpack__()


def test_dlpack_export_orders_the_consumers_stream_after_the_producers(gate):
    """The consumer names its stream; the producer makes it wait for the work queued so far."""
    src, s = filled_behind(gate)
    with s:
        unsynced_capsule = src.__dlpack__(stream=-1)  # the consumer takes care of it (and here does not)
    unsynced = mt.from_dlpack(unsynced_capsule).clone()
    np.testing.assert_array_equal(host(unsynced), np.zeros(16, np.float32))
    with s:
        synced_capsule = src.__dlpack__(stream=1)  # the consumer reads on the legacy default stream
    synced = mt.from_dlpack(synced_capsule).clone()
    gate.open()
    np.testing.assert_array_equal(host(synced), np.full(16, 5.0, np.float32))


class SpyProducer:
    """Forwards to a tensor's DLPack methods and records what the consumer asked for."""

    def __init__(self, tensor, legacy_only=False):
        self.tensor, self.legacy_only, self.calls = tensor, legacy_only, []

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        if self.legacy_only and "max_version" in kwargs:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return self.tensor.__dlpack__(**kwargs)


def test_from_dlpack_passes_the_current_stream_and_max_version():
    cpu, cuda = SpyProducer(mt.empty(2)), SpyProducer(mt.empty(2, device=DEV))
    mt.from_dlpack(cpu)
    mt.from_dlpack(cuda)
    s = mt.cuda.Stream()
    with s:
        mt.from_dlpack(cuda)
    assert cpu.calls == [{"max_version": (1, 0)}]
    assert cuda.calls == [{"max_version": (1, 0), "stream": 1}, {"max_version": (1, 0), "stream": s.cuda_stream}]


class BrokenCAI:
    """An array whose CAI getter fails, as torch's does for bfloat16 (KeyError on the typestr)."""

    @property
    def __cuda_array_interface__(self):
        raise KeyError("bfloat16")


class BrokenCAISpy(BrokenCAI, SpyProducer):
    pass


def test_as_tensor_takes_dlpack_when_the_cai_cannot_describe_the_array():
    t = mt.empty(3, dtype=mt.bfloat16, device=DEV)
    producer = BrokenCAISpy(t)
    assert mt.as_tensor(producer).data_ptr() == t.data_ptr() and len(producer.calls) == 1
    with pytest.raises(KeyError):
        mt.as_tensor(BrokenCAI())


class RawBytesCAISpy(SpyProducer):
    """An array whose CAI typestr says only "two bytes", as torch 2.11's does for bfloat16."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (3,), "typestr": "|V2", "data": (self.tensor.data_ptr(), False), "version": 3,
                "strides": None, "stream": None}


def test_as_tensor_takes_dlpack_when_the_cai_gives_raw_bytes():
    t = mt.empty(3, dtype=mt.bfloat16, device=DEV)
    producer = RawBytesCAISpy(t)
    u = mt.as_tensor(producer)
    assert u.dtype is mt.bfloat16 and u.data_ptr() == t.data_ptr() and len(producer.calls) == 1


def test_from_dlpack_falls_back_to_legacy_producers():
    t = mt.arange(4)
    producer = SpyProducer(t, legacy_only=True)
    u = mt.from_dlpack(producer)
    assert producer.calls == [{"max_version": (1, 0)}, {}]
    assert u.data_ptr() == t.data_ptr()
    assert mt.as_tensor(SpyProducer(t, legacy_only=True)).data_ptr() == t.data_ptr()


# ==============================================================================================
# DLPack: a producer written against the C structs, whose deleter we can count
# ==============================================================================================
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))


_exported_structs = {}  # like a C producer's heap: a struct lives until its deleter runs


def _struct_deleter(ptr):
    _exported_structs.pop(ptr).calls.append(ptr)


_struct_deleter_c = dlpack._DELETER(_struct_deleter)


class StructProducer:
    """A DLPack producer over memory it keeps (a numpy array or a minitensor cuda tensor); its deleter
    counts calls. Its capsules have no destructor: an unconsumed one leaks, as a sloppy producer's would."""

    def __init__(self, owner, ptr, shape, strides, device, code, versioned=True, flags=0, version=(1, 0),
                 byte_offset=0):
        self.owner, self.device, self.calls = owner, device, []
        n = len(shape)
        self.shape = (ctypes.c_int64 * n)(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * n)(*strides)
        as_pointer = ctypes.POINTER(ctypes.c_int64)
        dl = dlpack.DLTensor(data=ptr, device=dlpack.DLDevice(*device), ndim=n,
                             dtype=dlpack.DLDataType(*code, *(1,) * (3 - len(code))),  # lanes 1 unless given
                             shape=ctypes.cast(self.shape, as_pointer),
                             strides=None if strides is None else ctypes.cast(self.strides, as_pointer),
                             byte_offset=byte_offset)
        if versioned:
            self.managed = dlpack.DLManagedTensorVersioned(version=dlpack.DLPackVersion(*version), flags=flags,
                                                           deleter=_struct_deleter_c, dl_tensor=dl)
        else:
            self.managed = dlpack.DLManagedTensor(dl_tensor=dl, deleter=_struct_deleter_c)
        self.name = b"dltensor_versioned" if versioned else b"dltensor"

    @classmethod
    def over_array(cls, array, **kwargs):
        kwargs.setdefault("code", {"b": (6, 8), "u": (1, 8), "i": (0, array.itemsize * 8),
                                   "f": (2, array.itemsize * 8)}[array.dtype.kind])
        return cls(array, array.ctypes.data, array.shape, tuple(s // array.itemsize for s in array.strides),
                   (1, 0), **kwargs)

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        _exported_structs[ctypes.addressof(self.managed)] = self
        return _capsule_new(ctypes.addressof(self.managed), self.name, None)


@pytest.mark.parametrize("versioned", [True, False])
def test_deleter_runs_exactly_once_when_the_last_view_dies(versioned):
    array = random_array((4, 5), np.float64)
    producer = StructProducer.over_array(array, versioned=versioned)
    t = mt.from_dlpack(producer)
    np.testing.assert_array_equal(t.numpy(), array)
    views = [t[1:], t.t(), mt.from_numpy(t.numpy())]
    del t
    gc.collect()
    assert producer.calls == []
    views[0][0, 0] = -7.0
    assert array[1, 0] == -7.0
    del views
    gc.collect()
    assert producer.calls == [ctypes.addressof(producer.managed)]
    gc.collect()
    assert len(producer.calls) == 1


def test_struct_producer_offset_compact_and_read_only():
    array = np.arange(12, dtype=np.int32)
    compact = mt.from_dlpack(StructProducer(array, array.ctypes.data, (2, 3), None, (1, 0), (0, 32),
                                            versioned=False, byte_offset=8))
    assert compact.stride() == (3, 1) and compact.data_ptr() == array.ctypes.data + 8
    np.testing.assert_array_equal(compact.numpy(), array[2:8].reshape(2, 3))
    read_only = mt.from_dlpack(StructProducer.over_array(array, flags=dlpack.FLAG_READ_ONLY))
    np.testing.assert_array_equal(read_only.numpy(), array)
    assert not read_only.numpy().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        read_only.fill_(0)
    assert mt.from_dlpack(StructProducer.over_array(np.zeros((), np.float32))).shape == ()
    assert mt.from_dlpack(StructProducer.over_array(np.zeros((0, 4), np.float32))).shape == (0, 4)


def test_struct_producer_on_the_cuda_device():
    src = mt.tensor(random_array(8, np.float32), device=DEV)
    device = (2, src.device.index)
    producer = StructProducer(src, src.data_ptr(), (8,), (1,), device, (2, 32))
    t = mt.from_dlpack(producer)
    assert t.device == src.device and t.data_ptr() == src.data_ptr()
    t.fill_(3.0)
    np.testing.assert_array_equal(host(src), np.full(8, 3.0, np.float32))
    del t
    gc.collect()
    assert len(producer.calls) == 1
    read_only = StructProducer(src, src.data_ptr(), (8,), (1,), device, (2, 32), flags=dlpack.FLAG_READ_ONLY)
    with pytest.raises(BufferError, match="read-only"):
        mt.from_dlpack(read_only)
    assert read_only.calls == []  # not consumed: the capsule still owns the deleter


@pytest.mark.parametrize("kwargs, error, message", [
    ({"code": (5, 32)}, TypeError, "kDLComplex, bits=32"),
    ({"code": (1, 128)}, TypeError, "kDLUInt, bits=128"),
    ({"code": (2, 32, 4)}, TypeError, "lanes=4"),
    ({"version": (2, 0)}, BufferError, "DLPack 2.0 is not supported"),
], ids=lambda x: str(x)[:24])
def test_struct_producer_errors(kwargs, error, message):
    array = np.zeros(4, np.float32)
    producer = StructProducer.over_array(array, **kwargs)
    with pytest.raises(error, match=message):
        mt.from_dlpack(producer)
    assert producer.calls == []


def test_from_dlpack_errors():
    with pytest.raises(TypeError, match="expects an object with __dlpack__"):
        mt.from_dlpack([1, 2])
    array = np.zeros(4, np.float32)
    opencl = StructProducer(array, array.ctypes.data, (4,), (1,), (4, 0), (2, 32))
    with pytest.raises(BufferError, match="device type 4 is not supported"):
        mt.from_dlpack(opencl)
    with pytest.raises(BufferError, match="negative strides"):
        mt.from_dlpack(np.arange(4.0)[::-1])
    with pytest.raises(BufferError, match="named 'dltensor'"):
        mt.from_dlpack(_capsule_new(array.ctypes.data, b"something_else", None))


def _with(producer, **fields):
    """The producer with fields of its DLTensor overwritten, as a broken or hostile C producer may fill them."""
    for name, value in fields.items():
        setattr(producer.managed.dl_tensor, name, value)
    return producer


def _dl_cases(device):
    src = mt.zeros(8, device=device)  # the memory the capsules point into, unless a case changes it
    dl_device = (2, src.device.index) if device == DEV else (1, 0)

    def producer(dims=(8,), steps=(1,), **fields):
        return _with(StructProducer(src, src.data_ptr(), dims, steps, dl_device, (2, 32)), **fields)
    cases = {
        "negative size": (producer(dims=(-3,)), "negative dimension -3"),
        "negative ndim": (producer(ndim=-1), "ndim -1"),
        "huge ndim": (producer(ndim=1000), "ndim 1000"),
        "null shape": (producer(shape=None), "null shape"),
        "null data": (producer(data=None), "null pointer for 8 elements"),
        "numel overflow": (producer(dims=(2**62, 2**62), steps=(0, 0)), "numel: integer multiplication overflow"),
        "stride overflow": (producer(steps=(2**62,)), "Storage size calculation overflowed"),
        "byte_offset overflow": (producer(byte_offset=2**64 - 4), "data pointer"),
    }
    if device == DEV:  # device memory: the driver knows its allocations
        cases.update({
            "wild pointer": (producer(data=0x1000), "0x1000 is in no allocation"),
            "past the allocation": (producer(dims=(2**29,)), "beyond the allocation"),
            "huge byte_offset": (producer(byte_offset=2**40), "is in no allocation"),
            "host memory as cuda": (_with(StructProducer.over_array(np.zeros(8, np.float32)), device=DL_CUDA),
                                    "is in no allocation"),
        })
    return src, cases


DL_CUDA = dlpack.DLDevice(2, 0)


@pytest.mark.parametrize("device", ["cpu", DEV])
def test_from_dlpack_absurd_fields_are_refused_and_the_capsule_kept(device):
    """Before: shape and strides were read for any ndim and the tensor made over any pointer: a crash."""
    src, cases = _dl_cases(device)
    for name, (producer, message) in cases.items():
        with pytest.raises(BufferError, match=re.escape(message)):
            mt.from_dlpack(producer)
        assert producer.calls == [], name  # not consumed: the producer still owns its memory
    np.testing.assert_array_equal(host(src), np.zeros(8, np.float32))


# ==============================================================================================
# numpy
# ==============================================================================================
@pytest.mark.parametrize("np_dtype", NP_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_dlpack_both_ways(np_dtype):
    array = random_array((4, 6), np_dtype)
    for source in (array, array[1:, ::2], array.T):
        t = mt.from_dlpack(source)
        assert t.dtype is mt.dtypes.from_numpy(np_dtype) and t.data_ptr() == source.ctypes.data
        assert t.stride() == tuple(s // source.itemsize for s in source.strides)
        np.testing.assert_array_equal(t.numpy(), source)
        back = np.from_dlpack(t)
        assert back.ctypes.data == source.ctypes.data and back.strides == source.strides
        assert back.flags.writeable or not NUMPY_2_1
    t = mt.from_dlpack(array)
    t[0] = 1
    assert array[0].tolist() == [1] * 6
    if NUMPY_2_1:  # older numpy makes the arrays it takes through DLPack read-only
        np.from_dlpack(t[2:])[0, 0] = 0
        assert array[2, 0] == 0


def test_numpy_consumes_minitensor_capsules_and_frees_them():
    t = mt.tensor(random_array(5, np.float32))
    storage = weakref.ref(t.untyped_storage())
    exported = len(dlpack._exported)
    back = np.from_dlpack(t)
    del t
    gc.collect()
    assert storage() is not None and len(dlpack._exported) == exported + 1
    del back
    gc.collect()
    assert storage() is None and len(dlpack._exported) == exported


def test_numpy_array_lifetime_through_from_dlpack():
    array = random_array(7, np.int64)
    expected = array.copy()
    alive = weakref.ref(array)
    t = mt.from_dlpack(array)
    del array
    gc.collect()
    assert alive() is not None
    np.testing.assert_array_equal(t.numpy(), expected)
    del t
    gc.collect()
    assert alive() is None


def test_numpy_refusing_a_cuda_capsule_says_why_and_leaks_nothing():
    """numpy drops our capsule with its own error pending: the C capsule destructor hands that error back
    (as torch's does) and still runs the deleter."""
    t = mt.tensor([1.5, 2.5], device=DEV)
    exported = len(dlpack._exported)
    with pytest.raises((RuntimeError, BufferError), match="Unsupported device in DLTensor"):  # numpy versions differ
        np.from_dlpack(t)
    gc.collect()
    assert len(dlpack._exported) == exported


def test_without_a_compiler_the_capsule_destructor_reports_the_error_it_cannot_hand_back(monkeypatch, tmp_path):
    """The ctypes destructor (no C compiler) cannot hand numpy's error back: numpy raises SystemError, the
    reason is reported as unraisable, and the deleter still runs."""
    monkeypatch.setenv("MINITENSOR_CACHE_DIR", str(tmp_path))  # nothing built yet
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    monkeypatch.setattr(dlpack, "_destructor", None)
    assert dlpack.capsule_destructor() == ctypes.cast(dlpack._destroy_capsule_c, ctypes.c_void_p).value
    t = mt.tensor([1.5, 2.5], device=DEV)
    exported = len(dlpack._exported)
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    with pytest.raises(SystemError):
        np.from_dlpack(t)
    gc.collect()
    assert len(dlpack._exported) == exported
    assert len(reported) == 1 and "Unsupported device" in str(reported[0].exc_value)
    capsule = t.__dlpack__()  # one nobody consumes: its deleter runs when it dies
    assert len(dlpack._exported) == exported + 1
    del capsule
    gc.collect()
    assert len(dlpack._exported) == exported


@pytest.mark.skipif(not NUMPY_2_1, reason="numpy < 2.1 has no from_dlpack(device=...)")
def test_numpy_from_dlpack_of_a_cuda_tensor_copies_to_the_host():
    np.testing.assert_array_equal(np.from_dlpack(mt.tensor([1.5, 2.5], device=DEV), device="cpu"), [1.5, 2.5])


def test_read_only_tensors_export_read_only():
    array = np.arange(4.0)
    array.flags.writeable = False
    back = np.from_dlpack(mt.from_numpy(array))
    assert not back.flags.writeable and back.ctypes.data == array.ctypes.data


def test_array_protocol():
    t = mt.tensor(random_array((2, 3), np.float32))
    shared = np.asarray(t)
    assert shared.ctypes.data == t.data_ptr()
    shared[0, 0] = 42
    assert t[0, 0].item() == 42
    assert np.asarray(t, copy=False).ctypes.data == t.data_ptr()
    assert np.array(t).ctypes.data != t.data_ptr()  # copy=True
    as_double = np.asarray(t, dtype=np.float64)
    assert as_double.dtype == np.float64 and as_double.ctypes.data != t.data_ptr()
    with pytest.raises(ValueError, match="Unable to avoid copy"):
        np.asarray(t, dtype=np.float64, copy=False)
    cuda = mt.empty(2, device=DEV)
    with pytest.raises(TypeError, match=r"can't convert cuda:\d device type tensor to numpy. Use Tensor.cpu\(\) to "
                                        r"copy the tensor to host memory first."):
        np.asarray(cuda)
    with pytest.raises(TypeError, match="BFloat16"):
        np.asarray(mt.empty(2, dtype=mt.bfloat16))


def test_from_numpy_shares_memory_and_numpy_returns_it():
    array = random_array((3, 8), np.int16)[:, 1::3]
    t = mt.from_numpy(array)
    assert t.stride() == (8, 3) and t.data_ptr() == array.ctypes.data
    out = t.numpy()
    assert out.ctypes.data == array.ctypes.data and out.strides == array.strides
    t[1] = 9
    assert (array[1] == 9).all()
    broadcast = mt.from_numpy(np.broadcast_to(np.arange(3.0), (4, 3)))  # zero strides, read-only
    assert broadcast.stride() == (0, 1)
    np.testing.assert_array_equal(broadcast.numpy(), np.broadcast_to(np.arange(3.0), (4, 3)))


def test_from_numpy_read_only_arrays_stay_read_only():
    array = np.arange(6.0)
    array.flags.writeable = False
    t = mt.from_numpy(array)
    assert t.data_ptr() == array.ctypes.data and not t.numpy().flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        t[0] = 5
    with pytest.raises(ValueError, match="read-only"):
        t.add_(1)
    np.testing.assert_array_equal(array, np.arange(6.0))
    writable = mt.tensor(array)
    writable[0] = 5
    assert writable[0].item() == 5 and array[0] == 0
    assert mt.as_tensor(array).data_ptr() == array.ctypes.data


@pytest.mark.parametrize("array, message", [
    (np.arange(6.0)[::-2], "negative"),
    (np.arange(6, dtype=">i4"), "byte order"),
    (np.zeros(4, dtype=[("a", "<i4"), ("b", "<i2")])["a"], "not a multiple of the element byte size"),
], ids=["negative", "byteorder", "odd-strides"])
def test_from_numpy_refuses_what_a_tensor_cannot_view(array, message):
    with pytest.raises(ValueError, match=message):
        mt.from_numpy(array)


# ==============================================================================================
# A real GPU: numba.cuda, CuPy and torch
# ==============================================================================================
def gpu_library(name):
    if not ON_GPU:
        pytest.skip(f"{name} interop needs a real GPU; the cuda device here is the {mt.cuda.backend()} backend")
    return pytest.importorskip(name, reason=f"{name} is not installed")


@pytest.fixture
def numba_cuda():
    cuda = gpu_library("numba.cuda")
    if not cuda.is_available():
        pytest.skip("numba.cuda finds no GPU")
    return cuda


@pytest.fixture
def cupy():
    return gpu_library("cupy")


@pytest.fixture
def torch():
    torch = gpu_library("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch is installed without CUDA")
    return torch


@pytest.mark.parametrize("dtype", list(TYPESTR), ids=str)
def test_numba_array_adaptor(numba_cuda, dtype):
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    cput = mt.arange(10).to(dtype)
    npt = cput.numpy()
    assert not numba_cuda.is_cuda_array(cput)
    with pytest.raises(TypeError):
        numba_cuda.as_cuda_array(cput)
    cudat = cput.to(DEV)
    assert numba_cuda.is_cuda_array(cudat)
    view = numba_cuda.as_cuda_array(cudat)
    assert isinstance(view, DeviceNDArray)
    assert view.dtype == npt.dtype and view.strides == npt.strides and view.shape == tuple(cudat.shape)
    np.testing.assert_array_equal(view.copy_to_host(), npt)
    cudat[:5] = 11
    np.testing.assert_array_equal(view.copy_to_host(), host(cudat))
    strided = cudat[::2]
    strided_view = numba_cuda.as_cuda_array(strided)
    assert strided_view.dtype == npt.dtype and strided_view.strides == cput[::2].numpy().strides
    assert strided_view.shape == tuple(strided.shape)
    np.testing.assert_array_equal(strided_view.copy_to_host(), host(strided))


def test_numba_conversion_errors(numba_cuda):
    cput = mt.arange(100)
    assert not numba_cuda.is_cuda_array(cput)
    with pytest.raises(TypeError):
        numba_cuda.as_cuda_array(cput)
    with pytest.raises(TypeError, match="bfloat16"):
        numba_cuda.as_cuda_array(mt.empty(3, dtype=mt.bfloat16, device=DEV))


@pytest.mark.parametrize("np_dtype", [np.float64, np.float32, np.float16, np.int64, np.int32, np.int16, np.int8,
                                      np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_numba_to_minitensor(numba_cuda, np_dtype):
    arrays = [np.ones((), np_dtype), np.arange(6).reshape(2, 3).astype(np_dtype),
              np.arange(6).reshape(2, 3).astype(np_dtype)[1:], np.arange(6).reshape(2, 3).astype(np_dtype)[:, None]]
    for array in arrays:
        numba_ary = numba_cuda.to_device(array)
        t = mt.as_tensor(numba_ary, device="cuda")
        theirs, ours = numba_ary.__cuda_array_interface__, t.__cuda_array_interface__
        assert (ours["shape"], ours["typestr"], ours["data"]) == (theirs["shape"], theirs["typestr"], theirs["data"])
        np.testing.assert_array_equal(host(t), array)
        if np_dtype != np.bool_:
            t += 42
            np.testing.assert_array_equal(numba_ary.copy_to_host(), host(t))
    numba_ary = numba_cuda.to_device(np.arange(6).reshape(2, 3).astype(np_dtype))
    assert numba_ary.is_c_contiguous() and mt.as_tensor(numba_ary, device="cuda").is_contiguous()
    copied = mt.tensor(numba_ary, device="cuda")
    assert copied.data_ptr() != numba_ary.__cuda_array_interface__["data"][0]


def test_numba_lifetime_and_complex(numba_cuda):
    numba_ary = numba_cuda.to_device(np.arange(6))
    t = mt.as_tensor(numba_ary, device="cuda")
    del numba_ary
    gc.collect()
    np.testing.assert_array_equal(host(t), np.arange(6))
    complex_ary = numba_cuda.to_device(np.arange(3) + 0.5j)
    np.testing.assert_array_equal(host(mt.as_tensor(complex_ary)), np.arange(3) + 0.5j)


@pytest.mark.parametrize("dtype", list(TYPESTR), ids=str)
def test_cupy_both_ways(cupy, dtype):
    values = random_array((4, 5), dtype.np)
    t = mt.tensor(values, device=DEV)
    for c in (cupy.asarray(t), cupy.from_dlpack(t)):  # CUDA array interface, DLPack
        assert c.data.ptr == t.data_ptr() and c.dtype == values.dtype
        np.testing.assert_array_equal(cupy.asnumpy(c), values)
    c = cupy.asarray(t)
    c[0] = 1
    cupy.cuda.Device().synchronize()
    values[0] = 1
    np.testing.assert_array_equal(host(t), values)
    arr = cupy.asarray(random_array((3, 4), dtype.np))[:, ::2]
    for u in (mt.as_tensor(arr), mt.from_dlpack(arr)):
        assert u.data_ptr() == arr.data.ptr and u.stride() == tuple(s // arr.itemsize for s in arr.strides)
        u.fill_(0)
        np.testing.assert_array_equal(cupy.asnumpy(arr), np.zeros((3, 2), values.dtype))
    dropped = cupy.arange(6, dtype=cupy.int64)
    kept = mt.from_dlpack(dropped)
    del dropped
    gc.collect()
    np.testing.assert_array_equal(host(kept), np.arange(6))


def test_cupy_stream_is_waited_for(cupy, gate):
    # Load the kernels used behind the gate now, minitensor's copy and CuPy's fill: loading one waits for the
    # device to go idle, which it never does while the gate is closed (CuPy's loads are not ours to refuse).
    mt.zeros(16, device=DEV).clone()
    arr = cupy.zeros(16, cupy.float32)
    arr.fill(1)
    cupy.cuda.Device().synchronize()
    with cupy.cuda.Stream(non_blocking=True) as cs:
        with mt.cuda.stream(mt.cuda.ExternalStream(cs.ptr)):
            gate.wait()  # cs is blocked until the gate opens
        arr.fill(5)
        t = mt.as_tensor(arr)  # the CAI names cs: minitensor's current stream waits for it
    copied = t.clone()
    gate.open()
    np.testing.assert_array_equal(host(copied), np.full(16, 5, np.float32))


@pytest.mark.parametrize("dtype", mt.dtypes.ALL, ids=str)
def test_torch_both_ways(torch, dtype):
    torch_dtype = getattr(torch, dtype.name)
    values = random_array((4, 5), np.float32 if dtype is mt.bfloat16 else dtype.np)
    t = mt.tensor(values, dtype=dtype, device=DEV)
    exports = [torch.from_dlpack(t)] + ([] if dtype is mt.bfloat16 else [torch.as_tensor(t, device="cuda")])
    expected = t.float().cpu().numpy()
    expected[0] = 1
    for tt in exports:
        assert tt.data_ptr() == t.data_ptr() and tt.dtype == torch_dtype and tt.is_cuda
        assert tt.shape == tuple(t.shape) and tt.stride() == t.stride()
    tt = torch.from_dlpack(t)
    tt[0] = 1
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.float().cpu().numpy(), expected)
    source = torch.arange(12, device="cuda").reshape(3, 4).to(torch_dtype)[:, 1::2]
    imports = [mt.from_dlpack(source), mt.as_tensor(source)]  # DLPack; CAI (bfloat16: DLPack again)
    for u in imports:
        assert u.data_ptr() == source.data_ptr() and u.stride() == source.stride() and u.dtype is dtype
        u.fill_(0)
        torch.cuda.synchronize()
        assert not source.to(torch.float32).any().item()
        source.fill_(1)
        torch.cuda.synchronize()
        np.testing.assert_array_equal(u.float().cpu().numpy(), np.ones((3, 2), np.float32))


def test_torch_lifetime_and_cpu(torch):
    dropped = torch.arange(6, device="cuda")
    kept = mt.from_dlpack(dropped)
    del dropped
    gc.collect()
    np.testing.assert_array_equal(host(kept), np.arange(6))
    cpu = torch.arange(5, dtype=torch.float32)
    u = mt.from_dlpack(cpu)
    assert u.device == mt.device("cpu") and u.data_ptr() == cpu.data_ptr()
    u[0] = 9
    assert cpu[0].item() == 9
    back = torch.from_dlpack(mt.arange(4))
    assert back.tolist() == [0, 1, 2, 3]


def test_torch_from_dlpack_waits_for_minitensors_stream(torch, gate):
    torch.zeros(16, device="cuda").clone()  # loads torch's copy kernel: see test_cupy_stream_is_waited_for
    torch.cuda.synchronize()
    src, s = filled_behind(gate)
    with s:
        tt = torch.from_dlpack(src)  # torch passes its current stream; s's work must come first
    copied = tt.clone()
    gate.open()
    assert copied.cpu().tolist() == [5.0] * 16
