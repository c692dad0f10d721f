"""The device-generic API of torch 2.x: mt.accelerator, mt.Stream and mt.Event (whose subclasses mt.cuda's are),
mt.get_device_module; torch's test_cuda.py tests of it in minitensor's names."""
import gc

import numpy as np
import pytest

import minitensor as mt

pytestmark = pytest.mark.usefixtures("clean_cuda_state")


def test_generic_stream_event():
    """torch's test_generic_stream_event."""
    stream = mt.Stream("cuda")
    assert stream.device_index == mt.cuda.current_device()
    cuda_stream = mt.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                 device_type=stream.device_type)
    assert isinstance(cuda_stream, mt.Stream) and mt.Stream in type(cuda_stream).mro()
    assert stream.stream_id == cuda_stream.stream_id and cuda_stream == stream
    assert stream.stream_id != mt.cuda.current_stream().stream_id

    event1 = mt.Event("cuda", enable_timing=True)
    event2 = mt.Event("cuda", enable_timing=True)
    assert event1.event_id == 0
    a, b = mt.randn(1000), mt.randn(1000)
    with mt.cuda.stream(cuda_stream):
        a_cuda = a.to("cuda", non_blocking=True)
        b_cuda = b.to("cuda", non_blocking=True)
        assert stream.stream_id == mt.cuda.current_stream().stream_id
    event1.record(stream)
    event1.synchronize()
    assert event1.query()
    mt.cuda.current_stream().wait_stream(stream)
    c_cuda = a_cuda + b_cuda
    event2.record()
    event2.synchronize()
    assert event2.query()
    assert event1.event_id != event2.event_id
    np.testing.assert_allclose(c_cuda.cpu().numpy(), (a + b).numpy())
    assert event1.elapsed_time(event2) >= 0
    cuda_event = mt.cuda.Event()
    assert isinstance(cuda_event, mt.Event) and mt.Event in type(cuda_event).mro()


def test_event_cuda_event_is_its_handle():
    """torch's test_events tail: 0 until recorded, then the raw handle, which event_id is too."""
    event = mt.cuda.Event(enable_timing=True)
    assert event.cuda_event == 0 and event.event_id == 0
    event.record()
    assert event.cuda_event != 0 and event.cuda_event == event.event_id


def test_stream_compatibility():
    """torch's test_stream_compatibility."""
    s1, s2 = mt.cuda.Stream(), mt.cuda.Stream()
    mt.accelerator.set_stream(s1)
    assert mt.accelerator.current_stream().stream_id == s1.stream_id
    mt.accelerator.set_stream(s2)
    assert mt.accelerator.current_stream().stream_id == s2.stream_id
    with pytest.raises(RuntimeError, match="Device index value .* is out of index range"):
        mt.accelerator.current_stream(mt.accelerator.device_count())


def test_device_context_manager():
    """torch's test_device_context_manager."""
    prev = mt.cuda.current_device()
    with mt.accelerator.device_index(None):
        assert mt.cuda.current_device() == prev
    assert mt.cuda.current_device() == prev
    with mt.accelerator.device_index(0):
        assert mt.cuda.current_device() == 0
    assert mt.cuda.current_device() == prev


@pytest.mark.parametrize("api", [mt.cuda, mt.accelerator], ids=["cuda", "accelerator"])
def test_memory_stats(api):
    """torch's test_memory_stats (written with torch.accelerator's memory API, which is torch.cuda's)."""
    gc.collect()
    api.empty_cache()
    api.reset_peak_memory_stats()
    api.reset_accumulated_memory_stats()
    prev_allocated, prev_reserved = api.memory_allocated(), api.memory_reserved()
    assert prev_allocated == api.max_memory_allocated()
    assert prev_reserved == api.max_memory_reserved()
    prev_active = api.memory_stats()["active_bytes.all.current"]
    tmp = mt.randn(256, device="cuda")  # an op makes no hidden allocation: only its output's 1 KiB
    assert api.memory_stats()["active_bytes.all.current"] == 1024 + prev_active
    assert api.memory_stats()["active_bytes.all.freed"] == 0
    del tmp
    gc.collect()
    api.empty_cache()
    assert api.memory_stats()["active_bytes.all.current"] == prev_active
    assert api.memory_stats()["active_bytes.all.freed"] == 1024
    api.reset_peak_memory_stats()
    assert api.max_memory_allocated() == prev_allocated
    assert api.max_memory_reserved() == prev_reserved


def test_accelerator_names_the_cuda_device():
    assert mt.accelerator.is_available() and mt.accelerator.device_count() == mt.cuda.device_count()
    assert mt.accelerator.current_accelerator() == mt.device("cuda")
    assert mt.accelerator.current_device_index() == mt.cuda.current_device()
    mt.accelerator.set_device_index(0)
    assert mt.cuda.current_device() == 0
    free, total = mt.accelerator.get_memory_info()
    assert 0 <= free <= total
    mt.accelerator.synchronize()


def test_get_device_module():
    assert mt.get_device_module("cuda") is mt.cuda and mt.get_device_module() is mt.cuda
    assert mt.get_device_module(mt.device("cuda:0")) is mt.cuda
    with pytest.raises(RuntimeError, match="does not have a corresponding module"):
        mt.get_device_module("xpu")


def test_stream_names_must_name_an_existing_stream():
    with pytest.raises(ValueError, match="device_type"):
        mt.cuda.Stream(stream_id=0, device_index=0, device_type=7)
    with pytest.raises(ValueError, match="no stream has stream_id"):
        mt.cuda.Stream(stream_id=10**6, device_index=0, device_type=1)
    default = mt.cuda.Stream(stream_id=0, device_index=0, device_type="cuda")
    assert default == mt.cuda.default_stream(0) and default.cuda_stream == 0


def test_subclasses_of_the_generic_classes():
    class MyStream(mt.cuda.Stream):
        __slots__ = ()

    s = MyStream()
    assert isinstance(s, mt.Stream) and "MyStream" in repr(s)
    with mt.cuda.stream(s):
        assert mt.cuda.current_stream() == s
