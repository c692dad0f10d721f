"""`store_tcp_client.py PORT NAME`: a TCPStore client in another process. It waits for a key the parent sets
later, adds to a shared counter 50 times, races for a compare_set, then prints RESULT {json}."""
import datetime
import json
import sys

from minitensor.distributed.tcp_store import TCPStore

port, name = int(sys.argv[1]), sys.argv[2]
store = TCPStore("127.0.0.1", port, world_size=3, timeout=datetime.timedelta(seconds=60))
released = store.get("go").decode()
sums = [store.add("counter", 1) for _ in range(50)]
leader = store.compare_set("leader", "", name).decode()
store.set(f"from/{name}", bytes([0, 255]) + name.encode())
store.wait(["counter_checked"])
print("RESULT " + json.dumps({"released": released, "increasing": sums == sorted(sums), "leader": leader,
                              "counter": int(store.get("counter"))}), flush=True)
