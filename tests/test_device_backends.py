"""A device type a third party registers (mt.backends.register_device_type): the fake-backend seed's five tests
(torch's test_cpp_extensions_mtia_backend.py) against a type built on a simulator of its own with two devices,
then its tensors, memory, events and errors."""
import numpy as np
import pytest

import minitensor as mt
from minitensor.backends.base import Driver
from minitensor.backends.sim import SimDriver

FAKE = "fake"
DTYPES = [mt.bool, mt.uint8, mt.int8, mt.int16, mt.int32, mt.int64, mt.float16, mt.bfloat16, mt.float32, mt.float64]


def random_tensor(shape, dtype, seed):
    """A CPU tensor of random values of `dtype` (never only zeros)."""
    values = np.random.default_rng(seed).standard_normal(shape) * 50
    return mt.tensor(values > 0 if dtype is mt.bool else values, dtype=dtype)


@pytest.fixture(scope="module")
def fake():
    """The "fake" device module: registered once per process (a registration is for good)."""
    if FAKE not in mt.backends.registered_device_types():
        mt.backends.register_device_type(FAKE, lambda: SimDriver(devices=2, memory=64 << 20))
    return mt.get_device_module(FAKE)


# ---------------------------------------------------------------------------------------- the seed's five tests
def test_get_device_module(fake):
    default_stream = mt.get_device_module(mt.device("fake:0")).current_stream()
    assert default_stream.device_type == mt.backends.device_type_id(FAKE) == fake.Stream().device_type
    assert default_stream.device_type not in (0, mt.cuda.Stream().device_type)
    assert mt.Stream in type(default_stream).__mro__ and mt.Stream in mt.cuda.Stream.__mro__
    assert mt.get_device_module("cuda") is mt.cuda and mt.get_device_module(mt.device("cuda:0")) is mt.cuda
    assert mt.get_device_module("fake:1") is fake is mt.fake


def test_stream_basic(fake):
    default_stream = fake.current_stream()
    user_stream = fake.Stream()
    assert fake.current_stream() == default_stream
    assert default_stream != user_stream
    assert default_stream.stream_id == 0
    assert user_stream.stream_id != 0
    with fake.stream(user_stream):
        assert fake.current_stream() == user_stream
    assert user_stream.query()
    default_stream.synchronize()
    assert default_stream.query()


def test_stream_context(fake):
    stream_0 = fake.Stream(device="fake:0")
    stream_1 = fake.Stream(device="fake:0")
    assert stream_0 != stream_1
    with fake.stream(stream_0):
        assert fake.current_stream() == stream_0
    with fake.stream(stream_1):
        assert fake.current_stream() == stream_1
    assert fake.current_stream() == fake.default_stream()


def test_stream_context_different_device(fake):
    device_0, device_1 = mt.device("fake:0"), mt.device("fake:1")
    stream_0, stream_1 = fake.Stream(device=device_0), fake.Stream(device=device_1)
    original = fake.current_device()
    with fake.stream(stream_0):
        assert fake.current_device() == device_0.index
        assert fake.current_stream() == stream_0
    assert fake.current_device() == original
    with fake.stream(stream_1):
        assert fake.current_device() == device_1.index
        assert fake.current_stream() == stream_1
        assert fake.current_stream(0) == fake.default_stream(0)  # the other device's stays its own
    assert fake.current_device() == original
    assert mt.cuda.current_device() == 0  # cuda's current device is another thing


def test_device_context(fake):
    with fake.device(mt.device("fake:0")):
        assert fake.current_device() == 0
    with fake.device(mt.device("fake:1")):
        assert fake.current_device() == 1
        with fake.device("fake:0"):  # contexts nest
            assert fake.current_device() == 0
        assert fake.current_device() == 1
    assert fake.current_device() == 0
    with fake.device(None):
        assert fake.current_device() == 0


# ---------------------------------------------------------------------------------------- devices and streams
def test_device_strings_and_indices(fake):
    assert str(mt.device("fake:1")) == "fake:1" and mt.device("fake", 1) == "fake:1"
    assert fake.device_count() == 2 and fake.is_available()
    with pytest.raises(RuntimeError, match=r"^Device index value 2 is out of index range \[0, 2\)"):
        fake.Stream(device="fake:2")
    with pytest.raises(RuntimeError, match=r"Device index value 5 is out of index range \[0, 2\)"):
        mt.empty(3, device="fake:5")
    with pytest.raises(ValueError, match="Expected a fake device, but got: cuda:0"):
        fake.set_device("cuda:0")
    with pytest.raises(RuntimeError, match="Invalid device string: 'fakes:0'"):
        mt.device("fakes:0")
    with pytest.raises(ValueError, match="Expected a cuda device, but got: fake:0"):
        mt.cuda.Stream(device="fake:0")
    with pytest.raises(ValueError, match="Expected a fake device, but got: cuda:0"):
        fake.Event(device="cuda:0")


def test_generic_stream_and_event_take_the_device_type(fake):
    s = mt.Stream(device="fake:1")
    assert s.device == mt.device("fake:1") and s.device_type == fake.Stream().device_type
    again = fake.Stream(stream_id=s.stream_id, device_index=1, device_type=s.device_type)
    assert again == s and again.cuda_stream == s.cuda_stream
    e = mt.Event(device="fake:1", enable_timing=True)
    e.record(s)
    e.synchronize()
    assert e.query() and e.event_id != 0
    assert repr(fake.Stream()).startswith("<minitensor.fake.Stream device=fake:0")


def test_events_order_work_between_streams(fake):
    """A copy queued behind an event on another stream of the same device sees the first stream's work."""
    host = random_tensor((257,), mt.float32, 1).numpy()
    a, b = fake.Stream(device=1), fake.Stream(device=1)
    with fake.stream(a):
        t = mt.from_numpy(host).to("fake:1")
        start, end = fake.Event(enable_timing=True), fake.Event(enable_timing=True)
        start.record()
        end.record()
    b.wait_event(end)
    with fake.stream(b):
        np.testing.assert_array_equal(t.cpu().numpy(), host)
    end.synchronize()
    assert start.elapsed_time(end) >= 0
    with pytest.raises(RuntimeError, match="a cuda stream cannot wait for an event recorded on a fake stream"):
        mt.cuda.current_stream().wait_event(end)
    with pytest.raises(ValueError, match="a cuda event cannot be recorded on a fake stream"):
        mt.cuda.Event().record(a)


# ---------------------------------------------------------------------------------------- tensors and memory
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tensors_round_trip_through_the_device(fake, dtype):
    host = random_tensor((5, 7), dtype, 7)
    t = host.to("fake:1")
    assert t.device == mt.device("fake:1") and not t.is_cuda and t.dtype is dtype
    assert t.cpu().tolist() == host.tolist()
    assert t[1:4, ::2].cpu().tolist() == host[1:4, ::2].tolist()  # a view: the bytes it spans move
    assert t.t().contiguous().cpu().tolist() == host.t().tolist()
    assert t.to("cuda").cpu().tolist() == host.tolist()  # through the host
    assert t.to("fake:0").cpu().tolist() == host.tolist()
    assert t.to(mt.float64).cpu().tolist() == host.to(mt.float64).tolist()


def test_writes_into_views_keep_the_rest(fake):
    host = random_tensor((6, 5), mt.int32, 3).numpy()
    t = mt.from_numpy(host).to("fake:0")
    t[:, 1:4:2] = mt.tensor([[-1, -2]], dtype=mt.int32)  # a non-contiguous, broadcast write
    t[2].fill_(9)
    expected = host.copy()
    expected[:, 1:4:2] = [[-1, -2]]
    expected[2] = 9
    np.testing.assert_array_equal(t.cpu().numpy(), expected)
    u = mt.full((3, 4), 2.5, device="fake:1")
    np.testing.assert_array_equal(u.numpy(force=True), np.full((3, 4), 2.5, np.float32))
    with pytest.raises(TypeError, match="can't convert fake:1 device type tensor to numpy"):
        u.numpy()
    np.testing.assert_array_equal(mt.zeros(0, device="fake:1").cpu().numpy(), np.zeros(0, np.float32))
    assert "device='fake:1'" in repr(u)


def test_memory_goes_through_its_own_allocator(fake):
    fake.empty_cache()
    before, cuda_before = fake.memory_allocated(1), mt.cuda.memory_allocated()
    t = mt.empty(1000, device="fake:1")
    assert fake.memory_allocated(1) - before == 4096  # 4000 bytes in 512-byte blocks
    assert fake.memory_stats("fake:1")["allocation.all.current"] >= 1
    assert mt.cuda.memory_allocated() == cuda_before and fake.memory_allocated(0) == 0
    del t
    assert fake.memory_allocated(1) == before and fake.memory_reserved(1) > 0
    fake.empty_cache()
    assert fake.memory_reserved(1) == 0 and fake.max_memory_allocated(1) >= 4096
    fake.reset_peak_memory_stats(1)
    assert fake.max_memory_allocated(1) == 0
    assert fake.mem_get_info(1)[1] == 64 << 20


def test_record_stream_keeps_the_block_from_reuse(fake):
    side = fake.Stream(device=0)
    t = mt.ones(256, device="fake:0")
    driver = fake._driver
    gate = driver.gate_create()
    driver.gate_wait(gate, side.cuda_stream)  # side is busy: an event recorded on an idle stream is done at once
    try:
        t.record_stream(side)
        ptr = t.data_ptr()
        del t
        assert mt.empty(256, device="fake:0").data_ptr() != ptr  # the side stream may still use it
    finally:
        driver.gate_open(gate)
    side.synchronize()


@pytest.mark.parametrize("op", [lambda t: t + 1, lambda t: t.sum(), lambda t: t.neg_(), lambda t: t.uniform_(),
                                lambda t: t.gather(0, mt.zeros(1, dtype=mt.int64, device="fake:0")),
                                lambda t: mt.isclose(t, t)])
def test_ops_refuse_a_registered_device(fake, op):
    t = mt.ones(4, device="fake:0")
    with pytest.raises(NotImplementedError, match="with arguments from the 'fake' backend"):
        op(t)
    np.testing.assert_array_equal(t.cpu().numpy(), np.ones(4, np.float32))


# ---------------------------------------------------------------------------------------- registration
def test_registration_errors(fake):
    with pytest.raises(RuntimeError, match="device type 'fake' is already registered"):
        mt.backends.register_device_type(FAKE, SimDriver)
    with pytest.raises(RuntimeError, match="device type 'cuda' is already registered"):
        mt.backends.register_device_type("cuda", SimDriver)
    with pytest.raises(ValueError, match="lowercase letters"):
        mt.backends.register_device_type("Bad-Name", SimDriver)
    with pytest.raises(TypeError, match="driver_factory must be callable"):
        mt.backends.register_device_type("notcallable", 3)
    with pytest.raises(RuntimeError, match="does not have a corresponding module registered as 'minitensor.nope'"):
        mt.get_device_module("nope")
    if "broken" not in mt.backends.registered_device_types():
        mt.backends.register_device_type("broken", object)
    with pytest.raises(TypeError, match="returned a object, not a minitensor.backends.base.Driver"):
        mt.get_device_module("broken").device_count()
    assert issubclass(SimDriver, Driver)


def test_save_and_load_keep_the_device_and_the_sharing(fake, tmp_path):
    t = random_tensor((3, 4), mt.float32, 11).to("fake:1")
    path = tmp_path / "fake.pt"
    mt.save({"t": t, "view": t[1:, ::2]}, path)
    loaded = mt.load(path)
    assert loaded["t"].device == mt.device("fake:1") and loaded["view"]._storage is loaded["t"]._storage
    assert loaded["view"].cpu().tolist() == t[1:, ::2].cpu().tolist()
    on_cuda = mt.load(path, map_location="cuda")["t"]
    assert on_cuda.is_cuda and on_cuda.cpu().tolist() == t.cpu().tolist()
    assert mt.load(path, map_location={"fake:1": "fake:0"})["t"].device == mt.device("fake:0")
    with pytest.raises(RuntimeError, match=r"Device index value 7 is out of index range \[0, 2\)"):
        mt.load(path, map_location="fake:7")
