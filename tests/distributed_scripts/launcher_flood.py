"""Run by the launcher: `launcher_flood.py DIR MIB`. Creates DIR/ready; once DIR/go exists, writes MIB MiB to
stdout without a newline and creates DIR/written; exits once DIR/done exists."""
import os
import sys
import time


def wait_for(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(sys.argv[1], name)) and time.monotonic() < deadline:
        time.sleep(0.01)


open(os.path.join(sys.argv[1], "ready"), "w").close()
wait_for("go")
block = b"x" * 2**20
for _ in range(int(sys.argv[2])):
    sys.stdout.buffer.write(block)
sys.stdout.buffer.flush()
open(os.path.join(sys.argv[1], "written"), "w").close()
wait_for("done")
