"""The simulated device's memory (backends/sim.py): one reserved anonymous mapping per device, cut first-fit; the
pages mapped into expandable segments (sim_vmm.py) count against the same capacity. `SimMemory` holds the
driver's calls over it."""
import ctypes
import mmap
import threading

from ..base.errors import CudaError, OutOfMemoryError

ALIGNMENT = 512


class Arena:
    """One device's memory: a reserved mapping and a first-fit free list of (offset, size), merged on free."""

    def __init__(self, capacity):
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
        self.capacity = capacity
        self.map = mmap.mmap(-1, capacity, flags=flags)
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.map))
        self.free_ranges = [(0, capacity)]
        self.sizes = {}  # live offset -> size
        self.used = 0
        self.lock = threading.Lock()

    def malloc(self, nbytes):
        size = -(-nbytes // ALIGNMENT) * ALIGNMENT
        with self.lock:
            if self.used + size > self.capacity:  # expandable segments hold the rest
                return None
            for i, (offset, length) in enumerate(self.free_ranges):
                if length >= size:
                    if length == size:
                        del self.free_ranges[i]
                    else:
                        self.free_ranges[i] = (offset + size, length - size)
                    self.sizes[offset] = size
                    self.used += size
                    return self.base + offset
        return None

    def charge(self, nbytes):
        """Count `nbytes` of expandable-segment pages as used, if the capacity has room for them."""
        with self.lock:
            if self.used + nbytes > self.capacity:
                return False
            self.used += nbytes
            return True

    def uncharge(self, nbytes):
        with self.lock:
            self.used -= nbytes

    def free(self, ptr):
        offset = ptr - self.base
        with self.lock:
            size = self.sizes.pop(offset, None)
            if size is None:
                raise CudaError(1, "invalid argument")
            self.used -= size
            ranges = self.free_ranges
            i = 0
            while i < len(ranges) and ranges[i][0] < offset:
                i += 1
            ranges.insert(i, (offset, size))
            if i + 1 < len(ranges) and offset + size == ranges[i + 1][0]:
                ranges[i] = (offset, size + ranges[i + 1][1])
                del ranges[i + 1]
            if i > 0 and ranges[i - 1][0] + ranges[i - 1][1] == offset:
                ranges[i - 1] = (ranges[i - 1][0], ranges[i - 1][1] + ranges[i][1])
                del ranges[i]
        self._release_pages(offset, size)

    def _release_pages(self, offset, size):
        """Give whole freed pages back to the OS, so tests of large tensors don't keep host memory."""
        page = mmap.PAGESIZE
        start, end = -(-offset // page) * page, (offset + size) // page * page
        if end - start >= 16 * page:
            self.map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def contains(self, ptr):
        return self.base <= ptr < self.base + self.capacity

    def allocation(self, ptr):
        """(start, size) of the live allocation holding `ptr`, or None."""
        offset = ptr - self.base
        with self.lock:
            return next(((self.base + start, size) for start, size in self.sizes.items()
                         if start <= offset < start + size), None)


class SimMemory:
    """SimDriver's device memory calls (a mixin: they share its lock and streams). State, set by the driver:
    `_arenas`, one Arena per device or None until first used; `_capacity`, each one's bytes."""

    def mem_get_info(self, device: int) -> tuple[int, int]:
        """(free, total) bytes of the simulated device, as cuMemGetInfo."""
        arena = self._arenas[device]
        used = arena.used if arena is not None else 0
        return self._capacity - used, self._capacity

    def _arena(self, device):
        arena = self._arenas[device]
        if arena is None:
            with self._lock:
                if self._arenas[device] is None:
                    self._arenas[device] = Arena(self._capacity)
                arena = self._arenas[device]
        return arena

    def malloc(self, device: int, nbytes: int) -> int:
        """An address of `nbytes` in the device's arena, as cuMemAlloc; OutOfMemoryError past its capacity."""
        ptr = self._arena(device).malloc(nbytes)
        if ptr is None:
            raise OutOfMemoryError(f"CUDA error 2: out of memory (simulated device {device} has "
                                   f"{self._capacity} bytes)")
        return ptr

    def free(self, device: int, ptr: int) -> None:
        """Give an allocation back to the arena, as cuMemFree (after the device's queued work)."""
        # cuMemFree waits for the device's work; so does the simulation, or queued kernels could
        # write into memory that a later malloc hands out again.
        for stream in self._device_streams(device):
            stream.drain()
        self._arena(device).free(ptr)
