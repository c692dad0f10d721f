"""torch's typing rules where operands are tensors and Python numbers: the result type, the compute type, which
device an op runs on, and the checks of an `out=` tensor, with torch's error messages."""
import numpy as np

from ..base import dtypes
from ..base.device import CPU
from ..core import fields
from ..core.shapes import broadcast_shapes


def result_type(*operands):
    """torch.result_type: dimensioned tensors outrank 0-d tensors, which outrank Python scalars;
    a lower rank only matters when its category (bool < int < float) is higher."""
    dims, zero_dims, scalar_cat = None, None, -1
    for x in operands:
        if isinstance(x, fields.TensorFields):
            if x.dim() > 0:
                dims = x.dtype if dims is None else dtypes.promote_types(dims, x.dtype)
            else:
                zero_dims = x.dtype if zero_dims is None else dtypes.promote_types(zero_dims, x.dtype)
        else:
            scalar_cat = max(scalar_cat, dtypes.scalar_category(x))
    result = dims
    if zero_dims is not None and (result is None or zero_dims.category > result.category):
        result = zero_dims if result is None else dtypes.promote_types(result, zero_dims)
    if scalar_cat >= 0 and (result is None or scalar_cat > result.category):
        result = (dtypes.bool_, dtypes.default_int, dtypes.default_float)[scalar_cat]
    return result


def compute_type(result):
    """Half types compute in float32, as torch's kernels do."""
    return dtypes.float32 if result in (dtypes.float16, dtypes.bfloat16) else result


def not_implemented(name, device, dtype):
    return f'"{name}_{device.type}" not implemented for \'{dtypes.TORCH_NAMES[dtype.name]}\''


def operand_value(x):
    """A tensor as is; a number as a plain Python number; anything else refused."""
    if isinstance(x, fields.TensorFields):
        return x
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, complex) or not isinstance(x, (bool, int, float)):
        raise TypeError(f"unsupported operand type: {type(x).__name__} (minitensor supports tensors and real "
                        "Python numbers)")
    return x


def check_out_shape(operands, out):
    shape = broadcast_shapes(*(x._shape for x in operands if isinstance(x, fields.TensorFields)))
    if out._shape != shape:
        raise RuntimeError(f"output with shape {list(out._shape)} doesn't match the broadcast shape {list(shape)}")


def check_cast(result, out):
    if not dtypes.can_cast(result, out.dtype):
        raise RuntimeError(f"result type {dtypes.TORCH_NAMES[result.name]} can't be cast to the desired output type "
                           f"{dtypes.TORCH_NAMES[out.dtype.name]}")


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
    return devices.pop()
