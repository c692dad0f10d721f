"""`store_no_threads.py`: a TCPStore master whose process cannot start a thread for a while (its address space
limited below what a thread's stack needs, a real resource limit), as a loaded machine refuses them. A peer that
connects meanwhile must lose its connection, and the master must accept and serve the next client once threads
can start again. Prints RESULT {json}."""
import datetime
import json
import resource
import socket
import threading

from minitensor.distributed import tcp_protocol as protocol
from minitensor.distributed.tcp_store import TCPStore

master = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
in_use = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
threading.stack_size(1 << 30)  # each new thread asks for 1 GiB of address space...
resource.setrlimit(resource.RLIMIT_AS, (in_use + (256 << 20), hard))  # ...which the process no longer has
try:
    threading.Thread(target=lambda: None).start()
    starts = True
except RuntimeError:
    starts = False
with socket.create_connection(("127.0.0.1", master.port), timeout=20) as peer:
    protocol.send(peer, [b"hello", protocol.MAGIC, b"use", b""])
    try:
        dropped = peer.recv(100) == b""
    except ConnectionError:
        dropped = True
resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
threading.stack_size(0)
client = TCPStore("127.0.0.1", master.port, timeout=datetime.timedelta(seconds=20))
client.set("after", "served")
print("RESULT " + json.dumps({"thread_starts": starts, "dropped": dropped, "after": master.get("after").decode()}),
      flush=True)
