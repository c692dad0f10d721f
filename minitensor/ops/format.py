"""repr of a tensor, as torch prints one."""
import numpy as np

from ..base import dtypes


def format_tensor(t):
    values = t._host_values()
    if t.numel() == 0:
        body = "[]" if t.dim() == 1 else f"[], size={tuple(t._shape)}"
    elif t.dtype.is_floating_point:
        values = values.astype(np.float64)
        finite = values[np.isfinite(values)]
        integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
        big = finite.size and (np.abs(finite).max() >= 1e8 or 0 < np.abs(finite[finite != 0]).min(initial=1) < 1e-4)
        if big:
            fmt = "{:.4e}".format
        elif integral:
            fmt = lambda v: f"{v:.0f}." if np.isfinite(v) else str(v)
        else:
            fmt = "{:.4f}".format
        body = np.array2string(values, separator=", ", formatter={"float_kind": fmt}, prefix="tensor(",
                               threshold=1000)
    else:
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=1000)
    extras = []
    if t.device.type == "cuda":
        extras.append(f"device='{t.device}'")
    if t.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_) or (t.numel() == 0 and t.dtype is not dtypes.float32):
        extras.append(f"dtype={t.dtype}")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"
