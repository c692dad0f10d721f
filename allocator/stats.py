"""The allocator's statistics as plain ints, and torch's `memory_stats()` dict built from them on demand.

The allocator updates the counters in place on every call, so they are kept to what cannot be derived:
- per pool (small, large) each stat's current value and peak, and its accumulated increase since the last
  `reset_accumulated` (torch's "allocated" field); the accumulated decrease ("freed") follows from
  increase - (current - current at that reset);
- `active` is `allocation` plus the blocks freed but waiting on record_stream events (`pending`), and it
  rises exactly when `allocation` does;
- the "all" pool is the sum of the two, except for its peaks, which the allocator tracks itself.
"""

STATS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes", "active_bytes",
         "inactive_split_bytes", "requested_bytes")
_INCREASED = ("allocation", "allocated_bytes", "requested_bytes", "inactive_split", "inactive_split_bytes",
              "segment", "reserved_bytes")
_CURRENT = ("allocation", "allocated_bytes", "pending", "pending_bytes", "requested_bytes", "inactive_split",
            "inactive_split_bytes", "segment", "reserved_bytes")
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


class Peaks:
    """The peak of every stat, for one pool or for all of them."""

    __slots__ = tuple(f"{s}_peak" for s in STATS)

    def __init__(self):
        for name in Peaks.__slots__:
            setattr(self, name, 0)


class PoolStats(Peaks):
    """The counters of one pool."""

    __slots__ = _CURRENT + tuple(f"{s}_inc" for s in _INCREASED) + tuple(f"{s}_base" for s in STATS)

    def __init__(self):
        super().__init__()
        for name in PoolStats.__slots__:
            setattr(self, name, 0)

    def current(self, stat):
        if stat == "active":
            return self.allocation + self.pending
        if stat == "active_bytes":
            return self.allocated_bytes + self.pending_bytes
        return getattr(self, stat)

    def increase(self, stat):
        return getattr(self, _inc_source(stat) + "_inc")


def _inc_source(stat):
    return {"active": "allocation", "active_bytes": "allocated_bytes"}.get(stat, stat)


class Oversize:
    """Blocks and segments of at least max_split_size: current, peak, and accumulated increase."""

    __slots__ = ("current", "peak", "inc", "base")

    def __init__(self):
        self.current = self.peak = self.inc = self.base = 0

    def up(self):
        self.current += 1
        self.inc += 1
        if self.current > self.peak:
            self.peak = self.current

    def down(self):
        self.current -= 1

    def fields(self):
        return {"current": self.current, "peak": self.peak, "allocated": self.inc,
                "freed": self.inc - (self.current - self.base)}


class DeviceStats:
    """Every statistic of one device's allocator."""

    def __init__(self):
        self.small = PoolStats()
        self.large = PoolStats()
        self.all = Peaks()
        self.oversize_allocations = Oversize()
        self.oversize_segments = Oversize()
        for name in COUNTERS:
            setattr(self, name, 0)

    def current(self, stat):
        return self.small.current(stat) + self.large.current(stat)

    def as_dict(self, max_split_size):
        """torch's flat dict: "<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>", the
        plain counters, `max_split_size` (-1 when unset) and the oversize stats."""
        out = {}
        pools = (("small_pool", self.small), ("large_pool", self.large))
        for stat in STATS:
            total = {"current": 0, "allocated": 0, "base": 0}
            for name, p in pools:
                cur, inc, base = p.current(stat), p.increase(stat), getattr(p, stat + "_base")
                out[f"{stat}.{name}.current"] = cur
                out[f"{stat}.{name}.peak"] = getattr(p, stat + "_peak")
                out[f"{stat}.{name}.allocated"] = inc
                out[f"{stat}.{name}.freed"] = inc - (cur - base)
                total["current"] += cur
                total["allocated"] += inc
                total["base"] += base
            out[f"{stat}.all.current"] = total["current"]
            out[f"{stat}.all.peak"] = getattr(self.all, stat + "_peak")
            out[f"{stat}.all.allocated"] = total["allocated"]
            out[f"{stat}.all.freed"] = total["allocated"] - (total["current"] - total["base"])
        for name in COUNTERS:
            out[name] = getattr(self, name)
        out["max_split_size"] = -1 if max_split_size is None else max_split_size
        for name in ("oversize_allocations", "oversize_segments"):
            for field, value in getattr(self, name).fields().items():
                out[f"{name}.{field}"] = value
        return dict(sorted(out.items()))

    def reset_peaks(self):
        for p in (self.small, self.large):
            for stat in STATS:
                setattr(p, stat + "_peak", p.current(stat))
        for stat in STATS:
            setattr(self.all, stat + "_peak", self.current(stat))
        for o in (self.oversize_allocations, self.oversize_segments):
            o.peak = o.current

    def reset_accumulated(self):
        for p in (self.small, self.large):
            for stat in _INCREASED:
                setattr(p, stat + "_inc", 0)
            for stat in STATS:
                setattr(p, stat + "_base", p.current(stat))
        for name in COUNTERS:
            setattr(self, name, 0)
        for o in (self.oversize_allocations, self.oversize_segments):
            o.inc, o.base = 0, o.current
