"""Run by the launcher (as a script or with -m): each rank reports its variables, meets the others through
env:// and reads every rank's value from the store. Prints one line: RESULT {json}."""
import datetime
import json
import os
import sys

from minitensor.distributed.rendezvous import rendezvous

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def main():
    env = {name: os.environ.get(name) for name in VARIABLES}
    store, rank, world_size = rendezvous("env://", timeout=datetime.timedelta(seconds=60))
    store.set(f"value/{rank}", f"from rank {rank}")
    arrived = store.add("arrived", 1)
    seen = [store.get(f"value/{other}").decode() for other in range(world_size)]
    store.set(f"done/{rank}", "")
    if rank == 0:  # the store lives in rank 0's process: it stays until everyone is done with it
        store.wait([f"done/{other}" for other in range(world_size)])
    print("RESULT " + json.dumps({"env": env, "rank": rank, "world_size": world_size, "arrived": arrived,
                                  "seen": seen, "argv": sys.argv[1:], "main": __name__}), flush=True)


if __name__ == "__main__":
    main()
