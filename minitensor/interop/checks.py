"""What a foreign array's description (CUDA array interface, DLPack) must hold before a tensor is made over its
memory: numbers int64 can hold, a pointer that is an address, and, on a cuda device, memory inside one
allocation the driver knows. A tensor over anything else would crash or corrupt the process on its first
kernel, far from the call that took it in; host memory has no one to ask, so only its arithmetic is checked.
"""
from ..backends import active_driver
from ..core.shapes import storage_nbytes

_ADDRESS_END = 2**64


def described_nbytes(shape, stride, itemsize, what):
    """The bytes under (shape, stride) from the data pointer, or BufferError naming `what` described them."""
    try:
        return storage_nbytes(shape, stride, 0, itemsize, what)
    except RuntimeError as e:
        raise BufferError(f"{what} describes no tensor minitensor can hold: {e}") from None


def check_address(ptr, nbytes, numel, what):
    """`ptr` must be an address with room for `nbytes` after it; null only for no elements."""
    if not 0 <= ptr <= _ADDRESS_END - nbytes:
        raise BufferError(f"{what}: data pointer {ptr} with {nbytes} bytes after it is not an address (expected 0 "
                          f"to 2**64 - {nbytes})")
    if numel and not ptr:
        raise BufferError(f"{what}: a null pointer for {numel} elements")


def device_of_memory(ptr, nbytes, what):
    """The index of the cuda device whose allocation holds all of [ptr, ptr + nbytes), or None for pinned host
    memory (every device reaches it); BufferError when no allocation the driver knows holds it all."""
    found = active_driver().memory_range(ptr)
    if found is None:
        raise BufferError(f"{what}: the memory at {ptr:#x} is in no allocation of a cuda device nor in pinned host "
                          "memory, so no kernel may read it (as torch, minitensor refuses pageable host memory)")
    device, start, size = found
    if ptr + nbytes > start + size:
        raise BufferError(f"{what}: {nbytes} bytes at {ptr:#x} reach beyond the allocation that holds them "
                          f"({size} bytes at {start:#x})")
    return device
