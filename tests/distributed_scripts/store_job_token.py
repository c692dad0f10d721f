"""Run by the launcher: each rank meets the others through env:// (so the ranks share the launcher's job token),
and rank 0 checks that a client without the token is refused. Prints one line: RESULT {json}."""
import datetime
import json
import os

from minitensor.distributed.errors import DistStoreError
from minitensor.distributed.rendezvous import rendezvous
from minitensor.distributed.tcp_store import TCPStore

store, rank, world_size = rendezvous("env://", timeout=datetime.timedelta(seconds=60))
outsider = None
if rank == 0:
    try:
        TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), job_token="",
                 timeout=datetime.timedelta(seconds=10))
    except DistStoreError as error:
        outsider = str(error)
store.set(f"done/{rank}", "")
if rank == 0:  # the store lives in rank 0's process: it stays until everyone is done with it
    store.wait([f"done/{other}" for other in range(world_size)])
print("RESULT " + json.dumps({"rank": rank, "token": os.environ.get("MINITENSOR_JOB_TOKEN"), "outsider": outsider}),
      flush=True)
