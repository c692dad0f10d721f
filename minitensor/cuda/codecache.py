"""`mt.cuda.codecache`: CUDA C++ source compiled, cached and loaded, torch inductor's CUDACodeCache and AsyncCompile
in minitensor's terms (RawKernel and RawModule, raw_kernels.py, sit on the same cache).

- `compile(source, kind, options=())` -> (artifact path, key, source path), kind "o" or "so" (nvcc: sources with
  host code) or "cubin" or "ptx" (NVRTC: kernels only), for the current device's architecture. "o" and "so" of
  one source share the key and the source path.
- `load(source, kind, options=())` -> (handle, key, source path): for "so" a SharedLibrary whose exported C
  functions are called by name (ctypes arguments); for "cubin" or "ptx" a RawModule whose kernels launch.
- `compile_async` / `load_async`: compiled in worker processes, a concurrent.futures.Future of compile's tuple /
  of load's handle alone (not a tuple, as torch's); `wait(scope)`
  replaces the futures among a dict's values by their results. Errors surface from `.result()`.

A SharedLibrary's runtime-API launches (`kernel<<<grid, block>>>`) go to the legacy default stream of the device's
primary context, the context minitensor uses, so they see minitensor's memory. The legacy stream orders only with
itself: minitensor's side streams are non-blocking. So a call is ordered after the work queued on the current
stream, and the current stream's later work after the call, with two events when the current stream is not the
default one (none when it is). On the simulator the library is the source built for the CPU emulation, whose
launches run during the call, after the current and default streams' work.
"""
import contextlib
import ctypes
import threading

from ..base.errors import CompileError
from ..backends import active_driver
from .devices import current_device, get_device_capability
from .raw_kernels import RawModule, source_kernels
from .streams import Event, current_stream, default_stream

__all__ = ["CompileError", "SharedLibrary", "compile", "compile_async", "load", "load_async", "wait"]

_libraries = {}  # path -> SharedLibrary
_modules = {}  # (source, kind, options) -> RawModule
_lock = threading.Lock()
_cuda_cache = []  # the compile cache's module, once imported
_archs = {}  # device index -> compute capability number


def _cache():
    """kernels/cuda_cache.py, imported at the first compile: a hit in a fresh process pays for nothing more (and a
    hit in memory not for the import statement's lookup either)."""
    if not _cuda_cache:
        from ..kernels import cuda_cache  # lazy: import cost
        _cuda_cache.append(cuda_cache)
    return _cuda_cache[0]


def _arch():
    """The current device's compute capability as a number (90 for sm_90), kept per device."""
    device = current_device()
    arch = _archs.get(device)
    if arch is None:
        major, minor = get_device_capability(device)
        arch = _archs[device] = major * 10 + minor
    return arch


def compile(source, kind, options=()):
    """(artifact path, key, source path) of `source` compiled to `kind`; raises CompileError."""
    artifact = _cache().compile(source, kind, tuple(options), arch=_arch())
    return artifact.path, artifact.key, artifact.source_path


def load(source, kind, options=()):
    """(handle, key, source path): a SharedLibrary for "so", a loaded RawModule for "cubin" and "ptx"."""
    options = tuple(options)
    if kind == "so":  # checked just before it is dlopen'd: a damaged library would kill the process (SIGBUS)
        artifact = _cache().compile_checked(source, kind, options, arch=_arch())[0]
        path = artifact.path
        if active_driver().interprets_kernels:  # the emulation's library, checked as it is built or found
            path = source_kernels().emulation.emulated_library(source, options)
        return _library(path), artifact.key, artifact.source_path
    if kind not in ("cubin", "ptx"):
        raise ValueError(f"load takes kind 'so', 'cubin' or 'ptx', got {kind!r} (an 'o' object file is for "
                         "linking: use compile)")
    with _lock:
        module = _modules.get((source, kind, options))
        if module is None:
            module = _modules[(source, kind, options)] = RawModule(code=source, options=options, kind=kind)
    artifact = module.loaded(current_device()).artifact
    return module, artifact.key, artifact.source_path


def compile_async(source, kind, options=()):
    """A Future of compile()'s result, compiled in a worker process."""
    future = _cache().compile_async(source, kind, tuple(options), arch=_arch())
    return _then(future, lambda artifact: (artifact.path, artifact.key, artifact.source_path))


def load_async(source, kind, options=()):
    """A Future of load()'s handle: compiled in a worker process, loaded here once compiled."""
    future = _cache().compile_async(source, kind, tuple(options), arch=_arch())
    return _then(future, lambda artifact: load(source, kind, options)[0])


def wait(scope):
    """Replace every Future among the values of dict `scope` by its result (torch's AsyncCompile.wait)."""
    _cache().wait(scope)


def _then(future, step):
    """A Future of step(future's result), or of its error."""
    outcome = type(future)()

    def finish(done):
        try:
            outcome.set_result(step(done.result()))
        except BaseException as e:
            outcome.set_exception(e)
    future.add_done_callback(finish)
    return outcome


def _library(path):
    with _lock:
        library = _libraries.get(path)
        if library is None:
            library = _libraries[path] = SharedLibrary(path)
    return library


class SharedLibrary:
    """A compiled .so, each exported C function callable by name with ctypes arguments (torch's DLLWrapper): a
    non-zero return raises RuntimeError. Calls are ordered with the current stream (see the module's words)."""

    def __init__(self, path):
        self.path = path
        self._library = ctypes.CDLL(path)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        function = getattr(self._library, name)

        def call(*args):
            with _legacy_stream_order():
                status = function(*args)
            if status != 0:
                raise RuntimeError(f"Error in function: {name} (it returned {status})")
        call.__name__ = name
        self.__dict__[name] = call
        return call


@contextlib.contextmanager
def _legacy_stream_order():
    """The legacy default stream after the current stream's work, and the current stream after the call."""
    current = current_stream()
    if active_driver().interprets_kernels:
        current.synchronize()
        default_stream().synchronize()
        yield
        return
    if current.cuda_stream == 0:
        yield
        return
    legacy = default_stream()
    before = Event()
    before.record(current)
    legacy.wait_event(before)
    yield
    after = Event()
    after.record(legacy)
    current.wait_event(after)
