"""The launcher's children (`python -m minitensor.distributed.run`, run.py): each rank's process, and what the
ranks leave behind.

A rank runs in a session, so a process group, of its own: a terminal's Ctrl-C reaches the launcher once, which
forwards it once, and signalling the group reaches what the rank started. A thread per rank sees it end at once
and leaves it unreaped, so that the id of its group cannot pass to another process while the launcher may still
signal it. Its output passes through as it comes, newline or not (only the end of a line still being written
waits, 0.1 s at most, for the rest of it), and its last 64 KiB are kept.

The launcher is a child subreaper (Linux's PR_SET_CHILD_SUBREAPER): a process the ranks started whose parent
ends comes to the launcher instead of to init. Such a leftover gets SIGTERM at once, and SIGKILL after the grace
period: it would outlive the job unseen, and under mpiexec, where Hydra puts a rank in a session of its own (out
of reach of the group), mpiexec would wait for it as long as it holds the output it inherited.
"""
import ctypes
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time

TAIL_LINES = 20  # of a rank's last output, shown in the failure report
_TAIL_BYTES = 64 * 1024  # kept of it
_CHUNK = 64 * 1024
_LINE_WAIT_S = 0.1  # for the rest of a line written in pieces
_POLL_S = 0.05
_KILL_WAIT_S = 5.0  # for what SIGKILL has not ended yet (a process in uninterruptible sleep)
_PR_SET_CHILD_SUBREAPER = 36
_echo_lock = threading.Lock()  # one piece at a time on the launcher's output, whichever rank wrote it


def become_subreaper() -> None:
    """Makes this process the one a descendant is reparented to when its parent ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(error)}")


class Tail:
    """The last 64 KiB a rank wrote (stdout and stderr in the order they came), however much it writes."""

    def __init__(self):
        self._data = bytearray()
        self._lock = threading.Lock()  # stdout's and stderr's readers both add

    def add(self, chunk: bytes) -> None:
        """Keeps `chunk`, dropping what falls out of the last 64 KiB."""
        with self._lock:
            self._data += chunk
            del self._data[:-_TAIL_BYTES]

    def lines(self) -> list[str]:
        """The last TAIL_LINES lines as a terminal shows them: of a line that `\\r` rewrote, the last text."""
        with self._lock:
            lines = self._data.decode(errors="replace").split("\n")
        if lines[-1] == "":
            lines.pop()
        return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines[-TAIL_LINES:]]


class Rank:
    """One rank's process (see the module's docstring). `exit_code` (-N for signal N) and `ended_at`
    (time.time()) are set when it ends, then the Rank is put on `ends`."""

    def __init__(self, command: list, env: dict, rank: int, local_rank: int, ends: queue.SimpleQueue):
        self.rank, self.local_rank = rank, local_rank
        self.tail = Tail()
        self.exit_code = self.ended_at = None
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        start_new_session=True)
        self._readers = [threading.Thread(target=self._pass_through, args=(pipe, out), daemon=True)
                         for pipe, out in ((self.process.stdout, sys.stdout), (self.process.stderr, sys.stderr))]
        for reader in self._readers:
            reader.start()
        threading.Thread(target=self._wait, args=(ends,), daemon=True).start()

    def _pass_through(self, pipe, out):
        """Writes what the rank writes through as it comes, but for the end of a line still being written (after
        the last `\\n` or `\\r`), which waits up to 0.1 s for the rest: another rank's output then does not cut
        into a line written in two pieces (print writes the text, then the newline)."""
        fd, pending, due, broken = pipe.fileno(), b"", 0.0, []

        def write(data):  # to the tail too, which so keeps whole lines as well
            if data:
                self.tail.add(data)
            if data and not broken:
                try:
                    with _echo_lock:
                        out.buffer.write(data)
                        out.buffer.flush()
                except OSError:  # the launcher's output was closed: read on, or the rank would block writing
                    broken.append(True)

        while True:
            if pending and not select.select([fd], [], [], max(due - time.monotonic(), 0))[0]:
                write(pending)
                pending = b""
                continue
            chunk = os.read(fd, _CHUNK)
            if not chunk:
                break
            data = pending + chunk
            cut = len(data) if len(data) >= _CHUNK else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
            if cut or not pending:  # what is left begins now
                due = time.monotonic() + _LINE_WAIT_S
            write(data[:cut])
            pending = data[cut:]
        write(pending)
        pipe.close()

    def _wait(self, ends):
        info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)  # unreaped until finish()
        self.ended_at = time.time()
        self.exit_code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        ends.put(self)

    def signal(self, signum: int) -> None:
        """Sends `signum` to the rank's process group, which exists while the rank is unreaped."""
        os.killpg(self.process.pid, signum)

    def finish(self, deadline: float) -> None:
        """Reaps the rank, and waits for the rest of its output until time.monotonic() `deadline`."""
        self.process.wait()
        for reader in self._readers:
            reader.join(max(deadline - time.monotonic(), 0))


class Leftovers:
    """The launcher's children that are no rank: processes the ranks started whose parents have ended."""

    def __init__(self, ranks: list):
        self._ranks = {rank.process.pid for rank in ranks}
        self._terminated = {}  # pid -> time.monotonic() of its SIGTERM

    def sweep(self, grace_s: float, kill: bool = False) -> bool:
        """SIGTERM to each new leftover, SIGKILL to those terminated `grace_s` seconds ago (to all with `kill`);
        reaps those that have ended. Whether any is left."""
        now = time.monotonic()
        for pid in _children() - self._ranks - self._terminated.keys():
            os.kill(pid, signal.SIGTERM)  # a child, unreaped: it exists
            self._terminated[pid] = now
        for pid, since in list(self._terminated.items()):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                del self._terminated[pid]
            elif kill or now - since >= grace_s:
                os.kill(pid, signal.SIGKILL)
        return bool(self._terminated)


def _children():
    """This process's children: each thread's, from /proc/self/task/*/children, or where the kernel lists no
    children there (no CONFIG_PROC_CHILDREN) those of every process in /proc whose parent it is."""
    me = os.getpid()
    if not os.path.exists(f"/proc/{me}/task/{me}/children"):
        return {int(name) for name in os.listdir("/proc") if name.isdigit() and _parent(name) == me}
    pids = set()
    for task in os.listdir(f"/proc/{me}/task"):
        try:
            with open(f"/proc/{me}/task/{task}/children") as file:
                pids.update(int(pid) for pid in file.read().split())
        except FileNotFoundError:  # the thread ended meanwhile
            pass
    return pids


def _parent(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return int(file.read().rsplit(b")", 1)[1].split()[1])
    except FileNotFoundError:  # it ended meanwhile
        return None


def stop(ranks: list, leftovers: Leftovers, signum: int, grace_s: float) -> None:
    """Sends `signum` to every rank's process group (an ended rank's too, with what it left in it), then
    `settle`s."""
    for rank in ranks:
        rank.signal(signum)
    settle(ranks, leftovers, grace_s)


def settle(ranks: list, leftovers: Leftovers, grace_s: float) -> None:
    """Waits for the ranks and the leftovers to end, SIGKILL to what is left after `grace_s` seconds (to a rank:
    to its group); reaps the ranks and waits a second at most for the rest of their output."""
    deadline = time.monotonic() + grace_s
    while _left(ranks, leftovers, grace_s, kill=False) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    for rank in ranks:
        if rank.exit_code is None:
            rank.signal(signal.SIGKILL)
    deadline = time.monotonic() + _KILL_WAIT_S
    while _left(ranks, leftovers, grace_s, kill=True) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    deadline = time.monotonic() + 1.0
    for rank in ranks:
        rank.finish(deadline)


def _left(ranks, leftovers, grace_s, kill):
    return leftovers.sweep(grace_s, kill) or any(rank.exit_code is None for rank in ranks)
