"""Compile each kernel once per signature and hand back a cheap launch function.

A signature is what changes the generated code: the parameter types (pointer dtypes, 32- or 64-bit ints), the
constexpr values (op, rank class, block size) and which parameters are 16-byte aligned. Kernels are named
"module.function" inside minitensor.kernels, so that finding one never imports the module defining it, nor Triton:
on the GPU a signature compiled by an earlier process comes from the disk cache (`diskcache`), keyed by the
kernel sources, the signature, the device's capability and the installed Triton. Only a miss imports Triton and
compiles. On the simulated device the kernel module is imported and its functions run in the interpreter.

The launch function is `launch(grid_x, grid_y, grid_z, stream, *args)` with raw int pointers.
"""
import functools
import glob
import hashlib
import importlib
import importlib.util
import json
import os
import re
import threading

from minitensor.backends import active_driver
from minitensor.base import cext, diskcache
from minitensor.base.errors import CudaError

from . import cuda_arguments

_compiled = {}
_lock = threading.Lock()
_HERE = os.path.dirname(os.path.abspath(__file__))
_native = None  # the C launcher's module (_launch.c), built or loaded with the first compiled kernel
_native_lock = threading.Lock()

# Ids of mt.cuda.Gate objects that some stream waits on and that are not open yet (cuda/testing.py keeps it). On a
# GPU, loading a kernel waits for the device to go idle, which it never does before such a gate opens.
closed_gates = set()


def get(kernel, device, types, constexprs, aligned=(), num_warps=4, num_stages=3):
    """The launch function of `kernel` ("module.function") for this signature.

    `types` gives a Triton type for each runtime parameter and `constexprs` a value for each constexpr
    parameter; constexpr parameters come last in every minitensor kernel. `aligned` holds the indices of
    pointer parameters known to be 16-byte aligned and int parameters known to be divisible by 16.
    `num_stages` is the depth of the software pipeline of loops over loads (Triton's default is 3)."""
    launch, scratch = get_with_scratch(kernel, device, types, constexprs, aligned, num_warps, num_stages)
    if scratch:
        raise RuntimeError(f"kernel {kernel} needs global scratch memory: launch it through get_with_scratch")
    return launch


def get_with_scratch(kernel, device, types, constexprs, aligned=(), num_warps=4, num_stages=3):
    """(launch, bytes of global scratch per program) for a kernel that may need scratch (tensor descriptors made
    in the kernel): when it is not 0, the launch takes the address of grid-size times that many bytes, from the
    allocator on the launch's stream, as its last argument."""
    key = (kernel, device, types, constexprs, aligned, num_warps, num_stages)
    entry = _compiled.get(key)
    if entry is None:
        with _lock:
            entry = _compiled.get(key)
            if entry is None:
                entry = _compiled[key] = _load(*key)
    return entry


def _load(kernel, device, types, constexprs, aligned, num_warps, num_stages):
    if closed_gates:
        raise RuntimeError(
            f"minitensor: kernel {kernel} is needed for the first time while a stream waits on a closed "
            "mt.cuda.Gate. On a GPU, loading a kernel waits for the device to go idle, which it never would "
            "before the gate opens; run the operation once before closing the gate.")
    driver = active_driver()
    if driver.interprets_kernels:
        function = _function(kernel)
        signature, constexpr_values = _signature(function, types, constexprs)
        return driver.interpret(device, function, _compat().interpreter_arg_wrappers(signature),
                                constexpr_values.values()), 0
    props = driver.properties(device)
    capability = props.major * 10 + props.minor
    name = "kernels-" + _cache_key(kernel, types, constexprs, aligned, (num_warps, num_stages), capability)
    binary = read_entry(diskcache.path(name))
    if binary is None:  # missing or damaged: compiled and written where the cache can be written
        function = _function(kernel)
        binary = _compat().compile_cuda(function, *_signature(function, types, constexprs), aligned, capability,
                                        num_warps, num_stages)
        write_entry(diskcache.writable(name), binary)
    function, context = driver.load_function(device, binary["cubin"], binary["name"], binary["shared"])
    return native().Launcher(function, context, 32 * binary["num_warps"], binary["shared"], binary["kinds"].encode(),
                             binary["name"]), binary["scratch"]


def native():
    """The C launcher's module, built once per Python version and loaded from the disk cache after that."""
    global _native
    if _native is None:
        with _native_lock:
            if _native is None:
                module = cext.load(os.path.join(_HERE, "_launch.c"), "_minitensor_launch")
                module.init(_raise_launch_error, cuda_arguments.plain_argument)
                _native = module
    return _native


def _raise_launch_error(code, kernel):
    """Called by the C launcher when cuLaunchKernel fails."""
    raise CudaError(code, f"{active_driver().error_string(code)} (launching {kernel})")


def _compat():
    """compat.py, which imports Triton: only a compile, or the simulator's interpreter, needs it."""
    from . import compat  # lazy: import cost
    return compat


def _function(kernel):
    module, name = kernel.split(".")
    return getattr(importlib.import_module(f"minitensor.kernels.{module}"), name)


def _signature(function, types, constexprs):
    names = function.arg_names
    if len(names) != len(types) + len(constexprs):
        raise TypeError(f"{function.__name__} takes {len(names)} parameters, got {len(types)} types and "
                        f"{len(constexprs)} constexprs")
    signature = dict(zip(names, types + ("constexpr",) * len(constexprs)))
    return signature, dict(zip(names[len(types):], constexprs))


def _cache_key(kernel, types, constexprs, aligned, options, capability):
    """Everything the binary depends on: the signature, the compile options, the device, and `_sources()`."""
    digest = hashlib.sha256(repr((kernel, types, constexprs, aligned, options, capability)).encode())
    digest.update(_sources())
    return digest.hexdigest()[:32]


@functools.lru_cache(maxsize=1)
def _sources():
    """A digest of what the binaries are built from: every module defining kernels (a line starting with
    `@jit`, or `@gluon.jit`; kernels call @jit helpers across modules), compat.py, and the Triton installation
    (its __init__.py carries the version). Host-side modules (plans, this launcher) are left out: changing them
    recompiles nothing."""
    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(_HERE, "*.py"))):
        with open(path, "rb") as f:
            text = f.read()
        if os.path.basename(path) == "compat.py" or re.search(rb"^@(gluon\.)?jit", text, re.MULTILINE):
            digest.update(text)
    with open(importlib.util.find_spec("triton").origin, "rb") as f:
        digest.update(f.read())
    return digest.digest()


def read_entry(entry):
    """The cached binary and its launch metadata, or None when either file is absent or not whole (each is sealed,
    diskcache.read_sealed: a truncated, empty or swapped cubin is compiled again, never loaded)."""
    cubin, metadata = diskcache.read_sealed(entry + ".cubin"), diskcache.read_sealed(entry + ".json")
    if cubin is None or metadata is None:
        return None
    try:
        binary = json.loads(metadata)
    except ValueError:
        return None
    binary["cubin"] = cubin
    return binary


def write_entry(entry, binary):
    """Write compile_cuda's `binary` as the entry read_entry reads: the cubin first, as the entry counts once its
    .json exists."""
    metadata = {key: value for key, value in binary.items() if key != "cubin"}
    diskcache.write_sealed(entry + ".cubin", binary["cubin"])
    diskcache.write_sealed(entry + ".json", json.dumps(metadata).encode())
