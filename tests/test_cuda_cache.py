"""User CUDA C++ compiled through minitensor.kernels.cuda_cache with the real nvcc and NVRTC (no GPU needed).

The four kinds of one source are compiled once for the module (`built`); tests that write entries get their
own MINITENSOR_CACHE_DIR. NVRTC comes from the nvidia-cuda-nvrtc wheel: without it these tests fail with the
install hint, as a missing compiler must.
"""
import hashlib
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
import timeit

import pytest

from minitensor.base.errors import CompileError
from minitensor.kernels import cuda_cache, cuda_compilers

SAXPY = """\
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
template <typename T> __global__ void axpy(T a, const T* x, T* y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" void launch_saxpy(float a, const float* x, float* y, int n) { saxpy<<<(n + 255) / 256, 256>>>(a, x, y, n); }
"""
DEVICE_ONLY = SAXPY[:SAXPY.index('extern "C" void')]  # NVRTC compiles device code only
NAMES = ("axpy<float>", "axpy<double>")
BROKEN = """\
__global__ void k(float* y)
{
#warning "look here"
    y[0] = undefined_name;
}
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MINITENSOR_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(cache folder, {kind: Artifact}) for SAXPY in every kind, compiled once for the module."""
    folder = tmp_path_factory.mktemp("cuda-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MINITENSOR_CACHE_DIR", str(folder))
        patch.setattr(cuda_compilers, "_identities", {})  # this folder's compilers.json is written, whatever ran before
        artifacts = {kind: cuda_cache.compile(SAXPY, kind, arch=90) for kind in ("o", "so")}
        artifacts.update({kind: cuda_cache.compile(DEVICE_ONLY, kind, arch=90, name_expressions=NAMES)
                          for kind in ("cubin", "ptx")})
    return folder, artifacts


def run_python(code, cache, *args):
    """Run `code` in a fresh interpreter with MINITENSOR_CACHE_DIR=cache; its stdout."""
    env = {**os.environ, "MINITENSOR_CACHE_DIR": str(cache)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


# ------------------------------------------------------------------------------------------- the artifacts
def test_o_and_so_share_the_key_and_the_source(built):
    _, a = built
    assert a["o"].key == a["so"].key and a["o"].source_path == a["so"].source_path
    assert a["o"].path.endswith(f"{a['o'].key}.o") and a["so"].path.endswith(f"{a['so'].key}.so")
    assert read(a["o"].source_path, "r") == SAXPY
    assert read(a["o"].path)[:4] == read(a["so"].path)[:4] == b"\x7fELF"
    assert read(a["o"].path)[16] == 1 and read(a["so"].path)[16] == 3  # e_type: relocatable, shared object
    assert b"launch_saxpy" in read(a["so"].path)
    assert a["o"].lowered_names == a["so"].lowered_names == {}


def test_cubin_is_elf_and_ptx_is_text(built):
    _, a = built
    assert read(a["cubin"].path)[:4] == b"\x7fELF"
    ptx = read(a["ptx"].path, "r")
    assert ".entry saxpy" in ptx and ".target sm_90" in ptx and "\0" not in ptx
    assert a["cubin"].key == a["ptx"].key != a["o"].key  # one compiler family, one key; another family, another


def test_name_expressions_give_lowered_names(built):
    _, a = built
    expected = {"axpy<float>": "_Z4axpyIfEvT_PKS0_PS0_i", "axpy<double>": "_Z4axpyIdEvT_PKS0_PS0_i"}
    assert a["cubin"].lowered_names == a["ptx"].lowered_names == expected
    ptx = read(a["ptx"].path, "r")
    assert all(f".entry {name}(" in ptx for name in expected.values())


def test_entry_layout_and_sidecar(built):
    folder, a = built
    entry = a["cubin"]
    assert os.path.dirname(entry.path) == os.path.join(str(folder), "cuda", entry.key[:2])
    sidecar = json.loads(read(entry.path + ".json"))
    assert sidecar["lowered_names"] == entry.lowered_names
    assert sidecar["sha256"] == hashlib.sha256(read(entry.path)).hexdigest()
    assert (sidecar["key"], sidecar["kind"], sidecar["size"]) == (entry.key, "cubin", len(read(entry.path)))
    assert not [n for n in os.listdir(os.path.dirname(entry.path)) if n.endswith(".tmp")]
    memo = json.loads(read(os.path.join(str(folder), "cuda", "compilers.json")))
    assert sorted(stamp.split("|")[0] for stamp in memo) == ["nvcc", "nvrtc"]


def test_key_follows_source_options_arch(cache_dir):
    def key(source=DEVICE_ONLY, options=(), arch=90):
        return cuda_cache.compile(source, "cubin", options, arch=arch).key

    keys = [key(), key(options=["-lineinfo"]), key(options=("-lineinfo", "-DX=1")), key(arch=80),
            key(source=DEVICE_ONLY + "\n")]
    assert len(set(keys)) == len(keys)
    assert key(options=("-lineinfo",)) == keys[1]  # a list and a tuple of the same options: one entry


def test_in_process_hit_is_cheap(built, monkeypatch):
    folder, a = built
    monkeypatch.setenv("MINITENSOR_CACHE_DIR", str(folder))
    assert cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=list(NAMES)) == a["cubin"]
    n = 20000
    seconds = timeit.timeit(lambda: cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=NAMES),
                            number=n) / n
    assert seconds < 50e-6, f"an in-process hit took {seconds * 1e6:.1f} us"


# ------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("kind", ["cubin", "o"])
def test_compile_error_names_the_lines(cache_dir, kind):
    with pytest.raises(CompileError) as info:
        cuda_cache.compile(BROKEN, kind, arch=90)
    e = info.value
    assert (4, "error") in [(line, k) for line, k, _ in e.lines]
    assert any("undefined_name" in message for line, k, message in e.lines if line == 4)
    assert (3, "warning") in [(line, k) for line, k, _ in e.lines]  # nvcc: from the host compiler's preprocessor
    assert read(e.source_path, "r") == BROKEN
    assert "line 4" in str(e) and e.log in str(e) and e.source_path in str(e)
    assert "-arch=sm_90" in e.command and (kind == "cubin" or e.command[0].endswith("nvcc"))
    copy = pickle.loads(pickle.dumps(e))  # as from a worker process
    assert (copy.log, copy.command, copy.source_path, copy.lines, str(copy)) == (
        e.log, e.command, e.source_path, e.lines, str(e))


def test_bad_name_expression_is_a_compile_error(cache_dir):
    with pytest.raises(CompileError, match=r"failed: __nv_name_map\(\d+\): error: identifier \"nope\"") as info:
        cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=["nope<float>"])
    assert info.value.lines == []  # its line numbers are of NVRTC's name map, not of the source


@pytest.mark.parametrize("kind, words", [("cubin", "unrecognized option"), ("o", "Unknown option")])
def test_unknown_compiler_option_is_a_compile_error(cache_dir, kind, words):
    with pytest.raises(CompileError, match=words) as info:
        cuda_cache.compile(DEVICE_ONLY, kind, ["--no-such-option"], arch=90)
    assert "--no-such-option" in info.value.command


@pytest.mark.parametrize("arguments, error, words", [
    (dict(options=[3]), TypeError, r"options\[0\] must be a str, got int"),
    (dict(options="-lineinfo"), TypeError, "options must be a tuple or list of str, got str"),
    (dict(options=[["-lineinfo"]]), TypeError, r"options\[0\] must be a str, got list"),
    (dict(arch="90"), TypeError, "arch must be a positive int"),
    (dict(arch=True), TypeError, "arch must be a positive int"),
    (dict(kind="fatbin"), ValueError, "kind must be one of 'o', 'so', 'cubin', 'ptx', got 'fatbin'"),
    (dict(kind="o", name_expressions=["axpy<float>"]), ValueError, "name_expressions need an NVRTC kind"),
    (dict(name_expressions=[b"axpy<float>"]), TypeError, r"name_expressions\[0\] must be a str"),
    (dict(source=DEVICE_ONLY.encode()), TypeError, "source must be a str of CUDA C\\+\\+, got bytes"),
])
def test_bad_arguments(cache_dir, arguments, error, words):
    call = {"source": DEVICE_ONLY, "kind": "cubin", "options": (), "arch": 90, **arguments}
    source, kind, options = call.pop("source"), call.pop("kind"), call.pop("options")
    with pytest.raises(error, match=words):
        cuda_cache.compile(source, kind, options, **call)
    with pytest.raises(error, match=words):
        cuda_cache.compile_async(source, kind, options, **call)


def test_missing_compilers_name_what_to_install(cache_dir, monkeypatch):
    monkeypatch.setattr(cuda_compilers, "_NVRTC_SONAMES", ("libnvrtc.so.0-not-there",))
    with pytest.raises(RuntimeError, match="pip install nvidia-cuda-nvrtc"):
        cuda_cache.compile(DEVICE_ONLY + "// new\n", "cubin", arch=90)
    monkeypatch.setattr(cuda_compilers, "_nvcc_candidates", lambda: iter(()))
    with pytest.raises(RuntimeError, match="nvcc.*not found.*CUDA toolkit.*nvidia-cuda-nvcc"):
        cuda_cache.compile(SAXPY + "// new\n", "o", arch=90)


# ------------------------------------------------------------------------------------------- the disk
def test_hit_in_another_process_compiles_nothing(built):
    """A fresh process finds every kind on disk: same paths, files untouched, and neither nvcc run nor libnvrtc
    loaded (the key's compiler identity comes from compilers.json)."""
    folder, a = built
    before = {kind: os.stat(art.path) for kind, art in a.items()}
    source_file = folder / "saxpy.cu"
    source_file.write_text(SAXPY)
    out = run_python("""
        import json, subprocess, sys, time
        from minitensor.kernels import cuda_cache
        ran = []
        subprocess.Popen = lambda *a, **k: ran.append(a)  # nvcc would be started through Popen
        full = open(sys.argv[1]).read()
        device = full[:full.index('extern "C" void')]
        names = ("axpy<float>", "axpy<double>")
        start = time.perf_counter()
        paths = {kind: cuda_cache.compile(full, kind, arch=90).path for kind in ("o", "so")}
        paths.update({kind: cuda_cache.compile(device, kind, arch=90, name_expressions=names).path
                      for kind in ("cubin", "ptx")})
        seconds = time.perf_counter() - start
        loaded = "libnvrtc" in open("/proc/self/maps").read() or "cuda.bindings.nvrtc" in sys.modules
        print(json.dumps({"paths": paths, "ran": len(ran), "loaded": loaded, "seconds": seconds}))
        """, folder, source_file)
    found = json.loads(out)
    assert found["paths"] == {kind: art.path for kind, art in a.items()}
    assert found["ran"] == 0 and not found["loaded"]
    after = {kind: os.stat(art.path) for kind, art in a.items()}
    assert {k: (s.st_ino, s.st_mtime_ns) for k, s in before.items()} == {
        k: (s.st_ino, s.st_mtime_ns) for k, s in after.items()}


SLOW = "\n".join(f'extern "C" __global__ void k{i}(float* y, int n) {{ float a = y[threadIdx.x]; '
                 f'for (int q = 0; q < n; q++) a = sinf(a) * {i}.5f + cosf(a); y[threadIdx.x] = a; }}'
                 for i in range(16))  # about 0.4 s of NVRTC: long enough for the processes to meet


def test_processes_compiling_one_source_compile_it_once(cache_dir):
    (cache_dir / "slow.cu").write_text(SLOW)
    children = [subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time
        from minitensor.kernels import cuda_cache, cuda_compilers
        folder, me = sys.argv[1], sys.argv[2]
        real = cuda_compilers.run
        def counted(*args):
            with open(os.path.join(folder, "compiles"), "a") as f:
                f.write(me + "\\n")
            return real(*args)
        cuda_compilers.run = counted
        open(os.path.join(folder, "ready-" + me), "w").close()
        while not os.path.exists(os.path.join(folder, "go")):
            time.sleep(0.001)
        print(cuda_cache.compile(open(os.path.join(folder, "slow.cu")).read(), "cubin", arch=90).path)
        """), str(cache_dir), str(i)], stdout=subprocess.PIPE, text=True) for i in range(3)]
    deadline = time.monotonic() + 60
    while len([n for n in os.listdir(cache_dir) if n.startswith("ready-")]) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    (cache_dir / "go").touch()
    paths = {child.communicate(timeout=60)[0].strip() for child in children}
    assert [child.returncode for child in children] == [0, 0, 0]
    assert len(paths) == 1 and read(paths.pop())[:4] == b"\x7fELF"
    assert len(read(cache_dir / "compiles", "r").split()) == 1


@pytest.mark.parametrize("damage", ["truncate", "drop sidecar", "garble sidecar"])
def test_damaged_entry_is_rebuilt(cache_dir, damage):
    first = cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=NAMES)
    good = read(first.path)
    if damage == "truncate":
        with open(first.path, "r+b") as f:
            f.truncate(len(good) // 2)
    elif damage == "drop sidecar":
        os.remove(first.path + ".json")
    else:
        with open(first.path + ".json", "w") as f:
            f.write("{not json")
    cuda_cache.cache_clear()  # memory trusts itself: a new process would start here
    again = cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=NAMES)
    assert again == first
    assert read(again.path) == good
    assert json.loads(read(again.path + ".json"))["lowered_names"] == first.lowered_names


@pytest.mark.parametrize("damage", ["truncate", "swap", "swap with its sidecar"])
def test_entry_damaged_after_its_compile_is_rebuilt_before_loading(cache_dir, damage):
    """This process remembers the entry, so compile() trusts it (a cheap hit); compile_checked, what loads it,
    reads and checks it again: a library dlopen'd truncated kills the process with SIGBUS."""
    first = cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=NAMES)
    other = cuda_cache.compile(DEVICE_ONLY, "cubin", arch=80, name_expressions=NAMES)
    good = read(first.path)
    assert read(other.path) != good
    if damage == "truncate":
        os.truncate(first.path, len(good) // 2)
    else:  # another valid cubin, with its own sidecar too: the sidecar names its entry
        for suffix in ("", ".json")[:1 + (damage == "swap with its sidecar")]:
            with open(first.path + suffix, "wb") as f:
                f.write(read(other.path + suffix))
    assert cuda_cache.compile(DEVICE_ONLY, "cubin", arch=90, name_expressions=NAMES) == first
    artifact, data = cuda_cache.compile_checked(DEVICE_ONLY, "cubin", arch=90, name_expressions=NAMES)
    assert artifact == first and data == good == read(first.path)


# ------------------------------------------------------------------------------------------- async
def test_compile_async_and_wait(cache_dir):
    scope = {"ptx": cuda_cache.compile_async(DEVICE_ONLY, "ptx", arch=80, name_expressions=NAMES),
             "so": cuda_cache.compile_async(SAXPY, "so", arch=80), "other": 7}
    cuda_cache.wait(scope)
    assert scope["other"] == 7
    assert ".entry saxpy" in read(scope["ptx"].path, "r") and scope["ptx"].lowered_names["axpy<float>"]
    assert read(scope["so"].path)[:4] == b"\x7fELF"
    again = cuda_cache.compile_async(DEVICE_ONLY, "ptx", arch=80, name_expressions=NAMES)
    assert again.done() and again.result() == scope["ptx"]  # an in-process hit: no worker
    assert cuda_cache.compile(SAXPY, "so", arch=80) == scope["so"]


def test_compile_async_error(cache_dir):
    broken = cuda_cache.compile_async(BROKEN, "cubin", arch=90)
    with pytest.raises(CompileError) as info:
        broken.result()
    assert (4, "error") in [(line, kind) for line, kind, _ in info.value.lines]
    scope = {"fine": cuda_cache.compile_async(DEVICE_ONLY, "cubin", arch=80), "broken": broken}
    with pytest.raises(CompileError, match="undefined_name"):
        cuda_cache.wait(scope)
    assert isinstance(scope["fine"], cuda_cache.Artifact)  # the results before the error are in place
