"""minitensor.distributed: collectives across processes and GPUs, with torch.distributed's names.

Groups and their engines (NCCL on GPUs, MPI on the simulator) are in groups.py, the collectives in
collectives.py; the stores ranks meet through are store.py, tcp_store.py and file_store.py, the launcher
`python -m minitensor.distributed.run`. Importing it imports neither nccl4py nor mpi4py.
"""
from .collectives import (all_gather, all_gather_into_tensor, all_reduce, barrier, broadcast, irecv, isend, recv,
                          reduce, reduce_scatter, reduce_scatter_tensor, send)
from .errors import DistBackendError, DistError, DistNetworkError, DistStoreError
from .file_store import FileStore
from .groups import (GroupMember, ProcessGroup, destroy_process_group, get_backend, get_global_rank,
                     get_group_rank, get_process_group_ranks, get_rank, get_world_size, group, init_process_group,
                     is_available, is_initialized, is_mpi_available, is_nccl_available, new_group)
from .reduce_op import ReduceOp
from .store import PrefixStore, Store
from .tcp_store import TCPStore
from .work import Work

__all__ = ["DistBackendError", "DistError", "DistNetworkError", "DistStoreError", "FileStore", "GroupMember",
           "PrefixStore", "ProcessGroup", "ReduceOp", "Store", "TCPStore", "Work", "all_gather",
           "all_gather_into_tensor", "all_reduce", "barrier", "broadcast", "destroy_process_group", "get_backend",
           "get_global_rank", "get_group_rank", "get_process_group_ranks", "get_rank", "get_world_size", "group",
           "init_process_group", "irecv", "is_available", "is_initialized", "is_mpi_available", "is_nccl_available",
           "isend", "new_group", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor", "send"]
