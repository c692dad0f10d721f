"""A simulated CUDA device in host memory, for machines without a GPU.

Each device is one lazily committed anonymous mapping of MINITENSOR_SIM_MEMORY bytes; device pointers
are real host addresses inside it, so Triton's interpreter can run the same kernels on them. Every stream
is an in-order queue drained by its own worker thread, so work really runs after the call that enqueued
it returns: `query()` is False while work is pending, events complete when the stream reaches them (at once
on an idle stream), and cross-stream waits block only the waiting stream. Work that raises on a worker is kept by
its stream and raised once, never dropped, by the next synchronising call that waits for that stream (its
synchronize, an event recorded on it, or the device's synchronize).

At exit every stream stops after the item it is running, and the process waits only for a kernel inside
Triton's interpreter (which must not be running while Python finalises): not for a sleep, a gate or an event
wait, which could last for ever. A synchronising call after that raises CUDA's "driver shutting down".
"""
import atexit
import collections
import ctypes
import functools
import hashlib
import itertools
import mmap
import os
import threading
import time
import uuid

import numpy as np

from ..base.errors import CudaError
from .base import DeviceProperties, Driver, ThreadDevice
from .sim_graphs import SimGraphs, capture_error
from .sim_memory import ALIGNMENT, SimMemory
from .sim_vmm import SimVmm

_ERRORS = {
    0: "no error",
    1: "invalid argument",
    2: "out of memory",
    4: "driver shutting down",
    101: "invalid device ordinal",
    400: "invalid resource handle",
    600: "device not ready",
    719: "unspecified launch failure",
}
# Triton's interpreter patches triton.language globally while a kernel runs: one kernel at a time.
_INTERPRETER_LOCK = threading.Lock()
_interpreter_held_at_exit = []  # non-empty once a simulator's exit has taken the lock for good
_failures = itertools.count()  # orders the failures kept by different streams


def _run_interpreted(work):
    with _INTERPRETER_LOCK, np.errstate(all="ignore"):  # a GPU computes inf and nan silently
        work()


class _Stream:
    """An in-order work queue with its own worker thread."""

    def __init__(self, driver, device):
        self.driver = driver
        self.device = device
        self.items = collections.deque()
        self.cond = threading.Condition()
        self.enqueued = 0
        self.completed = 0
        self.running = False
        self.closed = False
        self.errors = []  # (order, exception) of work that raised, until a synchronising call raises it
        self.capture = None  # the sim_graphs.Capture recording this stream's work instead of running it
        threading.Thread(target=self._run, daemon=True, name=f"minitensor-sim-stream-{device}").start()

    def enqueue(self, work, at_once_if_idle=False):
        """Queue `work` after what was enqueued before; with `at_once_if_idle`, run it now when nothing is
        pending (an event recorded on an idle stream is complete when recorded, so query() stays True)."""
        capture = self.capture
        if capture is not None:
            capture.record(self, work)
            return
        with self.cond:
            if self.closed:
                raise CudaError(4, _ERRORS[4])
            if at_once_if_idle and self.completed == self.enqueued:
                return work()
            self.items.append(work)
            self.enqueued += 1
            self.cond.notify_all()

    def _run(self):
        while True:
            with self.cond:
                while not self.items and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                work = self.items[0]
                self.running = True
            try:
                work()
            except BaseException as e:  # kept for the next synchronising call
                with self.driver._lock:
                    self.errors.append((next(_failures), e))
            with self.cond:
                self.running = False
                self.items.popleft()
                self.completed += 1
                self.cond.notify_all()

    def close(self):
        """Run no item after the one running (at interpreter exit); waiters raise instead of waiting."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def refuse_if_capturing(self):
        """Synchronizing or querying a capturing stream invalidates its capture and raises, as in CUDA."""
        capture = self.capture
        if capture is not None:
            raise capture.invalidate(900)

    def idle(self):
        self.refuse_if_capturing()
        with self.cond:
            return self.completed == self.enqueued

    def wait(self):
        self.refuse_if_capturing()
        self.drain()

    def drain(self):
        """Wait for the queued work (not the captured work, which never runs)."""
        with self.cond:
            target = self.enqueued
            while self.completed < target:
                if self.closed:
                    raise CudaError(4, _ERRORS[4])
                self.cond.wait()


class _Mark:
    """One record of an event: set when its stream reaches it, with the time it did. A record in a capture
    keeps the capture and its place there (sim_graphs.Capture.position) until the capture ends."""

    __slots__ = ("done", "time", "stream", "capture", "position")

    def __init__(self, stream):
        self.done = threading.Event()
        self.time = None
        self.stream = stream  # the _Stream it was recorded on: synchronizing the event raises its failures
        self.capture = None
        self.position = None

    def refuse_if_captured(self):
        if self.capture is not None:
            raise capture_error(907)

    def complete(self):
        self.time = time.perf_counter()
        self.done.set()


class _Event:
    __slots__ = ("timing", "mark")

    def __init__(self, timing):
        self.timing, self.mark = timing, None


def _env_int(name, default, least, what):
    """The integer in environment variable `name` (`default` when unset), at least `least`."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < least:
        raise ValueError(f"{name} must be {what} >= {least}, got {text!r}")
    return value


class SimDriver(SimGraphs, SimMemory, SimVmm, Driver):
    name = "sim"
    interprets_kernels = True
    host_waits = True  # a stream is a host thread: it can sleep, or wait for a gate, itself

    def __init__(self, devices=None, memory=None):
        """`devices` and `memory` (bytes per device) default to MINITENSOR_SIM_DEVICES and MINITENSOR_SIM_MEMORY."""
        count = devices or _env_int("MINITENSOR_SIM_DEVICES", 1, 1, "an integer")
        capacity = memory or _env_int("MINITENSOR_SIM_MEMORY", 4 << 30, ALIGNMENT, "an integer number of bytes")
        self._capacity = capacity
        self._count = count
        self._arenas = [None] * count  # mapped on first use
        self._tls = ThreadDevice()
        self._lock = threading.Lock()
        self._default_streams = [None] * count
        self._streams = {}  # handle -> _Stream
        self._events = {}  # handle -> _Event
        self._graphs = {}  # handle of a graph or an executable graph -> its work, in order
        self._next_handle = 0x1000
        self._host = {}  # host_alloc'd address -> mmap
        self._registered = {}  # host_register'd address -> nbytes
        self._reservations = {}  # expandable segments (sim_vmm.py): base address -> Reservation
        atexit.register(self._close_streams)

    def _close_streams(self):
        """At exit: stop every stream, then wait for a kernel still inside Triton's interpreter (a worker in it
        while Python finalises aborts the process). The lock stays taken, so no worker enters it again; another
        simulator's close (a test may make one) finds it taken by this thread and does not wait for it."""
        for device in range(self._count):
            for stream in self._device_streams(device):
                stream.close()
        if not _interpreter_held_at_exit:
            _INTERPRETER_LOCK.acquire()
            _interpreter_held_at_exit.append(True)

    # ------------------------------------------------------------------ devices
    def device_count(self):
        return self._count

    def properties(self, device):
        return DeviceProperties(name="minitensor simulated device", total_memory=self._capacity,
                                multi_processor_count=1, major=9, minor=0, shared_memory_per_block_optin=227 * 1024,
                                uuid=uuid.UUID(bytes=hashlib.md5(f"minitensor-sim-{device}".encode()).digest()))

    def set_device(self, device):
        self._tls.device = device

    def current_device(self):
        return self._tls.device or 0

    def synchronize(self, device):
        streams = self._device_streams(device)
        for stream in streams:
            stream.refuse_if_capturing()
        for stream in streams:
            stream.wait()
        self._raise_error(streams)

    def error_string(self, code):
        return _ERRORS.get(code, "unknown error")

    def _raise_error(self, streams):
        """Raise the first failure kept by these streams, once; the later ones are dropped with it."""
        with self._lock:
            errors = sorted((error for s in streams for error in s.errors), key=lambda item: item[0])
            for s in streams:
                s.errors.clear()
        if errors:
            raise errors[0][1]

    # ------------------------------------------------------------------ memory (device memory: sim_memory.py)
    def host_alloc(self, nbytes):
        m = mmap.mmap(-1, max(nbytes, 1))
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        with self._lock:
            self._host[ptr] = m
        return ptr

    def host_free(self, ptr):
        with self._lock:
            m = self._host.pop(ptr, None)
        if m is None:
            raise CudaError(1, _ERRORS[1])
        # the buffer export that gave us the address must be gone before the mapping can close
        del m

    def host_register(self, ptr, nbytes):
        with self._lock:
            self._registered[ptr] = nbytes

    def host_unregister(self, ptr):
        with self._lock:
            if self._registered.pop(ptr, None) is None:
                raise CudaError(1, _ERRORS[1])

    def _is_pageable(self, ptr):
        if any(arena is not None and arena.contains(ptr) for arena in self._arenas) or self._vmm_range(ptr):
            return False
        with self._lock:
            if ptr in self._host or ptr in self._registered:
                return False
            return not any(base <= ptr < base + len(m) for base, m in self._host.items()) and \
                not any(base <= ptr < base + n for base, n in self._registered.items())

    def memory_range(self, ptr):
        found = self._vmm_range(ptr)
        if found is not None:
            return found
        for device, arena in enumerate(self._arenas):
            if arena is not None and arena.contains(ptr):
                found = arena.allocation(ptr)
                return None if found is None else (device, *found)
        with self._lock:
            host = [(base, len(m)) for base, m in self._host.items()] + list(self._registered.items())
        return next(((None, base, n) for base, n in host if base <= ptr < base + n), None)

    def memcpy_async(self, dst, src, nbytes, stream):
        s = self._stream(stream)
        if self._is_pageable(dst) or self._is_pageable(src):
            # As in CUDA, a copy to or from pageable memory is synchronous: the caller may reuse the
            # buffer as soon as the call returns.
            s.wait()
            self._raise_error([s])
            ctypes.memmove(dst, src, nbytes)
        else:
            s.enqueue(lambda: ctypes.memmove(dst, src, nbytes))

    def can_access_peer(self, device, peer):
        """Simulated devices share the host's memory: each reaches every other one."""
        return device != peer

    def enable_peer_access(self, device, peer):
        pass

    def memcpy_peer_async(self, dst, dst_device, src, src_device, nbytes, stream):
        self._stream(stream).enqueue(lambda: ctypes.memmove(dst, src, nbytes))

    # ------------------------------------------------------------------ streams
    def _default_stream(self, device):
        stream = self._default_streams[device]
        if stream is None:
            with self._lock:
                if self._default_streams[device] is None:
                    self._default_streams[device] = _Stream(self, device)
                stream = self._default_streams[device]
        return stream

    def _stream(self, handle, device=None):
        """The queue behind a handle; 0 is the default stream of `device`, or of the current device."""
        if handle == 0:
            return self._default_stream(self.current_device() if device is None else device)
        try:
            return self._streams[handle]
        except KeyError:
            raise CudaError(400, _ERRORS[400]) from None

    def _device_streams(self, device):
        with self._lock:
            streams = [s for s in self._streams.values() if s.device == device]
            if self._default_streams[device] is not None:
                streams.append(self._default_streams[device])
        return streams

    def _new_handle(self):
        with self._lock:
            self._next_handle += 0x10
            return self._next_handle

    def stream_create(self, device, priority):
        handle = self._new_handle()
        stream = _Stream(self, device)
        with self._lock:
            self._streams[handle] = stream
        return handle

    def stream_query(self, stream):
        return self._stream(stream).idle()

    def stream_synchronize(self, stream):
        s = self._stream(stream)
        s.wait()
        self._raise_error([s])

    def stream_wait_event(self, stream, event):
        """A wait for an event recorded in a capture joins the waiting stream to that capture; a capturing
        stream may wait for no other work."""
        mark, s = self._event(event).mark, self._stream(stream)
        if mark is None:
            return
        capture = mark.capture
        if capture is not None:
            if s.capture is None:
                s.capture = capture
                capture.join(s)
            elif s.capture is not capture:
                raise s.capture.invalidate(902)
            capture.waited(s, mark.position)
        elif s.capture is not None:
            raise s.capture.invalidate(905)
        elif not mark.done.is_set():  # waiting for a completed event is no work: an idle stream stays idle
            s.enqueue(mark.done.wait)

    def enqueue(self, stream, work, interpreted=False):
        """Run `work()` on the stream's worker after everything enqueued before it; with `interpreted`, as
        `interpret`'s kernels run: one at a time, inf and nan computed silently."""
        if interpreted:
            self._stream(stream).enqueue(functools.partial(_run_interpreted, work))
        else:
            self._stream(stream).enqueue(work)

    # ------------------------------------------------------------------ events
    def _event(self, handle):
        try:
            return self._events[handle]
        except KeyError:
            raise CudaError(400, _ERRORS[400]) from None

    def event_create(self, device, enable_timing, blocking):
        handle = self._new_handle()
        with self._lock:
            self._events[handle] = _Event(enable_timing)
        return handle

    def event_destroy(self, event):
        # Without the lock: an Event's __del__ calls this whenever the garbage collector runs, which may be inside
        # a locked section of this very thread (a deadlock on a plain Lock). dict.pop is atomic, and a handle being
        # destroyed is used by no one else.
        self._events.pop(event, None)

    def event_record(self, event, stream):
        e, s = self._event(event), self._stream(stream)
        mark = _Mark(s)
        s.enqueue(mark.complete, at_once_if_idle=True)
        if s.capture is not None:
            mark.capture, mark.position = s.capture, s.capture.position(s)
            s.capture.marks.append(mark)
        e.mark = mark

    def event_query(self, event):
        mark = self._event(event).mark
        if mark is None:
            return True
        mark.refuse_if_captured()
        self.refuse_unsafe_call()
        return mark.done.is_set()

    def event_synchronize(self, event):
        mark = self._event(event).mark
        self.refuse_unsafe_call()
        if mark is not None:
            mark.refuse_if_captured()
            while not mark.done.wait(0.1):
                if mark.stream.closed:
                    raise CudaError(4, _ERRORS[4])
            self._raise_error([mark.stream])

    def event_elapsed_ms(self, start, end):
        a, b = self._event(start), self._event(end)
        if not (a.timing and b.timing):
            raise CudaError(1, _ERRORS[1])
        if a.mark is None or b.mark is None or not (a.mark.done.is_set() and b.mark.done.is_set()):
            raise CudaError(600, _ERRORS[600])
        return (b.mark.time - a.mark.time) * 1000.0

    # ------------------------------------------------------------------ kernels
    def interpret(self, device, kernel, wrappers, constexprs):
        """`kernel` is the interpreted form of a @triton.jit function, `wrappers` turn raw launch arguments into
        what the interpreter takes (both from kernels.compat), `constexprs` are the constexpr values.

        Like loading a module on a GPU (cuModuleLoadData), this first waits for the device to go idle, so that
        a test which first uses a kernel behind a `sleep` sees the same delay on both backends."""
        for s in self._device_streams(device):
            s.drain()
        tail = list(constexprs)

        def launch(gx, gy, gz, stream, *args):
            args = [w(a) for w, a in zip(wrappers, args)] + tail

            run = functools.partial(_run_interpreted, lambda: kernel[(gx, gy, gz)](*args))
            self._stream(stream, device).enqueue(run)  # handle 0: the kernel's device's default stream
        return launch

    # ------------------------------------------------------------------ test helpers
    def sleep(self, stream, ms):
        self._stream(stream).enqueue(lambda: time.sleep(ms / 1000.0))

    def gate_create(self):
        return threading.Event()

    def gate_wait(self, gate, stream):
        self._stream(stream).enqueue(gate.wait)

    def gate_open(self, gate):
        gate.set()
