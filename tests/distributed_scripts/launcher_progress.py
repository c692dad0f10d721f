"""Run by the launcher: `launcher_progress.py DIR`. Writes a progress bar's `\\r`-separated steps without a
newline (to stdout and stderr), waits for DIR/go, then writes its last step and exits with 4."""
import os
import sys
import time

sys.stdout.write("step 1/3\rstep 2/3\r")
sys.stderr.write("loading 50%\r")
deadline = time.monotonic() + 60
while not os.path.exists(os.path.join(sys.argv[1], "go")) and time.monotonic() < deadline:
    time.sleep(0.01)
sys.stdout.write("\rstep 3/3 done")
sys.exit(4)
