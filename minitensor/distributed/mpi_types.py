"""How the MPI engine reduces each minitensor dtype: the MPI datatype and MPI op of every (dtype, ReduceOp),
and what is left to do after MPI has reduced (AVG divides the sum by the group's size).

MPI has no 16-bit floats: float16 and bfloat16 travel as 16-bit words and reduce through user-defined MPI ops
that compute in float32 and round once per step (bfloat16 to nearest even). bool reduces as 0/1 bytes, with
SUM as logical or and PRODUCT as logical and (torch's NCCL rule). AVG is SUM followed by a division.
"""
import numpy as np

from ..base import dtypes
from .mpi_world import mpi
from .reduce_op import RedOpType

_MPI_TYPES = {"bool": "UINT8_T", "uint8": "UINT8_T", "int8": "INT8_T", "int16": "INT16_T", "int32": "INT32_T",
              "int64": "INT64_T", "uint16": "UINT16_T", "uint32": "UINT32_T", "uint64": "UINT64_T",
              "float16": "UINT16_T", "bfloat16": "UINT16_T", "float32": "FLOAT", "float64": "DOUBLE",
              "complex64": "C_FLOAT_COMPLEX", "complex128": "C_DOUBLE_COMPLEX"}
_MPI_OPS = {RedOpType.SUM: "SUM", RedOpType.AVG: "SUM", RedOpType.PRODUCT: "PROD", RedOpType.MIN: "MIN",
            RedOpType.MAX: "MAX", RedOpType.BAND: "BAND", RedOpType.BOR: "BOR", RedOpType.BXOR: "BXOR"}
_BOOL_OPS = {RedOpType.SUM: "MAX", RedOpType.PRODUCT: "MIN"}  # 0/1 bytes: or, and
_HALF_MATH = {RedOpType.SUM: np.add, RedOpType.AVG: np.add, RedOpType.PRODUCT: np.multiply,
              RedOpType.MIN: np.minimum, RedOpType.MAX: np.maximum}
_half_ops = {}  # (dtype name, RedOpType) -> the user-defined MPI op, made at first use


def view_dtype(dtype):
    """The numpy dtype of a numpy view over a tensor's memory (float16 and bfloat16 as their bits)."""
    return np.dtype(np.uint16) if dtype in (dtypes.float16, dtypes.bfloat16) else dtype.np


def datatype(dtype):
    """The MPI datatype of one element."""
    return getattr(mpi(), _MPI_TYPES[dtype.name])


def reduction(dtype, op):
    """The MPI op reducing `dtype` with `op` (a RedOpType the collectives already checked for the dtype)."""
    MPI = mpi()
    if dtype in (dtypes.float16, dtypes.bfloat16):
        key = (dtype.name, op)
        if key not in _half_ops:
            _half_ops[key] = MPI.Op.Create(_half_op(dtype, _HALF_MATH[op]), commute=True)
        return _half_ops[key]
    if dtype is dtypes.bool_:
        return getattr(MPI, _BOOL_OPS.get(op, _MPI_OPS[op]))
    return getattr(MPI, _MPI_OPS[op])


def _half_op(dtype, math):
    """An MPI user function: inout = math(in, inout) over 16-bit float words, computed in float32."""
    def combine(inbuf, inoutbuf, datatype):
        incoming = np.frombuffer(inbuf, np.uint16)
        target = np.frombuffer(inoutbuf, np.uint16)
        target[:] = from_float32(dtype, math(to_float32(dtype, incoming), to_float32(dtype, target)))
    return combine


def to_float32(dtype, bits):
    if dtype is dtypes.bfloat16:
        return dtypes.bf16_bits_to_f32(bits)
    return bits.view(np.float16).astype(np.float32)


def from_float32(dtype, values):
    if dtype is dtypes.bfloat16:
        return dtypes.f32_to_bf16_bits(values)
    return values.astype(np.float16).view(np.uint16)


def divide(view, dtype, divisor):
    """AVG's last step, in place on a numpy view of the reduced elements."""
    if dtype in (dtypes.float16, dtypes.bfloat16):
        view[:] = from_float32(dtype, to_float32(dtype, view) / np.float32(divisor))
    else:
        np.divide(view, divisor, out=view)

