"""Snapshots with a known truth, for the memory viewer's tests and its fuzzer: FakeAllocator is a tiny caching
allocator that writes torch's snapshot format (blocks tiling segments in address order, pending frees, pools,
streams, frames) and keeps the truth at every state, so the viewer is checked against numbers it did not compute.
Its recording starts after a warm-up, so some allocations predate the trace (freed in it, or still in the
snapshot's segments), as in real recordings.
"""
import random

FILES = [("/work/model/train.py", "step"), ("/work/model/layers.py", "linear"), ("/work/model/attention.py", "qkv"),
         ("/work/data/loader.py", "batch")]


class FakeAllocator:
    """Segments of 2 MiB for requests up to 1 MiB, else rounded up to 2 MiB; first fit, split, merge on free."""

    def __init__(self, seed, streams=(0,), pools=((0, 0),), device=0):
        self.rng, self.streams, self.pools, self.device = random.Random(seed), streams, pools, device
        self.segments = []  # {"address", "total_size", "stream", "pool", "small", "blocks": [[addr, size, state]]}
        self.frames = {}  # addr -> frames of the active block there
        self.pending = []
        self.next_addr = 0x7F0000000000 + device * 0x1000000000
        self.clock = 1_000_000
        self.trace = None  # a list once recording
        self.truth = []  # per state: (allocated, reserved, live segments, live blocks)
        self.shapes = []  # (size, frames or None, entry index of the alloc or None): every allocation of the trace

    # ---- recording
    def stack(self):
        return [{"filename": f, "line": self.rng.randrange(10, 400), "name": n}
                for f, n in self.rng.sample(FILES, self.rng.randrange(1, 4))]

    def state(self):
        blocks = [b for s in self.segments for b in s["blocks"] if b[2] != "inactive"]
        return (sum(b[1] for b in blocks), sum(s["total_size"] for s in self.segments), len(self.segments),
                len(blocks))

    def emit(self, action, addr, size, stream, pool, frames=()):
        self.clock += self.rng.randrange(1, 50)
        if self.trace is not None:
            self.trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "pool_id": pool,
                               "time_us": self.clock, "frames": list(frames)})
            self.truth.append(self.state())

    def start_recording(self):
        self.trace, self.truth = [], [self.state()]
        self.shapes = [(b[1], None, None) for s in self.segments for b in s["blocks"] if b[2] != "inactive"]

    # ---- the allocator
    def alloc(self, size, stream=0, pool=(0, 0), frames=None):
        size = -(-size // 512) * 512
        small = size <= 1 << 20
        frames = frames or self.stack()
        for seg in self.segments:
            if (seg["stream"], seg["pool"], seg["small"]) != (stream, pool, small):
                continue
            for j, block in enumerate(seg["blocks"]):
                if block[2] == "inactive" and block[1] >= size:
                    if block[1] > size:
                        seg["blocks"].insert(j + 1, [block[0] + size, block[1] - size, "inactive"])
                    block[1], block[2] = size, "active_allocated"
                    return self._allocated(block[0], size, stream, pool, frames)
        total = 2 << 20 if small else -(-size // (2 << 20)) * (2 << 20)
        addr, self.next_addr = self.next_addr, self.next_addr + total + (2 << 20)
        self.segments.append({"address": addr, "total_size": total, "stream": stream, "pool": pool, "small": small,
                              "blocks": [[addr, total, "inactive"]]})
        self.emit("segment_alloc", addr, total, stream, pool)
        return self.alloc(size, stream, pool, frames)

    def _allocated(self, addr, size, stream, pool, frames):
        self.frames[addr] = frames
        self.emit("alloc", addr, size, stream, pool, frames)
        if self.trace is not None:
            self.shapes.append((size, frames, len(self.trace) - 1))
        return addr

    def _find(self, addr):
        for seg in self.segments:
            if seg["address"] <= addr < seg["address"] + seg["total_size"]:
                return seg, next(j for j, b in enumerate(seg["blocks"]) if b[0] == addr)
        raise KeyError(addr)

    def free(self, addr, pending=False):
        seg, j = self._find(addr)
        block = seg["blocks"][j]
        self.emit("free_requested", addr, block[1], seg["stream"], seg["pool"], self.stack())
        block[2] = "active_pending_free"
        if pending:
            self.pending.append(addr)
        else:
            self.complete(addr)

    def complete(self, addr):
        seg, j = self._find(addr)
        blocks = seg["blocks"]
        blocks[j][2] = "inactive"
        del self.frames[addr]
        self.emit("free_completed", addr, blocks[j][1], seg["stream"], seg["pool"])
        if j + 1 < len(blocks) and blocks[j + 1][2] == "inactive":
            blocks[j][1] += blocks.pop(j + 1)[1]
        if j > 0 and blocks[j - 1][2] == "inactive":
            blocks[j - 1][1] += blocks.pop(j)[1]

    def empty_cache(self):
        for seg in [s for s in self.segments if len(s["blocks"]) == 1 and s["blocks"][0][2] == "inactive"]:
            self.segments.remove(seg)
            self.emit("segment_free", seg["address"], seg["total_size"], seg["stream"], seg["pool"])

    def live(self):
        return [b[0] for s in self.segments for b in s["blocks"] if b[2] == "active_allocated"]

    def run(self, entries, keep_live=40):
        """Random work until the trace has at least `entries` entries (or `entries` operations unrecorded)."""
        done = 0
        while (len(self.trace) if self.trace is not None else done) < entries:
            done += 1
            live, r = self.live(), self.rng.random()
            if self.pending and r < 0.08:
                self.complete(self.pending.pop(self.rng.randrange(len(self.pending))))
            elif r < 0.1:
                self.empty_cache()
            elif not live or (len(live) < keep_live and r < 0.6) or r < 0.45:
                size = self.rng.randrange(1, 2048) * 512 if self.rng.random() < 0.75 else \
                    self.rng.randrange(1 << 20, 24 << 20)
                self.alloc(size, self.rng.choice(self.streams), self.rng.choice(self.pools))
            else:
                self.free(self.rng.choice(live), pending=self.rng.random() < 0.15)

    def snapshot(self):
        segments = [{
            "device": self.device, "address": s["address"], "total_size": s["total_size"],
            "allocated_size": sum(b[1] for b in s["blocks"] if b[2] == "active_allocated"),
            "active_size": sum(b[1] for b in s["blocks"] if b[2] != "inactive"),
            "requested_size": sum(b[1] for b in s["blocks"] if b[2] != "inactive"), "stream": s["stream"],
            "segment_type": "small" if s["small"] else "large", "segment_pool_id": s["pool"], "is_expandable": False,
            "frames": [],
            "blocks": [{"address": a, "size": n, "requested_size": n, "state": st,
                        "frames": self.frames.get(a, []) if st != "inactive" else []} for a, n, st in s["blocks"]],
        } for s in sorted(self.segments, key=lambda s: s["address"])]
        return {"segments": segments, "device_traces": [self.trace or []], "allocator_settings": {}}


def make(entries, seed=0, warmup=60, **kw):
    """A FakeAllocator warmed up unrecorded, then recorded for `entries` trace entries."""
    fake = FakeAllocator(seed, **kw)
    fake.run(warmup, keep_live=12)
    fake.start_recording()
    fake.run(entries)
    return fake
