"""What a save to a path does to the file the path names (base/atomicfile.py behind mt.save, save_safetensors and
mt.cuda.memory._dump_snapshot): a regular file is replaced atomically and keeps its mode, owner and extended
attributes; a FIFO, a device or a pipe is written into, as open(path, "wb") would; a symlink is written through;
a hard link is replaced (the other names keep the old file). A failed save leaves a regular target as it was.

No test touches the machine's /dev/null: as root, the device node is one made here with os.mknod.
"""
import contextlib
import io
import os
import resource
import signal
import stat
import subprocess
import sys
import tempfile
import threading

import pytest

import minitensor as mt
from minitensor.cuda import memory
from minitensor.serialization import api as serialization

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def save_checkpoint(path, value=1.0):
    mt.save({"x": mt.full((3,), value)}, path)


def load_checkpoint(path):
    return mt.load(path)["x"].tolist()


def save_safetensors(path, value=1.0):
    mt.save_safetensors({"x": mt.full((3,), value)}, path)


def dump_snapshot(path, value=1.0):
    memory._dump_snapshot(path)


WRITERS = {"save": save_checkpoint, "save_safetensors": save_safetensors, "_dump_snapshot": dump_snapshot}


def temporaries(folder):
    return sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))


@contextlib.contextmanager
def umask(mask):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


class Reader(threading.Thread):
    """Reads a FIFO or a pipe to its end on a thread."""

    def __init__(self, open_file):
        super().__init__(daemon=True)
        self.open_file, self.data, self.opened = open_file, None, threading.Event()

    def run(self):
        with self.open_file() as file:
            self.opened.set()
            self.data = file.read()

    def result(self):
        self.join(timeout=120)  # a bound, not a timing assertion: the writer has finished by now
        assert not self.is_alive(), "the reader never saw the end of the stream"
        return self.data


# ---------------------------------------------------------------------------------------------- regular files
@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mode", [0o600, 0o640, 0o751, 0o604])
def test_an_existing_file_keeps_its_mode(tmp_path, writer, mode):
    path = tmp_path / "ckpt"
    path.write_bytes(b"old")
    os.chmod(path, mode)
    WRITERS[writer](path)
    assert stat.S_IMODE(os.stat(path).st_mode) == mode and path.read_bytes() != b"old"
    assert temporaries(tmp_path) == []


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_0666_less_the_umask_as_open_gives(tmp_path, mask, mode):
    with umask(mask):
        save_checkpoint(tmp_path / "new.pt")
        with open(tmp_path / "by_open", "wb"):
            pass
    assert stat.S_IMODE(os.stat(tmp_path / "new.pt").st_mode) == mode
    assert stat.S_IMODE(os.stat(tmp_path / "by_open").st_mode) == mode


@pytest.mark.skipif(not ROOT, reason="giving a file to another owner needs root")
@pytest.mark.parametrize("writer", WRITERS)
def test_an_existing_file_keeps_its_owner_and_group(tmp_path, writer):
    path = tmp_path / "ckpt"
    path.write_bytes(b"old")
    try:
        os.chown(path, 12345, 23456)
    except OSError as e:  # EINVAL: a user namespace that does not map these ids
        pytest.skip(f"cannot give a file to another owner here: {e}")
    os.chmod(path, 0o2640)  # chown clears set-group-id: the mode is set after the owner
    WRITERS[writer](path)
    info = os.stat(path)
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (12345, 23456, 0o2640)


def test_the_new_contents_are_never_readable_by_more_than_the_old(tmp_path, monkeypatch):
    """While the checkpoint is written, its temporary already has the target's mode: a 0600 file's new contents
    are not readable by others for the length of the save."""
    path = tmp_path / "secret.pt"
    save_checkpoint(path)
    os.chmod(path, 0o600)
    seen = []
    write = serialization.write_storage

    def observe(record, storage):
        seen.extend(stat.S_IMODE(os.stat(tmp_path / name).st_mode) for name in temporaries(tmp_path))
        write(record, storage)

    monkeypatch.setattr(serialization, "write_storage", observe)
    with umask(0o022):
        save_checkpoint(path, 2.0)
    assert seen == [0o600] and load_checkpoint(path) == [2.0] * 3


def test_an_existing_file_keeps_its_extended_attributes(tmp_path):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path)
    try:
        os.setxattr(path, "user.origin", b"run 17")
    except (AttributeError, OSError) as e:  # not Linux, or a filesystem without user attributes
        pytest.skip(f"no user extended attributes here: {e}")
    save_checkpoint(path, 2.0)
    assert os.getxattr(path, "user.origin") == b"run 17" and load_checkpoint(path) == [2.0] * 3


def as_nobody(fn):
    """Run `fn()` in a forked child as user and group 65534 (nobody); what it raised, as "Type: message", or ""."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        message = b""
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            fn()
        except BaseException as e:
            message = f"{type(e).__name__}: {e}".encode()
        finally:
            os.write(write_end, message)
            os._exit(0)
    os.close(write_end)
    with open(read_end, "rb") as file:
        message = file.read().decode()
    os.waitpid(pid, 0)
    return message


def test_a_read_only_file_is_refused_or_overwritten_as_open_would():
    """open(path, "wb") of a 0444 file fails unless the writer is root, who writes it; save does the same, and
    the file stays read-only either way. As root, a child that is user nobody checks the refusal."""
    with tempfile.TemporaryDirectory() as folder:  # not tmp_path: nobody must reach it
        os.chmod(folder, 0o777)
        path = os.path.join(folder, "frozen.pt")
        save_checkpoint(path)
        os.chmod(path, 0o444)
        refused = as_nobody(lambda: save_checkpoint(path, 2.0)) if ROOT else ""
        if not ROOT:
            with pytest.raises(PermissionError, match="frozen.pt"):
                save_checkpoint(path, 2.0)
        else:
            assert refused.startswith("PermissionError: [Errno 13]") and "frozen.pt" in refused, refused
            assert load_checkpoint(path) == [1.0] * 3
            save_checkpoint(path, 3.0)  # root writes it, as open() lets root
        assert load_checkpoint(path) == ([3.0] if ROOT else [1.0]) * 3
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o444 and temporaries(folder) == []


def test_a_save_that_runs_out_of_room_keeps_the_old_file(tmp_path):
    """A real write failure (the file size limit, EFBIG, as a full disk gives ENOSPC) part-way through: the target
    keeps its old bytes and mode, and no temporary is left."""
    path = tmp_path / "ckpt.pt"
    save_checkpoint(path)
    os.chmod(path, 0o600)
    before = path.read_bytes()
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, hard))
    try:
        with pytest.raises(OSError) as raised:
            mt.save({"x": mt.zeros(1 << 16)}, path)  # 256 KiB of storage
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert raised.value.errno is not None
    assert path.read_bytes() == before and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert temporaries(tmp_path) == []


def test_a_hard_link_is_replaced_and_the_other_names_keep_the_old_file(tmp_path):
    """The chosen behaviour (docs/serialization.md says why): the name saved to gets the new file, atomically;
    the file's other names keep the old one, so a save never changes a file seen under another name."""
    path, other = tmp_path / "ckpt.pt", tmp_path / "backup.pt"
    save_checkpoint(path)
    os.chmod(path, 0o640)
    os.link(path, other)
    save_checkpoint(path, 2.0)
    assert load_checkpoint(path) == [2.0] * 3 and load_checkpoint(other) == [1.0] * 3
    assert os.stat(path).st_nlink == 1 and os.stat(other).st_nlink == 1
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "runs").mkdir()
    real = tmp_path / "runs" / "real.pt"
    save_checkpoint(real)
    os.chmod(real, 0o600)
    (tmp_path / "middle.pt").symlink_to(os.path.join("runs", "real.pt"))  # relative, through a chain of two
    link = tmp_path / "latest.pt"
    link.symlink_to("middle.pt")
    save_checkpoint(link, 2.0)
    assert link.is_symlink() and (tmp_path / "middle.pt").is_symlink() and os.readlink(link) == "middle.pt"
    assert load_checkpoint(real) == [2.0] * 3 and stat.S_IMODE(os.stat(real).st_mode) == 0o600
    dangling = tmp_path / "dangling.pt"
    dangling.symlink_to(os.path.join("runs", "made.pt"))  # open() creates the file a dangling link names
    save_checkpoint(dangling, 3.0)
    assert dangling.is_symlink() and load_checkpoint(tmp_path / "runs" / "made.pt") == [3.0] * 3


def test_a_directory_is_refused_before_anything_is_written(tmp_path):
    folder = tmp_path / "ckpt.pt"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        save_checkpoint(folder)
    assert folder.is_dir() and os.listdir(folder) == [] and os.listdir(tmp_path) == ["ckpt.pt"]


# ---------------------------------------------------------------------------------------------- special files
@pytest.mark.parametrize("writer", WRITERS)
def test_a_fifo_is_streamed_into_and_stays_a_fifo(tmp_path, writer):
    fifo = tmp_path / "stream"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDWR)  # a writer of our own: the reader's open never waits, and its read ends
    try:  # only once this is closed too, whether or not the save wrote into the FIFO
        reader = Reader(lambda: open(fifo, "rb"))
        reader.start()
        assert reader.opened.wait(60)
        WRITERS[writer](fifo, 2.0)
    finally:
        os.close(keep)
    data = reader.result()
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and temporaries(tmp_path) == []
    if writer == "save":
        assert mt.load(io.BytesIO(data))["x"].tolist() == [2.0] * 3
    elif writer == "save_safetensors":
        (tmp_path / "copy.safetensors").write_bytes(data)
        assert mt.load_safetensors(tmp_path / "copy.safetensors")["x"].tolist() == [2.0] * 3
    else:
        assert data[:2] == b"\x80\x04"  # a protocol 4 pickle


def test_a_pipe_named_by_dev_fd_is_written_into(tmp_path):
    """/dev/fd/N (and so /dev/stdout) resolves to a pipe with no name to replace: the save writes into it."""
    read_end, write_end = os.pipe()
    reader = Reader(lambda: open(read_end, "rb"))
    reader.start()
    try:
        save_checkpoint(f"/dev/fd/{write_end}", 2.0)
    finally:
        os.close(write_end)
    assert mt.load(io.BytesIO(reader.result()))["x"].tolist() == [2.0] * 3


def test_a_deleted_file_reached_through_proc_self_fd_is_written_into(tmp_path):
    """/proc/self/fd/N of a deleted file resolves to "<name> (deleted)", no file's name: the save writes into
    the open file instead of creating a file of that name."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc/self/fd here")
    with open(tmp_path / "gone.pt", "w+b") as file:
        os.unlink(tmp_path / "gone.pt")
        save_checkpoint(f"/proc/self/fd/{file.fileno()}", 2.0)
        file.seek(0)
        assert mt.load(io.BytesIO(file.read()))["x"].tolist() == [2.0] * 3
    assert os.listdir(tmp_path) == []


def test_save_to_dev_stdout_writes_the_checkpoint_to_stdout(tmp_path):
    code = "import minitensor as mt; mt.save({'x': mt.arange(5)}, '/dev/stdout')"
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert mt.load(io.BytesIO(done.stdout))["x"].tolist() == list(range(5)) and os.listdir(tmp_path) == []


def character_device(tmp_path):
    """A char device for the test: as root, a node of our own with /dev/null's numbers (1, 3); otherwise the
    machine's /dev/null, which a user cannot replace."""
    if not ROOT:
        return os.devnull
    node = tmp_path / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        open(node, "wb").close()
    except PermissionError as e:  # a container without CAP_MKNOD, a folder on a nodev mount
        pytest.skip(f"no device node of our own here: {e}")
    return str(node)


@pytest.mark.skipif(not hasattr(os, "mknod"), reason="no device nodes here")
@pytest.mark.parametrize("writer", WRITERS)
def test_a_character_device_is_written_into_and_stays_a_device(tmp_path, writer):
    node = character_device(tmp_path)
    link = tmp_path / "to_null"
    link.symlink_to(node)
    for target in (node, link):
        WRITERS[writer](target)
        info = os.stat(node)
        assert stat.S_ISCHR(info.st_mode) and (os.major(info.st_rdev), os.minor(info.st_rdev)) == (1, 3)
    assert link.is_symlink() and temporaries(tmp_path) == []


# ---------------------------------------------------------------------------------------------- other targets
def test_file_objects_and_path_likes_still_work(tmp_path):
    class Where:
        def __init__(self, path):
            self.path = path

        def __fspath__(self):
            return self.path

    save_checkpoint(Where(str(tmp_path / "a.pt")), 2.0)
    assert load_checkpoint(Where(str(tmp_path / "a.pt"))) == [2.0] * 3
    buffer = io.BytesIO()
    save_checkpoint(buffer, 3.0)
    assert mt.load(io.BytesIO(buffer.getvalue()))["x"].tolist() == [3.0] * 3
    with open(tmp_path / "b.pt", "wb") as file:
        file.write(b"prefix")
        save_checkpoint(file, 4.0)
    with open(tmp_path / "b.pt", "rb") as file:
        file.seek(len(b"prefix"))
        assert mt.load(file)["x"].tolist() == [4.0] * 3
