"""record_stream's events, for both caching allocators (device.py, host.py): a freed block that other streams
used waits for one event recorded on each of them, and is free once all have completed (torch's allocators do
the same, with the same pool of completed events recorded again rather than created).
"""
import collections


class StreamEvents:
    """The events of freed blocks, from recording to completion, and the completed ones kept per device.

    A block goes through `record` (an event per entry of its `stream_uses`, into its `events`, counted by its
    `event_count`), then `queue` (under the allocator's lock), then `poll` or `synchronize`, which hand it to
    `done` once its last event has completed.

    Invariants: an event is in one place only: a block's `events`, a queue, or its device's spares. `queues`
    holds no empty deque, so an allocator tests that dict (never replaced) to know whether any event pends.
    """

    __slots__ = ("driver", "done", "queues", "_per_stream", "_spare")

    def __init__(self, driver, done, per_stream):
        self.driver = driver
        self.done = done  # called with each block whose events have all completed
        self.queues = {}  # stream, or None for all of them -> deque of (event, device, block), oldest first
        # torch's device allocator polls each stream's events apart, its host allocator all in one queue
        self._per_stream = per_stream
        self._spare = collections.defaultdict(list)  # device -> completed events

    def record(self, block):
        """Record an event on each (device, stream) of block.stream_uses, in order, with that device current,
        then make the caller's device current again. Needs no lock: the host allocator records in `free`."""
        driver = self.driver
        previous = current = driver.current_device()
        events = []
        try:
            for device, stream in sorted(block.stream_uses):
                if current != device:
                    driver.set_device(device)
                    current = device
                try:
                    event = self._spare[device].pop()
                except IndexError:
                    event = driver.event_create(device, False, False)
                driver.event_record(event, stream)
                events.append((event, device, stream))
        finally:
            if current != previous:
                driver.set_device(previous)
            block.stream_uses = None
            block.events = events
            block.event_count = len(events)

    def queue(self, block):
        """Queue the events `record` gave the block."""
        queues = self.queues
        for event, device, stream in block.events:
            key = stream if self._per_stream else None
            queue = queues.get(key)
            if queue is None:
                queue = queues[key] = collections.deque()
            queue.append((event, device, block))
        block.events = None

    def poll(self):
        """Count the completed events: each queue oldest first, up to its first event not yet complete."""
        query, queues = self.driver.event_query, self.queues
        for key, queue in list(queues.items()):
            while queue:
                event, device, block = queue[0]
                if not query(event):
                    break
                queue.popleft()
                self._completed(event, device, block)
            if not queue:
                del queues[key]

    def synchronize(self):
        """Wait for every queued event and count it completed."""
        synchronize = self.driver.event_synchronize
        for queue in self.queues.values():
            for event, device, block in queue:
                synchronize(event)
                self._completed(event, device, block)
        self.queues.clear()

    def destroy_spares(self):
        """Give the completed events back to the driver."""
        for spare in self._spare.values():
            for event in spare:
                self.driver.event_destroy(event)
        self._spare.clear()

    def _completed(self, event, device, block):
        self._spare[device].append(event)
        block.event_count -= 1
        if not block.event_count:
            self.done(block)
