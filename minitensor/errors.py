"""Errors raised by the device layer, shared by both backends."""


class CudaError(RuntimeError):
    """A driver call failed; `code` is the CUresult value and the message the driver's own."""

    def __init__(self, code, message=None):
        self.code = int(code)
        if message is None:
            from .backends import active_driver
            message = active_driver().error_string(self.code)
        super().__init__(f"CUDA error {self.code}: {message}")


class OutOfMemoryError(RuntimeError):
    """A device allocation failed after the allocator released what it could."""


def check_error(code):
    if int(code) != 0:
        raise CudaError(code)
