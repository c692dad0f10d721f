"""`mt.accelerator`, torch.accelerator: the device-generic face of the current accelerator, for code written
once for whichever device a machine has. minitensor's accelerator is `cuda` (a GPU, or the simulator), so each
call is `mt.cuda`'s, under torch's generic name."""
from . import cuda
from .base.device import device as _device
from .cuda.device_modules import module_for
from .cuda.devices import device as _device_context

__all__ = ["get_device_module", "current_accelerator", "current_device_idx", "current_device_index", "current_stream", "device_count",
           "device_index", "empty_cache", "get_memory_info", "is_available", "max_memory_allocated",
           "max_memory_reserved", "memory_allocated", "memory_reserved", "memory_stats",
           "reset_accumulated_memory_stats", "reset_peak_memory_stats", "set_device_idx", "set_device_index",
           "set_stream", "synchronize"]


def device_count():
    return cuda.device_count()


def is_available():
    return cuda.is_available()


def current_accelerator(check_available=False):
    """`mt.device("cuda")`; None when `check_available` and no device is there."""
    return None if check_available and not is_available() else _device("cuda")


def current_device_index():
    return cuda.current_device()


def set_device_index(device):
    cuda.set_device(device)


current_device_idx, set_device_idx = current_device_index, set_device_index  # torch's earlier names


class device_index(_device_context):
    """Context manager: `device` current inside (None changes nothing), as torch.accelerator.device_index."""


def current_stream(device=None):
    return cuda.current_stream(device)


def set_stream(stream):
    cuda.set_stream(stream)


def synchronize(device=None):
    cuda.synchronize(device)


def empty_cache():
    cuda.empty_cache()


def memory_stats(device_index=None):
    return cuda.memory_stats(device_index)


def memory_allocated(device_index=None):
    return cuda.memory_allocated(device_index)


def max_memory_allocated(device_index=None):
    return cuda.max_memory_allocated(device_index)


def memory_reserved(device_index=None):
    return cuda.memory_reserved(device_index)


def max_memory_reserved(device_index=None):
    return cuda.max_memory_reserved(device_index)


def reset_accumulated_memory_stats(device_index=None):
    cuda.reset_accumulated_memory_stats(device_index)


def reset_peak_memory_stats(device_index=None):
    cuda.reset_peak_memory_stats(device_index)


def get_device_module(device=None):
    """The module of a device type, torch.get_device_module: `mt.cuda` for "cuda" (a device or its string) and
    for None (the current accelerator); a registered type's DeviceModule (cuda/device_modules.py) for it."""
    if device is None:
        return cuda
    kind = device.partition(":")[0] if isinstance(device, str) else getattr(device, "type", device)
    return cuda if kind == "cuda" else module_for(kind)


def get_memory_info(device_index=None):
    """(free, total) bytes of the device."""
    return cuda.mem_get_info(device_index)
