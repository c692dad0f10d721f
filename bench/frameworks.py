"""One small adapter per framework, so a case and the timing loops need not know which one runs.

torch and CuPy are optional: each is used only when it imports and sees a real CUDA GPU.
"""

from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable


@dataclass(frozen=True)
class Framework:
    name: str
    module: Any  # what a case's op receives: minitensor, torch or cupy
    version: str
    synchronize: Callable[[], None]
    event: Callable[[], Any]  # a new timing event with record() and synchronize()
    elapsed_ms: Callable[[Any, Any], float]
    rand: Callable[[tuple], Any]  # float32 uniform [0, 1) on the GPU
    empty: Callable[[tuple], Any]  # float32 on the GPU


def _installed_version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:  # run from a source tree on PYTHONPATH
        return "?"


def minitensor():
    import minitensor as mt

    return Framework(
        name="minitensor",
        module=mt,
        version=_installed_version("minitensor"),
        synchronize=mt.cuda.synchronize,
        event=lambda: mt.cuda.Event(enable_timing=True),
        elapsed_ms=lambda start, end: start.elapsed_time(end),
        rand=lambda shape: mt.rand(*shape, device="cuda"),
        empty=lambda shape: mt.empty(*shape, device="cuda"),
    )


def torch_or_none():
    """torch on its GPU, or None when torch is missing or sees no GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return Framework(
        name="torch",
        module=torch,
        version=torch.__version__,
        synchronize=torch.cuda.synchronize,
        event=lambda: torch.cuda.Event(enable_timing=True),
        elapsed_ms=lambda start, end: start.elapsed_time(end),
        rand=lambda shape: torch.rand(*shape, device="cuda"),
        empty=lambda shape: torch.empty(*shape, device="cuda"),
    )


def cupy_or_none():
    """CuPy on its GPU, or None when CuPy is missing or sees no GPU."""
    try:
        import cupy as cp
    except ImportError:
        return None
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            return None
    except Exception:  # CuPy raises its own CUDA errors (no driver, no device): all mean "not here"
        return None
    return Framework(
        name="cupy",
        module=cp,
        version=cp.__version__,
        synchronize=cp.cuda.runtime.deviceSynchronize,
        event=cp.cuda.Event,
        elapsed_ms=cp.cuda.get_elapsed_time,
        rand=lambda shape: cp.random.random(shape, dtype=cp.float32),
        empty=lambda shape: cp.empty(shape, dtype=cp.float32),
    )


def baselines(mt_backend):
    """The comparison frameworks present; none on the simulated device, whose sizes are scaled down."""
    if mt_backend != "nvidia":
        return []
    return [fw for fw in (torch_or_none(), cupy_or_none()) if fw is not None]
