"""Every Triton-version-specific detail minitensor relies on, in one place (checked on 3.6; the
interpreter internals used here exist unchanged through 3.9).

- `jit`: kernels are decorated once; on the simulated backend they become interpreted functions, so
  nested @jit helpers are interpreted too (a plain JITFunction refuses to be called outside a kernel).
- the interpreter's argument conventions: pointers and scalars are handed over as the interpreter's own
  one-element tensors, typed as the compiled kernel's signature types them, so index arithmetic overflows
  (or not) exactly as on the GPU, and Triton never inspects (nor imports torch for) a foreign object.
- `compile_cuda`: `triton.compile` with explicit divisibility attributes, returning the cubin and what
  minitensor's own launcher needs to call it; a Gluon kernel (matmul_fma.py) compiles from Gluon's own source
  class (`triton.experimental.gluon`, present with the same names from 3.6 through 3.9); `async_load` is
  Gluon's cp.async copy, which 3.9 renamed from `async_copy_global_to_shared`.
- `widen` and `narrow`: bfloat16 to and from float32 on the bits in the interpreter, whose own conversions lose
  subnormals (and whose bfloat16 compares its raw bits: -0.0 != 0); `narrow` rounds to nearest even, as the GPU.
- `libdevice`: Triton's on the GPU; numpy stand-ins for the few functions used (pow, tanh, rint, hypot, fmod, and
  complex_math.py's exp, log1p, sinh, cosh, atan2, copysign), in the interpreter.
- `quiet_exit_report`: Triton 3.9's nanobind reports objects its C++ side still holds at exit once a Gluon kernel
  compiled (not a leak of the process: nothing in Python refers to them); a compile of one drops that report.
- `dtype`: a Triton type from its name inside a kernel, so host code passes type names as constexprs without
  importing Triton.
"""
import atexit
import os
import subprocess
import sys

import numpy as np
import triton
import triton.language as tl

from minitensor.backends import active_driver

INTERPRETED = active_driver().interprets_kernels

if INTERPRETED:
    from triton.runtime.interpreter import InterpretedFunction, TensorHandle

    def jit(fn):
        return InterpretedFunction(fn)

    class libdevice:
        """The libdevice functions minitensor's kernels use, as numpy: the interpreter cannot call libdevice."""

        @staticmethod
        def _apply(function, *args):
            shaped = next((a for a in args if a.type.is_block()), args[0])  # a scalar broadcasts against a block
            with np.errstate(all="ignore"):
                data = function(*(a.handle.data for a in args)).astype(shaped.handle.data.dtype)
            return tl.core.tensor(TensorHandle(data, shaped.handle.dtype), shaped.type)

        @staticmethod
        def pow(x, y):
            return libdevice._apply(np.power, x, y)

        @staticmethod
        def tanh(x):
            return libdevice._apply(np.tanh, x)

        @staticmethod
        def rint(x):
            return libdevice._apply(np.rint, x)

        @staticmethod
        def hypot(x, y):
            return libdevice._apply(np.hypot, x, y)

        @staticmethod
        def fmod(x, y):
            """x - y * trunc(x / y), exactly (C's fmod): what remainder and floor_divide build on."""
            return libdevice._apply(np.fmod, x, y)

        # complex_math.py's
        exp = staticmethod(lambda x: libdevice._apply(np.exp, x))
        log1p = staticmethod(lambda x: libdevice._apply(np.log1p, x))
        sinh = staticmethod(lambda x: libdevice._apply(np.sinh, x))
        cosh = staticmethod(lambda x: libdevice._apply(np.cosh, x))
        atan2 = staticmethod(lambda y, x: libdevice._apply(np.arctan2, y, x))
        copysign = staticmethod(lambda x, y: libdevice._apply(np.copysign, x, y))
else:
    from triton.language.extra import libdevice

    jit = triton.jit


if INTERPRETED:
    @jit
    def widen(x):
        """A half-type `x` as float32, a bfloat16 by its bits (the interpreter's own conversion turns its subnormals
        into other values); any other `x` as it is."""
        if tl.constexpr(x.dtype.is_bf16()):
            return (x.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
        elif tl.constexpr(x.dtype.is_fp16()):
            return x.to(tl.float32)
        else:
            return x

    @jit
    def narrow(x, ty):
        """float32 `x` converted to `ty`, bfloat16 rounded to nearest even on the bits as the GPU rounds (the
        interpreter's own conversion truncates and flushes subnormals); nan stays nan."""
        if ty == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            half = tl.where(x != x, (bits >> 16) | 0x40, rounded)
            return half.to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return x.to(ty)
else:
    @jit
    def widen(x):
        """A half-type `x` as float32; any other `x` as it is."""
        if tl.constexpr(x.dtype.is_fp16() or x.dtype.is_bf16()):
            return x.to(tl.float32)
        else:
            return x

    @jit
    def narrow(x, ty):
        """float32 `x` converted to `ty` (the GPU rounds bfloat16 to nearest even itself)."""
        return x.to(ty)


def async_load():
    """Gluon's builtin that starts a cp.async copy from global to shared memory, under its name in this Triton."""
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    return getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared


_TYPES = {"i1": tl.int1, "u8": tl.uint8, "i8": tl.int8, "i16": tl.int16, "i32": tl.int32, "i64": tl.int64,
          "u16": tl.uint16, "u32": tl.uint32, "u64": tl.uint64, "fp16": tl.float16, "bf16": tl.bfloat16,
          "fp32": tl.float32, "fp64": tl.float64}


@triton.constexpr_function
def dtype(name):
    """The Triton type named as in kernel signatures ("i32", "fp32"; minitensor's `dtype.triton`)."""
    return _TYPES[name]


_SCALAR_TYPES = {"i32": (np.int32, tl.int32), "i64": (np.int64, tl.int64), "u32": (np.uint32, tl.uint32),
                 "u64": (np.uint64, tl.uint64), "fp32": (np.float32, tl.float32), "fp64": (np.float64, tl.float64)}


def _interpreted_value(np_type, tl_type):
    """A converter from a raw launch argument to the interpreter's one-element tensor of `tl_type`."""
    return lambda value: tl.tensor(TensorHandle(np.array([value], dtype=np_type), tl_type), tl_type)


def interpreter_arg_wrappers(signature):
    """One converter per runtime parameter turning raw launch arguments into what the interpreter needs.

    Pointers are handed over as the interpreter's own pointer tensors: an object with `data_ptr()` would go
    through Triton's native specialisation, which imports torch when it is installed (3.6 through 3.9) and
    copies "GPU tensors" to the host and back (simulated device memory already is host memory)."""
    wrappers = []
    for ty in signature.values():
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            wrappers.append(_interpreted_value(np.uint64, tl.pointer_type(_TYPES[ty[1:]])))
        elif ty in _SCALAR_TYPES:
            wrappers.append(_interpreted_value(*_SCALAR_TYPES[ty]))
        else:
            raise TypeError(f"no interpreter conversion for parameter type {ty}")
    return wrappers


# Triton 3.6 appends two pointer parameters to every compiled kernel: global scratch (tensor descriptors made in
# the kernel live there, a slot per program) and profile scratch (minitensor never profiles). A kernel that needs
# global scratch takes its address as one more launch argument ('p'); the launcher passes null for the rest.
_SCRATCH_KINDS = {False: "nn", True: "pn"}
_SCRATCH_ALIGN = 512  # every allocator block starts on this boundary
_PARAM_KINDS = {"i32": "i", "u32": "u", "i64": "l", "u64": "q", "fp32": "f", "fp64": "d"}


def compile_cuda(kernel, signature, constexprs, aligned, capability, num_warps, num_stages):
    """Compile for a device of this capability and return what the launcher needs: the cubin, the kernel's
    name, its dynamic shared memory, num_warps, a kind code per kernel parameter (see _launch.c), and the bytes of
    global scratch each program needs (0: none, and no scratch argument).

    `aligned` holds the indices of pointer parameters known to be 16-byte aligned and int parameters
    known to be divisible by 16: without that Triton cannot emit 128-bit loads."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    if kernel.is_gluon():
        quiet_exit_report()
    source_class = GluonASTSource if kernel.is_gluon() else ASTSource
    source = source_class(kernel, signature, constexprs=constexprs, attrs=attrs)
    # FMA contraction stays on (3.6's default), named so that 3.9, whose default will flip in 3.10, does not warn
    options = {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": True}
    compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options=options)
    metadata = compiled.metadata
    if metadata.profile_scratch_size or metadata.global_scratch_align > _SCRATCH_ALIGN:
        raise RuntimeError(f"kernel {metadata.name} needs profile scratch or scratch aligned to "
                           f"{metadata.global_scratch_align} bytes, which minitensor does not provide")
    scratch = metadata.global_scratch_size
    kinds = "".join("p" if ty.startswith("*") else _PARAM_KINDS[ty] for ty in signature.values() if ty != "constexpr")
    return {"cubin": compiled.asm["cubin"], "name": metadata.name, "shared": metadata.shared,
            "num_warps": metadata.num_warps, "kinds": kinds + _SCRATCH_KINDS[scratch > 0], "scratch": scratch}


# The lines of nanobind's report, which stderr's filter drops: "nanobind: leaked 4 instances!", one " - leaked ..."
# line per object (" - ... skipped remainder" past ten), then "nanobind: this is likely caused ..." and a link.
_EXIT_FILTER = """
import sys
inside = False
for line in sys.stdin.buffer:
    if line.startswith((b"nanobind: leaked ", b"nanobind: this is likely caused")):
        inside = True
    elif not (inside and line.startswith((b" - ", b"See https://nanobind.readthedocs.io"))):
        inside = False
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""
_quiet_at_exit = False


def quiet_exit_report():
    """Have this process's exit drop nanobind's report of Triton objects still alive, and nothing else.

    Compiling a Gluon kernel makes Triton 3.9's C++ side keep references to some of its Python types (no Python
    object refers to them: gc finds no holder), so nanobind lists them, with their methods, as "leaked" once the
    interpreter is gone: dozens of lines that read as a crash. Triton silences the same report in its own compile
    workers by pointing their stderr at /dev/null at exit; here, from the exit on, stderr goes through a small
    filter process that drops only the report's lines. Registered at the first Gluon compile, so the exit handlers
    registered after it run first, unfiltered; bindings that are not nanobind's (older Triton) need nothing."""
    global _quiet_at_exit
    if _quiet_at_exit or type(triton._C.libtriton.ir.builder).__module__ != "nanobind":
        return
    _quiet_at_exit = True
    atexit.register(_filter_stderr)


def _filter_stderr():
    try:
        sys.stderr.flush()
        read, write = os.pipe()
        subprocess.Popen([sys.executable, "-I", "-S", "-c", _EXIT_FILTER], stdin=read, stdout=2,
                         stderr=subprocess.DEVNULL)
        os.dup2(write, 2)
        os.close(read)
        os.close(write)
    except (OSError, ValueError):  # no executable, no more processes or descriptors: the report shows
        pass
