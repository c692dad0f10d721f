"""Launch plans of the random kernels (kernels/random.py): argument types, grid and the number of Philox
counters a call consumes, worked out once per (kernel, dtypes, numel, device) and kept.

Every random kernel writes a contiguous output of n elements (minitensor.random fills other layouts through
a contiguous temporary) and takes `out_ptr, seed, offset, n, s0, s1`: two scalars, or for bernoulli a
number and a pointer. In a CUDA graph (`captured`), `seed` is the address of the graph's generator state
(kernels/random.py `_philox`), which `state_setter` writes before each replay.
"""
import functools

from minitensor.backends import active_driver

from . import launcher

# The interpreter costs ~1 ms per program whatever its size: few, large programs there. On the H100, uniform_
# of 2^28 float32 runs at the same speed (0.33 ms) for blocks of 1024 to 8192 elements and 4 or 8 warps;
# normal_ (compute-bound) is fastest with 2048 by 4 warps (0.61 ms, against 0.74 ms with 4096 or 8192).
BLOCK = 1 << 16 if active_driver().interprets_kernels else 2048
NUM_WARPS = 4


class _Plan:
    """`counters`: how far a call advances the generator's offset; `run(stream, out_ptr, seed, offset, s0,
    s1)`: the launch, with 16-byte alignment hints for the pointers that are aligned (s1 is a pointer when
    `s1_pointer`)."""

    __slots__ = ("counters", "run")

    def __init__(self, kernel, device, out_type, scalar_types, n, constexprs, per, s1_pointer, captured):
        index64 = n >= 2**31
        types = (out_type, "*i64" if captured else "i64", "i64", "i64" if index64 else "i32") + scalar_types
        consts = constexprs + (index64, BLOCK)
        n_aligned = ((1,) if captured else ()) + ((3,) if n % 16 == 0 else ())  # a graph's state: 512-aligned
        pointers = (0, 5) if s1_pointer else (0,)
        grid = -(-n // BLOCK)
        self.counters = -(-n // per)
        fast = launcher.get(kernel, device, types, consts, pointers + n_aligned, NUM_WARPS)

        def slow(stream, out_ptr, seed, offset, s0, s1):
            aligned = tuple(i for i, p in zip(pointers, (out_ptr, s1)) if p % 16 == 0) + n_aligned
            launcher.get(kernel, device, types, consts, aligned, NUM_WARPS)(grid, 1, 1, stream, out_ptr, seed,
                                                                               offset, n, s0, s1)

        if s1_pointer:
            def run(stream, out_ptr, seed, offset, s0, s1):
                if (out_ptr | s1) & 15:
                    return slow(stream, out_ptr, seed, offset, s0, s1)
                fast(grid, 1, 1, stream, out_ptr, seed, offset, n, s0, s1)
        else:
            def run(stream, out_ptr, seed, offset, s0, s1):
                if out_ptr & 15:
                    return slow(stream, out_ptr, seed, offset, s0, s1)
                fast(grid, 1, 1, stream, out_ptr, seed, offset, n, s0, s1)
        self.run = run


def _float_scalar(dtype):
    return "fp64" if dtype.name == "float64" else "fp32"


@functools.lru_cache(maxsize=1024)
def uniform_plan(dtype, n, device, captured=False):
    """s0, s1: the bounds low, high."""
    return _Plan("random.uniform", device, "*" + dtype.triton, (_float_scalar(dtype),) * 2, n, (),
                 2 if dtype.name == "float64" else 4, False, captured)


@functools.lru_cache(maxsize=1024)
def normal_plan(dtype, n, device, captured=False):
    """s0, s1: mean, std."""
    return _Plan("random.normal", device, "*" + dtype.triton, (_float_scalar(dtype),) * 2, n, (),
                 2 if dtype.name == "float64" else 4, False, captured)


@functools.lru_cache(maxsize=1024)
def bernoulli_plan(p_dtype, dtype, n, device, captured=False):
    """s0: p as a number when p_dtype is None; s1: else the address of a contiguous p of out's shape."""
    return _Plan("random.bernoulli", device, "*" + dtype.triton, ("fp64", "*" + (p_dtype or dtype).triton), n,
                 (p_dtype is None,), 4, p_dtype is not None, captured)


@functools.lru_cache(maxsize=1024)
def integers_plan(mode, dtype, n, device, captured=False):
    """s0, s1: low and the span (int64 bits); see random.integers for the modes."""
    return _Plan("random.integers", device, "*" + dtype.triton, ("i64", "i64"), n, (mode,), 4 if mode == 0 else 2,
                 False, captured)


@functools.lru_cache(maxsize=None)
def state_setter(device):
    """set(stream, state_ptr, seed, offset): a graph's generator state, launched before each replay."""
    launch = launcher.get("random.set_state", device, ("*i64", "i64", "i64"), (), (0,), 1)

    def set_state(stream, state_ptr, seed, offset):
        launch(1, 1, 1, stream, state_ptr, seed, offset)
    return set_state
