"""Triton kernels and the launcher that compiles them once per signature.

Importing a module here imports Triton and picks the backend (compiled for the GPU, interpreted on the
simulated device), so minitensor imports these lazily, at the first operation that needs them.
"""
