"""The stream and event classes carry torch's names and reprs under minitensor's module names (torch 2.11 on an
H200: torch.Stream is `Stream` in module `torch`, repr `torch.Stream device_type=cuda, device_index=0,
stream_id=35`; torch.cuda.Stream `<torch.cuda.Stream device=cuda:0 cuda_stream=0x3cfc0d00>`; torch.cuda.Event
`<torch.cuda.Event uninitialized>`, then `<torch.cuda.Event 0x3d1de8c0>`; torch.Event
`torch.Event device_type=cuda, device_index=-1, event_flag=0, event_id=0`). `mt.Stream.__name__` was
"GenericStream"."""
import re

import minitensor as mt


def test_class_names_are_torchs():
    assert (mt.Stream.__name__, mt.Stream.__qualname__, mt.Stream.__module__) == ("Stream", "Stream", "minitensor")
    assert (mt.Event.__name__, mt.Event.__qualname__, mt.Event.__module__) == ("Event", "Event", "minitensor")
    for cls, name in [(mt.cuda.Stream, "Stream"), (mt.cuda.Event, "Event"), (mt.cuda.ExternalStream, "ExternalStream")]:
        assert (cls.__name__, cls.__qualname__, cls.__module__) == (name, name, "minitensor.cuda.streams")
    assert issubclass(mt.cuda.Stream, mt.Stream) and issubclass(mt.cuda.Event, mt.Event)
    assert repr(mt.Stream) == "<class 'minitensor.Stream'>"


def test_cuda_stream_and_event_reprs():
    s = mt.cuda.Stream()
    assert repr(s) == f"<minitensor.cuda.Stream device=cuda:0 cuda_stream={s.cuda_stream:#x}>"
    assert repr(mt.cuda.default_stream()) == "<minitensor.cuda.Stream device=cuda:0 cuda_stream=0x0>"
    e = mt.cuda.Event()
    assert repr(e) == "<minitensor.cuda.Event uninitialized>"
    e.record(s)
    assert repr(e) == f"<minitensor.cuda.Event {e.cuda_event:#x}>" and e.cuda_event


def test_generic_stream_and_event_reprs():
    s = mt.Stream("cuda")
    assert type(s) is mt.Stream
    assert repr(s) == f"minitensor.Stream device_type=cuda, device_index=0, stream_id={s.stream_id}"
    e = mt.Event("cuda")
    assert repr(e) == "minitensor.Event device_type=cuda, device_index=-1, event_flag=0, event_id=0"
    e.record(s)
    assert re.fullmatch(r"minitensor\.Event device_type=cuda, device_index=0, event_flag=0, event_id=[1-9]\d*",
                        repr(e)) and str(e.event_id) in repr(e)
    assert "event_flag=1" in repr(mt.Event("cuda", enable_timing=True))


def test_subclasses_are_named_by_their_own_class():
    class MyStream(mt.Stream):
        __slots__ = ()

    class MyCudaEvent(mt.cuda.Event):
        __slots__ = ()

    assert repr(MyStream("cuda")).startswith(f"{__name__}.test_subclasses_are_named_by_their_own_class.<locals>"
                                             ".MyStream device_type=cuda, device_index=0, stream_id=")
    assert repr(MyCudaEvent()).endswith(".MyCudaEvent uninitialized>")
