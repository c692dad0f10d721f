"""`mt.cuda`: devices, streams and events, whichever backend (real GPU or simulator) is active."""
import threading

from ..backends import active_driver
from ..device import device as _device_type
from ..errors import CudaError, OutOfMemoryError, check_error
from .streams import Event, ExternalStream, Stream, current_stream, default_stream, set_stream, stream
from . import host_memory, memory
from .host_memory import (host_empty_cache, host_memory_stats, host_register, host_unregister,
                          reset_accumulated_host_memory_stats, reset_peak_host_memory_stats)
from .memory import (caching_allocator_alloc, caching_allocator_delete, empty_cache, get_per_process_memory_fraction,
                     max_memory_allocated, max_memory_reserved, memory_allocated, memory_reserved, memory_snapshot,
                     memory_stats, reset_accumulated_memory_stats, reset_peak_memory_stats,
                     set_per_process_memory_fraction)

__all__ = ["CudaError", "Event", "ExternalStream", "Gate", "OutOfMemoryError", "Stream", "backend",
           "check_error", "current_device", "current_stream", "default_stream", "device", "device_count",
           "get_device_capability", "get_device_name", "get_device_properties", "is_available", "manual_seed",
           "manual_seed_all", "initial_seed", "mem_get_info", "set_device", "set_stream", "sleep", "stream", "synchronize"]
__all__ += [name for name in memory.__all__ if name != "mem_get_info"]
__all__ += host_memory.__all__

_DEVICES = []  # one canonical mt.device("cuda", i) per device
_devices_lock = threading.Lock()


def _check_index(index):
    """Validate a device index; also fills _DEVICES on first use."""
    if not _DEVICES:
        with _devices_lock:
            if not _DEVICES:
                _DEVICES.extend(_device_type("cuda", i) for i in range(active_driver().device_count()))
    if not isinstance(index, int) or not 0 <= index < len(_DEVICES):
        raise RuntimeError(f"Invalid device index {index!r}: there are {len(_DEVICES)} cuda devices "
                           f"(valid indices 0..{len(_DEVICES) - 1})")
    return index


def _device(d=None):
    """The canonical mt.device of the cuda device named by `d` (see _index)."""
    return _DEVICES[_check_index(_index(d))]


def _index(d):
    """The device index named by None (current), an int, a string or an mt.device."""
    if d is None:
        return current_device()
    if isinstance(d, int) and not isinstance(d, bool):
        return _check_index(d)
    d = _device_type(d) if not isinstance(d, _device_type) else d
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    return current_device() if d.index is None else _check_index(d.index)


def is_available():
    return device_count() > 0


def backend():
    """'nvidia' for a real GPU, 'sim' for the simulated device."""
    return active_driver().name


def device_count():
    return active_driver().device_count()


def current_device():
    return active_driver().current_device()


def set_device(d):
    active_driver().set_device(_index(d))


class device:
    """Context manager that makes a device current and restores the previous one; None does nothing."""

    def __init__(self, d):
        self.index = None if d is None else _index(d)
        self.previous = None

    def __enter__(self):
        if self.index is not None:
            self.previous = current_device()
            set_device(self.index)
        return self

    def __exit__(self, *exc):
        if self.index is not None:
            set_device(self.previous)
        return False


def synchronize(device=None):
    index = _index(device)
    active_driver().synchronize(index)
    raise_device_errors(index)


def raise_device_errors(index):
    """Raise what kernels recorded on device `index` (an out-of-range gather index): synchronising calls run
    this after their wait, so the error surfaces there, as torch's device-side asserts do."""
    from ..indexing import raise_pending
    raise_pending(index)


def get_device_properties(d=None):
    return active_driver().properties(_index(d))


def get_device_name(d=None):
    return get_device_properties(d).name


def get_device_capability(d=None):
    props = get_device_properties(d)
    return props.major, props.minor


def mem_get_info(d=None):
    """(free, total) bytes of the device."""
    return active_driver().mem_get_info(_index(d))


def sleep(ms):
    """Keep the current stream busy for `ms` milliseconds (a test helper)."""
    s = current_stream()
    active_driver().sleep(s.cuda_stream, ms)


class Gate:
    """A device-side wait the host releases: `wait()` blocks the current stream until `open()`.

    While a stream waits on a closed gate, no kernel may be used for the first time: on a GPU, loading a
    kernel waits for the device to go idle, which it never does before `open()`. The launcher refuses such a
    load on both backends (`closed_with_waiters`) instead of hanging; another library's first use of one of
    its kernels (CuPy, torch) behind a closed gate hangs, unseen by minitensor. A gate dropped while closed
    opens itself, so a failed test never leaves a stream blocked for every later call and the process's exit."""

    _waited = set()  # ids of gates some stream waits on and that are not open yet

    def __init__(self):
        self._gate = active_driver().gate_create()

    @classmethod
    def closed_with_waiters(cls):
        return bool(cls._waited)

    def wait(self):
        active_driver().gate_wait(self._gate, current_stream().cuda_stream)
        Gate._waited.add(id(self))

    def open(self):
        active_driver().gate_open(self._gate)
        Gate._waited.discard(id(self))

    def __del__(self):
        try:
            self.open()
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


def manual_seed(seed):
    """Seed the current device's generator (restarting its offset), as torch.cuda.manual_seed."""
    from .. import random
    random.cuda_manual_seed(seed, current_device())


def manual_seed_all(seed):
    """Seed every device's generator."""
    from .. import random
    random.manual_seed_all(seed)


def initial_seed():
    """The current device's seed."""
    from .. import random
    return random.cuda_generator(current_device()).seed
