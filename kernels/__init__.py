"""Triton kernels and the launch path that compiles, caches and launches them.

- kernel modules (`elementwise`, `reduce`, `index`, `random`, `timing`): the @triton.jit functions; importing
  one imports Triton.
- plan modules (`plans`, `reduce_plans`, `index_plans`, `random_plans`): how an op's operands become launches of
  those kernels, worked out once per signature.
- `launcher`: compiled kernels per signature, from memory, the disk cache (minitensor/base/diskcache.py) or a
  compile, and the C launcher `_launch.c` (built by minitensor/base/cext.py); `compat` holds every
  Triton-version detail of these kernels, `user_kernels` those of users' own @triton.jit kernels.
- users' CUDA C++ (mt.cuda.RawKernel, codecache): `cuda_compilers` (nvcc, NVRTC), `cuda_cache` (the compile
  cache), `cuda_signatures`, `cuda_arguments`, `cuda_modules` (loaded modules, launches) and `cuda_emulation`
  (the simulator's CPU emulation).

A warm process touches only plans, launcher and the C launcher: Triton is imported when a kernel must be
compiled (or interpreted, on the simulated device).
"""
