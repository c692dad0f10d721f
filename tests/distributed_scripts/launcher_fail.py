"""Run by the launcher: `launcher_fail.py PID_DIR FAILING_RANK EXIT_CODE [ignore-sigterm]`.

Every rank writes its pid into PID_DIR. Once all have, FAILING_RANK prints 25 numbered lines and exits with
EXIT_CODE; the others sleep (rank 0 ignoring SIGTERM when asked), so only the launcher can end them.
A FAILING_RANK of -1 means nobody fails."""
import os
import signal
import sys
import time

pid_dir, failing_rank, exit_code = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if rank == 0 and sys.argv[4:] == ["ignore-sigterm"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(pid_dir, f"{rank}.tmp"), "w") as file:
    file.write(str(os.getpid()))
os.rename(os.path.join(pid_dir, f"{rank}.tmp"), os.path.join(pid_dir, f"{rank}.pid"))
while len([name for name in os.listdir(pid_dir) if name.endswith(".pid")]) < world_size:
    time.sleep(0.02)
if rank == failing_rank:
    for line in range(25):
        print(f"rank {rank} line {line}")
    print(f"rank {rank} fails with {exit_code}", file=sys.stderr)
    sys.exit(exit_code)
print(f"rank {rank} sleeping", flush=True)
time.sleep(120)
