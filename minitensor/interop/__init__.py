"""Zero-copy exchange with other array libraries: the CUDA Array Interface and numpy's __array__ (cai.py),
DLPack (dlpack.py), what a foreign description must hold (checks.py), the protocols' stream numbering
(streams.py), which of them a foreign array speaks (foreign.py); minitensor as Triton's driver, for users' own @triton.jit kernels
(triton_hook.py, triton_driver.py)."""
from .cai import cuda_array_interface, to_numpy_array
from .dlpack import dlpack_device, from_dlpack, to_dlpack
from .foreign import foreign_tensor
from . import triton_hook  # noqa: F401  (registers with the backend's start)
