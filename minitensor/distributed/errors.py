"""torch.distributed's error types, so code that catches `dist.DistStoreError` or `dist.DistError` catches ours.

All are RuntimeErrors, as in torch, so code written against a plain `except RuntimeError` keeps working.
"""


class DistError(RuntimeError):
    """Something in minitensor.distributed failed: a store, the network or a collective's backend."""


class DistBackendError(DistError):
    """A collective's engine (NCCL, MPI) failed or timed out."""


class DistStoreError(DistError):
    """A store operation failed, e.g. a key that was never set before the store's timeout."""


class DistNetworkError(DistError):
    """A socket could not be bound, could not reach its peer before the timeout, or lost it."""
