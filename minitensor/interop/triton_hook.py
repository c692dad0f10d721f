"""When minitensor becomes Triton's driver: once minitensor's backend has started and Triton is imported,
whichever comes second, without importing Triton itself (`import minitensor` and a warm start stay Triton-free).

If Triton is not imported when the backend starts, a finder on sys.meta_path waits for its import and installs
minitensor's driver as soon as the `triton` package has run (see triton_driver.py for what that changes).
"""
import importlib.abc
import sys
import warnings

from ..backends import on_start


def _install(driver):
    """A Triton this cannot adapt to still leaves minitensor, and Triton's own driver, working: it warns."""
    try:
        from . import triton_driver  # lazy: import cost (Triton)
        triton_driver.install(driver)
    except Exception as e:
        warnings.warn(f"minitensor could not become Triton's driver ({type(e).__name__}: {e}); @triton.jit kernels "
                      "launch through Triton's own driver, unordered with minitensor's streams", RuntimeWarning)


def _on_start(driver):
    if "triton" in sys.modules:
        _install(driver)
    else:
        sys.meta_path.insert(0, _TritonImportWatch(driver))


class _TritonImportWatch(importlib.abc.MetaPathFinder):
    """Finds `triton` as the other finders do, and installs minitensor's driver once the package has run."""

    def __init__(self, driver):
        self.driver = driver

    def find_spec(self, name, path=None, target=None):
        """Asked for every import, and by importlib.util.find_spec, which loads nothing: the watch ends when
        Triton has run, not here."""
        if name != "triton":
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None:
                spec.loader = _InstallingLoader(spec.loader, self)
                return spec
        return None

    def done(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _install(self.driver)


class _InstallingLoader(importlib.abc.Loader):
    """Triton's own loader, then the install."""

    def __init__(self, loader, watch):
        self.loader, self.watch = loader, watch

    def __getattr__(self, name):  # what else importlib or resources ask the loader: Triton's answers
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.watch.done()


on_start(_on_start)
