"""`Work`, what a collective called with `async_op=True` returns (torch.distributed.Work).

The op runs on its group's side stream; `wait()` makes the current stream wait for it (the host does not
block) and then drops the tensors the op used, which the Work kept alive until then (torch's rule since it
stopped using record_stream). How the waiting is done is the engine's: each gives the Work a completion with
`stream_wait(device)`, `query()`, `host_wait(seconds)` and `error()`.
"""
import datetime

from .errors import DistBackendError
from .store import MAX_TIMEOUT_S


class Work:
    """A collective in flight. `wait()` returns True once the current stream is ordered after the op."""

    __slots__ = ("_completion", "_device", "_keep", "_then")

    def __init__(self, completion, device, keep=(), then=None):
        self._completion = completion
        self._device = device  # the index of the device whose current stream waits
        self._keep = keep  # tensors the op reads or writes: alive until wait()
        self._then = then  # what wait() does after the stream waits (e.g. copies out of a gathered buffer)

    def wait(self, timeout=None):
        """Makes the current stream wait for the op; with `timeout` (a timedelta) the host also waits for it,
        raising DistBackendError when it has not finished by then. A failed op raises here."""
        if timeout is not None:
            if not isinstance(timeout, datetime.timedelta):
                raise TypeError(f"wait(): timeout must be a datetime.timedelta, got {type(timeout).__name__}")
            self._completion.host_wait(min(timeout.total_seconds(), MAX_TIMEOUT_S))
        self._completion.stream_wait(self._device)
        then, self._then, self._keep = self._then, None, ()
        if then is not None:
            then()
        return True

    def _chain(self, then):
        """Have wait() call `then()` once the current stream waits for the op, after what it calls already
        (a collective's copies out of its own buffer come after the engine's)."""
        earlier = self._then
        if earlier is None:
            self._then = then
            return

        def both():
            earlier()
            then()
        self._then = both

    def is_completed(self):
        """Whether the op has finished (successfully or not), without waiting."""
        return self._completion.query()

    def is_success(self):
        """Whether the op has finished without an error."""
        return self._completion.query() and self._completion.error() is None

    def exception(self):
        """The error the op failed with, or None."""
        return self._completion.error()

    def synchronize(self):
        """The host waits until the op has finished (torch's Work.synchronize)."""
        self._completion.host_wait(None)

    def __repr__(self):
        return f"<minitensor.distributed.Work completed={self.is_completed()}>"


class Finished:
    """The completion of an op that ran to its end before the call returned (the MPI engine's host staging)."""

    @staticmethod
    def stream_wait(device):
        pass

    @staticmethod
    def query():
        return True

    @staticmethod
    def host_wait(timeout_s):
        pass

    @staticmethod
    def error():
        return None


def timed_out(what, timeout_s, rank, size):
    """The error for a collective that did not finish in time, as every engine words it."""
    return DistBackendError(f"{what} on rank {rank} of a group of {size} timed out after {timeout_s:g} s: a rank "
                            "did not take part (it skipped the call, failed or died)")
