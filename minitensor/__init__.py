"""minitensor: a small eager tensor framework on Triton, with torch's names and without torch.

`import minitensor as mt`; the contract is docs/API.md, the layers docs/architecture.md. Importing is cheap:
the backend starts and Triton is imported at the first operation that needs them.
"""
import importlib

from . import accelerator, backends, cuda, nn
from .accelerator import get_device_module
from .backends.cuda import get_float32_matmul_precision, set_float32_matmul_precision
from .base import dtypes
from .base.device import device
from .base.dtypes import (bfloat16, bool_ as bool, complex64, complex128, dtype, float16, float32, float64, int8,
                          int16, int32, int64, promote_types, uint8, uint16, uint32, uint64)
from .base.errors import OutOfMemoryError
from .core.shapes import broadcast_shapes
from .core.storage import UntypedStorage
from .core.typed_storage import TypedStorage
from .cuda.streams import GenericEvent as Event, GenericStream as Stream
from .creation import (arange, as_tensor, empty, empty_like, empty_strided, from_numpy, full, full_like, ones,
                       ones_like, rand, rand_like, randint, randint_like, randn, randn_like, tensor, zeros, zeros_like)
from .interop import from_dlpack
from .ops import pointwise
from .ops.complex_views import conj, imag, is_complex, real, view_as_complex, view_as_real
from .ops.pointwise import add, clamp, sub, where
from .ops.index_put import index_put, index_put_
from .ops.indexing import gather, index_select
from .ops.matmul import addmm, baddbmm, bmm, dot, matmul, mm, mv
from .ops.random import bernoulli, initial_seed, manual_seed
from .ops.reductions import all, allclose, any, equal, isclose, max, mean, min, return_types, sum
from .ops.typing import result_type
from .tensor import Size, Tensor

half, float, double = float16, float32, float64
short, int, long = int16, int32, int64
cfloat, cdouble = complex64, complex128
globals().update(pointwise.FUNCTIONS)  # mul, div, exp, eq, maximum, ... with out=
subtract, clip = sub, clamp

_LAZY = {"save": "serialization.api", "load": "serialization.api", "save_safetensors": "serialization.safetensors",
         "load_safetensors": "serialization.safetensors"}


def __getattr__(name):
    """mt.save, mt.load and the safetensors pair, imported on first use: `import minitensor` stays cheap; and
    the module of each registered device type (`mt.fake` once "fake" is registered), as torch's `torch.mtia`;
    and `mt.distributed`, the package, as `torch.distributed`."""
    if name in backends.registered_device_types():
        return get_device_module(name)
    if name == "distributed":
        return importlib.import_module(f"{__name__}.{name}")
    if name not in _LAZY:
        raise AttributeError(f"module 'minitensor' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
