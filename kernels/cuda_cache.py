"""User CUDA C++ source compiled once and kept: in this process, and on disk for the next ones (CuPy's RawKernel
cache, torch inductor's CUDACodeCache and AsyncCompile).

An entry lives in <cache folder>/cuda/<key[:2]>/ (the folder of base/diskcache.py, $MINITENSOR_CACHE_DIR):
- `<key>.cu`: the source; nvcc compiles this file, so its messages and CompileError name it.
- `<key>.<kind>`: the artifact as the compiler wrote it, for cuobjdump, ctypes.CDLL or cuModuleLoad.
- `<key>.<kind>.json`: the artifact's key, kind, size, sha256 and lowered names, written last. The entry counts
  only once this exists and the artifact matches it, so a torn, truncated or swapped artifact is found, removed
  and built again. `compile_checked` checks it again just before the artifact is loaded, from the bytes it
  returns (or before the path is dlopen'd): a file damaged since this process compiled it is built again rather
  than mapped (dlopen of a truncated library kills the process with SIGBUS).
- `<key>.<kind>.lock`: flock'd around a miss, so processes that miss together compile once.
Every file is written to a temporary beside it, fsync'd and renamed into place. Entries are read from the cache
folder wherever it is; a missing or damaged one is built where the cache can be written (this process's temporary
folder for a read-only cache, diskcache.writable). The key hashes the source, the options as given, the arch,
the compiler's version and the name expressions, but not the kind: "o" and "so" of one source share the key and
the .cu, as in torch.

compile_async compiles in worker processes started with spawn, so that none inherits a CUDA context.
"""
import atexit
import fcntl
import hashlib
import json
import os
import threading
from contextlib import suppress
from dataclasses import dataclass
from functools import partial

from minitensor.base import diskcache

from . import cuda_compilers

SCHEMA = 2  # bump when the key's contents or the entry's layout change
_ENV = "MINITENSOR_CACHE_DIR"
_keys = {}  # request (source, kind, options, arch, name_expressions) -> key: a hit hashes no source
_artifacts = {}  # ($MINITENSOR_CACHE_DIR, key, kind) -> Artifact
_pool = None
_pool_lock = threading.Lock()


@dataclass(frozen=True)
class Artifact:
    """A compiled entry: `path` the artifact, `source_path` its .cu, `lowered_names` {expression: mangled name}
    for "cubin" and "ptx" (empty for "o" and "so")."""
    path: str
    key: str
    source_path: str
    lowered_names: dict


def compile(source, kind, options=(), *, arch, name_expressions=()):
    """The Artifact of CUDA C++ `source` compiled to `kind` ("o", "so", "cubin" or "ptx") for compute
    capability `arch` (90 for sm_90), from memory, the disk cache, or the compiler. Raises CompileError."""
    request = _request(source, kind, options, arch, name_expressions)
    artifact = _in_memory(request)
    if artifact is None:
        key = _key(request)
        artifact = _on_disk(_folder(key), key, kind) or _build(_folder(key, writable=True), key, request)
        _remember(os.environ.get(_ENV), request, artifact)
    return artifact


def compile_checked(source, kind, options=(), *, arch, name_expressions=()):
    """(Artifact, its bytes) as compile() gives it, the bytes read and checked against the sidecar now, for
    loading: an entry this process remembers but whose file was damaged since is forgotten and built again."""
    for _ in range(2):
        artifact = compile(source, kind, options, arch=arch, name_expressions=name_expressions)
        data = _whole(os.path.dirname(artifact.path), artifact.key, kind)
        if data is not None:
            return artifact, data[1]
        _artifacts.pop((os.environ.get(_ENV), artifact.key, kind), None)
    raise RuntimeError(f"the cached CUDA artifact {artifact.path} was damaged again as soon as it was rebuilt "
                       f"(something else writes to the cache folder)")


def compile_async(source, kind, options=(), *, arch, name_expressions=()):
    """compile() in a worker process: a Future of the Artifact, whose result() raises a CompileError. A hit in
    memory or on disk gives a Future already done, without starting a worker. As with any spawn pool, a script
    that calls this while being imported needs `if __name__ == "__main__":` (the workers import it again)."""
    from concurrent.futures import Future  # here: compile() alone never pays for importing it (5 ms)

    request = _request(source, kind, options, arch, name_expressions)
    artifact = _in_memory(request)
    setting = os.environ.get(_ENV)
    if artifact is None:
        key = _key(request)
        artifact = _on_disk(_folder(key), key, kind)
    if artifact is not None:
        _remember(setting, request, artifact)
        done = Future()
        done.set_result(artifact)
        return done
    cache_dir = os.path.dirname(os.path.dirname(_folder(key, writable=True)))  # where this process writes
    future = _workers().submit(_compile_in_worker, cache_dir, request)
    future.add_done_callback(partial(_remember_result, setting, request))
    return future


def wait(scope):
    """Replace every Future among the values of dict `scope` by its result, as torch inductor's
    AsyncCompile.wait; the first failed one raises its error."""
    from concurrent.futures import Future  # here: compile() alone never pays for importing it (5 ms)

    for name, value in list(scope.items()):
        if isinstance(value, Future):
            scope[name] = value.result()


def cache_clear():
    """Forget this process's entries (the disk keeps them), as torch's CodeCache.cache_clear: the next
    compile reads the disk again."""
    _keys.clear()
    _artifacts.clear()


# ------------------------------------------------------------------------------------------- the request
def _request(source, kind, options, arch, name_expressions):
    """The arguments as a dict key; lists become tuples (a str stays a str, for _key's check to refuse)."""
    options = tuple(options) if type(options) is list else options
    names = tuple(name_expressions) if type(name_expressions) is list else name_expressions
    return source, kind, options, arch, names


def _in_memory(request):
    try:
        return _artifacts.get((os.environ.get(_ENV), _keys.get(request), request[1]))
    except TypeError:  # an unhashable argument: _key's checks name it
        return None


def _key(request):
    """The entry's key (sha256 hex), after checking every argument."""
    _check(*request)
    source, kind, options, arch, names = request
    identity = cuda_compilers.compiler_identity(kind)
    payload = json.dumps([SCHEMA, source, list(options), arch, identity, sorted(names)])
    key = _keys[request] = hashlib.sha256(payload.encode()).hexdigest()
    return key


def _check(source, kind, options, arch, name_expressions):
    if not isinstance(source, str):
        raise TypeError(f"source must be a str of CUDA C++, got {type(source).__name__}")
    if kind not in cuda_compilers.KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, cuda_compilers.KINDS))}, got {kind!r}")
    _check_strings("options", options)
    if not isinstance(arch, int) or isinstance(arch, bool) or arch <= 0:
        raise TypeError(f"arch must be a positive int compute capability such as 90 (for sm_90), got {arch!r}")
    _check_strings("name_expressions", name_expressions)
    if name_expressions and cuda_compilers.KINDS[kind] != "nvrtc":
        raise ValueError(f"name_expressions need an NVRTC kind ('cubin' or 'ptx'), got kind {kind!r}")


def _check_strings(what, values):
    if not isinstance(values, tuple):
        raise TypeError(f"{what} must be a tuple or list of str, got {type(values).__name__} {values!r}")
    for i, value in enumerate(values):
        if not isinstance(value, str):
            raise TypeError(f"{what}[{i}] must be a str, got {type(value).__name__} {value!r}")


def _remember(setting, request, artifact):
    _keys[request] = artifact.key
    _artifacts[setting, artifact.key, request[1]] = artifact


# ------------------------------------------------------------------------------------------- the disk
def _folder(key, writable=False):
    """The entry's folder: where it is read, or with `writable` where it is built (created)."""
    if not writable:
        return os.path.join(diskcache.path("cuda"), key[:2])
    folder = os.path.join(diskcache.writable("cuda"), key[:2])
    os.makedirs(folder, exist_ok=True)
    return folder


def _on_disk(folder, key, kind, repair=False):
    """The entry if it is whole (see _whole). With `repair` (under the lock, where no one is writing it) a damaged
    entry is removed."""
    base = os.path.join(folder, key)
    path = f"{base}.{kind}"
    whole = _whole(folder, key, kind)
    if whole is not None and os.path.exists(base + ".cu"):
        return Artifact(path, key, base + ".cu", whole[0]["lowered_names"])
    if repair:
        for damaged in (path + ".json", path):  # the sidecar first: the entry stops counting at once
            with suppress(FileNotFoundError):
                os.remove(damaged)
    return None


def _whole(folder, key, kind):
    """(sidecar, artifact bytes) when the sidecar names this entry and the artifact has its size and sha256,
    else None."""
    path = os.path.join(folder, f"{key}.{kind}")
    try:
        with open(path + ".json", "rb") as f:
            sidecar = json.loads(f.read())
        with open(path, "rb") as f:
            data = f.read()
        whole = ((sidecar["key"], sidecar["kind"], sidecar["size"]) == (key, kind, len(data))
                 and sidecar["sha256"] == hashlib.sha256(data).hexdigest()
                 and isinstance(sidecar["lowered_names"], dict))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return (sidecar, data) if whole else None


def _build(folder, key, request):
    """Compile under the entry's lock, unless a process that held it first left a whole entry."""
    source, kind, options, arch, names = request
    base = os.path.join(folder, key)
    with open(f"{base}.{kind}.lock", "ab") as lock:  # closing it releases the flock
        fcntl.flock(lock, fcntl.LOCK_EX)
        source_path = base + ".cu"
        if diskcache.read(source_path) != source.encode():
            _write(source_path, source.encode())
        found = _on_disk(folder, key, kind, repair=True)
        if found is not None:
            return found
        data, lowered = cuda_compilers.run(kind, source, source_path, options, arch, names)
        _write(f"{base}.{kind}", data)
        sidecar = {"key": key, "kind": kind, "size": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                   "lowered_names": lowered}
        _write(f"{base}.{kind}.json", json.dumps(sidecar).encode())  # last: now the entry counts
    return Artifact(f"{base}.{kind}", key, source_path, lowered)


def _write(path, data):
    """Atomically and durably (fsync'd, then renamed): a reader sees the old file or the new one, and after a
    crash a torn artifact or sidecar still fails the sha256 check and is built again."""
    diskcache.write(path, data)


# ------------------------------------------------------------------------------------------- the workers
def _workers():
    import multiprocessing  # here: only an async compile pays for importing the pool
    from concurrent.futures import ProcessPoolExecutor

    global _pool
    with _pool_lock:
        if _pool is None:
            context = multiprocessing.get_context("spawn")  # a forked worker would share the parent's CUDA context
            _pool = ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=context)
            atexit.register(_pool.shutdown, cancel_futures=True)
        return _pool


def _compile_in_worker(cache_dir, request):
    """compile() in a worker, in the submitting process's cache folder (the worker's environment is from its
    start, and a test or a caller may have changed it since)."""
    os.environ[_ENV] = cache_dir
    source, kind, options, arch, names = request
    return compile(source, kind, options, arch=arch, name_expressions=names)


def _remember_result(setting, request, future):
    if not future.cancelled() and future.exception() is None:
        _remember(setting, request, future.result())
