"""`mt.nn`: torch.nn's functional ops that minitensor has (functional.py)."""
from . import functional

__all__ = ["functional"]
