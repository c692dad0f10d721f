"""Run by the launcher: `launcher_children.py PID_DIR FAILING_RANK`.

Every rank starts two children that ignore SIGTERM and sleep, one in its process group (a data-loader worker,
say) and one in a session of its own (a server), then writes "RANK_PID WORKER_PID SERVER_PID" into
PID_DIR/RANK.pid. Once all have, FAILING_RANK exits with 3 and the others
sleep, so only the launcher can end them and their children."""
import os
import subprocess
import sys
import time

pid_dir, failing_rank = sys.argv[1], int(sys.argv[2])
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
sleeper = [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(120)"]
children = [subprocess.Popen(sleeper, start_new_session=server) for server in (False, True)]
with open(os.path.join(pid_dir, f"{rank}.tmp"), "w") as file:
    file.write(" ".join(str(pid) for pid in (os.getpid(), *(child.pid for child in children))))
os.rename(os.path.join(pid_dir, f"{rank}.tmp"), os.path.join(pid_dir, f"{rank}.pid"))
while len([name for name in os.listdir(pid_dir) if name.endswith(".pid")]) < world_size:
    time.sleep(0.02)
if rank == failing_rank:
    time.sleep(0.2)  # the child has set its SIGTERM handler by then
    sys.exit(3)
time.sleep(120)
