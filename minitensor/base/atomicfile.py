"""Writing a file so that it appears under its name only once complete.

The bytes go to a temporary file in the same folder, which is renamed over the target at the end (an
atomic replace on one filesystem). If writing fails the temporary file is removed and the target is untouched.
If the process dies part-way (SIGKILL, a crash, the machine's OOM killer) the target still holds the old,
complete file, but the temporary is left behind: its name carries the writer's host and process id
(`.<name>.mt-<host>-<pid>-<random>.tmp`), so the next write to the same target removes every such temporary
whose writer process is gone, and leaves those of writers still running (or on another host) alone.
"""
import contextlib
import os
import re
import socket
import zlib

_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"
_NAME_MAX = 255  # bytes in a file name on the usual filesystems
_TAIL = len(f".mt-{_HOST}-{2**32}-{'0' * 12}.tmp") + 1  # what a temporary's name adds to the target's, at most


@contextlib.contextmanager
def atomic_write(path):
    """Yields a binary file object; on a clean exit its contents replace `path`."""
    target = os.path.realpath(path)  # through a symlink, replace the file it names, not the link
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise RuntimeError(f"Parent directory {os.path.dirname(os.path.abspath(path))} does not exist.")
    remove_stale_temporaries(target)
    while True:
        temp = temporary_path(target, os.getpid())
        try:  # O_EXCL: never reuse someone else's file; mode 0o666 less the umask, as open() would give
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
            break
        except FileExistsError:
            continue
    try:
        with open(fd, "wb") as file:
            yield file
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def temporary_path(target, pid):
    """A new temporary's path for `target` written by process `pid` of this host."""
    return os.path.join(os.path.dirname(target), f"{_prefix(target)}{pid}-{os.urandom(6).hex()}.tmp")


def remove_stale_temporaries(target):
    """Remove the temporaries that writes to `target` from this host left when their process died."""
    prefix = _prefix(target)
    pattern = re.compile(re.escape(prefix) + r"([0-9]+)-[0-9a-f]{12}\.tmp")
    try:
        names = os.listdir(os.path.dirname(target))
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match and not _alive(int(match.group(1))):
            with contextlib.suppress(OSError):  # another writer removed it first, or the folder is read-only
                os.unlink(os.path.join(os.path.dirname(target), name))


def _prefix(target):
    """`.<name>.mt-<host>-`, the name cut so that a temporary's name fits in _NAME_MAX bytes (a cut inside a
    character stays the same bytes on disk, through surrogateescape)."""
    name = os.path.basename(target).encode("utf-8", "surrogateescape")[:_NAME_MAX - _TAIL]
    return f".{name.decode('utf-8', 'surrogateescape')}.mt-{_HOST}-"


def _alive(pid):
    """Whether process `pid` exists; where that cannot be asked (not POSIX), every writer counts as alive."""
    if os.name != "posix" or pid <= 0:  # kill(0, ...) would signal our own process group
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists but belongs to another user
        return True
    return True
