"""Writing a file so that it appears under its name only once complete.

The bytes go to a temporary file in the same folder, which is renamed over the target at the end (an
atomic replace on one filesystem). If writing fails or the process dies part-way, the target is untouched:
it never holds a half-written file. The temporary file is removed on failure.
"""
import contextlib
import os


@contextlib.contextmanager
def atomic_write(path):
    """Yields a binary file object; on a clean exit its contents replace `path`."""
    target = os.path.realpath(path)  # through a symlink, replace the file it names, not the link
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise RuntimeError(f"Parent directory {os.path.dirname(os.path.abspath(path))} does not exist.")
    while True:
        temp = os.path.join(folder, f".{os.path.basename(target)}.{os.urandom(6).hex()}.tmp")
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
