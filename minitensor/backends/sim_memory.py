"""The simulated device's memory (backends/sim.py): one reserved anonymous mapping per device, cut first-fit; the
pages mapped into expandable segments (sim_vmm.py) count against the same capacity."""
import ctypes
import mmap
import threading

from ..base.errors import CudaError

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
