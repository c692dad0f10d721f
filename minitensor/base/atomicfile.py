"""Writing to a path as open(path, "wb") would, except that a regular file changes only once complete.

A regular file (new, or the one a chain of symlinks names) is written to a temporary file in the same folder,
renamed over it at the end: an atomic replace on one filesystem. Before a byte is written the temporary takes
what the file it replaces has: its owner and group (where the writer may give them: root can, a user can keep
a group it is in; otherwise the new file is the writer's), its extended attributes (POSIX ACLs, labels) and
its mode, so the new contents are never readable by more users than the old. A new file gets 0o666 less the
umask, as open() gives. A file open() could not write (read-only to this user) raises the PermissionError
open() would. If writing fails the temporary is removed and the target is untouched. A hard link is replaced
like any regular file: the name written gets the new file and the file's other names keep the old one, as
rsync, git and editors that save atomically do, so a save never changes the bytes seen under another name (the
other names of `cp -al` or `rsync --link-dest` copies, of hard-linked caches) and stays atomic.

Anything else open() can write is opened and written in place, as torch.save does: a FIFO (its reader gets
the stream), a character or block device, a pipe or terminal named through /dev/stdout or /dev/fd/N, and a
file with no name to rename over (a deleted file or a memfd reached through /proc/self/fd). There nothing
can be rolled back: a failed write leaves what it wrote.

If the process dies part-way (SIGKILL, a crash, the machine's OOM killer) the target still holds the old,
complete file, but the temporary is left behind: its name carries the writer's host and process id
(`.<name>.mt-<host>-<pid>-<random>.tmp`), so the next write to the same target removes every such temporary
whose writer process is gone, and leaves those of writers still running (or on another host) alone.
"""
import contextlib
import errno
import os
import re
import socket
import stat
import zlib
from typing import BinaryIO, Iterator

_HOST = f"{zlib.crc32(socket.gethostname().encode()):08x}"
_NAME_MAX = 255  # bytes in a file name on the usual filesystems
_TAIL = len(f".mt-{_HOST}-{2**32}-{'0' * 12}.tmp") + 1  # what a temporary's name adds to the target's, at most


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """Yields a binary file object whose contents become `path`'s: on a clean exit for a regular file (new or
    replaced, keeping its owner, attributes and mode), as they are written for a FIFO, device or pipe."""
    info = _stat(path)
    target = os.path.realpath(path)  # through a symlink, replace the file it names, not the link
    if info is not None and not (stat.S_ISREG(info.st_mode) and _named_by(target, info)):
        with open(path, "wb") as file:  # IsADirectoryError for a folder, before anything is written
            yield file
        return
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        given = os.path.dirname(os.path.abspath(path))
        raise RuntimeError(f"Parent directory {given if not os.path.isdir(given) else folder} does not exist.")
    if info is not None and not os.access(path, os.W_OK, effective_ids=os.access in os.supports_effective_ids):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
    remove_stale_temporaries(target)
    fd, temp = _create_temporary(target, 0o666 if info is None else 0o600)
    try:
        with open(fd, "wb") as file:
            if info is not None:
                _take_over(file.fileno(), temp, target, info)
            yield file
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        raise


def _stat(path):
    """What `path` names, through symlinks; None where nothing is (a missing file or folder, a dangling link).
    Other errors (a loop of links, a folder this user cannot search) raise as open() would raise them."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _named_by(target, info):
    """Whether the path `target` names the file `info` describes: not so for a deleted file or a memfd that
    /proc/self/fd links to, whose resolved "name" is no file's."""
    try:
        found = os.stat(target, follow_symlinks=False)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino)


def _create_temporary(target, mode):
    """A new temporary for `target`, opened for writing: (fd, path). O_EXCL: never reuse someone else's file;
    `mode` less the umask, as open() would give."""
    while True:
        temp = temporary_path(target, os.getpid())
        try:
            return os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), mode), temp
        except FileExistsError:
            continue


def _take_over(fd, temp, target, info):
    """Give the temporary (`fd`, at `temp`) the owner and group, extended attributes and mode of the file it
    replaces, each as far as this writer may. The mode comes last: a change of owner clears set-id bits."""
    if hasattr(os, "fchown"):
        try:
            os.fchown(fd, info.st_uid, info.st_gid)
        except OSError:  # EPERM: not root; EINVAL: an owner outside this user namespace
            with contextlib.suppress(OSError):
                os.fchown(fd, -1, info.st_gid)
    if hasattr(os, "listxattr"):
        with contextlib.suppress(OSError):  # a filesystem without them
            for name in os.listxattr(target):
                with contextlib.suppress(OSError):  # one this user may not set (trusted.*, a security label)
                    os.setxattr(fd, name, os.getxattr(target, name))
    with contextlib.suppress(OSError):  # a filesystem without modes (FAT)
        os.chmod(fd if os.chmod in os.supports_fd else temp, stat.S_IMODE(info.st_mode))


def temporary_path(target: str | os.PathLike, pid: int) -> str:
    """A new temporary's path for `target` written by process `pid` of this host."""
    return os.path.join(os.path.dirname(target), f"{_prefix(target)}{pid}-{os.urandom(6).hex()}.tmp")


def remove_stale_temporaries(target: str | os.PathLike) -> None:
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
