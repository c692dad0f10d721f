"""Every Triton-version-specific detail minitensor relies on, in one place (checked on 3.6; the
interpreter internals used here exist unchanged through 3.9).

- `jit`: kernels are decorated once; on the simulated backend they become interpreted functions, so
  nested @jit helpers are interpreted too (a plain JITFunction refuses to be called outside a kernel).
- the interpreter's argument conventions: pointer arguments are objects with `data_ptr()` and a dtype
  name, and scalars are wrapped with the type the compiled kernel's signature gives them, so index
  arithmetic overflows (or not) exactly as on the GPU.
- `compile_cuda`: `triton.compile` with explicit divisibility attributes and a raw-launch closure that
  skips JITFunction.run and the Python launcher wrapper.
"""
import numpy as np
import triton
import triton.language as tl

from minitensor.backends import active_driver

INTERPRETED = active_driver().name == "sim"

if INTERPRETED:
    from triton.runtime.interpreter import InterpretedFunction, TensorHandle

    def jit(fn):
        return InterpretedFunction(fn)
else:
    jit = triton.jit

_TRITON_TO_DTYPE_NAME = {"i1": "bool", "u8": "uint8", "i8": "int8", "i16": "int16", "i32": "int32",
                         "i64": "int64", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32",
                         "fp64": "float64"}
_SCALAR_TYPES = {"i32": (np.int32, tl.int32), "i64": (np.int64, tl.int64), "u32": (np.uint32, tl.uint32),
                 "fp32": (np.float32, tl.float32), "fp64": (np.float64, tl.float64)}


class _Pointer:
    """What the interpreter wants of a tensor argument. The torch-like methods are no-ops: the
    interpreter would copy a GPU tensor to the host and back, but simulated device memory already is
    host memory."""

    __slots__ = ("address", "dtype")

    def __init__(self, address, dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self):
        return self.address

    def untyped_storage(self):
        return self

    def cpu(self):
        return self

    def new_empty(self, *args, **kwargs):
        return self

    def set_(self, *args):
        return self

    def copy_(self, other):
        return self

    def storage_offset(self):
        return 0

    def size(self):
        return ()

    def stride(self):
        return ()


def interpreter_arg_wrappers(signature):
    """One converter per runtime parameter turning raw launch arguments into what the interpreter needs."""
    wrappers = []
    for ty in signature.values():
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            name = _TRITON_TO_DTYPE_NAME[ty[1:]]
            wrappers.append(lambda a, name=name: _Pointer(a, name))
        elif ty in _SCALAR_TYPES:
            np_type, tl_type = _SCALAR_TYPES[ty]
            wrappers.append(lambda a, np_type=np_type, tl_type=tl_type:
                            tl.tensor(TensorHandle(np.array([a], dtype=np_type), tl_type), tl_type))
        else:
            raise TypeError(f"no interpreter conversion for parameter type {ty}")
    return wrappers


def compile_cuda(kernel, signature, constexprs, aligned, capability, num_warps):
    """Compile for the current device and return `launch(gx, gy, gz, stream, *runtime_args)`; the
    C launcher also takes the constexpr values, which the closure appends.

    `aligned` holds the indices of pointer parameters known to be 16-byte aligned and int parameters
    known to be divisible by 16: without that Triton cannot emit 128-bit loads."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    source = ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs)
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": num_warps})
    runner = compiled.run  # builds (or loads) the C launcher and loads the module
    if runner.global_scratch_size or runner.profile_scratch_size:
        raise RuntimeError(f"kernel {compiled.name} needs scratch memory, which minitensor does not provide")
    raw_launch, function, metadata = runner.launch, compiled.function, compiled.packed_metadata
    cooperative, pdl = runner.launch_cooperative_grid, runner.launch_pdl
    tail = tuple(constexprs.values())

    def launch(gx, gy, gz, stream, *args):
        raw_launch(gx, gy, gz, stream, function, cooperative, pdl, None, None, metadata, None, None, None,
                   *args, *tail)
    return launch
