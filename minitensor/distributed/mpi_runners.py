"""Where the MPI engine's calls run, and how the current stream waits for them.

On the simulator (`StreamRunner`) a device address is a host address: MPI reads and writes the tensors in place
through numpy views, on the group's own stream, after the work the current stream had queued. A collective
runs to its end there; a send or recv is only posted there (in program order) and finished by whoever waits
for it, so that an isend and an irecv between two ranks are both posted before either is waited for. The
current stream waits by running a waiter that finishes the call and raises its error, so the error surfaces
at the current stream's next synchronising call (t.cpu(), synchronize()). The host never blocks.

On a real GPU (`HostRunner`: its driver runs no host work on streams) the calls run on the calling thread
through host copies of the tensors: copy in, MPI, copy out.
"""
import contextlib
import ctypes
import threading

import numpy as np

from ..cuda import streams, transfer
from ..cuda.devices import device as device_context
from .errors import DistBackendError
from .mpi_world import finish, mpi
from .work import Finished, Work, timed_out

IN, OUT, INOUT = "in", "out", "inout"  # what a call does with a tensor: the host staging copies accordingly
_idle_streams = {}  # device -> stream handles of destroyed groups, for the next group
_active = [0]  # MPI calls running now, on any thread: the exit waits for them to give up
_active_changed = threading.Condition()


@contextlib.contextmanager
def calling():
    """Counts an MPI call in progress for `wait_for_calls`."""
    with _active_changed:
        _active[0] += 1
    try:
        yield
    finally:
        with _active_changed:
            _active[0] -= 1
            _active_changed.notify_all()


def wait_for_calls(timeout_s):
    with _active_changed:
        _active_changed.wait_for(lambda: _active[0] == 0, timeout_s)


def _fail(engine, error):
    """The DistBackendError for `error`, which makes the group unusable."""
    if not isinstance(error, DistBackendError):
        error = DistBackendError(f"MPI call failed: {error!r}")
    if engine.failure is None:
        engine.failure = error
    return error


def _bytes_at(ptr, nbytes):
    """A writable numpy uint8 view of `nbytes` at host address `ptr` (a simulated device address is one)."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(ptr), np.uint8)



def _completion_error(engine, what, request):
    """Completes `request` within the group's timeout: None, or the error that has failed the group."""
    try:
        with calling():
            finish(request, what, engine.timeout_s, engine.rank, engine.size)
    except Exception as e:
        return _fail(engine, e)
    return None

class StreamRunner:
    """Runs a group's calls on its own stream of the simulated device, on the tensors' memory in place."""

    def __init__(self, engine, driver):
        self.engine, self.driver = engine, driver
        idle = _idle_streams.get(engine.device)
        handle = idle.pop() if idle else driver.stream_create(engine.device, 0)
        self.stream = streams.ExternalStream(handle, engine.device)

    def submit(self, what, call, buffers, async_op):
        device = self.engine.device
        views = [_bytes_at(t.data_ptr(), t.nbytes) for t, _ in buffers]
        completion = _Completion(self.engine, self.driver, what)
        self.stream.wait_stream(streams.current_stream(device))
        self.driver.enqueue(self.stream.cuda_stream, lambda: completion.run(call, views))
        if async_op:
            return Work(completion, device, tuple(t for t, _ in buffers))
        completion.stream_wait(device)
        return None

    def close(self):
        self.stream.synchronize()
        _idle_streams.setdefault(self.engine.device, []).append(self.stream.cuda_stream)


class _Completion:
    """One call on a group's stream: it has run, and its request (a send's or recv's), if any, is complete
    once `_request` is None again. Its error is kept for the waiters and the group, not raised on the group's
    stream, whose errors nobody waits for."""

    __slots__ = ("_engine", "_driver", "_what", "_ran", "_request", "_lock", "_error")

    def __init__(self, engine, driver, what):
        self._engine, self._driver, self._what = engine, driver, what
        self._ran = threading.Event()
        self._request = None
        self._lock = threading.Lock()  # one thread at a time tests the request
        self._error = None

    def run(self, call, views):
        try:
            with calling():
                self._request = call(*views)
        except Exception as e:
            self._error = _fail(self._engine, e)
        finally:
            self._ran.set()

    def _finish(self):
        """Waits for the call to have run and its request to complete (the group's timeout at the most)."""
        self._ran.wait()
        with self._lock:
            request, self._request = self._request, None
            if request is not None:
                self._error = _completion_error(self._engine, self._what, request) or self._error

    def stream_wait(self, device):
        """The current stream of `device` finishes the call before its later work, and raises its error at its
        next synchronising call."""
        if self._error is not None:
            raise self._error
        with device_context(device):
            self._driver.enqueue(streams.current_stream(device).cuda_stream, self._finish_and_raise)

    def _finish_and_raise(self):
        self._finish()
        if self._error is not None:
            raise self._error

    def query(self):
        if not self._ran.is_set() or not self._lock.acquire(blocking=False):
            return False
        try:
            if self._request is not None and self._request.Test():
                self._request = None
        except mpi().Exception as e:
            self._request, self._error = None, _fail(self._engine, e)
        finally:
            self._lock.release()
        return self._request is None

    def host_wait(self, timeout_s):
        if not self._ran.wait(timeout_s):
            raise timed_out(f"waiting for {self._what}", timeout_s, self._engine.rank, self._engine.size)
        self._finish_and_raise()

    def error(self):
        return self._error


class HostRunner:
    """Runs a group's calls on the calling thread through host copies of the tensors (a real GPU)."""

    def __init__(self, engine):
        self.engine = engine

    def submit(self, what, call, buffers, async_op):
        device = self.engine.device
        staged = [np.empty(t.nbytes, np.uint8) for t, _ in buffers]
        for (t, role), host in zip(buffers, staged):
            if role != OUT and t.nbytes:
                transfer.copy_bytes(host.ctypes.data, None, t.data_ptr(), device, t.nbytes)

        def copy_out():
            for (t, role), host in zip(buffers, staged):
                if role != IN and t.nbytes:
                    transfer.copy_bytes(t.data_ptr(), device, host.ctypes.data, None, t.nbytes)
        try:
            with calling():
                request = call(*staged)
        except Exception as e:
            raise _fail(self.engine, e) from e
        completion = Finished if request is None else _HostRequest(self.engine, what, request)
        if async_op:
            return Work(completion, device, tuple(t for t, _ in buffers), copy_out)
        completion.host_wait(None)
        copy_out()
        return None

    def close(self):
        pass


class _HostRequest:
    """A send or recv posted from the host: finished by the host when waited for."""

    __slots__ = ("_engine", "_what", "_request", "_error")

    def __init__(self, engine, what, request):
        self._engine, self._what, self._request, self._error = engine, what, request, None

    def host_wait(self, timeout_s):
        request, self._request = self._request, None
        if request is not None:
            self._error = _completion_error(self._engine, self._what, request) or self._error
        if self._error is not None:
            raise self._error

    def stream_wait(self, device):
        self.host_wait(None)

    def query(self):
        return self._request is None or bool(self._request.Test())

    def error(self):
        return self._error
