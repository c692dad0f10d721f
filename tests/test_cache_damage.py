"""Cached binaries damaged on disk are built again, never loaded; a read-only cache still compiles new kernels.

A cache is filled once by a fresh process that uses every cached binary: the C extensions (`fields-*.so`,
`launch-*.so`, `dlpack_capsule-*.so`), users' CUDA C++ under `cuda/` (a RawKernel's cubin, codecache's "so"),
on a GPU the Triton kernels' `kernels-*.cubin` and on the simulator the emulation's `cuda-emu-*.so` libraries and
headers. Each test damages a copy of it
(truncated, emptied, or each binary swapped for another valid one) and a fresh process must still import
minitensor, compute the right results and leave every entry whole again. Before entries were checked, an empty
or swapped extension made `import minitensor` fail and a truncated library killed the process with SIGBUS.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import minitensor as mt
from helpers import REPO, SEED_SAXPY_SOURCE
from minitensor.base import diskcache
from minitensor.kernels import launcher

TWICE = r"""extern "C" __global__ void twice(int n, float *y) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] *= 2;
}
"""

# every cached binary in use: each line prints what it computed
USE = """
    import ctypes, os, sys, warnings
    warnings.simplefilter("always")
    import numpy as np
    import minitensor as mt
    from minitensor.base import cext
    from minitensor.core import fields
    from minitensor.kernels import launcher
    x = mt.arange(8, dtype=mt.float32, device="cuda") + 1
    print("fields", fields.NATIVE, x.cpu().numpy().tolist())
    launch = cext.load(os.path.join(os.path.dirname(launcher.__file__), "_launch.c"), "_minitensor_launch")
    print("launch", hasattr(launch, "RawLauncher"))
    print("dlpack", np.from_dlpack(mt.ones(2)).tolist())
    mt.cuda.RawKernel(sys.argv[1], "twice")((1,), (8,), (8, x))
    print("raw", x.cpu().numpy().tolist())
    library = mt.cuda.codecache.load(sys.argv[2], "so")[0]
    y = mt.ones(8, device="cuda")
    library.saxpy(ctypes.c_int(8), ctypes.c_float(2.0), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()))
    print("so", y.cpu().numpy().tolist())
"""
EXPECTED = ("fields True [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]\nlaunch True\ndlpack [1.0, 1.0]\n"
            "raw [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0, 16.0]\nso [5.0, 9.0, 13.0, 17.0, 21.0, 25.0, 29.0, 33.0]\n")


def run(cache, prefix=(), kernel=TWICE):
    """USE in a fresh interpreter over `cache` (its command line after `prefix`): the finished process."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               MINITENSOR_CACHE_DIR=str(cache), MINITENSOR_BACKEND=mt.cuda.backend())
    command = [*prefix, sys.executable, "-c", textwrap.dedent(USE), kernel, SEED_SAXPY_SOURCE]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    """A cache folder filled by USE, to be copied by each test."""
    cache = tmp_path_factory.mktemp("filled") / "cache"
    done = run(cache)
    assert done.returncode == 0 and done.stdout == EXPECTED, done.stderr
    return cache


def binaries(cache):
    """{path: group}: the cached binaries, grouped by what may stand in for another (an ELF file, a header)."""
    found = {}
    for pattern in ("*.so", "kernels-*.cubin", "cuda/*/*.cubin", "cuda/*/*.so"):  # kernels-*: Triton's, on a GPU
        found.update((path, "elf") for path in glob.glob(os.path.join(cache, pattern)))
    found.update((path, "header") for path in glob.glob(os.path.join(cache, "cuda-emu-include-*", "*.h")))
    return found


def damage(cache, how):
    """Truncate to half, empty, or swap (each file gets the bytes of the next one of its group that differs) every
    cached binary; their contents before."""
    found = binaries(cache)
    contents = {path: open(path, "rb").read() for path in found}
    for group in set(found.values()):
        paths = sorted(p for p, g in found.items() if g == group)
        for i, path in enumerate(paths):
            other = next(contents[o] for o in paths[i + 1:] + paths[:i] if contents[o] != contents[path])
            data = {"truncate": contents[path][:len(contents[path]) // 2], "empty": b"", "swap": other}[how]
            with open(path, "wb") as f:
                f.write(data)
    return contents


def whole(path, original):
    """Whether a cached binary is whole: a sealed file's seal, a CUDA artifact's sidecar, a header's bytes."""
    if path.endswith(".h"):
        return open(path, "rb").read() == original
    if os.path.exists(path + ".json"):
        sidecar = json.loads(open(path + ".json", "rb").read())
        return sidecar["sha256"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
    return diskcache.read_sealed(path) is not None


@pytest.mark.parametrize("how", ["truncate", "empty", "swap"])
def test_damaged_cached_binaries_are_rebuilt(filled, tmp_path, how):
    cache = tmp_path / "cache"
    shutil.copytree(filled, cache)
    contents = damage(cache, how)
    assert len(contents) >= 6 and not [p for p, data in contents.items() if whole(p, data)]
    done = run(cache)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr}"
    assert done.stdout == EXPECTED and "Warning" not in done.stderr, done.stderr
    assert [p for p, data in contents.items() if not whole(p, data)] == []


def read_only_prefix(cache):
    """The command prefix of a process that cannot write to `cache`. Permission bits stop a user; root, whom they
    do not stop, runs in a mount namespace where `cache` is a read-only bind mount of itself (EROFS), as on a
    read-only medium."""
    if os.geteuid() != 0:
        for folder, _, _ in os.walk(cache):
            os.chmod(folder, 0o555)
        return ()
    prefix = ("unshare", "--mount", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(cache))
    try:
        probe = subprocess.run([*prefix, "touch", os.path.join(cache, "probe")], capture_output=True, text=True)
    except OSError as e:
        pytest.skip(f"root needs unshare(1) to make a folder it cannot write: {e}")
    if "Read-only file system" not in probe.stderr:
        pytest.skip(f"root cannot make a read-only bind mount here: {probe.stderr.strip()}")
    return prefix


def test_read_only_cache_reads_its_entries_and_builds_the_rest_elsewhere(filled, tmp_path):
    """A read-only cache with a damaged extension and without a new kernel's entries: both are built in the
    process's temporary folder, with one warning; the cache is left as it was."""
    cache = tmp_path / "cache"
    shutil.copytree(filled, cache)
    (fields_library,) = glob.glob(os.path.join(cache, "fields-*.so"))
    os.truncate(fields_library, 0)
    before = {path: open(path, "rb").read() for path in glob.glob(os.path.join(cache, "**"), recursive=True)
              if os.path.isfile(path)}
    try:
        done = run(cache, read_only_prefix(cache), TWICE + "// a kernel the cache has not seen\n")
    finally:
        for folder, _, _ in os.walk(cache):
            os.chmod(folder, 0o755)
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr}"
    assert done.stdout == EXPECTED, done.stderr
    assert done.stderr.count(f"MINITENSOR_CACHE_DIR={str(cache)!r} is not usable") == 1, done.stderr
    after = {path: open(path, "rb").read() for path in glob.glob(os.path.join(cache, "**"), recursive=True)
             if os.path.isfile(path)}
    assert after == before


# ------------------------------------------------------------------------------------------- sealed files
@pytest.mark.parametrize("how", ["truncate", "empty", "extend", "another entry's file", "unsealed"])
def test_a_sealed_file_reads_back_only_whole(tmp_path, how):
    target, other = str(tmp_path / "entry-1.so"), str(tmp_path / "entry-2.so")
    diskcache.write_sealed(target, b"\x7fELF" + bytes(range(256)))
    diskcache.write_sealed(other, b"\x7fELF" + bytes(range(256)))
    assert diskcache.read_sealed(target) == b"\x7fELF" + bytes(range(256))
    whole = open(target, "rb").read()
    damaged = {"truncate": whole[:len(whole) // 2], "empty": b"", "extend": whole + b"\0",
               "another entry's file": open(other, "rb").read(), "unsealed": whole[:260]}[how]
    with open(target, "wb") as f:
        f.write(damaged)
    assert diskcache.read_sealed(target) is None
    assert diskcache.read_sealed(str(tmp_path / "missing.so")) is None
    assert [name for name in os.listdir(tmp_path) if name.endswith(".tmp")] == []


@pytest.mark.parametrize("how", ["truncate cubin", "swap cubins", "garble json", "drop json"])
def test_kernel_disk_cache_entry_is_checked(tmp_path, how):
    """The Triton kernels' entries of the GPU's launcher (kernels-<key>.cubin and .json) read back only whole."""
    binaries = [{"cubin": b"\x7fELF" + bytes([i]) * 300, "name": f"k{i}", "shared": 0, "num_warps": 4,
                 "kinds": "pp", "scratch": 0} for i in range(2)]
    entries = [str(tmp_path / f"kernels-{i}") for i in range(2)]
    for entry, binary in zip(entries, binaries):
        launcher.write_entry(entry, binary)
    assert launcher.read_entry(entries[0]) == binaries[0]
    if how == "truncate cubin":
        os.truncate(entries[0] + ".cubin", 100)
    elif how == "swap cubins":
        shutil.copyfile(entries[1] + ".cubin", entries[0] + ".cubin")
    elif how == "garble json":
        with open(entries[0] + ".json", "r+b") as f:
            f.write(b"[")
    else:
        os.remove(entries[0] + ".json")
    assert launcher.read_entry(entries[0]) is None
    assert launcher.read_entry(entries[1]) == binaries[1]
