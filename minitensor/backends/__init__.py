"""The driver layer: the Driver protocol (base.py), the real GPU (nvidia.py), the simulated one (sim.py), and the
choice between them (select.py), and the device types a third party registers (registry.py)."""
from .base import DeviceProperties, Driver
from .registry import device_type_id, register_device_type, registered_device_types, registered_driver
from .select import active_driver, on_start, prepare_first_op

__all__ = ["DeviceProperties", "Driver", "active_driver", "device_type_id", "on_start", "prepare_first_op",
           "register_device_type", "registered_device_types", "registered_driver"]
