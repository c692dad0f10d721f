"""Which streams capture a CUDA graph now, and what that forbids (the graphs themselves: graphs.py).

CUDA refuses to synchronize or query a capturing stream, or an event recorded in the capture, and with the
"global" capture mode any thread's potentially unsafe call (a host wait, a synchronous copy), with
"thread_local" the capturing thread's: the refused call also invalidates the capture. minitensor checks these
rules here first, in Python, and raises before the driver is touched, so the capture, the stream and the
allocator stay usable; both backends give the same error.
"""
import threading

from ..base.errors import CudaError

MODES = ("global", "thread_local", "relaxed")
_MESSAGE = "operation not permitted when stream is capturing"


class Capture:
    """One capture underway: the stream it began on (`stream`, a handle of device `device`), the streams that
    joined it by waiting for an event recorded in it (`streams` holds both), its mode, the thread that began
    it, the private pool its allocations come from, and the random generators its ops drew from (`rng`,
    generator -> graphs.GraphRng)."""

    __slots__ = ("stream", "device", "mode", "thread", "streams", "pool", "rng", "active")

    def __init__(self, stream, device, mode, pool):
        self.stream = stream
        self.device = device
        self.mode = mode
        self.thread = threading.get_ident()
        self.streams = {stream}
        self.pool = pool
        self.rng = {}
        self.active = True

    def __repr__(self):
        return f"<capture on stream {self.stream:#x} of cuda:{self.device}, mode {self.mode!r}, pool {self.pool}>"


_underway = []  # the Captures underway, oldest first
by_stream = {}  # stream handle -> its Capture, for every capturing stream: the ops' one test of a launch
_lock = threading.Lock()


def begin(capture):
    with _lock:
        _underway.append(capture)
        by_stream[capture.stream] = capture


def end(capture):
    with _lock:
        capture.active = False
        _underway.remove(capture)
        for stream in capture.streams:
            by_stream.pop(stream, None)


def join(capture, stream):
    """`stream` waited for an event recorded in the capture: its work is captured from now on."""
    with _lock:
        capture.streams.add(stream)
        by_stream[stream] = capture


def refuse(what, stream=None, device=None):
    """Raise CUDA's capture error when `what`, a call that waits for or queries device work, is illegal now:
    it concerns a capturing `stream` (a handle), or waits for a whole `device` where a capture is underway,
    or a capture's mode forbids host waits to this thread."""
    if not _underway:
        return
    thread = threading.get_ident()
    for capture in list(_underway):
        if stream is not None and stream in capture.streams:
            reason = f"stream {stream:#x} is capturing"
        elif device is not None and capture.device == device:
            reason = f"a capture is underway on cuda:{device}"
        elif capture.mode == "global" or (capture.mode == "thread_local" and capture.thread == thread):
            reason = f"a {capture.mode!r} capture is underway on stream {capture.stream:#x}"
        else:
            continue
        raise CudaError(900, f"{_MESSAGE}: {what} is not allowed while {reason} (end the capture first, or "
                             "capture with capture_error_mode='thread_local' or 'relaxed' to let other "
                             "threads wait)")


def refuse_captured_event(what, capture):
    """Raise when `capture`, the capture an event was last recorded in, is still underway."""
    if capture is not None and capture.active:
        raise CudaError(900, f"{_MESSAGE}: {what} is not allowed for an event recorded in the capture on "
                             f"stream {capture.stream:#x}, which is still underway")


def underway():
    return bool(_underway)
