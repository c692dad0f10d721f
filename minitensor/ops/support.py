"""Which pointwise ops torch has kernels for on its newer dtypes, with torch's errors for the others.

- uint16, uint32, uint64 are torch's "shell" types: copies, casts, fill, `mul`, `div` (to float), bitwise ops,
  `eq`/`ne`, `pow` with an exponent of 0 or 1, `where`, `floor`/`ceil`/`round`, the float functions (to float32)
  and `sum`/`all`/`any`; torch's CPU refuses the rest (gather and index_select too) with
  NotImplementedError('"add_stub" not implemented for 'UInt32'').
- complex64 and complex128: minitensor computes `add sub mul div pow eq ne logical_and logical_or logical_xor neg
  abs conj where` and the float functions (kernels/complex.py); torch refuses the ordering ops, floor division,
  remainder, bitwise ops, clamp, relu, floor, ceil and round.

Checked once per op signature, with the op's other checks, before any work.
"""
from ..base import dtypes
from .typing import not_implemented_for

# op -> the kernel torch's error names; "{device}" becomes the device type ("cpu", "cuda")
_UINT_BINARY = {"add": "add_stub", "sub": "add_stub", "floor_divide": "div_floor_{device}",
                "remainder": "remainder_{device}", "pow": "pow", "maximum": "maximum_{device}",
                "minimum": "minimum_{device}", "lt": "lt_{device}", "le": "le_{device}", "gt": "gt_{device}",
                "ge": "ge_{device}", "logical_and": "logical_and_{device}", "logical_or": "logical_or_{device}",
                "logical_xor": "logical_xor_{device}", "clamp": "clamp_scalar_{device}"}
_UINT_UNARY = {"neg": "neg_{device}", "abs": "abs_{device}", "relu": "clamp_min_scalar_{device}",
               "bitwise_not": "bitwise_not_{device}", "logical_not": "logical_not_{device}"}
_COMPLEX_BINARY_ERRORS = {"floor_divide": "div_floor_{device}", "remainder": "remainder_{device}",
                          "bitwise_and": "bitwise_and_{device}", "bitwise_or": "bitwise_or_{device}",
                          "bitwise_xor": "bitwise_xor_{device}", "lt": "lt_{device}", "le": "le_{device}",
                          "gt": "gt_{device}", "ge": "ge_{device}"}
_COMPLEX_UNARY_ERRORS = {"relu": "clamp is not supported for complex types",
                         "floor": "floor is not supported for complex inputs",
                         "ceil": "ceil is not supported for complex inputs"}
_UINT_INDEXING = {"gather": "scatter_gather_tensor_{device}", "index_select": "index_select"}


def _refusal(kernel, dtype, device):
    return not_implemented_for(kernel.format(device=device.type), dtype)


def check_binary(name, result, device, exponent=None):
    """Raise torch's error when `name` has no kernel for the `result` dtype (`exponent`: pow's second operand,
    whose values 0 and 1 torch computes without a kernel)."""
    if result in dtypes.SHELL_UINTS and name in _UINT_BINARY:
        if not (name == "pow" and type(exponent) in (int, bool) and exponent in (0, 1)):
            raise _refusal(_UINT_BINARY[name], result, device)
    if not result.is_complex:
        return
    if name in _COMPLEX_BINARY_ERRORS:
        raise _refusal(_COMPLEX_BINARY_ERRORS[name], result, device)
    if name in ("maximum", "minimum"):
        raise RuntimeError(f"{name} not implemented for complex tensors.")
    if name == "clamp":
        raise NotImplementedError("clamp is not supported for complex types")


def check_unary(name, dtype, device):
    """Raise torch's error when the unary op `name` has no kernel for `dtype`."""
    if dtype in dtypes.SHELL_UINTS and name in _UINT_UNARY:
        raise _refusal(_UINT_UNARY[name], dtype, device)
    if not dtype.is_complex:
        return
    if name in _COMPLEX_UNARY_ERRORS:
        raise NotImplementedError(_COMPLEX_UNARY_ERRORS[name])
    if name in ("round", "bitwise_not"):
        raise _refusal(f"{name}_{{device}}", dtype, device)


def check_indexing(name, dtype, device):
    """torch has no gather or index_select kernel for uint16/32/64."""
    if dtype in dtypes.SHELL_UINTS:
        raise _refusal(_UINT_INDEXING[name], dtype, device)
