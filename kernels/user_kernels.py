"""The Triton-version details behind users' own @triton.jit kernels on minitensor tensors (interop/triton_driver.py
holds what minitensor answers; compat.py the details of minitensor's own kernels). Checked on 3.6 and 3.9.

- `TorchFreeCudaDriver`: Triton's CUDA driver set up without its constructor, which on 3.6 and 3.7 imports torch
  to ask it for the current device and stream.
- `specialize_without_torch`: Triton's C argument specialiser imports torch at its first call (3.6 through 3.9)
  to recognise torch tensors fast; made first while torch cannot be found, it recognises tensors by `data_ptr()`.
- On the simulator: `divert_launches` sends every launch of a JITFunction (and of an InterpretedFunction given
  minitensor tensors, under TRITON_INTERPRET=1) to minitensor, which runs the kernel in the interpreter with
  `pointer_argument`s for tensors (the interpreter would otherwise copy a "GPU tensor" to the host through torch's
  API) and `interpret_nested_jit` held, so the plain @triton.jit helpers a kernel calls run interpreted too.
"""
import contextlib
import functools
import importlib.abc
import sys

import numpy as np
import triton.language as tl
from triton._C.libtriton import native_specialize_impl
from triton.backends.compiler import BaseBackend
from triton.backends.nvidia.driver import CudaDriver, CudaLauncher, CudaUtils
from triton.runtime.interpreter import InterpretedFunction, TensorHandle
from triton.runtime.jit import JITFunction


class TorchFreeCudaDriver(CudaDriver):
    """Triton's CUDA driver whose subclass answers for the current device and stream itself. Its C utilities
    (module loading, device properties) are built at the first kernel a user launches, not at install."""

    launcher_cls = CudaLauncher

    def __init__(self):
        pass

    @functools.cached_property
    def utils(self):
        return CudaUtils()


class _TorchHidden(importlib.abc.MetaPathFinder):
    """Makes `import torch` fail while installed (an imported torch and sys.modules stay as they are)."""

    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def specialize_without_torch():
    """Make the specialiser's first call now, with torch hidden, unless torch is imported already."""
    if "torch" in sys.modules:
        return
    hidden = _TorchHidden()
    sys.meta_path.insert(0, hidden)
    try:
        native_specialize_impl(BaseBackend, 1, False, True, True)
    finally:
        sys.meta_path.remove(hidden)


def pointer_argument(address, type_name):
    """What the interpreter takes for a pointer to elements of Triton type `type_name` ("fp32")."""
    ty = tl.str_to_ty("*" + type_name, None)
    return tl.tensor(TensorHandle(np.array([address], dtype=np.uint64), ty), ty)


def interpreted(kernel):
    """The interpreter's form of `kernel` (itself under TRITON_INTERPRET=1), made once per JITFunction."""
    if isinstance(kernel, InterpretedFunction):
        return kernel
    form = kernel.__dict__.get("_minitensor_interpreted")
    if form is None:
        form = kernel._minitensor_interpreted = InterpretedFunction(kernel.fn)
    return form


@contextlib.contextmanager
def interpret_nested_jit():
    """A plain JITFunction called inside an interpreted kernel runs interpreted (it raises otherwise). Held
    under the simulator's interpreter lock: one kernel at a time."""
    refuse = JITFunction.__call__
    JITFunction.__call__ = _call_interpreted
    try:
        yield
    finally:
        JITFunction.__call__ = refuse


def _call_interpreted(kernel, *args, **kwargs):
    return interpreted(kernel)(*args, **kwargs)


def divert_launches(launch, takes):
    """Route kernel launches to `launch(kernel, args, kwargs, grid, warmup)`: every JITFunction's, and an
    InterpretedFunction's when `takes(args, kwargs)` (minitensor's own kernels pass interpreter values)."""
    interpret = InterpretedFunction.run
    if getattr(interpret, "_minitensor_divert", False):
        return

    def run_jit(self, *args, grid, warmup, **kwargs):
        return launch(self, args, kwargs, grid, warmup)

    def run_interpreted(self, *args, grid, warmup, **kwargs):
        if takes(args, kwargs):
            return launch(self, args, kwargs, grid, warmup)
        return interpret(self, *args, grid=grid, warmup=warmup, **kwargs)

    run_interpreted._minitensor_divert = True
    JITFunction.run = run_jit
    InterpretedFunction.run = run_interpreted
