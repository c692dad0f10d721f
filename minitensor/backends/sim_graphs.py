"""Stream capture on the simulated device (backends/sim.py): CUDA's rules, with a graph as a list of work.

While a stream captures, the work enqueued on it is appended to its capture instead of its queue, and so is
the work of every stream that joined (by waiting for an event recorded in the capture). The host enqueues in
an order every dependency already respects (an event is waited for only after it was recorded), so replaying
the list in that order on one stream is a valid run of the graph CUDA would build. A call CUDA refuses while a
stream captures (synchronizing or querying it, an event recorded in it, waiting for uncaptured work) raises
CUDA's error and invalidates the capture, as on a GPU: its end then raises too.
"""
import threading

from ..base.errors import CudaError

ERRORS = {
    401: "the operation cannot be performed in the present state",
    900: "operation not permitted when stream is capturing",
    901: "operation failed due to a previous error during capture",
    902: "operation would result in a merge of separate capture sequences",
    903: "the capture was not initiated in this stream",
    904: "capture sequence contains a fork that was not joined to the primary stream",
    905: "dependency created on uncaptured work in another stream",
    907: "operation not permitted on an event last recorded in a capturing stream",
    908: "attempt to terminate a thread-local capture sequence from another thread",
}


def capture_error(code):
    return CudaError(code, ERRORS[code])


class Capture:
    """One capture sequence: its origin stream, the streams that joined it, and the work recorded so far.

    `counts[s]` is how many items stream s recorded; `rejoined[s] = (t, n)` says stream t waited for s's
    event recorded after s's n-th item. A joined stream is rejoined when such waits lead from its last item
    to the origin stream.
    """

    def __init__(self, origin, mode):
        self.origin = origin
        self.mode = mode
        self.thread = threading.get_ident()
        self.lock = threading.Lock()
        self.items = []
        self.counts = {origin: 0}
        self.rejoined = {}
        self.marks = []  # the event records in the capture (sim.py's _Mark)
        self.invalid = False

    def record(self, stream, work):
        with self.lock:
            if self.invalid:
                raise capture_error(901)
            self.items.append(work)
            self.counts[stream] += 1

    def invalidate(self, code):
        """A refused call: the capture is invalid from now on, and the call raises CUDA's error."""
        self.invalid = True
        return capture_error(code)

    def join(self, stream):
        with self.lock:
            self.counts.setdefault(stream, 0)

    def position(self, stream):
        """What an event recorded on `stream` now marks: (stream, items it recorded so far)."""
        with self.lock:
            return stream, self.counts[stream]

    def waited(self, waiter, position):
        stream, n = position
        if stream is not waiter:
            with self.lock:
                self.rejoined[stream] = (waiter, n)

    def unjoined(self):
        """The joined streams with work after their last wait by a stream that leads to the origin."""
        resolved = {self.origin}
        changed = True
        while changed:
            changed = False
            for stream, (waiter, n) in self.rejoined.items():
                if stream not in resolved and waiter in resolved and n == self.counts[stream]:
                    resolved.add(stream)
                    changed = True
        return [stream for stream in self.counts if stream not in resolved]


class SimGraphs:
    """SimDriver's capture and graph calls (a mixin: they share its streams, handles and lock). State, set by
    the driver: `_graphs`, handle of a graph or of an executable graph -> its work, in order."""

    _strict_captures = ()  # the captures underway in "global" or "thread_local" mode

    def stream_begin_capture(self, stream, mode):
        if stream == 0:
            raise capture_error(900)
        s = self._stream(stream)
        if s.capture is not None:
            raise capture_error(401)
        s.capture = Capture(s, mode)
        if mode != "relaxed":
            with self._lock:
                self._strict_captures += (s.capture,)

    def refuse_unsafe_call(self):
        """An event query or synchronisation while a capture is underway in "global" mode (any thread) or
        "thread_local" mode (this thread) invalidates it and fails, as CUDA's "potentially unsafe" calls do."""
        for capture in self._strict_captures:
            if capture.mode == "global" or capture.thread == threading.get_ident():
                raise capture.invalidate(900)

    def stream_end_capture(self, stream):
        s = self._stream(stream)
        capture = s.capture
        if capture is None:
            raise capture_error(401)
        if capture.origin is not s:
            raise capture.invalidate(903)
        if capture.mode != "relaxed" and capture.thread != threading.get_ident():
            raise capture_error(908)
        with self._lock:
            self._strict_captures = tuple(c for c in self._strict_captures if c is not capture)
        for joined in capture.counts:
            joined.capture = None
        for mark in capture.marks:  # what waits for them from now on waits for nothing
            mark.capture = None
            mark.complete()
        if capture.invalid:
            raise capture_error(901)
        if capture.unjoined():
            raise capture_error(904)
        handle = self._new_handle()
        with self._lock:
            self._graphs[handle] = tuple(capture.items)
        return handle

    def graph_node_count(self, graph):
        return len(self._graph(graph))

    def graph_instantiate(self, graph):
        handle = self._new_handle()
        items = self._graph(graph)
        with self._lock:
            self._graphs[handle] = items
        return handle

    def graph_destroy(self, graph):
        self._graph(graph)
        with self._lock:
            del self._graphs[graph]

    graph_exec_destroy = graph_destroy

    def graph_launch(self, graph_exec, stream):
        s = self._stream(stream)
        for work in self._graph(graph_exec):
            s.enqueue(work)

    def _graph(self, handle):
        try:
            return self._graphs[handle]
        except KeyError:
            raise CudaError(400, "invalid resource handle") from None
