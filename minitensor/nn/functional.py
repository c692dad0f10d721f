"""`mt.nn.functional`, torch.nn.functional: `linear` (ops/matmul.py)."""
from ..ops.matmul import linear

__all__ = ["linear"]
