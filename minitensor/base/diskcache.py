"""minitensor's files on disk: compiled kernels and the C extensions, kept so that a new process finds them
without importing Triton.

The folder is $MINITENSOR_CACHE_DIR, else ~/.cache/minitensor. Entries are written to a temporary file and
renamed into place, so a reader (another process, or this one after a crash) never sees half an entry.

A folder that cannot be written (a file, a read-only folder or medium) would make `import minitensor` fail, as
the C extensions are built there. Its entries are still read (an entry is a file `name`, or files `name.*` of
which `name.json` is written last, as the kernels' are); a missing one is written to a temporary folder of this
process instead (removed at exit), after one RuntimeWarning naming the folder and what went wrong.
Whether a folder can be written is found by writing to it: permission bits do not tell for root, nor for a
read-only mount.
"""
import atexit
import os
import shutil
import threading
import warnings

_checked = {}  # folder -> None when entries can be written to it, else why not
_fallback = None  # this process's temporary folder, made at the first entry that needs it
_lock = threading.Lock()


def path(name):
    """The path of entry `name`: in the cache folder, unless it is not there and cannot be written there."""
    configured = os.environ.get("MINITENSOR_CACHE_DIR")
    folder = configured or os.path.join(os.path.expanduser("~"), ".cache", "minitensor")
    entry = os.path.join(folder, name)
    if os.path.exists(entry) or os.path.exists(entry + ".json"):  # an entry is read wherever it is
        return entry
    if folder not in _checked:  # probed only when an entry is to be written: a warm start writes nothing
        with _lock:
            if folder not in _checked:
                _checked[folder] = _problem(folder)
    problem = _checked[folder]
    if problem is None:
        return entry
    what = f"MINITENSOR_CACHE_DIR={folder!r}" if configured else f"the cache folder {folder!r}"
    return os.path.join(_temporary(what, problem), name)


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
    """Write bytes to `target` atomically."""
    tmp = temporary(target)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
