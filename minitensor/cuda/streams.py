"""Streams and events, as torch has them: the device-generic `mt.Stream` and `mt.Event` (torch.Stream,
torch.Event), and their subclasses `mt.cuda.Stream` and `mt.cuda.Event`, which every stream and event minitensor
hands out is (users may subclass either).

`Stream()` hands out streams from a per-device pool of 32 per priority, round-robin, as torch does:
streams are never destroyed, so a handle cached by the allocator never comes back as another stream.
The current stream is per thread and per device; the default is the legacy default stream (handle 0).
"""
import threading

from ..backends import active_driver
from ..base.arguments import int_arg
from . import capturing
from .device_errors import raise_pending
from .devices import cuda_device, current_device, index_of, set_device

_POOL_SIZE = 32


class _ThreadState(threading.local):
    """Per thread: the current stream handle per device, or None while every device's is the default (0)."""
    handles = None


_tls = _ThreadState()
_pool_lock = threading.Lock()
_pools = {}  # (device, high priority?) -> [handles], filled lazily
_next_in_pool = {}
_stream_ids = {0: 0}  # handle -> stream_id; the default stream is 0
_stream_handles = {0: 0}  # stream_id -> handle
CUDA_DEVICE_TYPE = 1  # torch's DeviceType value for cuda, what Stream.device_type gives


def _driver():
    return active_driver()


def _current_handles():
    """This thread's current stream handle per device (0, the default stream, until set)."""
    handles = _tls.handles
    if handles is None:
        handles = _tls.handles = [0] * _driver().device_count()
    return handles


def current_stream_handle(index):
    """The raw handle kernels launch on: the hot path, so no Stream object is built."""
    handles = _tls.handles
    return 0 if handles is None else handles[index]


def checked_stream(s, what):
    """`s` if it is a Stream, else TypeError naming `what` (the argument that took it)."""
    if not isinstance(s, GenericStream):
        raise TypeError(f"{what} must be a minitensor.cuda.Stream, not {type(s).__name__}")
    return s


def _checked_event(e, what):
    if not isinstance(e, GenericEvent):
        raise TypeError(f"{what} must be a minitensor.cuda.Event, not {type(e).__name__}")
    return e


def _pooled_handle(index, priority):
    key = (index, priority < 0)
    with _pool_lock:
        pool = _pools.setdefault(key, [])
        n = _next_in_pool.get(key, 0)
        _next_in_pool[key] = n + 1
        if len(pool) < _POOL_SIZE:
            handle = _driver().stream_create(index, -1 if priority < 0 else 0)
            pool.append(handle)
            _stream_handles[len(_stream_ids)] = handle
            _stream_ids[handle] = len(_stream_ids)
            return handle
        return pool[n % _POOL_SIZE]


class GenericStream:
    """`mt.Stream(device=None, priority=0)`: a queue of device work (torch.Stream). Usable as a context manager
    that makes it (and its device) current. `stream_id`, `device_index` and `device_type` name an existing
    stream: `mt.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)` is
    `s` again."""

    __slots__ = ("device", "cuda_stream", "priority", "_saved")

    def __init__(self, device=None, priority=0, *, stream_id=None, device_index=None, device_type=None,
                 _handle=None):
        if stream_id is not None or device_index is not None or device_type is not None:
            device, _handle = _named_stream(stream_id, device_index, device_type)
        self.device = cuda_device(device)
        index = self.device.index
        priority = int_arg(priority, "Stream(): argument 'priority'")
        self.priority = priority
        self.cuda_stream = _pooled_handle(index, priority) if _handle is None else _handle
        self._saved = []  # what each `with` of it replaced (nested ones included), last first

    @property
    def stream_id(self):
        stream_id = _stream_ids.get(self.cuda_stream)
        if stream_id is None:
            with _pool_lock:  # two threads' new handles must not both take the next id
                stream_id = _stream_ids.setdefault(self.cuda_stream, len(_stream_ids))
                _stream_handles[stream_id] = self.cuda_stream
        return stream_id

    @property
    def device_index(self):
        return self.device.index

    @property
    def device_type(self):
        return CUDA_DEVICE_TYPE

    def query(self):
        """True when all work queued on the stream has completed."""
        capturing.refuse("Stream.query()", self.cuda_stream)
        return self._on_device(_driver().stream_query, self.cuda_stream)

    def synchronize(self):
        capturing.refuse("Stream.synchronize()", self.cuda_stream)
        self._on_device(_driver().stream_synchronize, self.cuda_stream)
        raise_pending(self.device.index)

    def wait_event(self, event):
        """Make future work on this stream wait for the event's last record. Waiting for an event recorded in a
        capture underway joins the capture (its work is captured from now on, and must be waited for by the
        capturing stream before the capture ends); a capturing stream waits for nothing outside its capture."""
        if _checked_event(event, "wait_event(): argument 'event'")._handle is None:
            return
        capture = event._capture if event._capture is not None and event._capture.active else None
        mine = capturing.by_stream.get(self.cuda_stream) if capturing.by_stream else None
        if mine is not None and capture is not mine:
            raise RuntimeError(f"stream {self.cuda_stream:#x} captures a CUDA graph and cannot wait for work outside "
                               "its capture (an event recorded before the capture or on another capture's stream)")
        self._on_device(_driver().stream_wait_event, self.cuda_stream, event._handle)
        if capture is not None and mine is None:
            capturing.join(capture, self.cuda_stream)

    def wait_stream(self, stream):
        self.wait_event(checked_stream(stream, "wait_stream(): argument 'stream'").record_event())

    def record_event(self, event=None):
        event = Event() if event is None else _checked_event(event, "record_event(): argument 'event'")
        event.record(self)
        return event

    def _on_device(self, fn, *args):
        """Run a driver call with this stream's device current (handle 0 means that device's default)."""
        previous = current_device()
        if previous == self.device.index:
            return fn(*args)
        set_device(self.device.index)
        try:
            return fn(*args)
        finally:
            set_device(previous)

    def __cuda_stream__(self):
        return 0, self.cuda_stream

    def __eq__(self, other):
        return isinstance(other, GenericStream) and (self.device, self.cuda_stream) == (other.device,
                                                                                        other.cuda_stream)

    def __hash__(self):
        return hash((self.device, self.cuda_stream))

    def __repr__(self):
        return f"<{_public_name(self)} device={self.device} cuda_stream={self.cuda_stream:#x}>"

    def __enter__(self):
        self._saved.append(_make_current(self))
        return self

    def __exit__(self, *exc):
        _restore(self._saved.pop())
        return False


class Stream(GenericStream):
    """`mt.cuda.Stream(device=None, priority=0)`, torch.cuda.Stream."""

    __slots__ = ()


def _named_stream(stream_id, device_index, device_type):
    """(device index, handle) of the stream these name, as torch.cuda.Stream's keyword arguments do."""
    if device_type not in (CUDA_DEVICE_TYPE, "cuda"):
        raise ValueError(f"Stream(): device_type must be {CUDA_DEVICE_TYPE} (cuda), got {device_type!r}")
    handle = _stream_handles.get(int_arg(stream_id, "Stream(): argument 'stream_id'"))
    if handle is None:
        raise ValueError(f"Stream(): no stream has stream_id {stream_id}")
    return int_arg(device_index, "Stream(): argument 'device_index'"), handle


def _public_name(obj):
    """How a repr names a stream or event: minitensor's classes by where users find them, a user's by its own."""
    cls = type(obj)
    return _PUBLIC_NAMES.get(cls) or f"{cls.__module__}.{cls.__qualname__}"


class ExternalStream(Stream):
    """Wraps a stream created elsewhere (another library's handle); minitensor never destroys it."""

    __slots__ = ()

    def __init__(self, stream_ptr, device=None):
        handle = int_arg(stream_ptr, "ExternalStream(): argument 'stream_ptr'")
        if handle < 0:
            raise ValueError(f"ExternalStream(): stream_ptr must be a stream's address (>= 0), got {handle}")
        super().__init__(device, 0, _handle=handle)


def current_stream(device=None):
    index = index_of(device)
    return Stream(index, _handle=_current_handles()[index])


def default_stream(device=None):
    return Stream(index_of(device), _handle=0)


def set_stream(s):
    """Make `s` the current stream of its device in this thread; None does nothing, as in torch."""
    if s is not None:
        checked_stream(s, "set_stream(): argument 'stream'")
        _current_handles()[s.device.index] = s.cuda_stream


def _make_current(s):
    """Make stream `s` and its device current; what they replaced, for _restore."""
    saved = current_device(), current_stream(s.device)
    set_device(s.device.index)
    set_stream(s)
    return saved


def _restore(saved):
    device, previous = saved
    set_stream(previous)
    set_device(device)


class stream:
    """Context manager form of set_stream; None does nothing. Each `with` keeps what it replaced, so the same
    stream may be entered again inside, or by another thread."""

    def __init__(self, s):
        self.s = None if s is None else checked_stream(s, "stream(): argument 'stream'")
        self._saved = None

    def __enter__(self):
        if self.s is not None:
            self._saved = _make_current(self.s)
        return self.s

    def __exit__(self, *exc):
        if self.s is not None:
            _restore(self._saved)
        return False


class GenericEvent:
    """`mt.Event(device=None, *, enable_timing=False, blocking=False, interprocess=False)`: a marker in a stream
    (torch.Event). Created on the driver at its first record, on the recording stream's device; `event_id` and
    `cuda_event` are its raw handle, 0 until then."""

    __slots__ = ("enable_timing", "blocking", "_handle", "_device", "_capture", "__weakref__")

    def __init__(self, device=None, *, enable_timing=False, blocking=False, interprocess=False):
        if device is not None:
            cuda_device(device)  # checked: the device it is recorded on is the recording stream's
        if interprocess:
            raise NotImplementedError("interprocess events are not supported by minitensor")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._handle = None
        self._device = None
        self._capture = None  # the capture of its last record, if recorded on a capturing stream

    @property
    def event_id(self):
        return self._handle or 0

    cuda_event = event_id
    def record(self, stream=None):
        stream = current_stream() if stream is None else checked_stream(stream, "record(): argument 'stream'")
        if self._handle is None:
            self._device = stream.device
            self._handle = stream._on_device(_driver().event_create, stream.device.index, self.enable_timing,
                                             self.blocking)
        elif stream.device != self._device:
            raise RuntimeError(f"Event device {self._device} does not match recording stream's device "
                               f"{stream.device}")
        stream._on_device(_driver().event_record, self._handle, stream.cuda_stream)
        self._capture = capturing.by_stream.get(stream.cuda_stream) if capturing.by_stream else None

    def query(self):
        if self._handle is None:
            return True
        capturing.refuse_captured_event("Event.query()", self._capture)
        capturing.refuse("Event.query()")
        return _driver().event_query(self._handle)

    def synchronize(self):
        if self._handle is not None:
            capturing.refuse_captured_event("Event.synchronize()", self._capture)
            capturing.refuse("Event.synchronize()")
            _driver().event_synchronize(self._handle)
            raise_pending(self._device.index)

    def wait(self, stream=None):
        (current_stream() if stream is None else checked_stream(stream, "wait(): argument 'stream'")).wait_event(self)

    def elapsed_time(self, end_event):
        """Milliseconds from this event to `end_event`; both must be recorded and complete."""
        _checked_event(end_event, "elapsed_time(): argument 'end_event'")
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'")
        if self._handle is None or end_event._handle is None:
            raise ValueError("Both events must be recorded before calculating elapsed time")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time")
        return _driver().event_elapsed_ms(self._handle, end_event._handle)

    def __del__(self):
        if self._handle is not None:
            try:
                _driver().event_destroy(self._handle)
            except Exception:  # interpreter shutdown: the driver may already be gone
                pass

    def __repr__(self):
        state = f"cuda_event={self._handle:#x}" if self._handle is not None else "uninitialized"
        return f"<{_public_name(self)} {state}>"


class Event(GenericEvent):
    """`mt.cuda.Event(enable_timing=False, blocking=False, interprocess=False)`, torch.cuda.Event."""

    __slots__ = ()

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        super().__init__(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


_PUBLIC_NAMES = {GenericStream: "minitensor.Stream", Stream: "minitensor.cuda.Stream",
                 GenericEvent: "minitensor.Event", Event: "minitensor.cuda.Event"}
