"""Test helpers that hold a stream back: `sleep` for a time, `Gate` until the host opens it.

On the simulator a stream is a host thread that waits itself (the driver's `host_waits`); on a GPU a spin kernel
(kernels/timing.py) does, reading the clock or a flag in mapped pinned memory.

A gate left closed would keep its stream waiting through the process's exit (a GPU's context waits for its
kernels), so every gate a stream waits on is opened at exit.
"""
import atexit
import weakref

from ..backends import active_driver
from .devices import current_device
from .streams import current_stream

_waited = weakref.WeakSet()  # gates some stream has waited on: opened at exit


@atexit.register
def _open_all():
    for gate in list(_waited):
        gate.open()


def sleep(ms):
    """Keep the current stream busy for `ms` milliseconds."""
    driver, stream = active_driver(), current_stream().cuda_stream
    if driver.host_waits:
        driver.sleep(stream, ms)
    else:
        _kernels()[1].spin_sleep(current_device(), stream, int(ms * 1e6))


class Gate:
    """A device-side wait the host releases: `wait()` blocks the current stream until `open()`.

    While a stream waits on a closed gate, no kernel may be used for the first time: on a GPU, loading a
    kernel waits for the device to go idle, which it never does before `open()`. The launcher refuses such a
    load on both backends (`launcher.closed_gates`) instead of hanging; another library's first use of one of
    its kernels (CuPy, torch) behind a closed gate hangs, unseen by minitensor. A gate dropped while closed
    opens itself, so a failed test never leaves a stream blocked for every later call, and one still referenced
    at exit is opened then, so that the process exits."""

    def __init__(self):
        self._gate = active_driver().gate_create()

    def wait(self):
        driver, stream = active_driver(), current_stream().cuda_stream
        launcher, timing = _kernels()
        _waited.add(self)
        if driver.host_waits:
            driver.gate_wait(self._gate, stream)
        else:
            timing.spin_on_flag(current_device(), stream, driver.gate_device_pointer(self._gate))
        launcher.closed_gates.add(id(self))

    def open(self):
        active_driver().gate_open(self._gate)
        _kernels()[0].closed_gates.discard(id(self))

    def __del__(self):
        try:
            self.open()
        except Exception:  # interpreter shutdown: the driver may already be gone
            pass


def _kernels():
    """(launcher, timing) of minitensor.kernels: the launcher keeps the closed gates, and on a GPU the spin
    kernels of timing do the waiting. Imported at the first sleep or gate, as at every first op: `import
    minitensor` should not pay for them."""
    from ..kernels import launcher, timing  # lazy: import cost (Triton)
    return launcher, timing
