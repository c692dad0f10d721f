"""minitensor's C extensions (the kernel launcher `_launch.c`; the tensor and storage fields; DLPack's capsule
destructor), each built once per source and Python version with the system C compiler (Triton needs one too,
for its own launcher) and loaded from the disk cache after that. A cached library is sealed (diskcache): one
that is truncated, empty or not this entry's is built again before it is loaded, never dlopen'd."""
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from contextlib import suppress

from . import diskcache


def load(source, module_name):
    """The extension module built from the C file `source`, whose init function is PyInit_<module_name>."""
    with open(source, "rb") as f:
        text = f.read()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256(text + sys.version.encode() + suffix.encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(source))[0].lstrip("_")
    name = f"{stem}-{tag}{suffix}"
    library = diskcache.path(name)
    if diskcache.read_sealed(library) is None:  # missing or damaged: built again where it can be written
        library = diskcache.writable(name)
        _build(source, library)
    spec = importlib.util.spec_from_file_location(module_name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(source, library):
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        raise RuntimeError(f"minitensor needs a C compiler (cc, gcc or clang on PATH, or $CC) to build "
                           f"{os.path.basename(source)}, as Triton needs one for its own launcher")
    tmp = diskcache.temporary(library) + ".so"
    command = [compiler, source, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", tmp,
               "-ldl"]
    try:
        proc = subprocess.run(command, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building {os.path.basename(source)} failed:\n{' '.join(command)}\n{proc.stderr}")
        with open(tmp, "rb") as f:
            diskcache.write_sealed(library, f.read())
    finally:
        with suppress(FileNotFoundError):
            os.remove(tmp)
