"""Device types a third party registers: a name and a factory of the Driver that runs it.

`register_device_type("fake", factory)` makes "fake" and "fake:N" device strings; the factory is called once,
on the type's first use, and must return an object implementing the Driver protocol (base.py) for the devices
of that type. minitensor's own `cuda` type is not here: select.py chooses its driver.
"""
import threading

from ..base.device import register_type
from .base import Driver

# torch's DeviceType values: PrivateUse1 is what torch gives the first backend registered from outside
PRIVATE_USE_1 = 20

_factories = {}  # type name -> (device type id, driver factory)
_drivers = {}  # type name -> the driver, made on first use
_lock = threading.Lock()


def register_device_type(name, driver_factory):
    """Register device type `name`, run by the Driver `driver_factory()` returns; returns its device type id
    (20, torch's PrivateUse1, for the first, then 21, ...), which its streams' `device_type` gives."""
    if not callable(driver_factory):
        raise TypeError(f"register_device_type(): driver_factory must be callable, not "
                        f"{type(driver_factory).__name__}")
    with _lock:
        register_type(name)
        type_id = PRIVATE_USE_1 + len(_factories)
        _factories[name] = (type_id, driver_factory)
    return type_id


def registered_device_types():
    """The names of the registered device types, in the order they were registered."""
    return tuple(_factories)


def device_type_id(name):
    return _checked(name)[0]


def registered_driver(name):
    """The driver of a registered device type, made by its factory on first use."""
    driver = _drivers.get(name)
    if driver is None:
        factory = _checked(name)[1]
        with _lock:
            driver = _drivers.get(name)
            if driver is None:
                driver = factory()
                if not isinstance(driver, Driver):
                    raise TypeError(f"the driver factory of device type '{name}' returned a "
                                    f"{type(driver).__name__}, not a minitensor.backends.base.Driver")
                _drivers[name] = driver
    return driver


def _checked(name):
    entry = _factories.get(name)
    if entry is None:
        raise RuntimeError(f"'{name}' is not a registered device type (registered: "
                           f"{', '.join(_factories) or 'none'}); see minitensor.backends.register_device_type")
    return entry
