"""Compile each kernel once per signature and hand back a cheap launch function.

A signature is what changes the generated code: the parameter types (pointer dtypes, 32- or 64-bit
ints), the constexpr values (op, rank class, block size) and which pointers are 16-byte aligned. The
launch function takes raw int pointers and the stream handle; nothing on that path builds cache keys
from tensors or goes through JITFunction.run.
"""
import threading

from minitensor.backends import active_driver

_compiled = {}
_lock = threading.Lock()


def get(kernel, device, types, constexprs, aligned=(), num_warps=4):
    """The launch function `launch(gx, gy, gz, stream, *args)` of `kernel` for this signature.

    `types` gives a Triton type for each runtime parameter and `constexprs` a value for each constexpr
    parameter; constexpr parameters come last in every minitensor kernel."""
    key = (kernel, device, types, constexprs, aligned, num_warps)
    launch = _compiled.get(key)
    if launch is None:
        with _lock:
            launch = _compiled.get(key)
            if launch is None:
                launch = _compiled[key] = _compile(kernel, device, types, constexprs, aligned, num_warps)
    return launch


def _compile(kernel, device, types, constexprs, aligned, num_warps):
    names = kernel.arg_names
    if len(names) != len(types) + len(constexprs):
        raise TypeError(f"{kernel.__name__} takes {len(names)} parameters, got {len(types)} types and "
                        f"{len(constexprs)} constexprs")
    signature = dict(zip(names, types + ("constexpr",) * len(constexprs)))
    constexpr_map = dict(zip(names[len(types):], constexprs))
    return active_driver().compile(device, kernel, signature, constexpr_map, aligned, num_warps)
