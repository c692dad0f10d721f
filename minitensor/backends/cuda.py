"""`mt.backends.cuda`, torch.backends.cuda: the flags that choose how matrix products compute, with torch's
names, defaults, get/set semantics and errors. The kernels layer reads them at each product (kernels/matmul_plans.py).

Two APIs set float32's precision, as in torch: the legacy one (`set_float32_matmul_precision` "highest" / "high"
/ "medium", `matmul.allow_tf32`) and the new one (`matmul.fp32_precision`: "ieee", "tf32" or "none", its default,
which computes as "ieee"). Each legacy setter also sets the new value; a legacy getter raises RuntimeError where
the new API has since been set to something it cannot express ("mix of the legacy and new APIs"). The products
follow the new API: tf32 for "tf32", IEEE float32 otherwise. (torch's generic `torch.backends.fp32_precision`,
which a matmul's "none" inherits, is not here: minitensor has no other fp32 operation for it to govern.)

`preferred_blas_library` keeps torch's choice and answers as torch does, but minitensor's products always run its
own Triton kernels: there is no cuBLAS, cuBLASLt or CK to prefer.
"""
import threading
import warnings

_LEGACY = ("highest", "high", "medium")
_PRECISIONS = ("ieee", "tf32", "none")
_MIX = ("Current status indicate that you have used mix of the legacy and new APIs to set the {what}. We "
        "suggest only using the new API ({new}).")


class BlasBackend(int):
    """torch._C._BlasBackend's values (Default, Cublas, Cublaslt, Ck: 0 to 3), printed as torch prints them. A
    plain int subclass: `enum` would cost `import minitensor` a module for four names."""

    def __repr__(self):
        return f"<_BlasBackend.{_BLAS_MEMBERS[self]}: {int(self)}>"

    def __str__(self):
        return f"_BlasBackend.{_BLAS_MEMBERS[self]}"


_BLAS_MEMBERS = ("Default", "Cublas", "Cublaslt", "Ck")
for _value, _member in enumerate(_BLAS_MEMBERS):
    setattr(BlasBackend, _member, BlasBackend(_value))
del _value, _member
_BLAS_NAMES = {"default": BlasBackend.Default, "cublas": BlasBackend.Cublas, "hipblas": BlasBackend.Cublas,
               "cublaslt": BlasBackend.Cublaslt, "hipblaslt": BlasBackend.Cublaslt, "ck": BlasBackend.Ck}


class _State:
    """Process-wide, as torch's at::Context: one lock, values read without it."""
    lock = threading.Lock()
    legacy = "highest"
    matmul = "none"
    fp16_reduction = (True, True)  # (allow reduced precision, allow it in split-K)
    bf16_reduction = (True, True)
    fp16_accumulation = False
    blas = BlasBackend.Cublas
    version = 0  # counts changes: ops keep fast paths per flag setting


def _check_bool(value, what):
    if not isinstance(value, bool):
        raise RuntimeError(f"{what} expects a bool, but got {type(value).__name__}")
    return value


def _check_precision(value):
    if not isinstance(value, str):
        raise TypeError(f"fp32_precision must be a str, not {type(value).__name__}")
    if value not in _PRECISIONS:
        raise RuntimeError(f"Unknown precision: {value}")
    return value


def version():
    """A number that changes whenever a flag that changes how products compute does."""
    return _State.version


def use_tf32():
    """Whether float32 products compute in tf32 now."""
    return _State.matmul == "tf32"


def _legacy_consistent():
    return use_tf32() == (_State.legacy != "highest")


def set_float32_matmul_precision(precision):
    """torch.set_float32_matmul_precision: "highest" (IEEE float32), "high" or "medium" (both tf32 here)."""
    if not isinstance(precision, str):
        raise RuntimeError(f"set_float32_matmul_precision expects a str, but got {type(precision).__name__}")
    if precision not in _LEGACY:
        warnings.warn(f"{precision} is not one of 'highest', 'high', or 'medium'; the current "
                      "set_float32_matmul_precision call has no effect.", UserWarning, stacklevel=2)
        return
    with _State.lock:
        _State.version += 1
        _State.legacy = precision
        _State.matmul = "ieee" if precision == "highest" else "tf32"


def get_float32_matmul_precision():
    if not _legacy_consistent():
        raise RuntimeError("minitensor is checking the matmul precision without a specific backend name, " +
                           _MIX.format(what="matmul precision", new="mt.backends.cuda.matmul.fp32_precision"))
    return _State.legacy


def _parse_reduction(value, name):
    """torch's reading of allow_{fp16,bf16}_reduced_precision_reduction: a bool or one or two bools."""
    if isinstance(value, bool):
        return value, True
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} expects a bool or a tuple/list of bools, but got {type(value)!r}")
    if not value:
        raise TypeError(f"{name} expects at least one boolean argument")
    if len(value) > 2:
        raise TypeError(f"{name} expects at most two boolean arguments")
    for item, which in zip(value, ("allow_reduced_precision", "allow_splitk")):
        if not isinstance(item, bool):
            raise TypeError(f"{name} expects a bool for {which}, but got {type(item)!r}")
    allow, split_k = value[0], value[1] if len(value) == 2 else True
    if allow and not split_k:
        raise RuntimeError("allow_splitk=False is not supported when reduced precision reductions are enabled")
    return allow, split_k


class MatmulFlags:
    """`mt.backends.cuda.matmul` (torch's cuBLASModule): its attributes are the flags, read and set as torch's."""

    def __getattr__(self, name):
        if name == "allow_tf32":
            if not _legacy_consistent():
                raise RuntimeError("minitensor is checking whether tf32 is enabled for matmul, " + _MIX.format(
                    what="TF32 status for matmul", new="mt.backends.cuda.matmul.fp32_precision"))
            return use_tf32()
        if name == "fp32_precision":
            return _State.matmul
        reductions = {"fp16": _State.fp16_reduction, "bf16": _State.bf16_reduction}
        for kind, (allow, split_k) in reductions.items():
            if name == f"allow_{kind}_reduced_precision_reduction":
                return allow
            if name == f"allow_{kind}_reduced_precision_reduction_split_k":
                return split_k
        if name == "allow_fp16_accumulation":
            return _State.fp16_accumulation
        raise AttributeError("Unknown attribute " + name)

    def __setattr__(self, name, value):
        with _State.lock:
            _State.version += 1
            if name == "allow_tf32":
                allow = _check_bool(value, "set_allow_tf32_cublas")
                _State.legacy, _State.matmul = ("high", "tf32") if allow else ("highest", "ieee")
            elif name == "fp32_precision":
                _State.matmul = _check_precision(value)
            elif name == "allow_fp16_reduced_precision_reduction":
                _State.fp16_reduction = _parse_reduction(value, name)
            elif name == "allow_bf16_reduced_precision_reduction":
                _State.bf16_reduction = _parse_reduction(value, name)
            elif name == "allow_fp16_accumulation":
                _State.fp16_accumulation = _check_bool(value, "set_allow_fp16_accumulation_cublas")
            else:
                raise AttributeError("Unknown attribute " + name)


matmul = MatmulFlags()


def fp16_accumulation():
    return _State.fp16_accumulation


def preferred_blas_library(backend=None):
    """torch.backends.cuda.preferred_blas_library: set (a name or a BlasBackend) and return the preference;
    "default" settles on cuBLAS, as torch does on CUDA. minitensor keeps the answer only: its kernels are Triton's."""
    if backend is not None:
        if isinstance(backend, str):
            if backend not in _BLAS_NAMES:
                raise RuntimeError(f"Unknown input value. Choose from: {', '.join(_BLAS_NAMES)}.")
            backend = _BLAS_NAMES[backend]
        elif not isinstance(backend, BlasBackend):
            raise RuntimeError("Unknown input value type.")
        _State.blas = BlasBackend.Cublas if backend == BlasBackend.Default else backend
    return _State.blas
