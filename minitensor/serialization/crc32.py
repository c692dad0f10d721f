"""CRC-32 of large buffers, split over threads.

zlib.crc32 runs at 1-2 GB/s on one core, slower than a disk write, and it releases the GIL: pieces of a
buffer are checksummed in parallel and joined with `combine` (zlib's crc32_combine, which Python does not
expose), so writing a checkpoint is not held back by its checksums.
"""
import functools
import os
import threading
import zlib

_POLY = 0xEDB88320  # the CRC-32 polynomial, bit-reflected
_PIECE = 2 << 20  # bytes per task: large enough that a task's overhead is noise, small enough that the
# 16 MiB pieces of a cuda tensor being saved (cuda/staging.py) are checksummed on several threads
_pool = None
_pool_lock = threading.Lock()


def _multiply(a, b):
    """a * b modulo the CRC polynomial (both bit-reflected)."""
    product, mask = 0, 1 << 31
    while a:
        if a & mask:
            product ^= b
            a ^= mask
        mask >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
    return product


def _powers():
    """x^(2^k) modulo the polynomial, for k = 0..63: each the square of the one before."""
    table = [1 << 30]  # x^1
    for _ in range(63):
        table.append(_multiply(table[-1], table[-1]))
    return table


_X2N = _powers()


@functools.lru_cache(maxsize=64)
def _shift_operator(nbytes):
    """x^(8 * nbytes) modulo the polynomial: what appending nbytes zero bytes does to a CRC."""
    p, k = 1 << 31, 3  # x^0; 8 * nbytes = nbytes << 3
    while nbytes:
        if nbytes & 1:
            p = _multiply(_X2N[k], p)
        nbytes >>= 1
        k += 1
    return p


def combine(crc1, crc2, len2):
    """The CRC of A + B from crc1 = crc(A), crc2 = crc(B) and len2 = len(B)."""
    return _multiply(_shift_operator(len2), crc1) ^ crc2


def _executor():
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor  # here, not at import: it slows `import minitensor`
            _pool = ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1),
                                       thread_name_prefix="minitensor-crc32")
    return _pool


def _after_fork_in_child():
    """A forked child has none of its parent's worker threads: it starts its own pool when needed."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def crc32(view, crc=0, alongside=None):
    """zlib.crc32(view, crc), computed in pieces on worker threads while this thread runs `alongside()`
    (e.g. writing the same bytes to a file). `view` is a byte memoryview."""
    if len(view) <= _PIECE:
        if alongside is not None:
            alongside()
        return zlib.crc32(view, crc)
    pieces = [view[i:i + _PIECE] for i in range(0, len(view), _PIECE)]
    pool = _executor()
    futures = [pool.submit(zlib.crc32, piece) for piece in pieces]
    if alongside is not None:
        alongside()
    for piece, future in zip(pieces, futures):
        crc = combine(crc, future.result(), len(piece))
    return crc
