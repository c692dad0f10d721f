"""MINITENSOR_NO_CACHING=1: every request goes straight to the driver and every free straight back, so
memory checkers see each allocation (torch's PYTORCH_NO_CUDA_MEMORY_CACHING).

Each allocation is its own segment of exactly the bytes asked for; the statistics, snapshot and memory
fraction work as with caching. record_stream needs no events: the driver's free waits for the device.
"""
from minitensor.base.errors import OutOfMemoryError

from .block import ALLOCATED, NULL
from .device import DeviceCachingAllocator
from .sizes import ONE_EB, SMALL_SIZE


class UncachedAllocator(DeviceCachingAllocator):

    def alloc(self, nbytes, stream):
        if nbytes <= 0:
            return self._alloc_nothing(nbytes)
        if nbytes >= ONE_EB:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate more than 1EB memory.")
        small = nbytes <= SMALL_SIZE
        with self._lock:
            block = self._new_segment(self._free_list(small, stream), nbytes)
            if block is None:
                self.stats.num_ooms += 1
                message = self._oom_message(nbytes)
                self._observe_oom(nbytes, stream)
                raise OutOfMemoryError(message)
            self._count_taken(block, nbytes)
            if self._history is not None:
                self._history.alloc(block.ptr, block.size, block.stream, None)
            return block

    def free(self, block):
        with self._lock:
            if block.state != ALLOCATED:
                if block.state == NULL:
                    return
                raise RuntimeError(f"minitensor allocator: {block!r} freed twice")
            if self._history is not None:
                self._history.free(block.ptr, block.size, block.stream, None, True)
            p = block.free_list.stats
            p.allocation -= 1
            p.allocated_bytes -= block.size
            p.requested_bytes -= block.requested
            if block.size >= self._max_split:
                self.stats.oversize_allocations.down()
            self._cache_block(block)
            self._release(block)

    def record_stream(self, block, stream):
        pass
