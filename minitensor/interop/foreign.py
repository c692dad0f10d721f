"""A tensor over another library's array without a copy, by whichever protocol it speaks."""
import numpy as np

from ..core.fields import TensorFields
from .cai import from_cuda_array_interface, is_void
from .dlpack import from_dlpack


def foreign_tensor(obj):
    """A tensor over another library's array without a copy: through its __cuda_array_interface__ first (as
    torch.as_tensor does), else its __dlpack__. None when obj is neither (or is a Tensor or numpy array,
    which the factories handle themselves)."""
    if isinstance(obj, (TensorFields, np.ndarray, np.generic)):
        return None
    dlpack = hasattr(obj, "__dlpack__")
    try:
        desc = obj.__cuda_array_interface__
    except AttributeError:
        desc = None
    except Exception:  # e.g. torch has no typestr for bfloat16: DLPack, when there, can still say it
        if not dlpack:
            raise
        desc = None
    if desc is not None and not (dlpack and is_void(desc.get("typestr"))):
        return from_cuda_array_interface(obj, desc)
    if dlpack:  # also for a typestr of raw bytes ("|V2": torch's bfloat16), whose DLPack dtype says what it is
        return from_dlpack(obj)
    return None
