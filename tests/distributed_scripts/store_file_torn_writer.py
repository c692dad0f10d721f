"""`store_file_torn_writer.py PATH killed|refused`: a FileStore writer whose `set` of a large value is cut short
by the file size limit (RLIMIT_FSIZE, set just above what the file holds), as a writer killed mid-write or a
full disk cuts it. `killed`: SIGXFSZ at its default, so the kernel kills the writer inside the record, exactly as
SIGKILL at that moment would. `refused`: the signal ignored (Python's default), so the write fails with EFBIG;
the writer then goes on once the limit is lifted and prints RESULT {json}."""
import datetime
import json
import os
import resource
import signal
import sys

from minitensor.distributed.errors import DistStoreError
from minitensor.distributed.file_store import FileStore

path, mode = sys.argv[1], sys.argv[2]
store = FileStore(path)
store.set("before", "kept")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
if mode == "killed":
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 1000, hard))
try:
    store.set("big", b"x" * 100_000)  # 1000 bytes of it reach the file
    outcome = "written"
except DistStoreError as error:
    outcome = str(error)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
store.set("after", "also kept")
store.set_timeout(datetime.timedelta(seconds=0.1))
try:
    store.get("big")
    big = "found"
except DistStoreError:
    big = "missing"
print("RESULT " + json.dumps({"outcome": outcome, "big": big, "after": store.get("after").decode()}), flush=True)
