"""Process groups, as torch.distributed has them: the default group that `init_process_group` makes, the groups
`new_group` makes from some of its ranks, and what names them (rank, size, backend).

Each group holds an engine (engine_nccl.py on GPUs, engine_mpi.py elsewhere) on one device, the device the
process chose at init. `backend=None` picks NCCL when minitensor's cuda device is a real GPU and MPI when it is
the simulator. Under `mpiexec -n N` the MPI engine takes its ranks from MPI itself (as torch's MPI backend
does); otherwise every backend meets through the init method's store.
"""
import datetime
import importlib.util
import os
import warnings

from ..backends import active_driver
from ..cuda import devices
from . import engine_mpi, engine_nccl, mpi_world
from .rendezvous import rendezvous
from .store import PrefixStore, check_timeout, timeout_seconds

DEFAULT_TIMEOUT = datetime.timedelta(minutes=10)
NOT_INITIALIZED = "Default process group has not been initialized, please make sure to call init_process_group."
_TORCH_ONLY_BACKENDS = ("gloo", "ucc", "xccl", "hccl", "cncl")


class ProcessGroup:
    """Ranks that run collectives together. A process outside the group holds one too (`rank()` -1), on
    which collectives do nothing, as torch's NON_GROUP_MEMBER."""

    def __init__(self, ranks, rank, engine, backend, device, name, timeout):
        self._ranks = ranks  # the world ranks of the members, in group-rank order
        self._rank = rank  # this process's group rank, -1 outside the group
        self._engine = engine  # None outside the group, and once destroyed
        self._backend = backend
        self._device = device  # the index of the cuda device its tensors must be on
        self._timeout = timeout
        self.group_name = name

    def rank(self):
        return self._rank

    def size(self):
        return len(self._ranks) if self._rank >= 0 else -1

    def __repr__(self):
        return f"<minitensor.distributed.ProcessGroup {self.group_name!r} {self._backend} ranks={self._ranks}>"


class group:
    """torch's `group.WORLD`: the default group while there is one."""

    WORLD = None


GroupMember = group


class _World:
    """The process's groups: the default one first, the store they meet through, and for MPI the communicator
    of every rank that new groups split from."""

    def __init__(self):
        self.groups = []
        self.store = None
        self.mpi_parent = None
        self.inits = 0  # default groups made so far: each uses fresh store keys
        self.made = 0  # groups new_group made since: each names its store keys


_world = _World()


def is_available():
    return True


def is_mpi_available():
    return importlib.util.find_spec("mpi4py") is not None


def is_nccl_available():
    return importlib.util.find_spec("nccl") is not None and importlib.util.find_spec("nccl.core") is not None


def is_initialized():
    return bool(_world.groups)


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None,
                       group_name="", pg_options=None, device_id=None):
    """Makes the default group of `world_size` ranks, this process being `rank` (torch's arguments; both
    default to the init method's or the environment's, or under mpiexec to MPI's)."""
    if _world.groups:
        raise ValueError("trying to initialize the default process group twice!")
    backend = _backend(backend)
    timeout = DEFAULT_TIMEOUT if timeout is None else check_timeout(timeout)
    if init_method is not None and store is not None:
        raise ValueError("Cannot specify both init_method and store.")
    device = _device(device_id)
    store, rank, world_size = _meet(backend, init_method, store, rank, world_size, timeout)
    _world.inits, _world.made = _world.inits + 1, 0
    _world.store = None if store is None else PrefixStore(f"default_pg/{_world.inits}", store)
    try:
        engine = _default_engine(backend, rank, world_size, device, timeout_seconds(timeout))
    except BaseException:
        _world.store = None  # a failed init leaves the process as it was: init may be called again
        raise
    default = ProcessGroup(list(range(world_size)), rank, engine, backend, device, group_name or "default_pg",
                           timeout)
    _world.groups.append(default)
    _set_world(default)


def _default_engine(backend, rank, world_size, device, timeout_s):
    if backend == "nccl":
        return engine_nccl.create(_world.store, rank, world_size, device, timeout_s)
    parent = mpi_world.world_communicator(_world.store, rank, world_size, timeout_s)
    engine = engine_mpi.MpiEngine(parent.Dup(), device, timeout_s)
    _world.mpi_parent = parent  # every rank's communicator, which new groups split from
    return engine


def _set_world(default):
    group.WORLD = default


def _backend(backend):
    """"nccl" or "mpi" for a backend argument, with torch's errors for the others."""
    driver = active_driver().name
    if backend is None:
        return "nccl" if driver == "nvidia" else "mpi"
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a str ('nccl' or 'mpi') or None, got {type(backend).__name__}")
    name = backend.lower()
    if name in _TORCH_ONLY_BACKENDS:
        raise RuntimeError(f"Distributed package doesn't have {name.upper()} built in: minitensor's backends are "
                           "'nccl' and 'mpi'")
    if name not in ("nccl", "mpi"):
        raise AssertionError(f"Unknown backend type {backend}")
    if name == "nccl" and driver != "nvidia":
        raise RuntimeError("backend 'nccl' needs NVIDIA GPUs, but minitensor's cuda device is the simulator here: "
                           "use backend='mpi'")
    return name


def _device(device_id):
    """The device this process's groups use, made current: `device_id`, else LOCAL_RANK's (modulo the device
    count, as the launcher sets it), else the current one."""
    if device_id is not None:
        index = devices.index_of(device_id)
    elif os.environ.get("LOCAL_RANK", "").isdigit():
        index = int(os.environ["LOCAL_RANK"]) % devices.device_count()
    else:
        index = devices.current_device()
    devices.set_device(index)
    return index


def _meet(backend, init_method, store, rank, world_size, timeout):
    """(store or None, rank, world_size) once every rank has arrived."""
    launched = mpi_world.launched_world() if backend == "mpi" else None
    if launched is not None:
        if (rank, world_size) != (-1, -1) and (rank, world_size) != launched:
            raise ValueError(f"rank {rank} and world_size {world_size} disagree with mpiexec's: rank {launched[0]} "
                             f"of {launched[1]}")
        return store, *launched
    if store is not None:
        if world_size <= 0:
            raise ValueError("world_size must be positive if using store")
        if rank < 0:
            raise ValueError("rank must be non-negative if using store")
        return store, rank, world_size
    return rendezvous(init_method or "env://", rank, world_size, timeout)


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None):
    """A group of some of the default group's ranks (all of them when None). Every rank of the default group
    calls it, in the same order as the others; those outside `ranks` get a group they are not a member of."""
    default = default_group()
    world_size, rank = default.size(), default.rank()
    ranks = _checked_ranks(list(range(world_size)) if ranks is None else ranks, world_size)
    if backend is not None and _backend(backend) != default._backend:
        raise ValueError(f"new_group(): backend {backend!r} differs from the default group's "
                         f"{default._backend!r}; minitensor's groups share the default group's backend")
    timeout = default._timeout if timeout is None else check_timeout(timeout)
    _world.made += 1
    number = _world.made
    member = rank in ranks
    seconds = timeout_seconds(timeout)
    if default._backend == "mpi":
        comm = mpi_world.split(_world.mpi_parent, ranks, rank, seconds)
        engine = engine_mpi.MpiEngine(comm, default._device, seconds) if member else None
    elif member:
        engine = engine_nccl.create(PrefixStore(f"group_{number}", _world.store), ranks.index(rank), len(ranks),
                                    default._device, seconds)
    else:
        engine = None
    made = ProcessGroup(ranks, ranks.index(rank) if member else -1, engine, default._backend, default._device,
                        group_desc or f"group_{number}", timeout)
    _world.groups.append(made)
    return made


def _checked_ranks(ranks, world_size):
    ranks = sorted(ranks)
    if len(set(ranks)) != len(ranks):
        raise ValueError(f"ranks list must not contain duplicate entries, got {ranks}")
    if len(ranks) > world_size:
        raise ValueError("the new group's world size should be less or equal to the world size set by "
                         "init_process_group")
    if ranks and not 0 <= ranks[0] <= ranks[-1] < world_size:
        raise ValueError("The new group's rank should be within the world_size set by init_process_group")
    return ranks


def destroy_process_group(group=None):
    """Ends `group`'s engine; None or the default group ends every group, after which init_process_group may
    be called again."""
    if group is None or (_world.groups and group is _world.groups[0]):
        if not _world.groups:
            raise AssertionError("Process group cannot be None")
        for made in reversed(_world.groups):
            _end(made)
        _world.groups.clear()
        if _world.mpi_parent is not None:
            _world.mpi_parent.Free()
        _world.store = _world.mpi_parent = None
        _set_world(None)
        return
    if group not in _world.groups:
        raise ValueError("Invalid process group specified")
    _end(group)
    _world.groups.remove(group)


def _end(made):
    engine, made._engine = made._engine, None
    if engine is not None:
        engine.destroy()


def default_group():
    if not _world.groups:
        raise ValueError(NOT_INITIALIZED)
    return _world.groups[0]


def resolve(pg, operation):
    """The group a collective runs on (None: the default group), or None with torch's warning when this
    process is not a member of it."""
    if pg is None:
        return default_group()
    if resolve_any(pg)._rank < 0:
        warnings.warn(f"Running {operation} on global rank {default_group().rank()} which does not belong to the "
                      "given group.", stacklevel=3)
        return None
    return pg


def get_rank(group=None):
    return resolve_any(group)._rank


def get_world_size(group=None):
    return resolve_any(group).size()


def get_backend(group=None):
    return resolve_any(group)._backend


def get_process_group_ranks(group):
    return list(resolve_any(group)._ranks)


def get_group_rank(group, global_rank):
    ranks = resolve_any(group)._ranks
    if global_rank not in ranks:
        raise ValueError(f"Global rank {global_rank} is not part of group {group}")
    return ranks.index(global_rank)


def get_global_rank(group, group_rank):
    ranks = resolve_any(group)._ranks
    if not 0 <= group_rank < len(ranks):
        raise ValueError(f"Group rank {group_rank} is not part of group {group}")
    return ranks[group_rank]


def resolve_any(pg):
    """The group `pg` names (None: the default), whether or not this process is a member of it."""
    if pg is None:
        return default_group()
    if not isinstance(pg, ProcessGroup) or pg not in _world.groups:
        raise ValueError(f"Process group {pg!r} is not initialized in the world group map. Please initialize the "
                         "group first.")
    return pg
