"""Users' CUDA C++ kernels launched on minitensor tensors: `mt.cuda.RawKernel(code, name)` and
`mt.cuda.RawModule(code=...)`, CuPy's names and call, over the compile cache (kernels/cuda_cache.py) and the
loaded modules (kernels/cuda_modules.py).

`kernel(grid, block, args, shared_mem=0, stream=None)`: grid and block are an int or a tuple of up to three;
`args` a tuple whose tensors pass as device pointers and whose Python numbers are typed by the kernel's
signature (a float for a `float` parameter is passed as 32 bits); a numpy scalar must be of the parameter's own
type. The launch is enqueued on `stream`, else on the current stream, like any minitensor op, so it orders with
events and record_stream and a capture records it. Source and options compile once per process (and once per
machine, through the disk cache); a module loads once per device.
"""
import threading
import types

from ..backends import active_driver
from .devices import current_device
from .streams import _tls as _streams_tls, checked_stream

_kernels = None


def source_kernels():
    """kernels' module loader, argument rules and CPU emulation, imported at the first kernel loaded: `import
    minitensor` should not pay for them (about 20 ms), nor a compile (codecache.py imports only the cache)."""
    global _kernels
    if _kernels is None:
        from ..kernels import cuda_arguments, cuda_emulation, cuda_modules  # lazy: import cost
        _kernels = types.SimpleNamespace(arguments=cuda_arguments, emulation=cuda_emulation, modules=cuda_modules)
    return _kernels


class RawModule:
    """A CUDA C++ source of kernels; `get_function(name)` gives one. `name_expressions` name C++ template instances
    to compile ("f<float>"), as CuPy's; C++ (not extern "C") kernels are found by name without them."""

    def __init__(self, code=None, *, options=(), name_expressions=(), backend="nvrtc", kind="cubin"):
        if not isinstance(code, str):
            raise TypeError(f"RawModule takes the CUDA C++ source as `code=`, a str; got {type(code).__name__}")
        if backend != "nvrtc":
            raise ValueError(f"RawModule compiles with backend='nvrtc' only, got {backend!r}")
        if kind not in ("cubin", "ptx"):
            raise ValueError(f"RawModule loads kind 'cubin' or 'ptx', got {kind!r}")
        self.code, self.options, self.kind = code, tuple(options), kind
        self.name_expressions = tuple(name_expressions)
        self._loaded = {}  # device index -> LoadedModule
        self._lock = threading.Lock()

    def get_function(self, name):
        """Kernel `name` of this module (compiled on first use, not here)."""
        return Kernel(self, name)

    def loaded(self, device):
        """The module compiled and loaded on `device` (raises CompileError)."""
        module = self._loaded.get(device)
        if module is None:
            with self._lock:
                module = self._loaded.get(device)
                if module is None:
                    module = self._loaded[device] = source_kernels().modules.LoadedModule(
                        self.code, self.kind, self.options, self.name_expressions, device)
        return module

    def compile(self):
        """Compile and load now, on the current device, rather than at the first launch."""
        self.loaded(current_device())


class Kernel:
    """One kernel of a RawModule, launched as `kernel(grid, block, args, shared_mem=0, stream=None)`."""

    def __init__(self, module, name):
        self.module, self.name = module, name
        self._launch = {}  # device index -> launch function
        self._tls_device = None  # the driver's current_device, bound at the first launch

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None):
        if stream is None:  # current_device() and current_stream_handle(), inline: a launch costs ~4 us
            device = current_device() if self._tls_device is None else self._tls_device()
            handles = _streams_tls.handles
            handle = 0 if handles is None else handles[device]
        else:
            stream = checked_stream(stream, "stream")
            device, handle = stream.device.index, stream.cuda_stream
        launch = self._launch.get(device) or self._launcher(device)
        try:
            launch(grid, block, args, shared_mem, handle)
        except source_kernels().arguments.ArgumentError as e:
            param = self.module.loaded(device).signature(self.name).params[e.index]
            raise TypeError(f"{self.name}: {e} (parameter {param.name!r} is {param.ctype!r})") from None

    def _launcher(self, device):
        launch = self._launch[device] = self.module.loaded(device).launcher(self.name)
        self._tls_device = active_driver().current_device
        return launch

    def compile(self):
        """Compile and load now, on the current device, rather than at the first launch."""
        self._launcher(current_device())


class RawKernel(Kernel):
    """`RawKernel(code, name, options=())`: the kernel `name` of source `code`, CuPy's RawKernel."""

    def __init__(self, code, name, options=(), *, backend="nvrtc"):
        super().__init__(RawModule(code=code, options=options, backend=backend), name)
