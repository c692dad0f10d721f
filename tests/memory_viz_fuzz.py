"""Fuzz target for the memory viewer's reader (minitensor.memory_viz): a mutated snapshot must render, or fail with
one line of SnapshotError; nothing else, no crash, bounded time and memory per case. A page that renders must be
one whose data cannot break out of its script element and whose JSON a browser parses.

The seeds are snapshots of fake_snapshots.FakeAllocator (one device; two devices and pinned host memory) and the
hostile pickles of HOSTILE below (each an attack on one budget, at a random size). Each case is one seed and one
mutation drawn from `numpy.random.default_rng([seed, case])`, so a case is reproduced from its two numbers alone:

    python tests/memory_viz_fuzz.py --seconds 600 --seed 5      # a long run
    python tests/memory_viz_fuzz.py --seed 5 --case 1234 --save case.pickle   # one case, written out

Mutations: on the snapshot's objects, one value anywhere replaced by an edge value (strings that are markup,
addresses as strings, ints past 64 bits, NaN, containers of the wrong kind), a key deleted, or the snapshot given
as a dict rather than a pickle; on the pickle's bytes, bit flips, interesting bytes, truncations, cut, duplicated
or repeated runs of opcodes, a hostile pickle spliced in.

tests/test_memory_viz_fuzz.py runs it in a child process under a memory cap; the child prints one JSON line per
case (its number) and a summary.
"""
import argparse
import collections
import faulthandler
import itertools
import json
import os
import pickle
import pickletools
import resource
import struct
import sys
import tempfile
import time

import numpy as np

from fake_snapshots import make
from minitensor import memory_viz

SLOW_SECONDS = 2.0  # a case taking more CPU time than this is a finding
HANG_SECONDS = 60  # a case still running after this ends the process, printing where it was
MARKUP = ["<img src=x onerror=window.__pwned=1>", "</script><script>window.__pwned=1</script>",
          "<!--<script>", "\"'><svg onload=window.__pwned=1>", "&lt;b&gt;&amp;", "@DATA@ @SCRIPT@ @SCRIPT_HASH@"]
EDGE_VALUES = [None, True, False, 0, -1, 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, -2**63 - 1, 2**200, 1.5,
               float("nan"), float("inf"), -float("inf"), "", "0x7f0000000000", "cuda:0", "x" * 5000, b"\x00\xff",
               [], {}, (), (1, 2), (1, 2, 3), [0, 0], ("a", 1), {"a": 1}, [[[]]], {1, 2}] + MARKUP
PICKLE_OPS = list(b"()tR\x85\x86\x87]ae}su\x8f\x90\x91N\x88\x89\x950Qqhrj\x94b.1cX")


# ---------------------------------------------------------------------------------------------- hostile pickles
def _text(value):
    data = value.encode("utf-8")
    return b"X" + struct.pack("<I", len(data)) + data


def _int(value):
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if -2**31 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data if len(data) < 256 else b"\x8b" + struct.pack("<i", len(data)) + data


def _put(index):
    return b"r" + struct.pack("<I", index)


def _get(index):
    return b"j" + struct.pack("<I", index)


def _dict(**fields):
    return b"}(" + b"".join(_text(k) + v for k, v in fields.items()) + b"u"


def _list(*items):
    return b"](" + b"".join(items) + b"e"


def _snapshot(segments=_list(), traces=_list(), **more):
    """A whole pickle: a snapshot dict of these opcodes."""
    return b"\x80\x02" + _dict(segments=segments, device_traces=traces, **more) + b"."


def _entry(**fields):
    """An alloc entry's opcodes; `fields` replace or add to its own."""
    return _dict(**{"action": _text("alloc"), "addr": _int(0), "size": _int(512), "stream": _int(0),
                    "time_us": _int(1), "frames": _list(), **fields})


def deep_pool_id(n):
    """A pool id nested n tuples deep: the C unpickler builds it, and hashing it crashed the process."""
    return _snapshot(traces=_list(_list(_entry(pool_id=b"N" + b"\x85" * n))))


def deep_frames(n):
    """A frame's file name nested n lists deep."""
    return _snapshot(traces=_list(_list(_entry(frames=_list(_dict(filename=b"]" * n + b"a" * (n - 1)))))))


def shared_segments(n):
    """n references to one segment of n references to one block: n * n blocks for 4n bytes."""
    block = _dict(address=_int(0), size=_int(512), state=_text("active_allocated")) + _put(1)
    segment = _dict(address=_int(0), total_size=_int(2**21), blocks=_list(block, _get(1) * (n - 1))) + _put(2)
    return _snapshot(segments=_list(segment, _get(2) * (n - 1)))


def shared_entries(n):
    """n references to one entry whose frames are n references to one frame."""
    frame = _dict(filename=_text("f.py"), line=_int(1), name=_text("g")) + _put(1)
    entry = _entry(frames=_list(frame, _get(1) * (n - 1))) + _put(2)
    return _snapshot(traces=_list(_list(entry, _get(2) * (n - 1))))


def shared_host_traces(n):
    """host_traces as n references to one list of n references to one entry."""
    entries = _list(_entry() + _put(1), _get(1) * (n - 1)) + _put(2)
    return _snapshot(host_traces=_list(entries, _get(2) * (n - 1)))


def long_file_name(n):
    """n frames that differ in their line, all naming one file name of 1 MB: n MB of frame text."""
    frames = b"".join(_dict(filename=_get(1), line=_int(i), name=_get(1)) for i in range(1, n))
    first = _dict(filename=_text("f" * (1 << 20)) + _put(1), line=_int(0), name=_get(1))
    return _snapshot(traces=_list(_list(_entry(frames=_list(first, frames)))))


def shared_segment_type(n):
    """n segments sharing one segment type of 1 MB."""
    first = _dict(address=_int(0), total_size=_int(512), segment_type=_text("t" * (1 << 20)) + _put(1))
    rest = b"".join(_dict(address=_int(i * 512), total_size=_int(512), segment_type=_get(1)) for i in range(1, n))
    return _snapshot(segments=_list(first, rest))


def big_time(n):
    """n entries sharing one time of 100,000 bits (30,000 digits each on a page)."""
    return _snapshot(traces=_list(_list(_entry(time_us=_int(2**100_000) + _put(1)),
                                        *(_entry(time_us=_get(1)) for _ in range(n - 1)))))


def a_global(n):
    """os.system through REDUCE: refused by name."""
    return _snapshot(segments=b"cos\nsystem\n" + _text("echo pwned") + b"\x85R")


def one_hash(n):
    """A dict of n int keys of one hash."""
    return _snapshot(allocator_settings=b"}(" + b"".join(_int(k * (2**61 - 1) + 5) + b"N" for k in range(1, n)) + b"u")


HOSTILE = [deep_pool_id, deep_frames, shared_segments, shared_entries, shared_host_traces, long_file_name,
           shared_segment_type, big_time, a_global, one_hash]


# ---------------------------------------------------------------------------------------------- seeds, mutations
def seeds():
    """[snapshot dict]: one device with pools and streams, two devices and pinned host memory, segments only."""
    one = make(150, seed=1, streams=(0, 7), pools=((0, 0), (1, 2))).snapshot()
    two = make(60, seed=2).snapshot()
    other = make(60, seed=3, device=1)
    two["segments"] += other.snapshot()["segments"]
    two["device_traces"].append(other.trace)
    two["host_segments"] = make(0, seed=4).snapshot()["segments"]
    two["host_traces"] = make(20, seed=5).trace
    return [one, two, {"segments": make(0, seed=6).snapshot()["segments"], "device_traces": []}]


def pick(rng, items):
    return items[int(rng.integers(len(items)))]


def _slots(obj):
    """[(container, key)] of every value in `obj`, walked without recursion."""
    out, stack = [], [obj]
    while stack:
        x = stack.pop()
        pairs = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        for key, value in pairs:
            out.append((x, key))
            stack.append(value)
    return out


def mutate(rng, all_seeds):
    """(mutation name, snapshot as a dict or pickle bytes)."""
    how = pick(rng, ["value"] * 6 + ["delete", "dict"] + ["bytes"] * 3 + ["repeat", "splice", "hostile"] * 2)
    if how == "hostile":
        builder = pick(rng, HOSTILE)
        return f"hostile {builder.__name__}", builder(pick(rng, [2, 100, 1001, 20_000, 60_000]))
    snapshot = pickle.loads(pickle.dumps(pick(rng, all_seeds)))  # a copy to change
    slots = _slots(snapshot)
    container, key = pick(rng, slots)
    if how in ("value", "dict"):
        container[key] = pick(rng, EDGE_VALUES)
    elif how == "delete":
        container.pop(key)
    if how == "dict":
        return how, snapshot
    data = pickle.dumps(snapshot, protocol=int(rng.integers(2, 6)))
    if how in ("value", "delete"):
        return how, data
    if how == "bytes":
        return how, _mutate_bytes(rng, data)
    ops = [pos for _, _, pos in pickletools.genops(data)] + [len(data)]
    i = int(rng.integers(len(ops) - 1))
    start, stop = ops[i], ops[min(len(ops) - 1, i + int(rng.integers(1, 8)))]
    if how == "repeat":  # a run of ops repeated many times: memo amplification's shape
        return how, data[:stop] + data[start:stop] * pick(rng, [10, 1000, 20_000]) + data[stop:]
    fragment = pick(rng, HOSTILE)(pick(rng, [2, 1001, 20_000]))[2:-1]  # a hostile dict, pushed and popped
    return how, data[:start] + fragment + b"0" + data[start:]


def _mutate_bytes(rng, data):
    raw = bytearray(data)
    pos, n = int(rng.integers(len(raw))), int(rng.integers(1, 64))
    how = int(rng.integers(5))
    if how == 0:
        for p in rng.integers(0, len(raw), int(rng.integers(1, 9))):
            raw[p] ^= 1 << int(rng.integers(8))
    elif how == 1:
        raw[pos] = pick(rng, [0, 1, 0x7F, 0x80, 0xFF] + PICKLE_OPS)
    elif how == 2:
        del raw[pos:]
    elif how == 3:
        del raw[pos:pos + n]
    else:
        raw[pos:pos] = raw[pos:pos + n] * int(rng.integers(1, 5))
    return bytes(raw)


# ---------------------------------------------------------------------------------------------- one case
def run_case(source, path):
    """Render `source` (a dict, or pickle bytes written to `path`): 'rendered' or 'SnapshotError'. Any other
    exception, a SnapshotError of more than one line, and a page whose data could break out, raise."""
    if isinstance(source, bytes):
        with open(path, "wb") as f:
            f.write(source)
        source = path
    try:
        page = memory_viz.render(source)
    except memory_viz.SnapshotError as exc:
        text = str(exc)
        if "\n" in text or not text.startswith(str(source) if isinstance(source, str) else "snapshot"):
            raise AssertionError(f"a SnapshotError must be one line naming its source, got {text[:300]!r}") from None
        return "SnapshotError"
    check_page(page)
    return "rendered"


def check_page(page):
    """Two script elements (the data and the page's own), no markup from the snapshot, JSON a browser parses."""
    if page.count("<script") != 2 or page.lower().count("</script") != 2 or "<img" in page or "<svg" in page:
        raise AssertionError("the page has markup it did not make")
    start = page.index('id="mtviz-data">') + len('id="mtviz-data">')
    data = page[start:page.index("</script>", start)]

    def refuse(name):
        raise AssertionError(f"the page's JSON holds {name}, which JSON.parse refuses")

    json.loads(data, parse_constant=refuse)


def case(all_seeds, seed, number):
    rng = np.random.default_rng([seed, number])
    return mutate(rng, all_seeds)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("MINITENSOR_FUZZ_SECONDS", 4)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("MINITENSOR_VIZ_FUZZ_SEED", 5)))
    parser.add_argument("--case", type=int, help="run only this case")
    parser.add_argument("--save", help="with --case: write the mutated snapshot (a pickle) here")
    parser.add_argument("--memory", type=int, default=2 << 30, help="address-space cap in bytes (0: none)")
    args = parser.parse_args(argv)
    if args.memory:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
    all_seeds = seeds()
    outcomes = collections.Counter()
    findings, slowest = [], (0.0, None)
    deadline = time.monotonic() + args.seconds
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "case.pickle")
        for number in [args.case] if args.case is not None else itertools.count():
            if args.case is None and time.monotonic() > deadline:
                break
            how, source = case(all_seeds, args.seed, number)
            if args.save:
                with open(args.save, "wb") as f:
                    f.write(source if isinstance(source, bytes) else pickle.dumps(source))
            print(json.dumps({"case": number}), flush=True)  # the last one printed is the culprit of a crash
            start = time.process_time()
            faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
            try:
                outcome = run_case(source, path)
            except BaseException as exc:  # noqa: B902 - every other exception is a finding
                outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
                findings.append({"case": number, "mutation": how, "error": outcome})
            faulthandler.cancel_dump_traceback_later()
            seconds = time.process_time() - start
            if seconds > SLOW_SECONDS:
                findings.append({"case": number, "mutation": how, "slow": round(seconds, 2)})
            slowest = max(slowest, (seconds, number))
            outcomes[(how.split(" ")[0], outcome.split(":")[0])] += 1
    summary = {"summary": True, "seed": args.seed, "cases": sum(outcomes.values()), "findings": findings,
               "slowest": {"cpu_seconds": round(slowest[0], 3), "case": slowest[1]},
               "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
               "outcomes": {" / ".join(k): v for k, v in sorted(outcomes.items())}}
    print(json.dumps(summary), flush=True)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
