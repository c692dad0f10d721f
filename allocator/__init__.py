"""Allocation policy, pure Python over a small driver protocol (see each module's docstring)."""
from .device import Block, DeviceCachingAllocator

__all__ = ["Block", "DeviceCachingAllocator"]
