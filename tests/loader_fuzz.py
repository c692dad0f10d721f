"""Fuzz target for the loaders: mutated checkpoints must load (and their tensors be readable) or fail with
pickle.UnpicklingError, ValueError or RuntimeError; nothing else, no crash, bounded time and memory per file.

The seeds are the files torch and the `safetensors` package wrote (tests/fixtures/serialization/) and files
mt.save / mt.save_safetensors write here. Each case is one seed and one mutation drawn from
`numpy.random.default_rng([seed, case])`, so a case is reproduced from its two numbers alone:

    python tests/loader_fuzz.py --seconds 600 --seed 17     # a long run
    python tests/loader_fuzz.py --seed 17 --case 1234 --save case.bin   # one case, written out

Mutations: bit flips, interesting bytes, truncations, cut or duplicated pieces, splices of another seed; on the
pickle (re-zipped): opcodes removed, duplicated, repeated, swapped, moved or inserted, int and string arguments
replaced by edge values; on the zip: a field of a local header, central-directory entry or end record set to
an edge value; on safetensors: the JSON header's shapes, offsets, dtypes and length.

tests/test_loader_fuzz.py runs it in a child process under a memory cap; the child prints one JSON line per
case (its number, the outcome, the seconds) and a summary.
"""
import argparse
import collections
import faulthandler
import io
import itertools
import json
import math
import os
import pickle
import pickletools
import resource
import struct
import sys
import tempfile
import time
import zipfile

import numpy as np

import minitensor as mt
from minitensor.serialization import zipformat

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "serialization")
CLEAN = (pickle.UnpicklingError, ValueError, RuntimeError)
SLOW_SECONDS = 2.0  # a case taking more CPU time than this is a finding (CPU time: other processes don't count)
HANG_SECONDS = 60  # a case still running after this ends the process, printing where it was
EDGE_INTS = [0, 1, -1, 2, 7, 63, 64, 65, 127, 128, 255, 256, 2**15, 2**16 - 1, 2**31 - 1, 2**31, -2**31, 2**32,
             2**53, 2**62, 2**63 - 1, 2**63, -2**63, 2**64 - 1, 2**64, 10**30, -(10**30), 2**2000]
EDGE_STRINGS = ["", "0", "1", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:127", "cuda:128", "cuda:" + "9" * 40, "mps",
                "storage", "latin1", "utf-8", "../../etc/passwd", "data/0", "\udcff", "x" * 300]
PICKLE_OPS = list(b"()tR\x85\x86\x87]ae}su\x8f\x90\x91N\x88\x89\x950Qqhrj\x94b.1")


# ---------------------------------------------------------------------------------------------- seeds
def seeds():
    """[(name, kind, bytes)], kind "zip" or "safetensors"; the zip seeds come with their records."""
    out = []
    for name in sorted(os.listdir(FIXTURES)):
        with open(os.path.join(FIXTURES, name), "rb") as f:
            data = f.read()
        if name.endswith(".pt"):
            out.append((name, "zip", data))
        elif name.endswith(".safetensors"):
            out.append((name, "safetensors", data))
    rng = np.random.default_rng(0)
    base = mt.tensor(rng.standard_normal((6, 5)).astype(np.float32))
    odd = mt.Tensor(mt.empty(9, dtype=mt.uint8).untyped_storage(), (2,), (1,), 1, mt.int16)
    state = collections.OrderedDict(w=base, t=base.t(), b=base[2:, 1::2], i=mt.arange(7, dtype=mt.int64),
                                    h=mt.ones(3, dtype=mt.float16), z=mt.empty(0, 4), s=mt.tensor(3.5))
    state._metadata = {"": {"version": 1}}
    values = [{"x": base, "n": [1, 2.5, "s", None, True, (1, (2, 3))], "k": {(1, 2): "t", 3.5: b"\x00\xff"}},
              {7, "seven"}, bytearray(b"ab"), complex(1, -2), -(2**100), mt.device("cuda:0"), mt.bfloat16,
              mt.Size([2, 3]), base.untyped_storage(), odd, mt.arange(12, dtype=mt.int32).view(mt.float32)]
    for i, obj in enumerate([state, values, base, [base, base[1:]] * 3]):
        buf = io.BytesIO()
        mt.save(obj, buf)
        out.append((f"mt_{i}.pt", "zip", buf.getvalue()))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "x.safetensors")
        mt.save_safetensors({"a": base, "b": mt.arange(5, dtype=mt.int64), "c": mt.ones(2, 2, dtype=mt.bfloat16),
                             "e": mt.empty(0, dtype=mt.uint8)}, path, metadata={"format": "pt"})
        with open(path, "rb") as f:
            out.append(("mt.safetensors", "safetensors", f.read()))
    return [(name, kind, data, _records(data) if kind == "zip" else None) for name, kind, data in out]


def _records(data):
    """(prefix, [(name, bytes)], pickle ops [(start, end)]) of a zip seed, or None for one that is not a zip."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            records = [(info.filename.split("/", 1)[1], z.read(info)) for info in z.infolist()]
            prefix = z.infolist()[0].filename.split("/", 1)[0]
    except zipfile.BadZipFile:
        return None
    pkl = dict(records)["data.pkl"]
    starts = [pos for _, _, pos in pickletools.genops(pkl)] + [len(pkl)]
    return prefix, records, list(zip(starts, starts[1:]))


# ---------------------------------------------------------------------------------------------- mutations
def pick(rng, items):
    return items[int(rng.integers(len(items)))]


def mutate(rng, seed, all_seeds):
    """(mutation name, mutated bytes) for one seed."""
    name, kind, data, records = seed
    choices = ["flip", "byte", "truncate", "cut", "duplicate", "splice"]
    if records is not None:
        choices += ["pickle"] * 6 + ["zip-field"] * 3
    if kind == "safetensors":
        choices += ["header"] * 6
    how = choices[int(rng.integers(len(choices)))]
    if how == "pickle":
        op, pkl = _mutate_pickle(rng, records, all_seeds)
        return f"pickle {op}", _rezip(records, pkl)
    if how == "zip-field":
        return how, _mutate_zip_field(rng, data)
    if how == "header":
        return how, _mutate_header(rng, data)
    return how, _mutate_bytes(rng, how, data, all_seeds)


def _mutate_bytes(rng, how, data, all_seeds):
    raw = bytearray(data)
    pos = int(rng.integers(len(raw) + 1))
    n = int(rng.integers(1, 64))
    if how == "flip":
        for p in rng.integers(0, len(raw), int(rng.integers(1, 9))):
            raw[p] ^= 1 << int(rng.integers(8))
    elif how == "byte":
        raw[min(pos, len(raw) - 1)] = pick(rng, [0, 1, 0x7F, 0x80, 0xFF] + PICKLE_OPS)
    elif how == "truncate":
        del raw[pos:]
    elif how == "cut":
        del raw[pos:pos + n]
    elif how == "duplicate":
        raw[pos:pos] = raw[pos:pos + n] * int(rng.integers(1, 5))
    else:  # splice: a piece of another seed over this one
        other = all_seeds[int(rng.integers(len(all_seeds)))][2]
        start = int(rng.integers(len(other)))
        raw[pos:pos + n] = other[start:start + n]
    return bytes(raw)


def _mutate_pickle(rng, records, all_seeds):
    _, recs, ops = records
    pkl = dict(recs)["data.pkl"]
    start, end = ops[int(rng.integers(len(ops)))]
    piece = pkl[start:end]
    how = pick(rng, ["remove", "duplicate", "repeat", "swap", "move", "insert", "int", "string", "splice", "hostile"])
    if how == "hostile":  # a stack-neutral run of ops that attacks a limit, between two ops
        return how, pkl[:start] + pick(rng, HOSTILE)(rng) + pkl[start:]
    if how == "remove":
        return how, pkl[:start] + pkl[end:]
    if how == "duplicate":
        return how, pkl[:end] + piece + pkl[end:]
    if how == "repeat":  # a run of ops repeated many times: memo amplification's shape
        stop = ops[min(len(ops) - 1, ops.index((start, end)) + int(rng.integers(1, 6)))][1]
        return how, pkl[:stop] + pkl[start:stop] * pick(rng, [10, 100, 1000]) + pkl[stop:]
    if how == "swap":
        s2, e2 = ops[min(len(ops) - 1, ops.index((start, end)) + 1)]
        return how, pkl[:start] + pkl[s2:e2] + piece + pkl[e2:] if s2 >= end else pkl
    if how == "move":
        rest = pkl[:start] + pkl[end:]
        at = int(rng.integers(len(rest) + 1))
        return how, rest[:at] + piece + rest[at:]
    if how == "insert":
        op = bytes([pick(rng, PICKLE_OPS)]) + bytes(rng.integers(0, 256, int(rng.integers(0, 5)), dtype=np.uint8))
        return how, pkl[:start] + op + pkl[start:]
    if how == "int":
        return how, pkl[:start] + _int_op(pick(rng, EDGE_INTS)) + pkl[end:]
    if how == "string":
        text = pick(rng, EDGE_STRINGS).encode("utf-8", "surrogatepass")
        return how, pkl[:start] + b"X" + struct.pack("<I", len(text)) + text + pkl[end:]
    donors = [s for s in all_seeds if s[3] is not None]  # splice: an op run of another seed's pickle
    _, dre, dops = donors[int(rng.integers(len(donors)))][3]
    dpkl = dict(dre)["data.pkl"]
    i = int(rng.integers(len(dops)))
    j = min(len(dops) - 1, i + int(rng.integers(1, 20)))
    return how, pkl[:start] + dpkl[dops[i][0]:dops[j][1]] + pkl[start:]


def _memoized_copies(rng):
    """A list memoized at a high index, then copied by builtins.set/frozenset or torch.Size over and over."""
    items = b"".join(_int_op(i) for i in range(int(rng.integers(1, 5000))))
    call = pick(rng, [b"cbuiltins\nset\n", b"cbuiltins\nfrozenset\n", b"ctorch\nSize\n"])
    return b"](" + items + b"e" + _put(0) + b"0(" + (call + _get(0) + b"\x85R") * pick(rng, [10, 1000, 20000]) + b"1"


def _put(index):
    return b"r" + struct.pack("<I", 0xF00000 + index)  # memo indices far above the seed's own


def _get(index):
    return b"j" + struct.pack("<I", 0xF00000 + index)


HOSTILE = [
    lambda rng: b"})" + b"\x85" * pick(rng, [999, 1000, 1001, 5000, 200_000]) + b"Ns0",  # a deep tuple as a key
    lambda rng: b"(" * pick(rng, [1000, 1001, 50_000]) + b"1" * pick(rng, [1000, 1001, 50_000]),  # deep marks
    lambda rng: b"]" * 1001 + b"a" * 1000 + b"0",  # lists 1001 deep
    _memoized_copies,
    lambda rng: b"}(" + b"".join(_int_op(k * (2**61 - 1) + 5) + b"N" for k in range(1, 3000)) + b"u0",  # one hash
    lambda rng: b")" + _put(1) + (_get(1) * 2 + b"\x86" + _put(1)) * 80 + b"}" + _get(1) + b"Ns0",  # doubled 80x
    lambda rng: b"ctorch\ndevice\nX\x04\x00\x00\x00cuda" + _int_op(pick(rng, EDGE_INTS)) + b"\x86R0",
]


def _int_op(value):
    if 0 <= value < 256:
        return b"K" + bytes([value])
    if -2**31 <= value < 2**31:
        return b"J" + struct.pack("<i", value)
    data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data if len(data) < 256 else b"\x8b" + struct.pack("<i", len(data)) + data


def _rezip(records, pkl):
    prefix, recs, _ = records
    buf = io.BytesIO()
    writer = zipformat.ZipWriter(buf, prefix)
    for name, data in recs:
        writer.write_record(name, pkl if name == "data.pkl" else data)
    writer.finish()
    return buf.getvalue()


_ZIP_STRUCTS = {zipformat._LOCAL_SIG: zipformat._LOCAL, zipformat._CENTRAL_SIG: zipformat._CENTRAL,
                zipformat._END_SIG: zipformat._END, zipformat._END64_SIG: zipformat._END64,
                zipformat._LOCATOR64_SIG: zipformat._LOCATOR64, zipformat._DESCRIPTOR_SIG: zipformat._DESCRIPTOR32}


def _mutate_zip_field(rng, data):
    """One field of one zip structure (found by its signature) set to an edge value."""
    found = [(i, sig) for sig in _ZIP_STRUCTS for i in _find_all(data, struct.pack("<I", sig))]
    if not found:
        return data
    at, sig = found[int(rng.integers(len(found)))]
    layout = _ZIP_STRUCTS[sig]
    codes = layout.format[1:]
    field = int(rng.integers(1, len(codes)))
    offset = at + struct.calcsize("<" + codes[:field])
    code = codes[field]
    size = struct.calcsize("<" + code)
    if offset + size > len(data):
        return data
    old = struct.unpack_from("<" + code, data, offset)[0]
    top = 2 ** (8 * size) - 1
    value = pick(rng, [0, 1, top, top - 1, old + 1, old - 1, old * 2, len(data), len(data) - at,
                       int.from_bytes(rng.bytes(size), "little")]) & top
    return data[:offset] + struct.pack("<" + code, value) + data[offset + size:]


def _find_all(data, needle):
    i = data.find(needle)
    while i >= 0:
        yield i
        i = data.find(needle, i + 1)


def _mutate_header(rng, data):
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    names = [k for k in header if k != "__metadata__"]
    entry = header[names[int(rng.integers(len(names)))]]
    how = int(rng.integers(8))
    if how == 0:
        entry["shape"] = entry["shape"] + [pick(rng, EDGE_INTS[:26])]
    elif how == 1 and entry["shape"]:
        entry["shape"][int(rng.integers(len(entry["shape"])))] = pick(rng, EDGE_INTS)
    elif how == 2:
        entry["shape"] = [1] * pick(rng, [63, 64, 65, 1000]) if rng.integers(2) else [2**64 - 1] * 20_000
    elif how == 3:
        entry["data_offsets"][int(rng.integers(2))] = pick(rng, EDGE_INTS)
    elif how == 4:
        entry["dtype"] = pick(rng, ["F32", "U16", "F8_E4M3", "BOOL", "I64", "Q1", ""])
    elif how == 5:
        header["__metadata__"] = {"a": int(rng.integers(10))} if rng.integers(2) else {"a": "b" * 1000}
    elif how == 6:
        del entry[pick(rng, ["shape", "dtype", "data_offsets"])]
    else:
        entry["data_offsets"] = [entry["data_offsets"][1], entry["data_offsets"][0]]
    text = json.dumps(header).encode()
    length = len(text) if rng.integers(4) else pick(rng, EDGE_INTS[:24]) % 2**64
    return struct.pack("<Q", length) + text + body


# ---------------------------------------------------------------------------------------------- one case
def run_case(kind, data, rng, folder):
    """Load `data` and use what loaded: 'loaded', or the name of the clean exception the load raised. Any other
    exception, and any exception from using a loaded object, propagates."""
    path = os.path.join(folder, "case.safetensors" if kind == "safetensors" else "case.pt")
    from_path = kind == "safetensors" or not rng.integers(4)
    if from_path:
        with open(path, "wb") as f:
            f.write(data)
    try:
        if kind == "safetensors":
            obj = mt.load_safetensors(path)
        else:
            map_location = ["cpu", lambda storage, tag: storage][int(rng.integers(2))]
            obj = mt.load(path if from_path else io.BytesIO(data), map_location=map_location,
                          mmap=from_path and bool(rng.integers(2)))
    except RecursionError:  # a RuntimeError, but a sign of recursion the limits should have stopped
        raise
    except CLEAN as exc:
        return type(exc).__name__
    exercise(obj)
    return "loaded"


def exercise(obj):
    """Touch what was loaded: every element of small tensors, the first and last of big ones (so every tensor
    must lie inside its storage), walking containers without recursion. "Small" counts the lists tolist() would
    build too: an empty tensor of size (2**31, 0) loads, as in torch, but its tolist() is 2**31 empty lists."""
    stack, seen = [obj], set()
    while stack:
        x = stack.pop()
        if isinstance(x, mt.Tensor):
            if math.prod(n or 1 for n in x.shape) <= 1 << 16:
                x.tolist()
            elif x.numel():
                x[(0,) * x.dim()].item()
                x[tuple(n - 1 for n in x.shape)].item()
        elif isinstance(x, (list, tuple, set, frozenset, dict)) and id(x) not in seen:
            seen.add(id(x))
            stack.extend(x.values() if isinstance(x, dict) else x)
            stack.extend(getattr(x, "__dict__", {}).values())


def case(all_seeds, seed, number):
    rng = np.random.default_rng([seed, number])
    chosen = all_seeds[int(rng.integers(len(all_seeds)))]
    how, data = mutate(rng, chosen, all_seeds)
    return chosen, how, data, rng


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=float(os.environ.get("MINITENSOR_FUZZ_SECONDS", 25)))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("MINITENSOR_FUZZ_SEED", 17)))
    parser.add_argument("--case", type=int, help="run only this case")
    parser.add_argument("--save", help="with --case: write the mutated file here")
    parser.add_argument("--memory", type=int, default=2 << 30, help="address-space cap in bytes (0: none)")
    args = parser.parse_args(argv)
    if args.memory:
        resource.setrlimit(resource.RLIMIT_AS, (args.memory, args.memory))
    all_seeds = seeds()
    outcomes = collections.Counter()
    findings, slowest = [], (0.0, None)
    deadline = time.monotonic() + args.seconds
    with tempfile.TemporaryDirectory() as folder:
        for number in [args.case] if args.case is not None else itertools.count():
            if args.case is None and time.monotonic() > deadline:
                break
            (name, kind, _, _), how, data, rng = case(all_seeds, args.seed, number)
            if args.save:
                with open(args.save, "wb") as f:
                    f.write(data)
            print(json.dumps({"case": number}), flush=True)  # the last one printed is the culprit of a crash
            start = time.process_time()
            faulthandler.dump_traceback_later(HANG_SECONDS, exit=True)
            try:
                outcome = run_case(kind, data, rng, folder)
            except BaseException as exc:  # noqa: B902 - every other exception is a finding
                outcome = f"{type(exc).__name__}: {str(exc)[:300]}"
                findings.append({"case": number, "seed": name, "mutation": how, "error": outcome})
            faulthandler.cancel_dump_traceback_later()
            seconds = time.process_time() - start
            if seconds > SLOW_SECONDS:
                findings.append({"case": number, "seed": name, "mutation": how, "slow": round(seconds, 2)})
            slowest = max(slowest, (seconds, number))
            outcomes[(kind, how, outcome.split(":")[0])] += 1
    summary = {"summary": True, "seed": args.seed, "cases": sum(outcomes.values()), "findings": findings,
               "slowest": {"cpu_seconds": round(slowest[0], 3), "case": slowest[1]},
               "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
               "outcomes": {" / ".join(k): v for k, v in sorted(outcomes.items())}}
    print(json.dumps(summary), flush=True)
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
