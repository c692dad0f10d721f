"""The driver layer: the Driver protocol (base.py), the real GPU (nvidia.py), the simulated one (sim.py), and the
choice between them (select.py)."""
from .select import active_driver, on_start, prepare_first_op

__all__ = ["active_driver", "on_start", "prepare_first_op"]
