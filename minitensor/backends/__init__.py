"""Chooses the driver behind the `cuda` device type, once per process, on first use.

MINITENSOR_BACKEND=nvidia|sim forces one; unset means nvidia when a driver and a GPU are found, else
the simulator, with one warning saying so.
"""
import os
import threading
import warnings

_driver = None
_lock = threading.Lock()


def active_driver():
    global _driver
    if _driver is None:
        with _lock:
            if _driver is None:
                _driver = _select()
    return _driver


def _select():
    choice = os.environ.get("MINITENSOR_BACKEND", "").strip().lower()
    if choice not in ("", "nvidia", "sim"):
        raise RuntimeError(f"MINITENSOR_BACKEND must be 'nvidia' or 'sim', got {choice!r}")
    if choice == "sim":
        from .sim import SimDriver
        return SimDriver()
    try:
        from .nvidia import NvidiaDriver
        return NvidiaDriver()
    except Exception as e:
        if choice == "nvidia":
            raise RuntimeError(f"MINITENSOR_BACKEND=nvidia, but the NVIDIA driver could not start: {e}") from e
        warnings.warn(f"minitensor: no usable NVIDIA GPU ({type(e).__name__}: {e}); the 'cuda' device is "
                      "simulated in host memory (set MINITENSOR_BACKEND=sim to silence this warning)",
                      RuntimeWarning, stacklevel=3)
        from .sim import SimDriver
        return SimDriver()
