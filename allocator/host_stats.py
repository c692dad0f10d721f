"""The pinned host allocator's statistics, and torch's `host_memory_stats()` dict built from them.

Keys: `<stat>.<current|peak|allocated|freed>` for the four stats below, `num_host_alloc` and `num_host_free`
(driver calls), and `host_alloc_time.*` / `host_free_time.*` with total/max/min/count/avg in microseconds.
"""

STATS = ("allocations", "allocated_bytes", "active_requests", "active_bytes")


class Stat:
    """A level: its current value, its peak, and what was added (allocated) and removed (freed) since the
    last reset of the accumulated fields."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self):
        self.current = self.peak = self.allocated = self.freed = 0

    def increase(self, n):
        current = self.current = self.current + n
        self.allocated += n
        if current > self.peak:
            self.peak = current

    def decrease(self, n):
        self.current -= n
        self.freed += n


class Duration:
    """How long driver calls took, in microseconds (min is 0 until the first call, as in torch)."""

    __slots__ = ("total", "max", "min", "count")

    def __init__(self):
        self.total = self.max = self.min = self.count = 0

    def add(self, us):
        self.total += us
        self.count += 1
        self.max = max(self.max, us)
        self.min = us if self.count == 1 or not self.min else min(self.min, us)

    def fields(self):
        return {"total": self.total, "max": self.max, "min": self.min, "count": self.count,
                "avg": self.total / self.count if self.count else 0}


class HostStats:
    """`allocations`/`allocated_bytes`: blocks the allocator holds from the driver, in use or cached.
    `active_requests`/`active_bytes`: blocks not free for reuse (handed out, or waiting on their events)."""

    def __init__(self):
        self.allocations, self.allocated_bytes = Stat(), Stat()
        self.active_requests, self.active_bytes = Stat(), Stat()
        self.host_alloc_time, self.host_free_time = Duration(), Duration()
        self.num_host_alloc = self.num_host_free = 0

    def as_dict(self):
        out = {}
        for name in STATS:
            stat = getattr(self, name)
            for field in Stat.__slots__:
                out[f"{name}.{field}"] = getattr(stat, field)
        for name in ("host_alloc_time", "host_free_time"):
            for field, value in getattr(self, name).fields().items():
                out[f"{name}.{field}"] = value
        out["num_host_alloc"] = self.num_host_alloc
        out["num_host_free"] = self.num_host_free
        return dict(sorted(out.items()))

    def reset_peaks(self):
        """Every peak to its current value; the durations' max and min to 0 (torch's reset_peak)."""
        for name in STATS:
            stat = getattr(self, name)
            stat.peak = stat.current
        for duration in (self.host_alloc_time, self.host_free_time):
            duration.max = duration.min = 0

    def reset_accumulated(self):
        """allocated/freed, the call counters and the durations' total and count to 0."""
        for name in STATS:
            stat = getattr(self, name)
            stat.allocated = stat.freed = 0
        for duration in (self.host_alloc_time, self.host_free_time):
            duration.total = duration.count = 0
        self.num_host_alloc = self.num_host_free = 0
