"""`ReduceOp`, as torch.distributed has it: `ReduceOp.SUM` is a `ReduceOp.RedOpType` member (an int enum that
prints as "RedOpType.SUM"), and `ReduceOp(op)` wraps one and compares equal to it.

The bitwise ops (BAND, BOR, BXOR) work on integer and bool tensors over MPI; NCCL has none of them.
"""
import enum


class RedOpType(enum.IntEnum):
    """torch's numbering of the reductions."""

    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7

    def __str__(self):
        return f"RedOpType.{self.name}"

    __format__ = object.__format__  # f"{op}" as str(op), not as the int


class ReduceOp:
    """`ReduceOp(op=ReduceOp.SUM)`: one reduction; the class attributes are the RedOpType members."""

    __slots__ = ("op",)
    RedOpType = RedOpType
    SUM, AVG, PRODUCT, MIN, MAX = RedOpType.SUM, RedOpType.AVG, RedOpType.PRODUCT, RedOpType.MIN, RedOpType.MAX
    BAND, BOR, BXOR = RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR

    def __init__(self, op=RedOpType.SUM):
        self.op = op_type(op)

    def __eq__(self, other):
        if isinstance(other, (ReduceOp, RedOpType)):
            return self.op == op_type(other)
        return NotImplemented

    def __hash__(self):
        return hash(self.op)

    def __repr__(self):
        return f"<ReduceOp {self.op}>"


def op_type(op):
    """The RedOpType of a reduction argument (a RedOpType member or a ReduceOp), TypeError for anything else."""
    if type(op) is RedOpType:
        return op
    if isinstance(op, ReduceOp):
        return op.op
    raise TypeError(f"op must be a minitensor.distributed.ReduceOp (e.g. ReduceOp.SUM), got {type(op).__name__}")
