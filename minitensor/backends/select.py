"""Chooses the driver behind the `cuda` device type, once per process, on first use.

MINITENSOR_BACKEND=nvidia|sim forces one; unset means nvidia when a driver and a GPU are found, else
the simulator, with one warning saying so.
"""
import os
import threading
import warnings

_driver = None
_lock = threading.Lock()
_first_op_preparations = []
_start_hooks = []


def prepare_first_op(function):
    """Have `function()` run on a thread while a GPU's first context is created (about 100 ms with the GIL
    released), to load what the first op needs next. Layers above register it at import, before any driver
    exists; a failure is ignored, since the first op loads the same things itself and reports what fails."""
    _first_op_preparations.append(function)


def on_start(function):
    """Have `function(driver)` run once the driver is chosen (or now, if it already is). Layers above register
    it at import; this is how minitensor becomes Triton's driver without importing Triton itself."""
    if _driver is not None:
        function(_driver)
    else:
        _start_hooks.append(function)


def _prepare():
    for function in _first_op_preparations:
        try:
            function()
        except Exception:
            pass


def active_driver():
    global _driver
    if _driver is None:
        with _lock:
            if _driver is not None:
                return _driver
            _driver = _select()
        for function in _start_hooks:
            function(_driver)
    return _driver


def _select():
    choice = os.environ.get("MINITENSOR_BACKEND", "").strip().lower()
    if choice not in ("", "nvidia", "sim"):
        raise RuntimeError(f"MINITENSOR_BACKEND must be 'nvidia' or 'sim', got {choice!r}")
    if choice == "sim":
        return _sim_driver()
    try:
        return _nvidia_driver()
    except Exception as e:
        if choice == "nvidia":
            raise RuntimeError(f"MINITENSOR_BACKEND=nvidia, but the NVIDIA driver could not start: {e}") from e
        warnings.warn(f"minitensor: no usable NVIDIA GPU ({type(e).__name__}: {e}); the 'cuda' device is "
                      "simulated in host memory (set MINITENSOR_BACKEND=sim to silence this warning)",
                      RuntimeWarning, stacklevel=3)
        return _sim_driver()


def _nvidia_driver():
    from .nvidia import NvidiaDriver  # lazy: import cost (cuda.bindings), and it fails where there is none
    return NvidiaDriver(prepare_first_op=_prepare)


def _sim_driver():
    from .sim import SimDriver  # lazy: import cost
    return SimDriver()
