"""Run by the launcher with two ranks: `launcher_first_failure.py PID_DIR`.

Rank 1 exits with 7. Rank 0 waits for the launcher's child of rank 1 (rank 1 itself, or the `mpiexec` it runs
under) to end, then exits with 1 once the launcher stops it or 30 ms later, whichever comes first: as an MPI rank
does whose collective broke when its peer ended. Rank 1 failed first, however close together the two ends are."""
import os
import signal
import sys
import time


def stat(pid):
    """(state, parent, session) of process `pid`, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
    except FileNotFoundError:
        return None
    return fields[0].decode(), int(fields[1]), int(fields[3])


def launched():
    """The launcher's child this rank runs in: the outermost session leader of the line it descends from (the
    rank, or Hydra's proxy and mpiexec above it; the launcher, started by a test, leads no session)."""
    pid = os.getpid()
    while True:
        parent = stat(pid)[1]
        if stat(parent)[2] != parent:
            return pid
        pid = parent


pid_dir = sys.argv[1]
rank = int(os.environ["RANK"])
deadline = time.monotonic() + 60
if rank == 1:
    with open(os.path.join(pid_dir, "1.tmp"), "w") as file:
        file.write(str(launched()))
    os.rename(os.path.join(pid_dir, "1.tmp"), os.path.join(pid_dir, "1.pid"))
    while not os.path.exists(os.path.join(pid_dir, "0.ready")) and time.monotonic() < deadline:
        time.sleep(0.005)
    sys.exit(7)
signal.signal(signal.SIGTERM, lambda number, frame: os._exit(1))
open(os.path.join(pid_dir, "0.ready"), "w").close()
while not os.path.exists(os.path.join(pid_dir, "1.pid")) and time.monotonic() < deadline:
    time.sleep(0.005)
peer = int(open(os.path.join(pid_dir, "1.pid")).read())
while stat(peer) is not None and stat(peer)[0] != "Z" and time.monotonic() < deadline:
    time.sleep(0.001)
time.sleep(0.03)
os._exit(1)
