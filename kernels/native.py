"""The C launcher of compiled kernels (`_launch.c`), built once per source and Python version with the system
C compiler (Triton needs one too, for its own launcher) and loaded from the disk cache after that."""
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

from . import diskcache

_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_launch.c")
_MODULE = "_minitensor_launch"


def load():
    """The extension module: `Launcher` and `init`."""
    with open(_SOURCE, "rb") as f:
        source = f.read()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256(source + sys.version.encode() + suffix.encode()).hexdigest()[:16]
    library = diskcache.path(f"launch-{tag}{suffix}")
    if not os.path.exists(library):
        _build(library)
    spec = importlib.util.spec_from_file_location(_MODULE, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(library):
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError("minitensor needs a C compiler (cc, gcc or clang on PATH, or $CC) to build its kernel "
                           "launcher, as Triton does for its own")
    tmp = diskcache.temporary(library)
    command = [compiler, _SOURCE, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", tmp,
               "-ldl"]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building minitensor's kernel launcher failed:\n{' '.join(command)}\n{proc.stderr}")
    os.replace(tmp, library)
