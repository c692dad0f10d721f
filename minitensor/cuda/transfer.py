"""Byte copies between the host and cuda devices, and between two cuda devices, with torch's rules
(aten/src/ATen/native/cuda/Copy.cu). Tensor-level decisions (casts, broadcasts, temporaries) are the copy op's
(minitensor/ops/copy.py); here both sides are contiguous bytes.

- Host and device: on the device's current stream; unless `asynchronous`, the host waits for it. From or to
  pinned host memory it is one transfer: left running, a pinned block of the host caching allocator is recorded
  on the stream, so it is not handed out again before the transfer is done. Pageable memory cannot be left to
  the device: a copy from it returns once the source is read, a copy to it once it is complete; from
  staging.THRESHOLD bytes on it goes through pinned chunks (staging.py).
- Between two cuda devices, as torch: the copy runs on the source device's current stream after the work queued
  on the destination's current stream, which then waits for it (events, no host synchronisation); peer to peer
  when the source device can reach the destination, else staged through pinned chunks.
"""
import threading

from ..backends import active_driver
from . import capturing, host_memory, staging
from .device_errors import raise_pending
from .streams import current_stream_handle

_peers = {}  # (device, peer) -> True when device copies to peer directly (access enabled)
_peers_lock = threading.Lock()


def copy_bytes(dst, dst_device, src, src_device, nbytes, asynchronous=False, pinned=False, block=None):
    """`nbytes` from address `src` on `src_device` to address `dst` on `dst_device` (device indices, None for the
    host). For a host side, `pinned` says whether it is pinned memory and `block` is its host-allocator block,
    if it has one."""
    if src_device is None:
        _host_and_device(dst, src, nbytes, dst_device, staging.host_to_device, asynchronous, pinned, block)
    elif dst_device is None:
        _host_and_device(dst, src, nbytes, src_device, staging.device_to_host, asynchronous, pinned, block)
    else:
        _between_devices(dst, dst_device, src, src_device, nbytes)


def _host_and_device(dst, src, nbytes, index, staged, asynchronous, pinned, block):
    driver = active_driver()
    previous = driver.current_device()
    if previous != index:
        driver.set_device(index)
    try:
        stream = current_stream_handle(index)
        capturing.refuse("a copy between host and cuda memory", stream)
        if pinned:
            driver.memcpy_async(dst, src, nbytes, stream)
            if asynchronous and block is not None:  # host_register'd memory is the caller's to keep alive
                host_memory.allocator().record_stream(block, index, stream)
        elif nbytes >= staging.THRESHOLD:
            staged(dst, src, nbytes, index, stream)
        else:
            driver.memcpy_async(dst, src, nbytes, stream)  # pageable: the host side is done on return
        if not asynchronous:
            driver.stream_synchronize(stream)
            raise_pending(index)
    finally:
        if previous != index:
            driver.set_device(previous)


def _between_devices(dst, d, src, s, nbytes):
    """Ordered on both devices' current streams."""
    driver = active_driver()
    src_stream, dst_stream = current_stream_handle(s), current_stream_handle(d)
    capturing.refuse("a copy between two cuda devices", src_stream)
    capturing.refuse("a copy between two cuda devices", dst_stream)
    previous = driver.current_device()
    try:
        if _peer(driver, s, d):
            _order(driver, d, dst_stream, s, src_stream)  # dst's memory may still be in use on its stream
            driver.set_device(s)
            driver.memcpy_peer_async(dst, d, src, s, nbytes, src_stream)
            _order(driver, s, src_stream, d, dst_stream)
        else:
            staging.device_to_device(dst, d, dst_stream, src, s, src_stream, nbytes)
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
