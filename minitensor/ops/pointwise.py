"""Pointwise ops (unary, binary, where, clamp) with broadcasting, Python scalars, torch's type promotion
and `out=`; in-place forms are the same ops with out=self.

Each call's checks and typing run once per signature: the operands' dtypes, shapes, strides and devices
(or, for a Python number, its type). The result is a `run` function (runs.py) kept in `_runs`, so a repeated
call is one dict lookup, an allocation and one kernel launch. cuda tensors run Triton kernels
(kernels/plans.py); CPU tensors run numpy, in the same compute types.
"""
import warnings

import numpy as np

from ..base import dtypes
from ..core import fields
from ..core.alloc import empty
from ..core.host_arrays import checked_scalar, numpy_values, numpy_view, to_storage_values
from ..core.layout import layout_of
from ..core.shapes import OVERLAP, broadcast_shapes, overlaps_itself
from . import support
from .runs import cuda_run, number_converter
from .typing import (check_cast, check_out_shape, common_device, compute_type, not_implemented, operand_value,
                     result_type)


# name -> kernel op code (kernels/elementwise.py `_binary_op`) and numpy function
_BINARY = {
    "add": (0, np.add), "sub": (1, np.subtract), "mul": (2, np.multiply), "div": (3, np.true_divide),
    "bitwise_or": (4, np.bitwise_or), "bitwise_and": (5, np.bitwise_and), "bitwise_xor": (6, np.bitwise_xor),
    "floor_divide": (7, np.floor_divide), "remainder": (8, np.remainder), "pow": (9, None),
    "maximum": (10, np.maximum), "minimum": (11, np.minimum),
    "eq": (12, np.equal), "ne": (13, np.not_equal), "lt": (14, np.less), "le": (15, np.less_equal),
    "gt": (16, np.greater), "ge": (17, np.greater_equal),
    "logical_and": (18, np.logical_and), "logical_or": (19, np.logical_or), "logical_xor": (20, np.logical_xor),
}
_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor"}  # bool results
_BITWISE = {"bitwise_or", "bitwise_and", "bitwise_xor"}
_BOOL_FORMS = {"add": "bitwise_or", "mul": "bitwise_and", "maximum": "bitwise_or", "minimum": "bitwise_and"}

# name -> kernel op code (`_unary_op`) and numpy function
_UNARY = {
    "neg": (0, np.negative), "abs": (1, np.abs), "exp": (2, np.exp), "log": (3, np.log), "sqrt": (4, np.sqrt),
    "rsqrt": (5, lambda x: 1 / np.sqrt(x)), "sin": (6, np.sin), "cos": (7, np.cos), "tanh": (8, np.tanh),
    "sigmoid": (9, lambda x: 1 / (1 + np.exp(-x))), "relu": (10, lambda x: np.where(x < 0, x.dtype.type(0), x)),
    "floor": (11, np.floor), "ceil": (12, np.ceil), "round": (13, np.rint), "bitwise_not": (14, np.invert),
    "logical_not": (15, np.logical_not), "conj": (16, np.conjugate),  # conj: complex only (kernels/complex.py)
}
_FLOAT_FUNCTIONS = {"exp", "log", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid"}
_HALF = (dtypes.float16, dtypes.bfloat16)
_WHERE, _CLAMP = 0, 1

# Named forms: Tensor methods with their in-place twins (tensor.py) and mt.* functions with out= (FUNCTIONS).
BINARY_METHODS = ("mul", "div", "floor_divide", "remainder", "pow", "maximum", "minimum", "bitwise_and",
                  "bitwise_or", "bitwise_xor", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
                  "logical_xor")
UNARY_METHODS = tuple(name for name in _UNARY if name not in ("logical_not", "conj"))
ALIASES = {"multiply": "mul", "divide": "div", "true_divide": "div", "greater": "gt", "less": "lt",
           "greater_equal": "ge", "less_equal": "le", "not_equal": "ne", "negative": "neg", "absolute": "abs"}

_runs = {}  # signature -> run(*operands, out) for cuda ops already checked once


def _key(x):
    """What an operand contributes to an op's signature: its layout number for a tensor (layout.py), its
    type for a number."""
    if type(x) is fields.Tensor:
        return x._layout or layout_of(x)
    return type(x)


# ---------------------------------------------------------------------------------------------- entry points
def binary(name, a, b, out=None, alpha=1, comparison=False):
    """`a (op) b`; into `out` when given (the in-place forms pass out=a). `comparison`: called as a comparison
    operator, which answers NotImplemented for an operand that is neither a tensor nor a number."""
    if alpha == 1:
        Tensor = fields.Tensor  # the signature, as _key builds it, inline: this is the hottest path
        key = (name, (a._layout or layout_of(a)) if type(a) is Tensor else type(a),
               (b._layout or layout_of(b)) if type(b) is Tensor else type(b),
               None if out is None else out._layout or layout_of(out))
        run = _runs.get(key)
        if run is not None:
            return run(a, b, out)
    else:
        key = None
        b = _apply_alpha(b, alpha, a)
    Tensor = fields.Tensor
    if comparison and not isinstance(b, (Tensor, bool, int, float, np.generic)):
        return NotImplemented
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TypeError(f"{name}(): expected at least one Tensor operand")
    a, b = operand_value(a), operand_value(b)
    if out is not None:  # torch checks devices, the shape, the cast, then whether the op supports the dtype
        common_device([x for x in (a, b) if isinstance(x, Tensor)], out)
        check_out_shape((a, b), out)
    op, result, compute, out_dtype = _binary_types(name, a, b, out)
    return _dispatch(key, ("binary", op), (a, b), result, compute, out_dtype, out)


def binary_method(name, reflected=False, comparison=False):
    """A Tensor method for `name` (`__add__`, `__radd__`, `t.mul(u)`, ...): `binary`'s signature lookup inline,
    one call less on the hottest path; `reflected` for the `__r*__` forms, which compute `other (op) self`."""
    get = _runs.get

    def method(self, other):
        Tensor = fields.Tensor
        if type(self) is Tensor:
            key_self = self._layout or layout_of(self)
            key_other = (other._layout or layout_of(other)) if type(other) is Tensor else type(other)
            run = get((name, key_other, key_self, None) if reflected else (name, key_self, key_other, None))
            if run is not None:
                return run(other, self, None) if reflected else run(self, other, None)
        if reflected:
            return binary(name, other, self, comparison=comparison)
        return binary(name, self, other, comparison=comparison)
    return method


def unary_method(name):
    """A Tensor method for `name` (`t.exp()`, `-t`): `unary`'s signature lookup inline."""
    get = _runs.get

    def method(self):
        if type(self) is fields.Tensor:
            run = get((name, self._layout or layout_of(self), None))
            if run is not None:
                return run(self, None)
        return unary(name, self)
    return method


def power(a, b, out=None):
    """`a ** b`: an integer exponent's sign matters to the checks, but not to the cached signature."""
    if type(b) is int and b < 0 and isinstance(a, fields.Tensor) and a.dtype.category < dtypes.FLOAT:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if type(b) in (int, bool) and isinstance(a, fields.Tensor) and a.dtype in dtypes.SHELL_UINTS:
        support.check_binary("pow", a.dtype, a.device, b)  # torch computes only the exponents 0 and 1
    return binary("pow", a, b, out)


def add(input, other, *, alpha=1, out=None):
    """mt.add: input + alpha * other."""
    return binary("add", input, other, out=out, alpha=alpha)


def sub(input, other, *, alpha=1, out=None):
    """mt.sub: input - alpha * other."""
    return binary("sub", input, other, out=out, alpha=alpha)


def unary(name, x, out=None):
    Tensor = fields.Tensor
    key = (name, (x._layout or layout_of(x)) if type(x) is Tensor else type(x),
           None if out is None else out._layout or layout_of(out))
    run = _runs.get(key)
    if run is not None:
        return run(x, out)
    if not isinstance(x, fields.Tensor):
        raise TypeError(f"{name}(): argument 'input' must be Tensor, not {type(x).__name__}")
    op, result, compute = _unary_types(name, x.dtype, x.device, out)
    return _dispatch(key, ("unary", op), (x,), result, compute, result, out)


def where(condition, input, other, *, out=None):
    """mt.where and Tensor.where: `input` where `condition` holds, else `other`."""
    Tensor = fields.Tensor
    key = ("where", (condition._layout or layout_of(condition)) if type(condition) is Tensor else type(condition),
           (input._layout or layout_of(input)) if type(input) is Tensor else type(input),
           (other._layout or layout_of(other)) if type(other) is Tensor else type(other),
           None if out is None else out._layout or layout_of(out))
    run = _runs.get(key)
    if run is not None:
        return run(condition, input, other, out)
    if not isinstance(condition, Tensor):
        raise TypeError(f"where(): argument 'condition' must be Tensor, not {type(condition).__name__}")
    if condition.dtype is dtypes.uint8:  # as torch: accepted, with its deprecation warning; not cached
        warnings.warn("where received a uint8 condition tensor. This behavior is deprecated (in torch too). Use a "
                      "boolean condition instead.", UserWarning, stacklevel=2)
        condition, key = binary("ne", condition, 0), None
    elif condition.dtype is not dtypes.bool_:
        raise RuntimeError(f"where expected condition to be a boolean tensor, but got a tensor with dtype "
                           f"{dtypes.TORCH_NAMES[condition.dtype.name]}")
    input, other = operand_value(input), operand_value(other)
    cuda_operand = next((x for x in (input, other, out) if isinstance(x, Tensor) and x.device.type == "cuda"), None)
    if condition.device.type == "cpu" and condition.dim() == 0 and cuda_operand is not None:
        condition, key = condition.to(cuda_operand.device), None  # as torch; not cached: it moves every call
    result = result_type(input, other)
    return _dispatch(key, ("ternary", _WHERE), (condition, input, other), result, compute_type(result), result, out)


def clamp(input, min=None, max=None, *, out=None):
    """mt.clamp and Tensor.clamp: `input` limited to [min, max] (either may be None, not both)."""
    key = ("clamp", _key(input), _key(min), _key(max), None if out is None else _key(out))
    run = _runs.get(key)
    if run is not None:
        return run(input, min, max, out)
    if not isinstance(input, fields.Tensor):
        raise TypeError(f"clamp(): argument 'input' must be Tensor, not {type(input).__name__}")
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    bounds = [operand_value(v) for v in (min, max) if v is not None]
    result = result_type(input, *bounds)
    if result is dtypes.bool_:
        raise RuntimeError(not_implemented("clamp", input.device, dtypes.bool_))
    support.check_binary("clamp", result, input.device)
    return _dispatch(key, ("ternary", _CLAMP), (input, min, max), result, compute_type(result), result, out)


# ---------------------------------------------------------------------------------------------- typing
def _binary_types(name, a, b, out):
    """(kernel op, result dtype, compute dtype, output dtype) of `a (name) b`, or torch's error."""
    Tensor = fields.Tensor
    result = result_type(a, b)
    device = next(x.device for x in (a, b) if isinstance(x, Tensor))
    bools = [isinstance(x, bool) or (isinstance(x, Tensor) and x.dtype is dtypes.bool_) for x in (a, b)]
    if name == "sub" and all(bools):
        raise RuntimeError("Subtraction, the `-` operator, with two bool tensors is not supported. Use the `^` or "
                           "`logical_xor()` operator instead.")
    if name == "sub" and any(bools):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are trying "
                           "to invert a mask, use the `~` or `logical_not()` operator instead.")
    if name == "div" and result.category < dtypes.FLOAT:
        result = dtypes.default_float
    if out is not None and name not in _COMPARISONS:
        check_cast(result, out)
    support.check_binary(name, result, device, b)
    if name in _BITWISE and result.is_floating_point:
        raise RuntimeError(not_implemented(name, device, result))
    if name == "pow" and result is dtypes.bool_ and type(b) is bool:
        name = "ge"  # torch's pow copies x for an exponent of 1 and gives 1 for 0: for bools, x ** e is x >= e
    if name in ("floor_divide", "remainder", "pow") and result is dtypes.bool_:
        raise RuntimeError(not_implemented(name, device, result))
    if name == "pow" and result.category < dtypes.FLOAT and isinstance(b, int) and b < 0:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if result is dtypes.bool_ and name in _BOOL_FORMS:
        name = _BOOL_FORMS[name]
    out_dtype = dtypes.bool_ if name in _COMPARISONS else result
    # torch's remainder takes its operands, numbers too, in a half result's own type (then fmod in float32); its
    # other ops take numbers in float32
    compute = result if name == "remainder" and result in _HALF else compute_type(result)
    return _BINARY[name][0], result, compute, out_dtype


def _unary_types(name, dtype, device, out=None):
    """(kernel op, result dtype, compute dtype) of `name(x)` for an x of `dtype`, or torch's error. The ops
    other than the float functions keep the dtype (complex abs gives the real type), and so must `out` (torch
    checks it before the dtype)."""
    support.check_unary(name, dtype, device)
    if dtype.is_complex:
        result = dtype.component if name == "abs" else dtype
        if out is not None and out.dtype is not result:
            names = dtypes.TORCH_NAMES
            raise RuntimeError(f"Found dtype {names[out.dtype.name]} but expected {names[result.name]}")
        return _UNARY[name][0], result, dtype
    if name in _FLOAT_FUNCTIONS:
        result = dtype if dtype.is_floating_point else dtypes.default_float
        return _UNARY[name][0], result, compute_type(result)
    if name == "neg" and dtype is dtypes.bool_:
        raise RuntimeError("Negation, the `-` operator, on a bool tensor is not supported. If you are trying to "
                           "invert a mask, use the `~` or `logical_not()` operator instead.")
    if out is not None and out.dtype is not dtype:
        names = dtypes.TORCH_NAMES
        raise RuntimeError(f"Found dtype {names[out.dtype.name]} but expected {names[dtype.name]}")
    if dtype is dtypes.bool_:
        if name == "bitwise_not":
            return _UNARY["logical_not"][0], dtype, dtype
        if name == "relu":
            raise RuntimeError("Boolean inputs not supported for relu")
        raise RuntimeError(f'"{name}" not implemented for \'Bool\'')
    if name == "bitwise_not" and dtype.is_floating_point:
        raise RuntimeError(f'"bitwise_not" not implemented for \'{dtypes.TORCH_NAMES[dtype.name]}\'')
    return _UNARY[name][0], dtype, compute_type(dtype)


def _apply_alpha(b, alpha, a):
    """alpha * b, with alpha checked against the result type as torch checks it; a number product wraps to
    64 bits, as it does in torch's kernel."""
    Tensor = fields.Tensor
    kinds = [x.dtype for x in (a, b) if isinstance(x, Tensor)]
    if isinstance(alpha, float) and all(not k.is_floating_point for k in kinds):
        raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
    if kinds:
        checked_scalar(result_type(operand_value(a), operand_value(b)), alpha)
    if isinstance(b, Tensor):
        return binary("mul", b, alpha)
    product = b * alpha
    return (product + 2**63) % 2**64 - 2**63 if type(product) is int else product


# ---------------------------------------------------------------------------------------------- running
def _dispatch(key, kernel, operands, result, compute, out_dtype, out):
    """Check devices and shapes, then run on the CPU or build, remember and call the cuda fast path.
    `operands` may hold tensors, Python numbers and None (a clamp bound not given)."""
    Tensor = fields.Tensor
    if compute is not result and not compute.is_complex and any(
            isinstance(x, Tensor) and x.dtype not in (result, dtypes.bool_) for x in operands):
        # a half-type result: torch rounds tensor operands of other types to it before computing in float32
        operands = tuple(x.to(result) if isinstance(x, Tensor) and x.dtype is not dtypes.bool_ else x
                         for x in operands)
        key = None
    tensors = [x for x in operands if isinstance(x, Tensor)]
    device = common_device(tensors, out)
    shape = broadcast_shapes(*(x._shape for x in tensors))
    if out is not None:
        check_out_shape(tensors, out)
        if overlaps_itself(out._shape, out._stride):  # a layout's property: checking once per signature holds
            raise RuntimeError(OVERLAP)
        check_cast(out_dtype, out)
        if out.dtype is not out_dtype and out_dtype in (dtypes.float16, dtypes.bfloat16):
            # torch rounds to the result type before widening into out: go through a result-typed temporary
            return out.copy_(_dispatch(None, kernel, operands, result, compute, out_dtype, None))
        out_dtype = out.dtype
    stored = _stored_numbers(kernel, result)
    if device.type == "cpu":
        if out is None:
            out = empty(shape, out_dtype, device)
        if out.numel():
            _run_numpy(kernel, operands, shape, result, compute, out, stored)
        return out
    run = cuda_run(kernel, operands, shape, result, compute, out_dtype, device, out, stored)
    if key is not None and all(x.device == device for x in tensors):  # a 0-d CPU operand changes per call
        _runs[key] = run
    return run(*operands, out)


def _stored_numbers(kernel, result):
    """The positions of the number operands torch checks against the result type, as values it stores: where's
    and clamp's, and pow's exponent unless the result is float32 or float64 (which take it as a double). Other
    numbers wrap (runs.number_converter)."""
    if kernel[0] == "ternary":
        return (1, 2)
    if kernel == ("binary", _BINARY["pow"][0]) and result not in (dtypes.float32, dtypes.float64):
        return (1,)
    return ()


def _run_numpy(kernel, operands, shape, result, compute, out, stored):
    """The CPU side: numpy in the same compute type as the kernels, numbers converted as the kernels get them."""
    Tensor = fields.Tensor
    family, op = kernel
    np_compute = np.float32 if compute is dtypes.bfloat16 else compute.np

    def values(i, np_type=np_compute):
        x = operands[i]
        if isinstance(x, Tensor):
            v = numpy_values(x)
        else:  # a number reaches a half compute type as the kernel's float32 scalar does: rounded to float32
            v = np.array(number_converter(compute, result, i in stored)(x))
            v = v.astype(np.float32) if compute in _HALF else v
        if compute is dtypes.bfloat16 and np_type is np_compute:  # held in float32, rounded to bfloat16's values
            v = dtypes.bf16_bits_to_f32(dtypes.f32_to_bf16_bits(v.astype(np.float32)))
        v = v.astype(np_type, copy=False)
        return np.broadcast_to(v, shape) if isinstance(x, Tensor) else v

    with np.errstate(all="ignore"):
        if family == "unary":
            function = next(f for o, f in _UNARY.values() if o == op)
            rounding = op in (_UNARY["floor"][0], _UNARY["ceil"][0], _UNARY["round"][0])
            r = values(0) if rounding and not compute.is_floating_point else function(values(0))
        elif family == "binary" and compute.is_complex and op == _BINARY["pow"][0]:
            r = _complex_pow(values(0), values(1), *(not isinstance(x, Tensor) for x in operands))
        elif family == "binary":
            a, b = values(0), values(1)
            r = _numpy_binary(op, a, b, compute)
        elif op == _WHERE:
            r = np.where(values(0, np.bool_), values(1), values(2))
        else:
            r = values(0)
            if operands[1] is not None:
                r = np.maximum(r, values(1))
            if operands[2] is not None:
                r = np.minimum(r, values(2))
        r = np.asarray(r)
        if r.dtype != np.bool_:
            r = r.astype(np_compute, copy=False)
    numpy_view(out)[...] = to_storage_values(r, out.dtype)


def _numpy_binary(op, a, b, compute):
    if op == _BINARY["remainder"][0] and compute.is_floating_point:
        return _float_remainder(a, b)
    if op == _BINARY["pow"][0]:
        if compute.is_floating_point:
            return np.power(a, b)
        return _int_pow(a, b)
    if op in (_BINARY["floor_divide"][0], _BINARY["remainder"][0]) and not compute.is_floating_point:
        if np.any(b == 0):
            raise RuntimeError("ZeroDivisionError")
    function = next(f for o, f in _BINARY.values() if o == op)
    return function(a, b)


def _float_remainder(a, b):
    """torch's float remainder (np.remainder differs in a zero's sign): fmod, then the divisor added where the signs
    differ; half types in float32, as the kernels (elementwise.py `_remainder`)."""
    if a.dtype == np.float16:
        a, b = a.astype(np.float32), b.astype(np.float32)
    r = np.fmod(a, b)
    return np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


def _int_pow(a, b):
    """Integer powers as torch computes them: wrapping, and for negative exponents 1, +-1 or 0."""
    a, b = np.broadcast_arrays(a, b)
    r = np.power(a, np.where(b < 0, 0, b))
    unit = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 1, -1, 1), 0)).astype(a.dtype)
    return np.where(b < 0, unit, r)


def _complex_pow(a, b, a_is_number, b_is_number):
    """Complex powers as torch's CPU kernels and kernels/complex_math.py compute them: exp(b log a) (cpow), except
    that a number exponent of 0, 1, 2, 3, -2, 0.5, -0.5 or -1 gives 1 or the product, root or quotient it stands
    for, and a number base of 1 gives 1."""
    r = np.exp(b * np.log(a))
    if a_is_number and a == 1:
        return np.ones_like(r)
    if b_is_number and b.imag == 0 and b.real.item() in _SPECIAL_EXPONENTS:
        return np.broadcast_to(_SPECIAL_EXPONENTS[b.real.item()](a), r.shape)
    return r


_SPECIAL_EXPONENTS = {0: np.ones_like, 1: lambda a: a, 2: lambda a: a * a, 3: lambda a: a * a * a,
                      -2: lambda a: 1 / (a * a), 0.5: np.sqrt, -0.5: lambda a: 1 / np.sqrt(a), -1: lambda a: 1 / a}


def _binary_function(name):
    def function(input, other, *, out=None):
        return power(input, other, out) if name == "pow" else binary(name, input, other, out=out)
    function.__name__ = function.__qualname__ = name
    return function


def _unary_function(name):
    def function(input, *, out=None):
        return unary(name, input, out=out)
    function.__name__ = function.__qualname__ = name
    return function


def logical_not(input, *, out=None):
    """`input == 0`: True where input is zero (NaN is not), as bools, or in out's dtype."""
    if isinstance(input, fields.Tensor):
        support.check_unary("logical_not", input.dtype, input.device)
    return binary("eq", input, 0, out)


def square(input, *, out=None):
    """`input ** 2`, with pow's types (a bool tensor squares to int64, as in torch); complex as `input * input`."""
    if isinstance(input, fields.Tensor) and input.dtype.is_complex:
        return binary("mul", input, input, out)
    return binary("pow", input, 2, out)


FUNCTIONS = {name: _binary_function(name) for name in BINARY_METHODS}
FUNCTIONS.update((name, _unary_function(name)) for name in UNARY_METHODS)
FUNCTIONS.update(logical_not=logical_not, square=square)
FUNCTIONS.update((alias, FUNCTIONS[name]) for alias, name in ALIASES.items())
