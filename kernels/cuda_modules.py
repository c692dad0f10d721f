"""A user's CUDA C++ kernels loaded for launching, on either backend (mt.cuda.RawModule and RawKernel sit on this).

The source is compiled by NVRTC through the cache (cuda_cache.py) on both backends, so that errors, keys and
cache entries are the GPU's everywhere. A GPU loads the cubin (or PTX) into the device's context and launches
through the C launcher's RawLauncher. The simulator runs the kernels through the CPU emulation
(cuda_emulation.py) instead, queued on the simulated stream in its order, one block after another.

A launch is `launch(grid, block, args, shared_mem, stream)` (grid and block an int or a tuple of up to three, args
a tuple), each argument typed by the kernel's signature (cuda_arguments.py).
"""
from minitensor.backends import active_driver

from . import cuda_arguments, cuda_cache, cuda_emulation, cuda_signatures
from .launcher import native


class LoadedModule:
    """One source compiled with one set of options and loaded on one device; its kernels by name."""

    def __init__(self, source, kind, options, name_expressions, device):
        self.signatures = cuda_signatures.parse(source)
        cxx_names = tuple(name for name, s in self.signatures.items() if not s.extern_c and not s.template)
        self._driver = driver = active_driver()
        props = driver.properties(device)
        self.artifact, image = cuda_cache.compile_checked(  # the bytes loaded are those checked
            source, kind, options, arch=props.major * 10 + props.minor,
            name_expressions=tuple(dict.fromkeys((*name_expressions, *cxx_names))))
        self.device = device
        self._launchers = {}
        if driver.interprets_kernels:
            self._emulated = cuda_emulation.emulated_module(source, options)
        else:
            self._module, self._context = driver.load_module(device, image + b"\0" * (kind == "ptx"))

    def signature(self, name):
        """The kernel's signature; a clear error where Python cannot launch it."""
        signature = self.signatures.get(name)
        if signature is None:
            raise AttributeError(f"the source defines no __global__ function {name!r}; it defines "
                                 f"{sorted(self.signatures) or 'none'}")
        if signature.kinds is None:
            raise TypeError(f"kernel {name!r} cannot be launched from Python: {_why_not(signature)}")
        return signature

    def launcher(self, name):
        """The launch function of kernel `name`, made once."""
        launch = self._launchers.get(name)
        if launch is None:
            kinds = self.signature(name).kinds
            if self._driver.interprets_kernels:
                launch = _emulated_launch(self._driver, self._emulated.launcher(name), kinds)
            else:
                lowered = self.artifact.lowered_names.get(name, name)
                function = self._driver.module_function(self._module, lowered)
                launch = native().RawLauncher(function, self._context, kinds.encode(), name)
            self._launchers[name] = launch
        return launch


def _why_not(signature):
    if signature.template:
        return "it is a template (launch an extern \"C\" kernel that calls the instance you need)"
    if signature.overloaded:
        return "the name is overloaded (give each kernel its own name)"
    bad = next(p for p in signature.params if p.kind is None)
    return (f"parameter {bad.name!r} is of type {bad.ctype!r}; kernels called from Python take pointers, int, "
            "unsigned, long long, unsigned long long, size_t, float and double")


def _emulated_launch(driver, prepare, kinds):
    """The simulator's launch: checked and its arguments packed now, the emulated kernel run on the stream's
    worker in the stream's order."""

    def launch(grid, block, args, shared, stream):
        run = prepare(*cuda_arguments.dims(grid, "grid"), *cuda_arguments.dims(block, "block"),
                      *cuda_arguments.plain_arguments(kinds, args))
        if run is not None:
            driver.enqueue(stream, run)
    return launch
