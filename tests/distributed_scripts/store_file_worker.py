"""`store_file_worker.py PATH RANK`: one of two processes sharing a FileStore(PATH, world_size=2). Both add
to a counter, race for a compare_set, read each other's key, and meet before reading the total. Prints
RESULT {json}; the second to exit removes the file."""
import datetime
import json
import sys

from minitensor.distributed.file_store import FileStore

path, rank = sys.argv[1], int(sys.argv[2])
store = FileStore(path, 2)
store.set_timeout(datetime.timedelta(seconds=60))
for _ in range(50):
    store.add("counter", 1)
won = store.compare_set("leader", "", f"rank {rank}").decode() == f"rank {rank}"
store.set(f"from/{rank}", f"hello from {rank}")
other = store.get(f"from/{1 - rank}").decode()
store.set(f"done/{rank}", "")
store.wait(["done/0", "done/1"])
print("RESULT " + json.dumps({"won": won, "other": other, "counter": int(store.get("counter")),
                              "leader": store.get("leader").decode()}), flush=True)
