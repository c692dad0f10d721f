"""Streams as the CUDA Array Interface and DLPack name them: 1 is the legacy default stream, 2 the per-thread
default stream, anything else a raw handle; 0 is refused as ambiguous. minitensor's own handle for the legacy
default stream is 0, so the helpers here translate, and order a consumer's stream after a producer's.
"""
from ..backends import active_driver
from ..cuda.streams import Event, ExternalStream

LEGACY_DEFAULT_STREAM, PER_THREAD_DEFAULT_STREAM = 1, 2


def protocol_stream(handle):
    """A minitensor stream handle as the protocols spell it (the legacy default stream is 1, not 0)."""
    return LEGACY_DEFAULT_STREAM if handle == 0 else handle


def driver_stream(value):
    """A protocol stream value as a driver handle. The simulator has no per-thread default stream; its
    default stream stands in for it."""
    if value == 0:
        raise ValueError("stream 0 is ambiguous (legacy or per-thread default stream?) and the CUDA Array "
                         "Interface and DLPack forbid it: use 1 for the legacy default stream, 2 for the "
                         "per-thread default stream")
    if value == LEGACY_DEFAULT_STREAM or (value == PER_THREAD_DEFAULT_STREAM and active_driver().name == "sim"):
        return 0
    return value


def order_after(producer, consumer, device):
    """Make work queued later on `consumer` wait for the work queued so far on `producer` (both handles,
    on `device`); nothing to do when they are one stream."""
    if producer != consumer:
        event = Event()
        event.record(ExternalStream(producer, device))
        ExternalStream(consumer, device).wait_event(event)
