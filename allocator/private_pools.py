"""Private pools: memory that CUDA graphs (and mt.cuda.MemPool) own, apart from the general cache, with torch's
rules (c10/cuda/CUDACachingAllocator.cpp, Note [Interaction with CUDA graph capture]).

- While a route to a pool is open (`begin_allocate_to_pool`), every allocation whose stream the route's
  `matches` accepts comes from that pool's own free lists and segments; a block goes back to the pool it came
  from when freed, whenever that is, so memory freed during a capture is reused only inside its pool.
- A route of a capture also stops what CUDA refuses while a stream captures: no event is queried or
  synchronized and no segment is freed (the out-of-memory ladder stops at a new segment, empty_cache
  raises), and a block other streams used (record_stream) that is freed meanwhile waits, pending, until the
  last capture ends to record its events.
- A pool lives while graphs or MemPools use it (`use_count`, from `begin_allocate_to_pool` or
  `create_pool` to `release_pool`). Unused, it is freeable: empty_cache gives back its whole free segments,
  and the pool goes once it has none left. Its blocks still handed out (a graph's outputs) keep their
  segments until they are freed.
"""
from minitensor.base.errors import CudaError


class PrivatePool:
    """One private pool. `id` is torch's pair of ints; `segments` counts the driver segments it holds."""

    __slots__ = ("id", "use_count", "segments")

    def __init__(self, pool_id):
        self.id = pool_id
        self.use_count = 0
        self.segments = 0

    def __repr__(self):
        return f"PrivatePool(id={self.id}, use_count={self.use_count}, segments={self.segments})"


class PrivatePools:
    """DeviceCachingAllocator's private pools (a mixin: they share its lock, free lists and segments).

    State, set by the allocator: `_pools`, pool id -> PrivatePool; `_routes`, the open routes as
    [pool, matches(stream), is_capture]; `_capturing`, how many of them are captures; `_deferred`, the blocks
    freed during a capture whose record_stream events wait for its end.
    Invariant: while any route is open the allocator takes no shortcut (`_plain` is False), so every
    allocation meets `_route`, and no queued block from a private pool is ever handed out by a shortcut.
    """

    def create_pool(self, pool_id):
        """Count one more user (a MemPool) of the pool, making it if new."""
        with self._lock:
            self._use_pool(pool_id)

    def begin_allocate_to_pool(self, pool_id, matches, capture):
        """Route the allocations of the streams `matches` accepts to the pool (one more user of it). With
        `capture`, also stop what is illegal while a stream captures (see the module's docstring)."""
        with self._lock:
            self._settle()
            pool = self._use_pool(pool_id)
            self._routes.append([pool, matches, capture])
            if capture:
                self._capturing += 1
            self._set_plain()

    def end_allocate_to_pool(self, pool_id, matches=None):
        """Close the route to the pool that `begin_allocate_to_pool` opened with `matches` (equal to it: a bound
        method of the same object will do), or the newest one when None; the pool keeps its user until
        `release_pool`. Routes sharing a pool may close in any order: two captures into one pool end as they
        like, and each closes its own."""
        with self._lock:
            self._settle()
            for i in range(len(self._routes) - 1, -1, -1):
                pool, route_matches, _ = self._routes[i]
                if pool.id == pool_id and (matches is None or route_matches == matches):
                    _, _, capture = self._routes.pop(i)
                    break
            else:
                raise RuntimeError(f"minitensor allocator: no allocation is routed to pool {pool_id}"
                                   f"{'' if matches is None else ' by this route'}")
            if capture:
                self._capturing -= 1
                if not self._capturing:
                    self._record_deferred()
            self._set_plain()

    def release_pool(self, pool_id):
        """One user fewer; at none the pool is freeable (empty_cache gives its free segments back)."""
        with self._lock:
            pool = self._pools.get(pool_id)
            if pool is None or pool.use_count <= 0:
                raise RuntimeError(f"minitensor allocator: pool {pool_id} is not in use")
            if pool.use_count == 1 and any(route[0] is pool for route in self._routes):
                raise RuntimeError(f"minitensor allocator: pool {pool_id} is released while allocations are "
                                   "still routed to it (end_allocate_to_pool first)")
            pool.use_count -= 1

    def pool_use_count(self, pool_id):
        """The users of the pool, 0 when it is freeable or gone."""
        pool = self._pools.get(pool_id)
        return 0 if pool is None else pool.use_count

    def _use_pool(self, pool_id):
        pool = self._pools.get(pool_id)
        if pool is None:
            pool = self._pools[pool_id] = PrivatePool(pool_id)
        pool.use_count += 1
        return pool

    def _route(self, stream):
        """The pool the newest open route that accepts `stream` leads to, or None (lock held)."""
        for pool, matches, _ in reversed(self._routes):
            if matches(stream):
                return pool
        return None

    def _refuse_while_capturing(self, what):
        if self._capturing:
            raise CudaError(900, f"operation not permitted when stream is capturing ({what} while a CUDA "
                                 f"graph capture is underway on device {self.device})")

    def _record_deferred(self):
        """The last capture ended: the blocks freed meanwhile that other streams used record their events."""
        deferred, self._deferred = self._deferred, []
        for block in deferred:
            self._events.record(block)
            self._events.queue(block)

    def _drop_unused_pools(self):
        """Forget the freeable pools that hold no segment any more, with their free lists."""
        gone = {pool_id for pool_id, pool in self._pools.items() if pool.use_count == 0 and not pool.segments}
        if gone:
            for pools in (self._small, self._large):
                for key in [key for key, free_list in pools.items()
                            if free_list.pool is not None and free_list.pool.id in gone]:
                    del pools[key]
            for pool_id in gone:
                del self._pools[pool_id]

    def private_bytes(self):
        """Bytes cached free in private pools, which the out-of-memory ladder cannot free (torch's message
        counts the same; lock held)."""
        return sum(block.size for pools in (self._small, self._large) for free_list in pools.values()
                   if free_list.pool is not None for block in free_list.blocks())
