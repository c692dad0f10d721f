"""The NCCL engine: a group's collectives over an NCCL communicator (nccl4py), on real GPUs.

nccl4py's Communicator methods resolve each buffer through DLPack or the CUDA array interface on every call;
this engine passes raw pointers, counts and type codes to nccl4py's binding layer (`nccl.bindings.nccl`)
instead, with the stream always named: a synchronous op runs on the current minitensor stream (nccl4py's
default would be the legacy stream), an async op on the group's side stream after an event from the current
one. Ops that only move bytes (broadcast, all_gather, send, recv) move them as uint8, so every dtype travels;
reductions take NCCL's types (bool as uint8 with SUM as max and PRODUCT as min, torch's rule; complex as pairs
of its float type, for SUM and AVG).

The communicator is created nonblocking, so that its creation can be polled and abandoned after the group's
timeout; once every rank has joined, it is split into the blocking communicator the collectives use. NCCL's
state is checked after every call.
"""
import datetime
import time

from ..backends import active_driver
from ..base import dtypes
from ..creation import zeros
from ..cuda import streams
from ..cuda.devices import device as device_context
from .errors import DistBackendError
from .reduce_op import RedOpType
from .work import Work, timed_out

_MODULES = []  # (nccl.core, nccl.bindings.nccl) once imported
_REDUCED_TYPES = {dtypes.bool_: ("Uint8", 1), dtypes.uint8: ("Uint8", 1), dtypes.int8: ("Int8", 1),
                  dtypes.int32: ("Int32", 1), dtypes.int64: ("Int64", 1), dtypes.uint32: ("Uint32", 1),
                  dtypes.uint64: ("Uint64", 1), dtypes.float16: ("Float16", 1), dtypes.bfloat16: ("Bfloat16", 1),
                  dtypes.float32: ("Float32", 1), dtypes.float64: ("Float64", 1), dtypes.complex64: ("Float32", 2),
                  dtypes.complex128: ("Float64", 2)}
_OPS = {RedOpType.SUM: "Sum", RedOpType.AVG: "Avg", RedOpType.PRODUCT: "Prod", RedOpType.MIN: "Min",
        RedOpType.MAX: "Max"}
_BOOL_OPS = {RedOpType.SUM: "Max", RedOpType.PRODUCT: "Min"}
_SUCCESS, _IN_PROGRESS = 0, 7  # ncclSuccess, ncclInProgress
_SPIN_S = 2e-3  # how long _settle polls before it sleeps between polls
_idle_streams = {}  # device -> side-stream handles of destroyed groups, for the next group


def nccl():
    """(nccl.core, nccl.bindings.nccl), imported at the first NCCL group."""
    if not _MODULES:
        try:
            import nccl.core as core  # lazy: optional extra
            from nccl.bindings import nccl as bindings  # lazy: optional extra
        except ImportError as e:
            raise RuntimeError("Distributed package doesn't have NCCL built in: install nccl4py "
                               "(pip install 'minitensor[nccl]')") from e
        _MODULES.extend((core, bindings))
    return _MODULES


def create(store, rank, size, device, timeout_s):
    """The engine of one group: rank 0's unique id goes through `store`, then every rank joins the
    communicator on `device`, DistBackendError when not all have after `timeout_s` seconds."""
    core, bindings = nccl()
    if rank == 0:
        store.set("nccl_unique_id", bytes(core.get_unique_id()))
    store.wait(["nccl_unique_id"], datetime.timedelta(seconds=timeout_s))
    unique_id = core.UniqueId.from_bytes(store.get("nccl_unique_id"))
    with device_context(device):
        joining = core.Communicator.init(size, rank, unique_id, core.NCCLConfig(blocking=False))
        try:
            _settle(joining, bindings, "NCCL communicator init", timeout_s, rank, size)
        except DistBackendError:
            joining.abort()
            raise
        # every rank has joined: the collectives go to a blocking copy, whose calls return once enqueued (a
        # nonblocking communicator reports each in progress for tens of microseconds, to be polled)
        communicator = joining.split(0, rank, core.NCCLConfig(blocking=True))
        _settle(joining, bindings, "NCCL communicator split", timeout_s, rank, size)
        joining.finalize()
        _settle(joining, bindings, "NCCL communicator finalize", timeout_s, rank, size)
        joining.destroy()
    return NcclEngine(communicator, bindings, rank, size, device, timeout_s)


def _settle(communicator, bindings, what, timeout_s, rank, size):
    """Waits while NCCL's state is "in progress"; DistBackendError for an error or after `timeout_s` seconds.
    It spins first, then sleeps between polls: a step of a nonblocking communicator is often in progress for only
    microseconds, and one sleep of the thread costs a hundred or more."""
    began = time.monotonic()
    while (result := int(communicator.get_async_error())) == _IN_PROGRESS:
        waited = time.monotonic() - began
        if waited > timeout_s:
            raise timed_out(what, timeout_s, rank, size)
        if waited > _SPIN_S:
            time.sleep(1e-4)
    if result != _SUCCESS:
        raise DistBackendError(f"{what} failed on rank {rank}: {bindings.get_error_string(result)} "
                               f"({communicator.get_last_error()})")


def _reduction(bindings, dtype, op):
    """(NCCL type, elements per element, NCCL op) reducing `dtype` with `op`, or torch's error."""
    if op not in _OPS:
        raise ValueError(f"Cannot use ReduceOp.{op.name} with NCCL")
    if dtype not in _REDUCED_TYPES:
        raise TypeError(f"Input tensor data type is not supported for NCCL process group: "
                        f"{dtypes.TORCH_NAMES[dtype.name]}")
    kind, factor = _REDUCED_TYPES[dtype]
    name = _BOOL_OPS.get(op, _OPS[op]) if dtype is dtypes.bool_ else _OPS[op]
    return int(bindings.DataType[kind]), factor, int(bindings.RedOp[name])


class NcclEngine:
    """One group's NCCL communicator and the streams its calls run on."""

    name = "nccl"

    def __init__(self, communicator, bindings, rank, size, device, timeout_s):
        self._communicator = communicator
        self._b = bindings
        self._comm = bindings.Comm(communicator.ptr)  # what the binding functions take
        self._bytes = int(bindings.DataType.Uint8)
        self.rank, self.size, self.device, self.timeout_s = rank, size, device, timeout_s
        self.failure = None
        self._reductions = {}  # (dtype, op) -> _reduction()
        self._side = None  # the side stream of async ops, made at the first
        self._flag = None  # barrier's one-element tensor

    def _reduced(self, dtype, op):
        found = self._reductions.get((dtype, op))
        if found is None:
            found = self._reductions[dtype, op] = _reduction(self._b, dtype, op)
        return found

    def _run(self, name, function, arguments, keep, async_op):
        """`function(*arguments, comm, stream)` on the current stream, or for `async_op` on the side stream
        after the current one, returning a Work."""
        if not async_op:
            function(*arguments, self._comm, streams.current_stream_handle(self.device))
            if self._b.comm_get_async_error(self._comm) != _SUCCESS:
                self._check(name)
            return None
        side = self._side_stream()
        side.wait_stream(streams.current_stream(self.device))
        function(*arguments, self._comm, side.cuda_stream)
        self._check(name)
        done = streams.Event()
        done.record(side)
        return Work(_EventCompletion(done, self), self.device, keep)

    def _check(self, what):
        if self.failure is not None:
            raise self.failure
        try:
            _settle(self._communicator, self._b, what, self.timeout_s, self.rank, self.size)
        except DistBackendError as e:
            self.failure = e
            raise

    def all_reduce(self, tensor, op, async_op):
        kind, factor, nccl_op = self._reduced(tensor.dtype, op)
        ptr = tensor.data_ptr()
        return self._run("all_reduce", self._b.all_reduce, (ptr, ptr, tensor.numel() * factor, kind, nccl_op),
                         (tensor,), async_op)

    def reduce(self, tensor, op, root, async_op):
        kind, factor, nccl_op = self._reduced(tensor.dtype, op)
        ptr = tensor.data_ptr()
        return self._run("reduce", self._b.reduce, (ptr, ptr, tensor.numel() * factor, kind, nccl_op, root),
                         (tensor,), async_op)

    def broadcast(self, tensor, root, async_op):
        ptr = tensor.data_ptr()
        return self._run("broadcast", self._b.broadcast, (ptr, ptr, tensor.nbytes, self._bytes, root), (tensor,),
                         async_op)

    def all_gather(self, output, tensor, async_op):
        return self._run("all_gather", self._b.all_gather,
                         (tensor.data_ptr(), output.data_ptr(), tensor.nbytes, self._bytes), (output, tensor),
                         async_op)

    def reduce_scatter(self, output, tensor, op, async_op):
        kind, factor, nccl_op = self._reduced(tensor.dtype, op)
        return self._run("reduce_scatter", self._b.reduce_scatter,
                         (tensor.data_ptr(), output.data_ptr(), output.numel() * factor, kind, nccl_op),
                         (output, tensor), async_op)

    def send(self, tensor, peer, tag, async_op):
        return self._run("send", self._b.send, (tensor.data_ptr(), tensor.nbytes, self._bytes, peer), (tensor,),
                         async_op)

    def recv(self, tensor, peer, tag, async_op):
        return self._run("recv", self._b.recv, (tensor.data_ptr(), tensor.nbytes, self._bytes, peer), (tensor,),
                         async_op)

    def barrier(self, async_op):
        """A one-element all_reduce; unless `async_op`, the host then waits for the current stream to pass it
        (DistBackendError after the group's timeout)."""
        if self._flag is None:
            self._flag = zeros(1, dtype=dtypes.int32, device=f"cuda:{self.device}")
        work = self.all_reduce(self._flag, RedOpType.SUM, async_op)
        if async_op:
            return work
        current = streams.current_stream(self.device)
        deadline = time.monotonic() + self.timeout_s
        while not current.query():
            if time.monotonic() > deadline:
                self.failure = timed_out("barrier", self.timeout_s, self.rank, self.size)
                raise self.failure
            time.sleep(1e-4)
        return None

    def _side_stream(self):
        if self._side is None:
            idle = _idle_streams.get(self.device)
            handle = idle.pop() if idle else active_driver().stream_create(self.device, 0)
            self._side = streams.ExternalStream(handle, self.device)
        return self._side

    def destroy(self):
        """Ends the communicator: finalised (every rank's pending calls flushed) and destroyed, or aborted when
        the group has failed or finalising does not finish within the timeout."""
        communicator, self._communicator = self._communicator, None
        if communicator is None:
            return
        if self._side is not None:
            _idle_streams.setdefault(self.device, []).append(self._side.cuda_stream)
        with device_context(self.device):
            if self.failure is None:
                try:
                    communicator.finalize()
                    _settle(communicator, self._b, "NCCL communicator finalize", self.timeout_s, self.rank,
                            self.size)
                except DistBackendError as e:
                    self.failure = e
            if self.failure is None:
                communicator.destroy()
            else:
                communicator.abort()


class _EventCompletion:
    """An async op's completion: an event recorded on the side stream after it."""

    __slots__ = ("_event", "_engine")

    def __init__(self, event, engine):
        self._event, self._engine = event, engine

    def stream_wait(self, device):
        streams.current_stream(device).wait_event(self._event)

    def query(self):
        return self._event.query()

    def host_wait(self, timeout_s):
        engine = self._engine
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._event.query():
            if deadline is not None and time.monotonic() > deadline:
                raise timed_out("Work.wait()", timeout_s, engine.rank, engine.size)
            time.sleep(1e-4)
        if engine.failure is not None:
            raise engine.failure

    def error(self):
        return self._engine.failure
