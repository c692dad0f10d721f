"""The cuda devices: their registry, the current device, and what names one.

One canonical `mt.device("cuda", i)` per device; "cuda" alone (or an index of None) names the calling thread's
current device. `as_device` is the one place device arguments of the whole library are normalised.
"""
import threading

from ..backends import active_driver, registered_driver
from ..base.device import CPU, device as _device_type
from ..base.errors import CudaError
from . import capturing
from .device_errors import raise_pending

_DEVICES = []  # one canonical mt.device("cuda", i) per device
_devices_lock = threading.Lock()
_named = {}  # device string -> the device it always names: factories take strings on every call
_registered = {}  # registered device type -> its canonical devices


def check_index(index):
    """Validate a device index; also fills _DEVICES on first use."""
    if not _DEVICES:
        with _devices_lock:
            if not _DEVICES:
                _DEVICES.extend(_device_type("cuda", i) for i in range(active_driver().device_count()))
    return _in_range(index, len(_DEVICES), "cuda")


def _in_range(index, count, type_name):
    if not isinstance(index, int) or not 0 <= index < count:
        raise RuntimeError(f"Device index value {index!r} is out of index range [0, {count}): there are {count} "
                           f"{type_name} devices")
    return index


def registered_device(d):
    """The canonical mt.device of a registered device type's device `d` (its index None: the current one)."""
    devices = _registered.get(d.type)
    driver = registered_driver(d.type)
    if devices is None:
        devices = _registered.setdefault(d.type, [_device_type(d.type, i) for i in range(driver.device_count())])
    index = driver.current_device() if d.index is None else d.index
    return devices[_in_range(index, len(devices), d.type)]


def index_of(d):
    """The device index named by None (current), an int, a string or an mt.device of type cuda."""
    if d is None:
        return current_device()
    if isinstance(d, int) and not isinstance(d, bool):
        return check_index(d)
    d = _device_type(d) if not isinstance(d, _device_type) else d
    if d.type != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {d}")
    return current_device() if d.index is None else check_index(d.index)


def cuda_device(d=None):
    """The canonical mt.device of the cuda device named by `d` (see index_of)."""
    return _DEVICES[check_index(index_of(d))]


def as_device(d):
    """Normalise any device argument (a string, an int, an mt.device): a cuda device always gets its index."""
    if type(d) is str:
        named = _named.get(d)
        if named is not None:
            return named
        parsed = _device_type(d)
        named = _resolve(parsed)
        if parsed.index is not None or named is CPU or (parsed.type == "cuda" and len(_DEVICES) == 1):
            _named[d] = named  # "cuda" names the current device, which is always cuda:0 on a one-GPU machine
        return named
    if isinstance(d, int):
        d = _device_type("cuda", d)
    elif not isinstance(d, _device_type):
        d = _device_type(d)
    return _resolve(d)


def _resolve(d):
    if d.type == "cuda":
        return _DEVICES[check_index(current_device() if d.index is None else d.index)]
    return CPU if d.type == "cpu" else registered_device(d)


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
    active_driver().set_device(index_of(d))


class device:
    """Context manager that makes a device current and restores the previous one; None does nothing."""

    def __init__(self, d):
        self.index = None if d is None else index_of(d)
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
    """Wait for every stream of the device, then raise what its kernels recorded (device_errors.py)."""
    index = index_of(device)
    capturing.refuse("synchronize()", device=index)
    active_driver().synchronize(index)
    raise_pending(index)


def get_device_properties(d=None):
    return active_driver().properties(index_of(d))


def get_device_name(d=None):
    return get_device_properties(d).name


def get_device_capability(d=None):
    props = get_device_properties(d)
    return props.major, props.minor


def mem_get_info(d=None):
    """(free, total) bytes of the device."""
    return active_driver().mem_get_info(index_of(d))


def check_error(code):
    """Raise CudaError for a nonzero CUresult, with the driver's words for it."""
    if int(code) != 0:
        raise CudaError(code, active_driver().error_string(int(code)))
