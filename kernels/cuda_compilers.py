"""The two compilers of user CUDA C++ source, and a cheap name for each compiler's version.

- nvcc (a subprocess) makes host code: kind "o" (`nvcc -c`) and "so" (`-shared`), both position independent so
  that an .o can be linked into a shared library. The host code's `<<<>>>` launches go through the CUDA
  runtime, linked statically (nvcc's default); the runtime uses the device's primary context, the one
  minitensor's driver retains, so the library and minitensor share memory and streams.
- NVRTC (`cuda.bindings.nvrtc`, in this process) makes device code: kind "cubin" and "ptx", and the lowered
  (mangled) names of `name_expressions` such as `axpy<float>`. nvrtcCompileProgram releases the GIL: two
  threads compiling a 3.5 s source each took 3.8 s together on two cores, against 7.2 s one after the other.

`compiler_identity(kind)` is part of every cache key, so it must cost almost nothing when the entry is already
on disk: it never runs nvcc nor loads libnvrtc there. The compiler's file is found with a few `stat` calls
(libnvrtc where cuda-pathfinder would load it from, whose own search costs 37 ms of imports), and its version
comes from `compilers.json` in the cache folder, keyed by the file's (path, size, mtime); only a new or changed
file runs `nvcc --version` or reads libnvrtc's build string. An nvcc that is a wrapper script is known by the
script, not by the compiler it starts.
"""
import glob
import hashlib
import json
import mmap
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile

from minitensor.base import diskcache
from minitensor.base.atomicfile import atomic_write
from minitensor.base.errors import CompileError

KINDS = {"o": "nvcc", "so": "nvcc", "cubin": "nvrtc", "ptx": "nvrtc"}  # kind -> compiler family
NVRTC_HINT = "pip install nvidia-cuda-nvrtc (minitensor's `nvrtc` extra)"
NVCC_HINT = "a CUDA toolkit (nvcc on PATH, or CUDA_HOME) or pip install nvidia-cuda-nvcc"
_NVRTC_SONAMES = ("libnvrtc.so.13", "libnvrtc.so.12")
# NVRTC's program name, the same for every source: NVRTC 13 compiles a program of a name it has not seen before
# 2.5x slower (25 ms against 9.4 for saxpy on the H100's host), so the log names the cached .cu only afterwards
_PROGRAM = "minitensor_source.cu"  # cuda-pathfinder's descriptor for "nvrtc"
_WHEEL_DIRS = {"nvrtc": ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"),
               "nvcc": ("nvidia/cu13/bin", "nvidia/cuda_nvcc/bin")}
_BUILD_STRING = b"Cuda compilation tools, release "  # what `nvcc --version` prints, also inside libnvrtc
_identities = {}  # "family|path|size|mtime_ns" -> identity, in front of compilers.json


def compiler_identity(kind):
    """A short string naming the version of the compiler that builds `kind`, such as "nvrtc-13.5.37-<hash>"."""
    family = KINDS[kind]
    path = find_nvcc() if family == "nvcc" else find_nvrtc()
    stat = os.stat(path)
    stamp = f"{family}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
    identity = _identities.get(stamp)
    if identity is None:
        identity = _identities[stamp] = _remembered(stamp, family, path)
    return identity


def _remembered(stamp, family, path):
    """The identity from compilers.json, computed and stored there when the file is new to it."""
    memo_path = os.path.join(diskcache.path("cuda"), "compilers.json")
    try:
        with open(memo_path, "rb") as f:
            memo = json.loads(f.read())
    except (OSError, ValueError):  # none yet, or torn by a crash: a memo, so start again
        memo = {}
    if stamp not in memo:
        version = _nvcc_version(path) if family == "nvcc" else _nvrtc_version(path)
        release = re.search(rb"V(\d+(?:\.\d+)+)", version)  # "V13.5.37": for a reader of the memo
        number = release.group(1).decode() if release else "unknown"
        memo[stamp] = f"{family}-{number}-{hashlib.sha256(version).hexdigest()[:12]}"
        memo_path = os.path.join(diskcache.writable("cuda"), "compilers.json")  # a read-only cache: elsewhere
        os.makedirs(os.path.dirname(memo_path), exist_ok=True)
        with atomic_write(memo_path) as f:  # two writers at once may lose one stamp: it is computed again
            f.write(json.dumps(memo, indent=0).encode())
    return memo[stamp]


def _nvcc_version(path):
    done = subprocess.run([path, "--version"], capture_output=True, check=False)
    if done.returncode:
        raise RuntimeError(f"`{path} --version` failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
    return done.stdout


def _nvrtc_version(path):
    """libnvrtc's build string ("release 13.5, V13.5.37, Build ..."), read without loading it; the whole file
    where a build has no such string."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        start = data.find(_BUILD_STRING)
        if start < 0:
            return hashlib.sha256(data).digest()
        return data[start:data.find(b"\0", start)]


# ------------------------------------------------------------------------------------------- finding them
def find_nvcc():
    """nvcc's path, looked for where torch and CuPy look, then where cuda-pathfinder does."""
    for candidate in _nvcc_candidates():
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate)
    raise RuntimeError(f"minitensor: nvcc, the CUDA compiler for kinds 'o' and 'so', was not found (looked in "
                       f"$CUDA_PATH, $CUDA_HOME, PATH, /usr/local/cuda, site-packages); install {NVCC_HINT}")


def _nvcc_candidates():
    """$CUDA_PATH, $CUDA_HOME, PATH, /usr/local/cuda, the nvidia-cuda-nvcc wheel, $CONDA_PREFIX."""
    roots = [os.environ.get(name) for name in ("CUDA_PATH", "CUDA_HOME")]
    yield from (os.path.join(root, "bin", "nvcc") for root in roots if root)
    on_path = shutil.which("nvcc")
    if on_path:
        yield on_path
    yield "/usr/local/cuda/bin/nvcc"
    yield from (os.path.join(folder, "nvcc") for folder in _wheel_folders("nvcc"))
    if os.environ.get("CONDA_PREFIX"):
        yield os.path.join(os.environ["CONDA_PREFIX"], "bin", "nvcc")


def find_nvrtc():
    """The libnvrtc file that cuda-pathfinder loads, found without loading it."""
    for folder in _nvrtc_folders():
        for soname in _NVRTC_SONAMES:
            candidate = os.path.join(folder, soname)
            if os.path.isfile(candidate):
                return os.path.realpath(candidate)
    raise RuntimeError(f"minitensor: libnvrtc ({' or '.join(_NVRTC_SONAMES)}), the CUDA compiler for kinds 'cubin' "
                       f"and 'ptx', was not found in site-packages or the library path; install {NVRTC_HINT}")


def _nvrtc_folders():
    """cuda-pathfinder's order: NVIDIA wheels in site-packages, $CONDA_PREFIX, where dlopen looks (roughly:
    LD_LIBRARY_PATH, the folders of ld.so.conf.d, the default ones), then $CUDA_PATH and $CUDA_HOME."""
    yield from _wheel_folders("nvrtc")
    yield from _lib_folders(os.environ.get("CONDA_PREFIX"))
    yield from (folder for folder in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if folder)
    for conf in sorted(glob.glob("/etc/ld.so.conf.d/*.conf")):
        try:
            with open(conf) as f:
                yield from [line.strip() for line in f if line.startswith("/")]
        except OSError:
            continue
    yield from ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/cuda/lib64")
    for name in ("CUDA_PATH", "CUDA_HOME"):
        yield from _lib_folders(os.environ.get(name))


def _lib_folders(root):
    return [os.path.join(root, "lib64"), os.path.join(root, "lib")] if root else []


def _wheel_folders(family):
    """The NVIDIA wheel folders for `family` under each site-packages, in cuda-pathfinder's order."""
    parents = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        parents.insert(1 if sys.prefix != sys.base_prefix else 0, site.getusersitepackages())
    return [os.path.join(parent, rel) for rel in _WHEEL_DIRS[family] for parent in parents]


# ------------------------------------------------------------------------------------------- compiling
def run(kind, source, source_path, options, arch, name_expressions):
    """Compile `source` (also saved at `source_path`) to the bytes of `kind`, and {expression: lowered name}."""
    if KINDS[kind] == "nvcc":
        return _nvcc(kind, source_path, options, arch), {}
    return _nvrtc(kind, source, source_path, options, arch, name_expressions)


def _nvcc(kind, source_path, options, arch):
    with tempfile.TemporaryDirectory(prefix="minitensor-nvcc-") as scratch:
        output = os.path.join(scratch, "out." + kind)
        mode = ["-c"] if kind == "o" else ["-shared"]
        command = [find_nvcc(), *mode, "-Xcompiler", "-fPIC", f"-arch=sm_{arch}", "-o", output, source_path,
                   *options]
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        if done.returncode:
            raise CompileError(done.stdout.decode(errors="replace"), command, source_path)
        with open(output, "rb") as f:
            return f.read()


def _nvrtc(kind, source, source_path, options, arch, name_expressions):
    nvrtc = _nvrtc_module()
    arch_option = f"-arch=sm_{arch}" if kind == "cubin" else f"-arch=compute_{arch}"
    command = [arch_option, *options]
    program = _checked(nvrtc, nvrtc.nvrtcCreateProgram(source.encode(), _PROGRAM.encode(), 0, [], []))
    try:
        for expression in name_expressions:
            _checked(nvrtc, nvrtc.nvrtcAddNameExpression(program, expression.encode()))
        (result,) = nvrtc.nvrtcCompileProgram(program, len(command), [o.encode() for o in command])
        if result in (nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION, nvrtc.nvrtcResult.NVRTC_ERROR_INVALID_OPTION):
            log = _nvrtc_log(nvrtc, program).replace(_PROGRAM + "(", source_path + "(")
            raise CompileError(log, command, source_path)
        _checked(nvrtc, (result,))
        lowered = {e: _checked(nvrtc, nvrtc.nvrtcGetLoweredName(program, e.encode())).decode()
                   for e in name_expressions}
        return _nvrtc_output(nvrtc, program, kind), lowered
    finally:
        nvrtc.nvrtcDestroyProgram(program)


def _nvrtc_module():
    """cuda.bindings.nvrtc, imported on the first NVRTC compile; find_nvrtc first, for its install hint."""
    find_nvrtc()
    from cuda.bindings import nvrtc  # here: only a compile pays for importing it
    return nvrtc


def _nvrtc_log(nvrtc, program):
    size = _checked(nvrtc, nvrtc.nvrtcGetProgramLogSize(program))
    log = b" " * size
    _checked(nvrtc, nvrtc.nvrtcGetProgramLog(program, log))
    return log.rstrip(b"\0").decode(errors="replace")


def _nvrtc_output(nvrtc, program, kind):
    get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if kind == "cubin"
                     else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
    data = b" " * _checked(nvrtc, get_size(program))
    _checked(nvrtc, get(program, data))
    return data.rstrip(b"\0") if kind == "ptx" else data  # PTX is a C string: its closing NUL is no text


def _checked(nvrtc, returned):
    """The value of an NVRTC call's (result, value) tuple, or a RuntimeError naming the failure."""
    result, *value = returned
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        message = nvrtc.nvrtcGetErrorString(result)[1].decode()
        raise RuntimeError(f"NVRTC call failed: {message} ({int(result)})")
    return value[0] if value else None
