"""Where the ranks of a group meet: an init_method URL becomes (store, rank, world_size), as in torch.

"env://" reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE (what the launcher sets), "tcp://host:port" names
the master, and both give a TCPStore served by rank 0, whose constructor waits for all `world_size` ranks, so
every rank returns only once the whole group has arrived. "file:///path" gives a FileStore. `rank` and
`world_size` arguments, or `?rank=..&world_size=..` in the URL, take precedence over the environment.
"""
import datetime
import numbers
import os
import urllib.parse

from .file_store import FileStore
from .store import check_timeout
from .tcp_store import TCPStore

default_pg_timeout = datetime.timedelta(minutes=30)


def _error(method, message):
    return ValueError(f"Error initializing minitensor.distributed using {method} rendezvous: {message}")


def _query(url):
    """"rank=0&world_size=2" as {"rank": "0", "world_size": "2"}."""
    return dict(pair.partition("=")[::2] for pair in url.query.split("&") if pair)


def _int(text, what, method):
    try:
        return int(text)
    except ValueError:
        raise _error(method, f"{what} must be an integer, got {text!r}") from None


def _env(name):
    value = os.environ.get(name)
    if not value:
        raise _error("env://", f"environment variable {name} expected, but not set")
    return value


def _env_store(url, query, timeout):
    rank = _int(query["rank"] if "rank" in query else _env("RANK"), "rank", "env://")
    world_size = _int(query["world_size"] if "world_size" in query else _env("WORLD_SIZE"), "world_size", "env://")
    master_addr = _env("MASTER_ADDR")
    master_port = _int(_env("MASTER_PORT"), "MASTER_PORT", "env://")
    return _tcp_store(master_addr, master_port, rank, world_size, timeout), rank, world_size


def _tcp_url_store(url, query, timeout):
    if url.port is None:
        raise _error("tcp://", "port number missing")
    rank, world_size = _rank_and_size(query, "tcp://")
    if url.hostname is None:
        raise AssertionError("hostname cannot be None")
    return _tcp_store(url.hostname, url.port, rank, world_size, timeout), rank, world_size


def _file_store(url, query, timeout):
    if not url.path:
        raise _error("file://", "path missing")
    rank, world_size = _rank_and_size(query, "file://")
    _check_rank(rank, world_size)
    store = FileStore(url.path, world_size)
    store.set_timeout(timeout)
    return store, rank, world_size


def _rank_and_size(query, method):
    if "rank" not in query:
        raise _error(method, "rank parameter missing")
    if "world_size" not in query:
        raise _error(method, "world size parameter missing")
    return _int(query["rank"], "rank", method), _int(query["world_size"], "world_size", method)


def _tcp_store(host, port, rank, world_size, timeout):
    if not 0 <= port < 2**16:
        raise ValueError(f"port must have value from 0 to 65535 but was {port}.")
    _check_rank(rank, world_size)
    return TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout)


def _check_rank(rank, world_size):
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} and world_size {world_size}: expected world_size >= 1 and "
                         f"0 <= rank < world_size")


_HANDLERS = {"env": _env_store, "tcp": _tcp_url_store, "file": _file_store}


def rendezvous(init_method, rank=-1, world_size=-1, timeout=default_pg_timeout):
    """(store, rank, world_size) for `init_method`; -1 for rank or world_size means "from the URL or the
    environment". Returns once every rank has arrived (TCP), or at once (file)."""
    if not isinstance(init_method, str):
        raise RuntimeError(f"`url` must be a string. {type(init_method)}: {init_method}")
    if not isinstance(rank, numbers.Integral):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if not isinstance(world_size, numbers.Integral):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    check_timeout(timeout)
    url = urllib.parse.urlparse(init_method)
    query = _query(url)
    if (rank != -1 or world_size != -1) and ("rank" in query or "world_size" in query):
        raise AssertionError(f"The url: {init_method} has node-specific arguments(rank, world_size) already.")
    query.update({name: str(value) for name, value in (("rank", rank), ("world_size", world_size)) if value != -1})
    if url.scheme not in _HANDLERS:
        raise RuntimeError(f"No rendezvous handler for {url.scheme}://")
    return _HANDLERS[url.scheme](url, query, timeout)
