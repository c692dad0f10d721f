"""MPI itself for the MPI engine: loading mpi4py (at the first MPI group, never at import) and building the
communicator of a group's ranks.

Under `mpiexec -n N`, MPI_COMM_WORLD already holds the ranks. Otherwise each rank is an MPI job of its own (the
launcher, or a user, starts each under `mpiexec -n 1`) and the ranks join through the store: rank 0 opens a
port and publishes its name, then ranks 1, 2, ... connect one at a time while the communicator grown so far
accepts and merges them, and a final split orders the ranks as the store's ranks. MPICH up to 5.0.2 gives
every process started without a process manager (a "singleton") the same identity, so singletons cannot
connect to one another, and separate Open MPI jobs connect only through an ompi-server: both cases are refused
with a message saying how to start the ranks (otherwise MPI_Comm_connect would hang until the timeout).

MPI is initialised with MPI_THREAD_MULTIPLE: a group's calls run on its stream's worker thread.
"""
import os
import re
import threading
import time

from .errors import DistBackendError
from .work import timed_out

_MPI = []  # mpi4py.MPI once loaded
closing = threading.Event()  # set at exit: calls still polling give up, so that MPI can finalise


def mpi():
    """mpi4py's MPI module, initialised with thread level MULTIPLE, or the reason it cannot be."""
    if _MPI:
        return _MPI[0]
    try:
        import mpi4py  # lazy: optional extra
    except ImportError as e:
        raise RuntimeError("Distributed package doesn't have MPI built in: install mpi4py and an MPI "
                           "(pip install 'minitensor[mpi]')") from e
    mpi4py.rc.thread_level = "multiple"  # read when mpi4py.MPI initialises MPI below (if nothing did before)
    from mpi4py import MPI  # lazy: optional extra
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise DistBackendError("MPI was initialised without MPI_THREAD_MULTIPLE, which minitensor's MPI engine "
                               "needs (collectives run on stream threads): set mpi4py.rc.thread_level = "
                               "'multiple' before importing mpi4py.MPI")
    _MPI.append(MPI)
    return MPI


def launched_world():
    """(rank, size) of MPI_COMM_WORLD when mpiexec started more than one rank in it, else None."""
    world = mpi().COMM_WORLD
    return (world.Get_rank(), world.Get_size()) if world.Get_size() > 1 else None


def world_communicator(store, rank, world_size, timeout_s):
    """A new communicator of the `world_size` ranks, rank `rank` in it."""
    MPI = mpi()
    if MPI.COMM_WORLD.Get_size() > 1:
        return MPI.COMM_WORLD.Dup()
    if world_size == 1:
        return MPI.COMM_SELF.Dup()
    if _is_mpich_singleton(MPI):
        raise DistBackendError(
            f"the MPI engine cannot join {world_size} ranks that were not started by an MPI process manager "
            "(MPICH <= 5.0.2 gives such processes one identity, so they cannot connect to each other): start "
            "them with `mpiexec -n N python script.py`, or with `python -m minitensor.distributed.run`, which starts "
            "each rank under `mpiexec -n 1` when mpi4py and MPICH's mpiexec are installed beside the interpreter")
    if MPI.Get_library_version().startswith("Open MPI") and "OMPI_MCA_pmix_server_uri" not in os.environ:
        raise DistBackendError(
            f"the MPI engine cannot join {world_size} ranks started as separate Open MPI jobs: Open MPI connects "
            "separate jobs only through a running ompi-server (OMPI_MCA_pmix_server_uri pointing to it); start "
            "the ranks with one `mpirun -n N python script.py`, or install MPICH's mpi4py and mpiexec (pip "
            "install 'minitensor[mpi]') for `python -m minitensor.distributed.run`")
    return _connect(MPI, store, rank, world_size, timeout_s)


def _is_mpich_singleton(MPI):
    """Whether this process is an MPICH (up to 5.0.2) process that no process manager started."""
    if any(name in os.environ for name in ("PMI_FD", "PMI_PORT", "PMIX_NAMESPACE", "PMIX_RANK")):
        return False
    version = re.match(r"MPICH Version:\s*(\d+)\.(\d+)\.?(\d*)", MPI.Get_library_version())
    return version is not None and tuple(int(part or 0) for part in version.groups()) <= (5, 0, 2)


def _connect(MPI, store, rank, world_size, timeout_s):
    """The ranks' communicator, grown one rank at a time over the port rank 0 publishes in the store."""
    info = MPI.Info.Create()
    info.Set("timeout", str(max(int(timeout_s), 1)))  # MPICH's limit for a connect or an accept
    try:
        if rank == 0:
            port = MPI.Open_port()
            store.set("mpi_port", port)
            comm = MPI.COMM_SELF
        else:
            port = store.get("mpi_port").decode()
            store.get(f"mpi_turn_{rank}")  # the group accepts one rank at a time, in rank order
            comm = _merged(MPI.COMM_SELF.Connect(port, info), high=True)
        for joining in range(rank + 1, world_size):
            if comm.Get_rank() == 0:
                store.set(f"mpi_turn_{joining}", "1")
            grown = _merged(comm.Accept(port, info), high=False)
            if comm != MPI.COMM_SELF:
                comm.Free()
            comm = grown
        if rank == 0:
            MPI.Close_port(port)
        ordered = comm.Split(0, rank)
        comm.Free()
        return ordered
    except MPI.Exception as e:
        raise DistBackendError(f"the MPI engine could not connect rank {rank} to the other {world_size - 1} "
                               f"ranks: {e}") from None
    finally:
        info.Free()


def _merged(intercomm, high):
    """The intracommunicator of both sides of `intercomm`, which is freed."""
    comm = intercomm.Merge(high=high)
    intercomm.Free()
    return comm


def finish(request, what, timeout_s, rank, size):
    """Polls a nonblocking MPI call until it completes; DistBackendError when MPI reports an error or when it
    is not done after `timeout_s` seconds (a rank that never joins, or died, looks the same)."""
    MPI = mpi()
    deadline = time.monotonic() + timeout_s
    pause = 0.0
    try:
        while not request.Test():
            if closing.is_set():
                raise DistBackendError(f"{what} on rank {rank} was abandoned: the process is exiting")
            if time.monotonic() > deadline:
                raise timed_out(what, timeout_s, rank, size)
            time.sleep(pause)
            pause = min(2 * pause or 1e-5, 1e-3)
    except MPI.Exception as e:
        raise DistBackendError(f"MPI {what} failed on rank {rank}: {e}") from None


def split(parent, ranks, rank, timeout_s):
    """The communicator of the world ranks `ranks` (sorted), split from `parent`, a communicator of every rank;
    every rank calls it (first meeting in a barrier that times out, as the split cannot), those outside `ranks`
    get None."""
    MPI = mpi()
    finish(parent.Ibarrier(), "new_group", timeout_s, rank, parent.Get_size())
    member = rank in ranks
    comm = parent.Split(0 if member else MPI.UNDEFINED, ranks.index(rank) if member else 0)
    return comm if member else None
