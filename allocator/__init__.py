"""Allocation policy, pure Python over a small driver protocol (see each module's docstring)."""
from .block import Block
from .device import DeviceCachingAllocator
from .host import HostBlock, HostCachingAllocator
from .uncached import UncachedAllocator

__all__ = ["Block", "DeviceCachingAllocator", "HostBlock", "HostCachingAllocator", "UncachedAllocator"]
