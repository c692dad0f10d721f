"""Device-side waits behind `mt.cuda.sleep` and `mt.cuda.Gate` on the real GPU (minitensor/cuda/testing.py).

The simulated device needs none of this: its streams are host threads that can simply sleep or wait.
"""
import triton.language as tl
from triton.language.extra.cuda import globaltimer

from . import launcher
from .compat import jit


@jit
def _spin_for(duration_ns):
    start = globaltimer()
    while globaltimer() - start < duration_ns:
        pass


@jit
def _spin_until_set(flag_ptr):
    while tl.load(flag_ptr, volatile=True) == 0:
        pass


def spin_sleep(device, stream, duration_ns):
    launcher.get("timing._spin_for", device, ("i64",), ())(1, 1, 1, stream, duration_ns)


def spin_on_flag(device, stream, flag_ptr):
    """`flag_ptr`: the device address of an int32 in mapped pinned memory that the host sets to open."""
    launcher.get("timing._spin_until_set", device, ("*i32",), ())(1, 1, 1, stream, flag_ptr)
