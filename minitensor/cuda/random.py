"""Each cuda device's random number generator, as torch.cuda.random: a Philox key (the seed) and an offset.

A random op reserves the Philox counters it needs from the offset under the generator's lock, so the same seed
and the same sequence of calls give the same numbers on every run, whatever the block size, the GPU or the
backend (the sampling is in minitensor/ops/random.py and kernels/random.py).
"""
import threading

from . import capturing
from .devices import current_device, device_count
from .streams import current_stream_handle

DEFAULT_SEED = 67280421310721
_INT64_MIN = -(2**63)
_SEED_IN_CAPTURE = ("CUDAGeneratorImpl::set_current_seed can be called during stream capture only if new seed is the "
                    "same as the original seed.")


def check_seed(seed):
    """torch's seed range: [-2^63, 2^64); negative seeds are taken as their 64-bit two's complement."""
    seed = int(seed)
    if not _INT64_MIN <= seed < 2**64:
        raise ValueError("Overflow when unpacking long long")
    return seed & (2**64 - 1)


class Philox:
    """One cuda device's generator: its seed and the next free counter. `lock` guards the offset, so
    threads drawing at once get disjoint counters."""

    __slots__ = ("seed", "key", "offset", "lock")

    def __init__(self, seed):
        self.lock = threading.Lock()
        self.reseed(seed)

    def reseed(self, seed):
        with self.lock:
            self.seed = seed
            self.key = seed - 2**64 if seed >= 2**63 else seed  # the kernels' int64 seed argument
            self.offset = 0


_seed = DEFAULT_SEED  # the seed of generators not made yet
_generators = {}  # device index -> Philox


def generator(index):
    """Device `index`'s generator, made on first use."""
    g = _generators.get(index)
    if g is None:
        g = _generators.setdefault(index, Philox(_seed))
    return g


class _DefaultGenerators:
    """`mt.cuda.default_generators[i]`: device i's generator (made on first use), as torch's tuple."""

    def __getitem__(self, index):
        if not isinstance(index, int) or not 0 <= index < device_count():
            raise IndexError(f"default_generators index {index!r} out of range for {device_count()} device(s)")
        return generator(index)

    def __len__(self):
        return device_count()


default_generators = _DefaultGenerators()


def manual_seed(seed):
    """Seed the current device's generator (restarting its offset), as torch.cuda.manual_seed. While the current
    stream captures a graph, only the generator's own seed is accepted, and changes nothing (torch's rule)."""
    seed = check_seed(seed)
    g = generator(current_device())
    if _capturing():
        _refuse_new_seed(g, seed)
    else:
        g.reseed(seed)


def manual_seed_all(seed):
    """Seed every device's generator; while the current stream captures a graph, as manual_seed."""
    global _seed
    seed = check_seed(seed)
    if _capturing():
        for index in range(device_count()):
            _refuse_new_seed(generator(index), seed)
        return
    _seed = seed
    for g in list(_generators.values()):
        g.reseed(_seed)


def _capturing():
    """Whether this thread's current stream on the current device captures a graph: the stream torch asks CUDA
    about, so seeding from another thread, or with a side stream current, is not refused."""
    return bool(capturing.by_stream) and current_stream_handle(current_device()) in capturing.by_stream


def _refuse_new_seed(g, seed):
    """torch's RuntimeError for a seed that would change `g` under a capture: its state is what the graph's random
    ops were recorded against."""
    if seed != g.seed:
        raise RuntimeError(_SEED_IN_CAPTURE)


def initial_seed():
    """The current device's seed."""
    return generator(current_device()).seed
