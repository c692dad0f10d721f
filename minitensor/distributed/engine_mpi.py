"""The MPI engine: a group's collectives over an MPI communicator, for machines without NCCL (the simulator).

Each call is the nonblocking MPI form, polled until the group's timeout (mpi_world.finish), so a rank that
skips a call, fails or dies makes the others raise DistBackendError instead of hanging; the group is unusable
after that, as torch's is. Where the calls run and how the current stream waits for them is mpi_runners.py:
in place on the group's own stream on the simulator, through host copies on a real GPU.
"""
import atexit
import itertools
import weakref

from ..backends import Driver, active_driver
from ..cuda.graphs import is_current_stream_capturing
from . import mpi_types
from .errors import DistBackendError
from .mpi_runners import IN, INOUT, OUT, HostRunner, StreamRunner, wait_for_calls
from .mpi_world import closing, finish, mpi
from .reduce_op import RedOpType

_engines = weakref.WeakSet()  # live engines: their communicators are freed at exit


class MpiEngine:
    """One group's communicator, rank and size, and where its calls run."""

    name = "mpi"

    def __init__(self, comm, device, timeout_s):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.device = device
        self.timeout_s = timeout_s
        self.failure = None  # the first error a call of the group raised: the group is unusable after it
        self._numbers = itertools.count(1)
        driver = active_driver()
        on_stream = type(driver).enqueue is not Driver.enqueue
        self._runner = StreamRunner(self, driver) if on_stream else HostRunner(self)
        _engines.add(self)

    def _submit(self, name, call, buffers, async_op):
        if is_current_stream_capturing():
            raise RuntimeError(f"{name}: MPI collectives cannot be captured in a CUDA graph (NCCL's can)")
        if self.failure is not None:
            raise DistBackendError(f"{name}: the group cannot be used after an earlier collective failed "
                                   f"({self.failure})")
        what = f"{name} #{next(self._numbers)}"
        return self._runner.submit(what, lambda *views: call(what, *views), buffers, async_op)

    def _wait(self, request, what):
        finish(request, what, self.timeout_s, self.rank, self.size)

    def all_reduce(self, tensor, op, async_op):
        MPI, dtype = mpi(), tensor.dtype
        reduction = mpi_types.reduction(dtype, op)

        def call(what, raw):
            view = raw.view(mpi_types.view_dtype(dtype))
            self._wait(self.comm.Iallreduce(MPI.IN_PLACE, [view, mpi_types.datatype(dtype)], reduction), what)
            if op is RedOpType.AVG:
                mpi_types.divide(view, dtype, self.size)
        return self._submit("all_reduce", call, [(tensor, INOUT)], async_op)

    def reduce(self, tensor, op, root, async_op):
        MPI, dtype, is_root = mpi(), tensor.dtype, self.rank == root
        reduction = mpi_types.reduction(dtype, op)

        def call(what, raw):
            typed = [raw.view(mpi_types.view_dtype(dtype)), mpi_types.datatype(dtype)]
            request = self.comm.Ireduce(MPI.IN_PLACE if is_root else typed, typed if is_root else None,
                                        reduction, root)
            self._wait(request, what)
            if is_root and op is RedOpType.AVG:
                mpi_types.divide(typed[0], dtype, self.size)
        return self._submit("reduce", call, [(tensor, INOUT if is_root else IN)], async_op)

    def broadcast(self, tensor, root, async_op):
        def call(what, raw):
            self._wait(self.comm.Ibcast([raw, mpi().BYTE], root), what)
        return self._submit("broadcast", call, [(tensor, IN if self.rank == root else OUT)], async_op)

    def all_gather(self, output, tensor, async_op):
        in_place = tensor.data_ptr() == output.data_ptr() + self.rank * tensor.nbytes  # torch allows it; MPI
        # needs it said

        def call(what, gathered, raw):
            MPI = mpi()
            self._wait(self.comm.Iallgather(MPI.IN_PLACE if in_place else [raw, MPI.BYTE], [gathered, MPI.BYTE]),
                       what)
        return self._submit("all_gather", call, [(output, INOUT if in_place else OUT), (tensor, IN)], async_op)

    def reduce_scatter(self, output, tensor, op, async_op):
        dtype = tensor.dtype
        reduction = mpi_types.reduction(dtype, op)

        def call(what, raw_out, raw_in):
            kind, datatype = mpi_types.view_dtype(dtype), mpi_types.datatype(dtype)
            out = raw_out.view(kind)
            self._wait(self.comm.Ireduce_scatter_block([raw_in.view(kind), datatype], [out, datatype], reduction),
                       what)
            if op is RedOpType.AVG:
                mpi_types.divide(out, dtype, self.size)
        return self._submit("reduce_scatter", call, [(output, OUT), (tensor, IN)], async_op)

    # point-to-point calls are only posted in order on the group's stream and finished by whoever waits for
    # them, so that an isend and an irecv between two ranks are both posted before either is waited for
    def send(self, tensor, peer, tag, async_op):
        def call(what, raw):
            return self.comm.Isend([raw, mpi().BYTE], peer, tag)
        return self._submit("send", call, [(tensor, IN)], async_op)

    def recv(self, tensor, peer, tag, async_op):
        def call(what, raw):
            return self.comm.Irecv([raw, mpi().BYTE], peer, tag)
        return self._submit("recv", call, [(tensor, OUT)], async_op)

    def barrier(self, async_op):
        """Every rank's earlier calls of the group are done; the host waits unless `async_op`."""
        def call(what):
            self._wait(self.comm.Ibarrier(), what)
        work = self._submit("barrier", call, [], True)
        if async_op:
            return work
        work.synchronize()
        work.wait()
        return None

    def destroy(self):
        """Waits for the group's calls to end (each ends by its timeout at the latest), frees the communicator."""
        self._runner.close()
        if self.comm is not None:
            self.comm.Free()
            self.comm = None
        _engines.discard(self)


@atexit.register
def _close_all():
    """Before MPI finalises: calls still polling give up, and every live group's communicator is freed."""
    closing.set()
    wait_for_calls(1.0)
    for engine in list(_engines):
        if engine.comm is not None:
            engine.comm.Free()
            engine.comm = None
