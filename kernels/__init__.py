"""Triton kernels and the launch path that compiles, caches and launches them.

- kernel modules (`elementwise`, `reduce`, `index`, `random`, `timing`): the @triton.jit functions; importing
  one imports Triton.
- plan modules (`plans`, `reduce_plans`, `index_plans`, `random_plans`): how an op's operands become launches of
  those kernels, worked out once per signature.
- `launcher`: compiled kernels per signature, from memory, the disk cache or a compile; `compat` holds every
  Triton-version detail, `_launch.c` the C launcher, `native` builds it (and minitensor's other C source),
  `diskcache` the files.

A warm process touches only plans, launcher and the C launcher: Triton is imported when a kernel must be
compiled (or interpreted, on the simulated device).
"""
