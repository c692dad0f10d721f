"""minitensor's C extensions (the kernel launcher `_launch.c`; the tensor and storage fields; DLPack's capsule
destructor), each built once per source and Python version with the system C compiler (Triton needs one too,
for its own launcher) and loaded from the disk cache after that."""
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig

from . import diskcache

def load(source, module_name):
    """The extension module built from the C file `source`, whose init function is PyInit_<module_name>."""
    with open(source, "rb") as f:
        text = f.read()
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    tag = hashlib.sha256(text + sys.version.encode() + suffix.encode()).hexdigest()[:16]
    stem = os.path.splitext(os.path.basename(source))[0].lstrip("_")
    library = diskcache.path(f"{stem}-{tag}{suffix}")
    if not os.path.exists(library):
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
    tmp = diskcache.temporary(library)
    command = [compiler, source, "-O2", "-shared", "-fPIC", f"-I{sysconfig.get_paths()['include']}", "-o", tmp,
               "-ldl"]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building {os.path.basename(source)} failed:\n{' '.join(command)}\n{proc.stderr}")
    os.replace(tmp, library)
