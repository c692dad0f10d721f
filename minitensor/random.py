"""Seeding and random tensors.

For now numbers are drawn on the host from one numpy PCG64 generator per device (and one for the CPU),
seeded by `manual_seed`, then copied to the device; the per-device Philox kernels replace this.
"""
import numpy as np

_DEFAULT_SEED = 67280421310721
_seed = _DEFAULT_SEED
_generators = {}


def manual_seed(seed):
    """Seed every device's generator and the CPU's."""
    global _seed
    _seed = int(seed)
    _generators.clear()


def initial_seed():
    return _seed


def generator(device):
    key = str(device)
    g = _generators.get(key)
    if g is None:
        g = _generators[key] = np.random.Generator(np.random.PCG64([_seed, hash(key) & 0xFFFFFFFF]))
    return g
