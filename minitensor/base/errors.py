"""Errors raised by the device layer, shared by both backends."""


class CudaError(RuntimeError):
    """A driver call failed; `code` is the CUresult value and `message` the driver's own words for it."""

    def __init__(self, code, message):
        self.code = int(code)
        super().__init__(f"CUDA error {self.code}: {message}")


class OutOfMemoryError(RuntimeError):
    """A device allocation failed after the allocator released what it could."""
