"""Expandable segments on the simulated device (backends/sim.py): CUDA's virtual memory management over host
mappings. A reservation is address space with no memory behind it (mapped PROT_NONE, MAP_NORESERVE). Mapping a
page charges its bytes to the device's arena (sim_memory.py), as a GPU's physical memory, which malloc then cannot
have, and makes it readable and writable; unmapping drops its contents and gives the bytes back. Touching a
reserved page that is not mapped kills the process (a SIGSEGV), where a GPU reports an illegal address.
"""
import ctypes
import mmap
import os
from dataclasses import dataclass, field

from ..base.errors import CudaError, OutOfMemoryError
from .mapped_pages import MappedPages

GRANULARITY = 2 << 20  # an H100's minimum granularity
ADDRESS_LIMIT = 1 << 40  # address space a device's reservations may take together (a GPU's is large but finite)
_PROT_NONE, _READ_WRITE = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = 0x4000  # Linux's value; Python's mmap module names it only from 3.13
_MAP_FAILED = 2**64 - 1

_libc = ctypes.CDLL(None, use_errno=True)  # an instance of our own: the argtypes below stay ours


def _function(name, restype, *argtypes):
    function = getattr(_libc, name)
    function.restype, function.argtypes = restype, argtypes
    return function


_size, _void = ctypes.c_size_t, ctypes.c_void_p
_mmap = _function("mmap", _void, _void, _size, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
_munmap = _function("munmap", ctypes.c_int, _void, _size)
_mprotect = _function("mprotect", ctypes.c_int, _void, _size, ctypes.c_int)
_madvise = _function("madvise", ctypes.c_int, _void, _size, ctypes.c_int)


def _os_check(result):
    """libc's -1 (MAP_FAILED for mmap) as OSError with errno's message."""
    if result in (-1, _MAP_FAILED):
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    return result


def _invalid():
    return CudaError(1, "invalid argument")


@dataclass
class Reservation:
    device: int
    base: int
    size: int
    mapped: MappedPages = field(default_factory=MappedPages)  # its mapped pages: address -> size


def _reserve_aligned(nbytes):
    """`nbytes` of address space starting on a page boundary, as cuMemAddressReserve's ranges do: a page more
    is reserved, and the unaligned head and the tail beyond are given back."""
    start = _os_check(_mmap(None, nbytes + GRANULARITY, _PROT_NONE,
                            mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0))
    base = -(-start // GRANULARITY) * GRANULARITY
    if base > start:
        _os_check(_munmap(start, base - start))
    _os_check(_munmap(base + nbytes, start + GRANULARITY - base))
    return base


class SimVmm:
    """SimDriver's expandable-segment calls (a mixin: they share its arenas, streams and lock). State, set by the
    driver: `_reservations`, base address -> Reservation, read and changed under `_lock`."""

    def vmm_granularity(self, device):
        return GRANULARITY

    def vmm_reserve(self, device, nbytes):
        if not 0 <= device < self._count:
            raise CudaError(101, "invalid device ordinal")
        if nbytes <= 0 or nbytes % GRANULARITY:
            raise _invalid()
        with self._lock:
            taken = sum(r.size for r in self._reservations.values() if r.device == device)
        if taken + nbytes > ADDRESS_LIMIT:
            raise CudaError(2, f"out of memory (the simulated device {device} has {ADDRESS_LIMIT} bytes of address "
                               f"space for expandable segments, {taken} of them reserved)")
        base = _reserve_aligned(nbytes)
        with self._lock:
            self._reservations[base] = Reservation(device, base, nbytes)
        return base

    def vmm_map(self, device, ptr, nbytes, page):
        arena = self._arena(device)  # before the lock, which creating the arena takes
        with self._lock:
            reservation = self._vmm_reservation_of(device, ptr, nbytes)
            if page <= 0 or page % GRANULARITY or nbytes % page or reservation.mapped.overlaps(ptr, ptr + nbytes):
                raise _invalid()
            if not arena.charge(nbytes):
                raise OutOfMemoryError(f"CUDA error 2: out of memory (simulated device {device} has "
                                       f"{self._capacity} bytes)")
            try:
                _os_check(_mprotect(ptr, nbytes, _READ_WRITE))
            except OSError:
                arena.uncharge(nbytes)
                raise
            reservation.mapped.update((at, page) for at in range(ptr, ptr + nbytes, page))

    def vmm_unmap(self, device, ptr, nbytes):
        """Waits for the device's streams first, as `free` does: work queued on them may still use the pages."""
        for stream in self._device_streams(device):
            stream.drain()
        arena = self._arena(device)
        with self._lock:
            reservation = self._vmm_reservation_of(device, ptr, nbytes)
            pages = reservation.mapped.tiling(ptr, nbytes)  # whole mapped pages, and only those
            if pages is None:
                raise _invalid()
            _os_check(_madvise(ptr, nbytes, mmap.MADV_DONTNEED))
            _os_check(_mprotect(ptr, nbytes, _PROT_NONE))
            for at in pages:
                del reservation.mapped[at]
            arena.uncharge(nbytes)

    def vmm_release(self, device, ptr, nbytes):
        with self._lock:
            reservation = self._reservations.get(ptr)
            if reservation is None or reservation.device != device or reservation.size != nbytes or \
                    reservation.mapped:
                raise _invalid()
            del self._reservations[ptr]
        _os_check(_munmap(ptr, nbytes))

    def _vmm_reservation_of(self, device, ptr, nbytes):
        """The reservation of `device` holding [ptr, ptr + nbytes), a range of whole granules, else CUDA's invalid
        argument. The caller holds `_lock`."""
        reservation = self._vmm_reservation(ptr)
        if nbytes <= 0 or ptr % GRANULARITY or nbytes % GRANULARITY or reservation is None or \
                reservation.device != device or ptr + nbytes > reservation.base + reservation.size:
            raise _invalid()
        return reservation

    def _vmm_reservation(self, ptr):
        return next((r for r in self._reservations.values() if r.base <= ptr < r.base + r.size), None)

    def _vmm_range(self, ptr):
        """(device, start, size) of the run of mapped pages holding `ptr`, else None (the driver protocol's
        memory_range: to their user, the pages of an expandable segment are one piece of memory)."""
        with self._lock:
            reservation = self._vmm_reservation(ptr)
            run = None if reservation is None else reservation.mapped.run(ptr)
            return None if run is None else (reservation.device, *run)
