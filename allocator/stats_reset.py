"""The stats resets that both caching allocators (device.py, host.py) share."""


class StatsReset:
    """reset_peak_stats and reset_accumulated_stats, each after completing the queued frees; for a class with a
    `_lock`, a `_settle()` to call under it, and a `stats` with reset_peaks() and reset_accumulated()."""

    def reset_peak_stats(self):
        with self._lock:
            self._settle()
            self.stats.reset_peaks()

    def reset_accumulated_stats(self):
        with self._lock:
            self._settle()
            self.stats.reset_accumulated()
