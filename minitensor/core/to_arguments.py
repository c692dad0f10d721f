"""Tensor.to's overloads, read into (device, dtype, non_blocking, copy)."""
from ..base import dtypes
from .fields import TensorFields


def parse_to(args, kwargs):
    """Tensor.to's overloads: to(dtype), to(device[, dtype]), to(tensor), and the keywords."""
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    if dtype is not None:
        dtype = dtypes.dtype_arg(dtype, "to")
    non_blocking = kwargs.pop("non_blocking", False)
    copy = kwargs.pop("copy", False)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to() got unexpected keyword arguments {sorted(kwargs)}")
    args = list(args)
    if args and isinstance(args[0], TensorFields):
        other = args.pop(0)
        device, dtype = other.device, other.dtype
    elif args and not isinstance(args[0], dtypes.dtype):
        device = args.pop(0)
    if args and isinstance(args[0], dtypes.dtype):
        dtype = args.pop(0)
    if args and isinstance(args[0], bool):
        non_blocking = args.pop(0)
    if args and isinstance(args[0], bool):
        copy = args.pop(0)
    if args:
        raise TypeError(f"to() received an invalid combination of arguments: {args!r}")
    return device, dtype, non_blocking, copy
