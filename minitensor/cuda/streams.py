"""Streams and events, as torch has them: the device-generic `mt.Stream` and `mt.Event` (torch.Stream,
torch.Event), and their subclasses `mt.cuda.Stream` and `mt.cuda.Event`, which every stream and event minitensor
hands out is (users may subclass either). A device type a third party registers (backends/registry.py) gets
the same streams and events over its own driver, each type's in its own `StreamTable`.

`Stream()` hands out streams from a per-device pool of 32 per priority, round-robin, as torch does:
streams are never destroyed, so a handle cached by the allocator never comes back as another stream.
The current stream is per thread and per device; the default is the legacy default stream (handle 0).
"""
import threading

from ..backends import active_driver, device_type_id, registered_driver
from ..base.arguments import int_arg
from ..base.device import device as _Device
from . import capturing
from .device_errors import raise_pending
from .devices import _DEVICES as _CUDA_DEVICES  # the canonical cuda devices, by an index index_of checked
from .devices import cuda_device, current_device, index_of, registered_device, set_device

_POOL_SIZE = 32
CUDA_DEVICE_TYPE = 1  # torch's DeviceType value for cuda, what Stream.device_type gives


class _ThreadState(threading.local):
    """Per thread: the current stream handle per device, or None while every device's is the default (0)."""
    handles = None


class StreamTable:
    """One device type's streams: its driver, the pools streams are handed out from, the ids that name them
    (the default stream's is 0) and each thread's current stream per device. Only cuda's streams can capture
    graphs and have kernels that record index errors, so only its table checks for those."""

    def __init__(self, type_name, type_id, driver, device_of, current_device, set_device, checks_cuda):
        self.type_name, self.type_id = type_name, type_id
        self.driver = driver  # a function: cuda's driver is chosen on first use
        self.device_of = device_of  # None (current), an index, a string or an mt.device -> the canonical device
        self.current_device, self.set_device = current_device, set_device
        self.checks_cuda = checks_cuda
        self.tls = _ThreadState()
        self.lock = threading.Lock()
        self.pools = {}  # (device, high priority?) -> [handles], filled lazily
        self.next_in_pool = {}
        self.ids = {0: 0}  # handle -> stream_id
        self.handles = {0: 0}  # stream_id -> handle
        self.stream_class = self.event_class = None  # set once the classes exist: below for cuda, else at first use

    def current_handles(self):
        """This thread's current stream handle per device (0, the default stream, until set)."""
        handles = self.tls.handles
        if handles is None:
            handles = self.tls.handles = [0] * self.driver().device_count()
        return handles

    def pooled_handle(self, index, priority):
        key = (index, priority < 0)
        with self.lock:
            pool = self.pools.setdefault(key, [])
            n = self.next_in_pool.get(key, 0)
            self.next_in_pool[key] = n + 1
            if len(pool) < _POOL_SIZE:
                handle = self.driver().stream_create(index, -1 if priority < 0 else 0)
                pool.append(handle)
                self.handles[len(self.ids)] = handle
                self.ids[handle] = len(self.ids)
                return handle
            return pool[n % _POOL_SIZE]

    def stream_id(self, handle):
        stream_id = self.ids.get(handle)
        if stream_id is None:
            with self.lock:  # two threads' new handles must not both take the next id
                stream_id = self.ids.setdefault(handle, len(self.ids))
                self.handles[stream_id] = handle
        return stream_id

    def on_device(self, index, fn, *args):
        """Run a driver call with device `index` current (handle 0 means that device's default stream)."""
        previous = self.current_device()
        if previous == index:
            return fn(*args)
        self.set_device(index)
        try:
            return fn(*args)
        finally:
            self.set_device(previous)


_CUDA = StreamTable("cuda", CUDA_DEVICE_TYPE, active_driver, cuda_device, current_device, set_device, True)
_tls = _CUDA.tls  # the ops' hot path reads cuda's current handles straight from it
_tables = {"cuda": _CUDA}
_tables_lock = threading.Lock()


def table_for(type_name):
    """The StreamTable of a device type: cuda's, or a registered type's, made on its first use."""
    table = _tables.get(type_name)
    if table is None:
        with _tables_lock:
            table = _tables.get(type_name)
            if table is None:
                table = _tables[type_name] = _registered_table(type_name)
    return table


def _registered_table(type_name):
    def driver():
        return registered_driver(type_name)

    def device_of(d):
        if d is None or (isinstance(d, int) and not isinstance(d, bool)):
            d = _Device(type_name, d)
        d = _Device(d) if not isinstance(d, _Device) else d
        if d.type != type_name:
            raise ValueError(f"Expected a {type_name} device, but got: {d}")
        return registered_device(d)

    table = StreamTable(type_name, device_type_id(type_name), driver, device_of,
                        lambda: driver().current_device(), lambda index: driver().set_device(index), False)
    table.stream_class, table.event_class = GenericStream, GenericEvent
    return table


def _table_of(device, own_type):
    """The table of the device type `device` names: None or an index name a device of `own_type` (cuda when
    None); a class of its own type (`own_type` not None) takes no other type's devices."""
    if device is None or isinstance(device, int):
        return table_for(own_type or "cuda")
    named = getattr(_Device(device) if isinstance(device, str) else device, "type", own_type)
    if own_type is not None and named != own_type:
        raise ValueError(f"Expected a {own_type} device, but got: {device}")
    return table_for(named)


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


class GenericStream:
    """`mt.Stream(device=None, priority=0)`: a queue of device work (torch.Stream). Usable as a context manager
    that makes it (and its device) current. `stream_id`, `device_index` and `device_type` name an existing
    stream: `mt.cuda.Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)` is
    `s` again. `device` may name a device of any type, cuda or a registered one (None and an index: cuda); a
    type's own class (`mt.cuda.Stream`, a registered module's `Stream`) takes only that type's devices."""

    __slots__ = ("device", "cuda_stream", "priority", "_saved", "_table")
    _device_type = None  # the one type a subclass takes, if it is a type's own

    def __init__(self, device=None, priority=0, *, stream_id=None, device_index=None, device_type=None,
                 _handle=None):
        table = _CUDA if type(device) is int and self._device_type == "cuda" else _table_of(device,
                                                                                            self._device_type)
        if stream_id is not None or device_index is not None or device_type is not None:
            device, _handle = _named_stream(table, stream_id, device_index, device_type)
        self._table = table
        self.device = table.device_of(device)
        priority = int_arg(priority, "Stream(): argument 'priority'")
        self.priority = priority
        self.cuda_stream = table.pooled_handle(self.device.index, priority) if _handle is None else _handle
        self._saved = []  # what each `with` of it replaced (nested ones included), last first

    @property
    def stream_id(self):
        return self._table.stream_id(self.cuda_stream)

    @property
    def device_index(self):
        return self.device.index

    @property
    def device_type(self):
        return self._table.type_id

    def query(self):
        """True when all work queued on the stream has completed."""
        if self._table.checks_cuda:
            capturing.refuse("Stream.query()", self.cuda_stream)
        return self._on_device(self._table.driver().stream_query, self.cuda_stream)

    def synchronize(self):
        table = self._table
        if table.checks_cuda:
            capturing.refuse("Stream.synchronize()", self.cuda_stream)
        self._on_device(table.driver().stream_synchronize, self.cuda_stream)
        if table.checks_cuda:
            raise_pending(self.device.index)

    def wait_event(self, event):
        """Make future work on this stream wait for the event's last record. Waiting for an event recorded in a
        capture underway joins the capture (its work is captured from now on, and must be waited for by the
        capturing stream before the capture ends); a capturing stream waits for nothing outside its capture."""
        if _checked_event(event, "wait_event(): argument 'event'")._handle is None:
            return
        if event._table is not self._table:
            raise RuntimeError(f"a {self._table.type_name} stream cannot wait for an event recorded on a "
                               f"{event._table.type_name} stream")
        capture = event._capture if event._capture is not None and event._capture.active else None
        mine = capturing.by_stream.get(self.cuda_stream) if capturing.by_stream and self._table.checks_cuda else None
        if mine is not None and capture is not mine:
            raise RuntimeError(f"stream {self.cuda_stream:#x} captures a CUDA graph and cannot wait for work outside "
                               "its capture (an event recorded before the capture or on another capture's stream)")
        self._on_device(self._table.driver().stream_wait_event, self.cuda_stream, event._handle)
        if capture is not None and mine is None:
            capturing.join(capture, self.cuda_stream)

    def wait_stream(self, stream):
        self.wait_event(checked_stream(stream, "wait_stream(): argument 'stream'").record_event())

    def record_event(self, event=None):
        event = self._table.event_class() if event is None else _checked_event(event,
                                                                                "record_event(): argument 'event'")
        event.record(self)
        return event

    def _on_device(self, fn, *args):
        """Run a driver call with this stream's device current (handle 0 means that device's default)."""
        return self._table.on_device(self.device.index, fn, *args)

    def __cuda_stream__(self):
        return 0, self.cuda_stream

    def __eq__(self, other):
        return isinstance(other, GenericStream) and (self.device, self.cuda_stream) == (other.device,
                                                                                        other.cuda_stream)

    def __hash__(self):
        return hash((self.device, self.cuda_stream))

    def __repr__(self):
        if self._device_type is None:  # torch.Stream's form
            return (f"{_public_name(self)} device_type={self._table.type_name}, device_index={self.device.index}, "
                    f"stream_id={self.stream_id}")
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
    _device_type = "cuda"


def _named_stream(table, stream_id, device_index, device_type):
    """(device index, handle) of the stream these name, as torch.cuda.Stream's keyword arguments do."""
    if device_type not in (table.type_id, table.type_name):
        raise ValueError(f"Stream(): device_type must be {table.type_id} ({table.type_name}), got {device_type!r}")
    handle = table.handles.get(int_arg(stream_id, "Stream(): argument 'stream_id'"))
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
    canonical = _CUDA_DEVICES[index] if _CUDA_DEVICES else cuda_device(index)  # cuda_device fills the list
    return _known_stream(Stream, _CUDA, canonical, _CUDA.current_handles()[index])


def default_stream(device=None):
    return Stream(index_of(device), _handle=0)


def current_stream_of(table, device=None):
    """The current stream of a device of `table`'s type (None: its current device), as the type's Stream."""
    d = table.device_of(device)
    return _known_stream(table.stream_class, table, d, table.current_handles()[d.index])


def _known_stream(cls, table, device, handle):
    """A `cls` for a handle known to be `device`'s current stream (`device` canonical): the Stream that
    current_stream() returns, built without __init__'s checks of what is already checked (a hot path: an
    Event().record() makes one)."""
    s = object.__new__(cls)
    s._table, s.device, s.priority, s.cuda_stream, s._saved = table, device, 0, handle, []
    return s


def _direct(fn, *args):
    """A driver call on the current device: what Stream._on_device does for a stream of that device."""
    return fn(*args)


def set_stream(s):
    """Make `s` the current stream of its device in this thread; None does nothing, as in torch."""
    if s is not None:
        checked_stream(s, "set_stream(): argument 'stream'")
        s._table.current_handles()[s.device.index] = s.cuda_stream


def _make_current(s):
    """Make stream `s` and its device current; what they replaced, for _restore."""
    table, index = s._table, s.device.index
    handles = table.current_handles()
    saved = table, table.current_device(), index, handles[index]
    table.set_device(index)
    handles[index] = s.cuda_stream
    return saved


def _restore(saved):
    table, device, index, handle = saved
    table.current_handles()[index] = handle
    table.set_device(device)


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

    __slots__ = ("enable_timing", "blocking", "_handle", "_device", "_capture", "_table", "__weakref__")
    _device_type = None  # as GenericStream's

    def __init__(self, device=None, *, enable_timing=False, blocking=False, interprocess=False):
        self._handle = None  # first: __del__ reads it even when a check below raises
        self._table = _table_of(device, self._device_type)
        if device is not None:
            self._table.device_of(device)  # checked: the device it is recorded on is the recording stream's
        if interprocess:
            raise NotImplementedError("interprocess events are not supported by minitensor")
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._device = None
        self._capture = None  # the capture of its last record, if recorded on a capturing stream

    @property
    def event_id(self):
        return self._handle or 0

    cuda_event = event_id

    def record(self, stream=None):
        """Record on `stream` (default: the current stream of the event's device type). The first record
        creates the event on that stream's device, which every later record must use."""
        if stream is None:
            stream, call = current_stream_of(self._table), _direct  # on the current device: no switch
        else:
            stream = checked_stream(stream, "record(): argument 'stream'")
            call = stream._on_device
        if self._device_type is not None and stream._table.type_name != self._device_type:
            raise ValueError(f"a {self._device_type} event cannot be recorded on a {stream._table.type_name} stream")
        if self._handle is None:
            self._table, self._device = stream._table, stream.device
            self._handle = call(self._table.driver().event_create, stream.device.index, self.enable_timing,
                                self.blocking)
        elif stream.device != self._device:
            raise RuntimeError(f"Event device {self._device} does not match recording stream's device "
                               f"{stream.device}")
        call(self._table.driver().event_record, self._handle, stream.cuda_stream)
        captures = capturing.by_stream and stream._table.checks_cuda
        self._capture = capturing.by_stream.get(stream.cuda_stream) if captures else None

    def query(self):
        if self._handle is None:
            return True
        if self._table.checks_cuda:
            capturing.refuse_captured_event("Event.query()", self._capture)
            capturing.refuse("Event.query()")
        return self._table.driver().event_query(self._handle)

    def synchronize(self):
        if self._handle is not None:
            if self._table.checks_cuda:
                capturing.refuse_captured_event("Event.synchronize()", self._capture)
                capturing.refuse("Event.synchronize()")
            self._table.driver().event_synchronize(self._handle)
            if self._table.checks_cuda:
                raise_pending(self._device.index)

    def wait(self, stream=None):
        stream = current_stream_of(self._table) if stream is None else checked_stream(stream,
                                                                                      "wait(): argument 'stream'")
        stream.wait_event(self)

    def elapsed_time(self, end_event):
        """Milliseconds from this event to `end_event`; both must be recorded and complete."""
        _checked_event(end_event, "elapsed_time(): argument 'end_event'")
        if not (self.enable_timing and end_event.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'")
        if self._handle is None or end_event._handle is None:
            raise ValueError("Both events must be recorded before calculating elapsed time")
        if not (self.query() and end_event.query()):
            raise RuntimeError("Both events must be completed before calculating elapsed time")
        if end_event._table is not self._table:
            raise RuntimeError(f"elapsed_time(): a {self._table.type_name} event and a "
                               f"{end_event._table.type_name} event")
        return self._table.driver().event_elapsed_ms(self._handle, end_event._handle)

    def __del__(self):
        if self._handle is not None:
            try:
                self._table.driver().event_destroy(self._handle)
            except Exception:  # interpreter shutdown: the driver may already be gone
                pass

    def __repr__(self):
        if self._device_type is None:  # torch.Event's form; event_flag: 1 with timing, else 0, as torch numbers it
            index = -1 if self._device is None else self._device.index
            return (f"{_public_name(self)} device_type={self._table.type_name}, device_index={index}, "
                    f"event_flag={int(self.enable_timing)}, event_id={self.event_id}")
        return f"<{_public_name(self)} {'uninitialized' if self._handle is None else f'{self._handle:#x}'}>"


class Event(GenericEvent):
    """`mt.cuda.Event(enable_timing=False, blocking=False, interprocess=False)`, torch.cuda.Event."""

    __slots__ = ()
    _device_type = "cuda"

    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        super().__init__(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


# The device-generic classes are torch.Stream and torch.Event under minitensor's name, as mt.Stream and mt.Event
GenericStream.__name__ = GenericStream.__qualname__ = "Stream"
GenericEvent.__name__ = GenericEvent.__qualname__ = "Event"
GenericStream.__module__ = GenericEvent.__module__ = "minitensor"
_PUBLIC_NAMES = {GenericStream: "minitensor.Stream", Stream: "minitensor.cuda.Stream",
                 GenericEvent: "minitensor.Event", Event: "minitensor.cuda.Event"}
_CUDA.stream_class, _CUDA.event_class = Stream, Event
