"""minitensor: a small eager tensor framework on Triton, with torch's names and without torch.

`import minitensor as mt`; the contract is API.md. Importing is cheap: the backend starts and Triton is
imported at the first operation that needs them.
"""
from . import cuda, dtypes
from .creation import (arange, as_tensor, empty, empty_like, from_numpy, full, full_like, ones, ones_like, rand,
                       rand_like, randint, randint_like, randn, randn_like, tensor, zeros, zeros_like)
from .device import device
from .dlpack import from_dlpack
from .dtypes import (bfloat16, bool_ as bool, dtype, float16, float32, float64, int8, int16, int32, int64,
                     promote_types, result_type, uint8)
from .errors import OutOfMemoryError
from .indexing import gather, index_select
from .ops import broadcast_shapes
from .random import bernoulli, initial_seed, manual_seed
from .reductions import all, allclose, any, equal, isclose, max, mean, min, return_types, sum
from .storage import UntypedStorage
from .tensor import Size, Tensor
from . import pointwise  # after tensor: tensor.py gives Tensor its methods from pointwise's tables

half, float, double = float16, float32, float64
short, int, long = int16, int32, int64


def add(input, other, *, alpha=1, out=None):
    return pointwise.binary("add", input, other, out=out, alpha=alpha)


def sub(input, other, *, alpha=1, out=None):
    return pointwise.binary("sub", input, other, out=out, alpha=alpha)


where, clamp = pointwise.where, pointwise.clamp
globals().update(pointwise.FUNCTIONS)  # mul, div, exp, eq, maximum, ... with out=
subtract, clip = sub, clamp


_LAZY = {"save": "serialization", "load": "serialization", "save_safetensors": "safetensors",
         "load_safetensors": "safetensors"}


def __getattr__(name):
    """mt.save, mt.load and the safetensors pair, imported on first use: `import minitensor` stays cheap."""
    if name not in _LAZY:
        raise AttributeError(f"module 'minitensor' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
