"""Copies between devices (cpu and cuda:N, every pair), with torch's rules (aten/src/ATen/native/cuda/Copy.cu).

- Blocking by default: on return, a copy to the host is complete and a copy from the host has consumed its
  source (the stream is synchronized).
- non_blocking=True with pinned host memory (pin_memory, host_register): the transfer is queued on the
  current stream of the cuda device and the call returns at once. The stream is recorded on the pinned block,
  so the host allocator does not hand the block out again before the transfer is done. With pageable memory
  the host side cannot be asynchronous: a copy from it returns once the source is read, a copy to it once
  it is complete.
- Casts and broadcasts run on a cuda device when non_blocking (so nothing waits on the host), else on the side
  where the data is smaller; non-contiguous tensors go through a contiguous temporary on their own device.
- Pageable transfers of at least staging.THRESHOLD bytes go through pinned chunks, the host copy overlapped
  with the transfer (staging.py).
- Between two cuda devices, as torch: the copy runs on the source device's current stream after the work
  queued on the destination's current stream, which then waits for it (events, no host synchronisation);
  peer to peer when the source device can reach the destination, else staged through pinned chunks.
"""
import threading

from . import dtypes, ops, staging
from .backends import active_driver
from .cuda.streams import current_stream_handle
from .device import CPU
from .tensor import Tensor

_peers = {}  # (device, peer) -> True when device copies to peer directly (access enabled)
_peers_lock = threading.Lock()


def copy_across(dst, src, non_blocking):
    """dst[...] = src for tensors on different devices (dst not empty, src broadcastable to it)."""
    if src.device.type == "cpu":
        _host_to_device(dst, src, non_blocking)
    elif dst.device.type == "cpu":
        _device_to_host(dst, src, non_blocking)
    else:
        _device_to_device(dst, src)


def copy_storage(dst, src, non_blocking=False):
    """All the bytes of storage `src` into storage `dst`, of the same size, on another device."""
    n = src.nbytes()
    if n:
        copy_across(Tensor(dst, (n,), (1,), 0, dtypes.uint8), Tensor(src, (n,), (1,), 0, dtypes.uint8),
                    non_blocking)


def _receives(dst, src):
    """Whether src's bytes can go straight into dst's memory."""
    return dst.dtype is src.dtype and dst._shape == src._shape and dst.is_contiguous()


def _on_device_as(src, shape, dtype):
    """src broadcast to `shape` and cast to `dtype`, contiguous, on its device (one kernel at most)."""
    if src._shape == shape and src.dtype is dtype and src.is_contiguous():
        return src
    out = Tensor._empty(shape, dtype, src.device)
    ops.copy_(out, src)
    return out


# ---------------------------------------------------------------------------------------------- host <-> device
def _host_to_device(dst, src, non_blocking):
    if not non_blocking and dst.dtype.itemsize < src.dtype.itemsize:
        src = src.to(dst.dtype)  # fewer bytes to move, and the host waits anyway
    src = src.contiguous()  # a pinned source stays itself when it is contiguous
    target = dst if _receives(dst, src) else Tensor._empty(src._shape, src.dtype, dst.device)
    _transfer(target, src, dst.device.index, src._storage, staging.host_to_device, non_blocking)
    if target is not dst:
        ops.copy_(dst, target)  # on the device: broadcast, cast, strides


def _device_to_host(dst, src, non_blocking):
    if non_blocking and dst.is_contiguous() and dst._storage.is_pinned():
        src = _on_device_as(src, dst._shape, dst.dtype)  # then one asynchronous transfer into dst
    elif src.dtype is not dst.dtype and (non_blocking or dst.dtype.itemsize < src.dtype.itemsize):
        src = src.to(dst.dtype)
    src = src.contiguous()
    target = dst if _receives(dst, src) else Tensor._empty(src._shape, src.dtype, CPU)
    asynchronous = non_blocking and target is dst
    _transfer(target, src, src.device.index, target._storage, staging.device_to_host, asynchronous)
    if target is not dst:
        ops.copy_(dst, target)  # on the host: broadcast, cast, strides


def _transfer(dst, src, index, host, staged, asynchronous):
    """The bytes of contiguous `src` into contiguous `dst`, one on the host (storage `host`) and the other on
    cuda device `index`, on that device's current stream: a single transfer when `host` is pinned, else through
    pinned chunks (`staged`, staging.py) when large. The host waits for it to finish unless `asynchronous`; then
    a pinned `host` block is recorded on the stream."""
    driver = active_driver()
    previous = driver.current_device()
    if previous != index:
        driver.set_device(index)
    try:
        stream = current_stream_handle(index)
        nbytes = src.numel() * src.dtype.itemsize
        if host.is_pinned():
            driver.memcpy_async(dst.data_ptr(), src.data_ptr(), nbytes, stream)
            if asynchronous:
                _record(host, index, stream)
        elif nbytes >= staging.THRESHOLD:
            staged(dst.data_ptr(), src.data_ptr(), nbytes, index, stream)
        else:
            driver.memcpy_async(dst.data_ptr(), src.data_ptr(), nbytes, stream)  # pageable: host side done on return
        if not asynchronous:
            _synchronize(index, stream)
    finally:
        if previous != index:
            driver.set_device(previous)


def _record(storage, index, stream):
    """A pinned block from the host allocator stays in use until the stream's work so far is done
    (host_register'd memory is the caller's to keep alive, as in torch)."""
    if storage._block is not None:
        storage._allocator.record_stream(storage._block, index, stream)


def _synchronize(index, stream):
    from .cuda import raise_device_errors
    active_driver().stream_synchronize(stream)
    raise_device_errors(index)


# ---------------------------------------------------------------------------------------------- device <-> device
def _device_to_device(dst, src):
    if dst.dtype.itemsize < src.dtype.itemsize:
        src = src.to(dst.dtype)  # on the source device: fewer bytes to move
    src = src.contiguous()
    target = dst if _receives(dst, src) else Tensor._empty(src._shape, src.dtype, dst.device)
    _between_devices(target, src)
    if target is not dst:
        ops.copy_(dst, target)  # on the destination device


def _between_devices(dst, src):
    """The bytes of contiguous `src` into contiguous `dst` on another device, ordered on both devices' current
    streams."""
    driver = active_driver()
    s, d = src.device.index, dst.device.index
    src_stream, dst_stream = current_stream_handle(s), current_stream_handle(d)
    nbytes = src.numel() * src.dtype.itemsize
    previous = driver.current_device()
    try:
        if _peer(driver, s, d):
            _order(driver, d, dst_stream, s, src_stream)  # dst's memory may still be in use on its stream
            driver.set_device(s)
            driver.memcpy_peer_async(dst.data_ptr(), d, src.data_ptr(), s, nbytes, src_stream)
            _order(driver, s, src_stream, d, dst_stream)
        else:
            staging.device_to_device(dst.data_ptr(), d, dst_stream, src.data_ptr(), s, src_stream, nbytes)
    finally:
        driver.set_device(previous)


def _peer(driver, device, peer):
    """Whether `device` copies to `peer` directly; enables the access the first time."""
    key = (device, peer)
    direct = _peers.get(key)
    if direct is None:
        with _peers_lock:
            direct = driver.can_access_peer(device, peer)
            if direct:
                driver.enable_peer_access(device, peer)
            _peers[key] = direct
    return direct


def _order(driver, first_device, first_stream, then_device, then_stream):
    """Work queued on then_stream from now on waits for the work queued on first_stream so far."""
    driver.set_device(first_device)
    event = driver.event_create(first_device, False, False)
    driver.event_record(event, first_stream)
    driver.set_device(then_device)
    driver.stream_wait_event(then_stream, event)
    driver.event_destroy(event)
