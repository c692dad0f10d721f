"""Each cuda device's random number generator, as torch.cuda.random: a Philox key (the seed) and an offset.

A random op reserves the Philox counters it needs from the offset under the generator's lock, so the same seed
and the same sequence of calls give the same numbers on every run, whatever the block size, the GPU or the
backend (the sampling is in minitensor/ops/random.py and kernels/random.py).
"""
import threading

from .devices import current_device, device_count

DEFAULT_SEED = 67280421310721
_INT64_MIN = -(2**63)


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
    """Seed the current device's generator (restarting its offset), as torch.cuda.manual_seed."""
    generator(current_device()).reseed(check_seed(seed))


def manual_seed_all(seed):
    """Seed every device's generator."""
    global _seed
    _seed = check_seed(seed)
    for g in list(_generators.values()):
        g.reseed(_seed)


def initial_seed():
    """The current device's seed."""
    return generator(current_device()).seed
