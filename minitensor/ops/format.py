"""repr of a tensor, as torch prints one."""
import numpy as np

from ..base import dtypes


def format_tensor(t):
    values = t._host_values()
    if t.numel() == 0:
        body = "[]" if t.dim() == 1 else f"[], size={tuple(t._shape)}"
    elif t.dtype.is_floating_point:
        values = values.astype(np.float64)
        body = np.array2string(values, separator=", ", formatter={"float_kind": _float_format(values)},
                               prefix="tensor(", threshold=1000)
    elif t.dtype.is_complex:  # as torch: the real and the imaginary parts, each with its own float format
        real_fmt, imag_fmt = _float_format(values.real), _float_format(values.imag)

        def fmt(v):
            imag = imag_fmt(v.imag)
            return real_fmt(v.real) + ("" if imag[0] in "+-" else "+") + imag + "j"
        body = np.array2string(values, separator=", ", formatter={"complex_kind": fmt}, prefix="tensor(",
                               threshold=1000)
    else:
        body = np.array2string(values, separator=", ", prefix="tensor(", threshold=1000)
    extras = []
    if t.device.type != "cpu":
        extras.append(f"device='{t.device}'")
    if t.dtype not in (dtypes.float32, dtypes.int64, dtypes.bool_, dtypes.complex64) or (
            t.numel() == 0 and t.dtype is not dtypes.float32):
        extras.append(f"dtype={t.dtype}")
    return "tensor(" + body + "".join(", " + e for e in extras) + ")"


def _float_format(values):
    """torch's float formatter for these values (float64): scientific where some magnitude is >= 1e8 or
    below 1e-4, "3." where every finite value is an integer, else four decimals."""
    finite = values[np.isfinite(values)]
    integral = finite.size == 0 or bool(np.all(finite == np.round(finite)))
    big = finite.size and (np.abs(finite).max() >= 1e8 or 0 < np.abs(finite[finite != 0]).min(initial=1) < 1e-4)
    if big:
        return "{:.4e}".format
    if integral:
        return lambda v: f"{v:.0f}." if np.isfinite(v) else str(v)
    return "{:.4f}".format
