"""minitensor's files on disk: compiled kernels and the C extensions, kept so that a new process finds them
without importing Triton.

The folder is $MINITENSOR_CACHE_DIR, else ~/.cache/minitensor. Entries are written to a temporary file, fsync'd
and renamed into place, so a reader (another process, or this one after a crash) never sees half an entry.
A binary that is mapped (dlopen'd) or loaded is also sealed (`write_sealed`): a trailer records its length and
the sha256 of its name and bytes, and `read_sealed` checks both before it is used. A truncated, empty or torn
file, or another entry's file put in its place, then reads as missing and is built again, rather than failing
`import minitensor` until the cache is deleted, or killing the process with SIGBUS (a mapped file shorter than
its ELF headers say).

A folder that cannot be written (a file, a read-only folder or medium) would make `import minitensor` fail, as
the C extensions are built there. Its entries are still read (an entry is a file `name`, or files `name.*` of
which `name.json` is written last, as the kernels' are); a missing or damaged one is written to a temporary
folder of this process instead (removed at exit), after one RuntimeWarning naming the folder and what went wrong.
Whether a folder can be written is found by writing to it: permission bits do not tell for root, nor for a
read-only mount.
"""
import atexit
import contextlib
import hashlib
import os
import shutil
import struct
import threading
import warnings

_checked = {}  # folder -> None when entries can be written to it, else why not
_fallback = None  # this process's temporary folder, made at the first entry that needs it
_lock = threading.Lock()
_SEAL = struct.Struct("<32sQ8s")  # sha256(name + data), len(data), magic: after the data
_MAGIC = b"mtseal01"


def path(name):
    """The path of entry `name`: in the cache folder, unless it is not there and cannot be written there."""
    entry = os.path.join(_folder()[0], name)
    if os.path.exists(entry) or os.path.exists(entry + ".json"):  # an entry is read wherever it is
        return entry
    return writable(name)


def writable(name):
    """Where entry `name` is (re)written: the cache folder, or this process's temporary folder where the cache
    folder cannot be written (a damaged entry of a read-only cache is built again there)."""
    folder, configured = _folder()
    if folder not in _checked:  # probed only when an entry is to be written: a warm start writes nothing
        with _lock:
            if folder not in _checked:
                _checked[folder] = _problem(folder)
    problem = _checked[folder]
    if problem is None:
        return os.path.join(folder, name)
    what = f"MINITENSOR_CACHE_DIR={folder!r}" if configured else f"the cache folder {folder!r}"
    return os.path.join(_temporary(what, problem), name)


def _folder():
    configured = os.environ.get("MINITENSOR_CACHE_DIR")
    return configured or os.path.join(os.path.expanduser("~"), ".cache", "minitensor"), configured


def _problem(folder):
    """None when entries can be written to `folder` (created if missing), else what stops it."""
    if os.path.exists(folder) and not os.path.isdir(folder):
        return "it is a file, not a folder"
    try:
        os.makedirs(folder, exist_ok=True)
        probe = temporary(os.path.join(folder, "probe"))
        with open(probe, "wb"):
            pass
        os.remove(probe)
        return None
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"


def _temporary(what, problem):
    global _fallback
    with _lock:
        if _fallback is None:
            import tempfile  # here: only a process without a usable cache folder pays for importing it
            _fallback = tempfile.mkdtemp(prefix="minitensor-cache-")
            atexit.register(shutil.rmtree, _fallback, ignore_errors=True)
            warnings.warn(f"minitensor: {what} is not usable ({problem}); this process caches compiled kernels and "
                          f"C extensions in {_fallback}, removed at exit", RuntimeWarning, stacklevel=3)
        return _fallback


def temporary(target):
    """A name beside `target` for writing it, unique to this process and thread."""
    return f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"


def write(target, data):
    """Write bytes to `target` atomically and durably: a temporary beside it, fsync'd, renamed over it."""
    tmp = temporary(target)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        raise


def write_sealed(target, data):
    """write() `data` followed by its seal, which read_sealed checks. The seal is a trailer, so a sealed shared
    library or cubin is still one file that the loader takes as it is (an ELF file ignores bytes past its end)."""
    write(target, data + _seal(os.path.basename(target), data))


def read(target):
    """`target`'s bytes, or None when it cannot be read (missing, a folder, unreadable)."""
    try:
        with open(target, "rb") as f:
            return f.read()
    except OSError:
        return None


def read_sealed(target):
    """The data write_sealed wrote to `target`, or None when it is missing or not whole: too short, its length
    or sha256 not those of the seal, or sealed under another name."""
    whole = read(target)
    if whole is None or len(whole) < _SEAL.size:
        return None
    data = whole[:-_SEAL.size]
    return data if whole[-_SEAL.size:] == _seal(os.path.basename(target), data) else None


def _seal(name, data):
    return _SEAL.pack(hashlib.sha256(name.encode("utf-8", "surrogateescape") + b"\0" + data).digest(), len(data),
                      _MAGIC)
