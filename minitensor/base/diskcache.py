"""minitensor's files on disk: compiled kernels and the C extensions, kept so that a new process finds them
without importing Triton.

The folder is $MINITENSOR_CACHE_DIR, else ~/.cache/minitensor. Entries are written to a temporary file and
renamed into place, so a reader (another process, or this one after a crash) never sees half an entry.
"""
import os
import threading


def path(name):
    """The path of entry `name`, creating the folder on first use."""
    folder = os.environ.get("MINITENSOR_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "minitensor")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


def temporary(target):
    """A name beside `target` for writing it, unique to this process and thread."""
    return f"{target}.{os.getpid()}.{threading.get_ident()}.tmp"


def write(target, data):
    """Write bytes to `target` atomically."""
    tmp = temporary(target)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, target)
