"""torch's typing rules where operands are tensors and Python numbers: the result type, the compute type, which
device an op runs on, and the checks of an `out=` tensor, with torch's error messages."""
import numpy as np

from ..base import dtypes
from ..base.device import CPU, of_registered_type
from ..core import fields
from ..core.shapes import broadcast_shapes


def result_type(*operands):
    """torch.result_type: dimensioned tensors outrank 0-d tensors, which outrank Python scalars (a float or
    complex one standing for the default float32 or complex64); a lower rank only matters when its category
    (bool < int < float < complex) is higher."""
    dims = zero_dims = wrapped = None
    for x in operands:
        if isinstance(x, fields.TensorFields):
            if x.dim() > 0:
                dims = x.dtype if dims is None else dtypes.promote_types(dims, x.dtype)
            else:
                zero_dims = x.dtype if zero_dims is None else dtypes.promote_types(zero_dims, x.dtype)
        else:
            number = _WRAPPED[dtypes.scalar_category(x)]
            wrapped = number if wrapped is None else dtypes.promote_types(wrapped, number)
    return _combine_ranks(dims, _combine_ranks(zero_dims, wrapped))


_WRAPPED = (dtypes.bool_, dtypes.default_int, dtypes.default_float, dtypes.complex64)  # per scalar category


def _combine_ranks(higher, lower):
    """torch's combine_categories: the higher rank's type, unless the lower rank's category is higher; a complex
    lower rank keeps a float higher rank's precision."""
    if higher is None or lower is None:
        return lower if higher is None else higher
    if higher.is_complex:
        return higher
    if lower.is_complex:
        return dtypes.complex_for(higher) if higher.is_floating_point else lower
    if higher.is_floating_point:
        return higher
    if higher is dtypes.bool_ or lower.is_floating_point:
        return dtypes.promote_types(higher, lower)
    return higher


def compute_type(result):
    """Half types compute in float32, as torch's kernels do."""
    return dtypes.float32 if result in (dtypes.float16, dtypes.bfloat16) else result


def not_implemented(name, device, dtype):
    return f'"{name}_{device.type}" not implemented for \'{dtypes.TORCH_NAMES[dtype.name]}\''


def not_implemented_for(kernel, dtype):
    """torch's NotImplementedError for a kernel with no instance for `dtype` (`"add_stub" not implemented for
    'UInt32'`): the same text on both devices, as the kernel names it."""
    return NotImplementedError(f'"{kernel}" not implemented for \'{dtypes.TORCH_NAMES[dtype.name]}\'')


def operand_value(x):
    """A tensor as is; a number as a plain Python number; anything else refused."""
    if isinstance(x, fields.TensorFields):
        return x
    if isinstance(x, np.generic):
        x = x.item()
    if not isinstance(x, (bool, int, float, complex)):
        raise TypeError(f"unsupported operand type: {type(x).__name__} (minitensor supports tensors and Python "
                        "numbers)")
    return x


def check_out_shape(operands, out):
    shape = broadcast_shapes(*(x._shape for x in operands if isinstance(x, fields.TensorFields)))
    if out._shape != shape:
        raise RuntimeError(f"output with shape {list(out._shape)} doesn't match the broadcast shape {list(shape)}")


def check_cast(result, out):
    if not dtypes.can_cast(result, out.dtype):
        raise RuntimeError(f"result type {dtypes.TORCH_NAMES[result.name]} can't be cast to the desired output type "
                           f"{dtypes.TORCH_NAMES[out.dtype.name]}")


def refuse_registered(device, op):
    """Raise for a device of a type a third party registered: minitensor's ops run on cpu and cuda only."""
    if of_registered_type(device):
        raise NotImplementedError(f"Could not run '{op}' with arguments from the '{device.type}' backend: "
                                  f"minitensor's ops run on cpu and cuda tensors. A registered device type's "
                                  f"tensors are made by factories, filled (fill_, zero_) and copied (to, cpu, "
                                  f"copy_); move them to cuda or the CPU for anything else")


def common_device(tensors, out):
    """The device the op runs on. A 0-d CPU tensor may join a cuda op, as in torch (it becomes a scalar)."""
    devices = {x.device for x in tensors if not (x.device.type == "cpu" and x.dim() == 0)}
    if out is not None:
        devices.add(out.device)
    if not devices:
        return CPU
    if len(devices) > 1:
        first, second = sorted(devices, key=str)[:2]
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{first} and {second}!")
    device = devices.pop()
    refuse_registered(device, "a pointwise op")
    return device
