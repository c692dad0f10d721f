"""User memory pools, as torch.cuda.MemPool: a private pool of a device's allocator
(allocator/private_pools.py) that a thread's allocations go to inside `use_mem_pool(pool)`, and that a
graph capture can take as its pool (`pool=`). Its memory is the pool's until the MemPool and every graph
using it are gone and its blocks are freed; then empty_cache gives it back.
"""
import threading

from . import memory
from .devices import current_device, index_of
from .graphs import graph_pool_handle

__all__ = ["MemPool", "use_mem_pool"]


class MemPool:
    """A private pool of the current device's allocator."""

    def __init__(self, allocator=None, use_on_oom=False):
        if allocator is not None or use_on_oom:
            raise NotImplementedError("MemPool(allocator=..., use_on_oom=...): minitensor's pools come from its "
                                      "own caching allocator")
        self.id = graph_pool_handle()
        self.device = current_device()
        memory.pool_allocator(self.device, "MemPool").create_pool(self.id)

    @property
    def allocator(self):
        return None

    def use_count(self):
        """The pool's users: this MemPool, each use_mem_pool context open on it, each graph capturing into it."""
        return memory.allocator(self.device).pool_use_count(self.id)

    def snapshot(self):
        """memory_snapshot()'s segments of this pool."""
        return [segment for segment in memory.memory_snapshot() if segment["segment_pool_id"] == self.id]

    def __repr__(self):
        return f"<minitensor.cuda.MemPool id={self.id} device=cuda:{self.device}>"

    def __del__(self):
        try:
            memory.allocator(self.device).release_pool(self.id)
        except Exception:  # interpreter shutdown: the allocator may be gone
            pass


class use_mem_pool:
    """`with mt.cuda.use_mem_pool(pool):` this thread's allocations on the pool's device come from the pool."""

    def __init__(self, pool, device=None):
        if not isinstance(pool, MemPool):
            raise TypeError(f"use_mem_pool() expects a minitensor.cuda.MemPool, not {type(pool).__name__}")
        self.pool = pool
        self.device = pool.device if device is None else index_of(device)
        if self.device != pool.device:
            raise ValueError(f"use_mem_pool(): the pool belongs to cuda:{pool.device}, not cuda:{self.device}")
        self._routes = []  # (thread, matches) of the routes this context opened: each exit closes its thread's

    def __enter__(self):
        thread = threading.get_ident()

        def matches(stream):
            return threading.get_ident() == thread
        memory.allocator(self.device).begin_allocate_to_pool(self.pool.id, matches, False)
        self._routes.append((thread, matches))
        return self.pool

    def __exit__(self, *exc):
        thread = threading.get_ident()
        mine = [i for i, (opener, _) in enumerate(self._routes) if opener == thread]
        if not mine:
            raise RuntimeError("use_mem_pool(): exited on a thread that did not enter it")
        allocator = memory.allocator(self.device)
        allocator.end_allocate_to_pool(self.pool.id, self._routes.pop(mine[-1])[1])
        allocator.release_pool(self.pool.id)
        return False
