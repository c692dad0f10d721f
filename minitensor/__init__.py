"""minitensor: a small eager tensor framework on Triton, with torch's names and without torch.

`import minitensor as mt`; the contract is API.md. Importing is cheap: the backend starts and Triton is
imported at the first operation that needs them.
"""
from . import cuda, dtypes
from .creation import (arange, as_tensor, empty, empty_like, from_numpy, full, full_like, ones, ones_like, rand,
                       rand_like, randint, randint_like, randn, randn_like, tensor, zeros, zeros_like)
from .device import device
from .dtypes import (bfloat16, bool_ as bool, dtype, float16, float32, float64, int8, int16, int32, int64,
                     promote_types, result_type, uint8)
from .errors import OutOfMemoryError
from .ops import broadcast_shapes
from .random import initial_seed, manual_seed
from .storage import UntypedStorage
from .tensor import Size, Tensor

half, float, double = float16, float32, float64
short, int, long = int16, int32, int64


def add(input, other, *, alpha=1, out=None):
    from .ops import binary
    return binary("add", input, other, out=out, alpha=alpha)


def sub(input, other, *, alpha=1, out=None):
    from .ops import binary
    return binary("sub", input, other, out=out, alpha=alpha)


def mul(input, other, *, out=None):
    from .ops import binary
    return binary("mul", input, other, out=out)


def div(input, other, *, out=None):
    from .ops import binary
    return binary("div", input, other, out=out)


subtract, multiply, divide, true_divide = sub, mul, div, div
