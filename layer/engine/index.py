"""The queue engine's per-message entry and its lazily invalidated indexes.

Every index here holds references to entries and never removes one eagerly: an entry that left an
index's concern (delivered, returned, done) stays in it until it reaches the front, where its
``state`` shows it is stale. Each index compacts itself when stale references outnumber live ones,
so memory stays proportional to the live messages and the cost stays amortized O(1) per change.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, merge
from itertools import islice
from operator import attrgetter
from typing import Any

from layer.engine.model import Bookmark

AVAILABLE = 0
LEASED = 1
DONE = 2
HELD = 3  # behind a pending barrier (or the barrier itself): in the queue, not deliverable yet
DELAYED = 4  # waiting for its delayed (re)delivery time

# Compaction slack: small indexes are never worth rebuilding.
_SLACK = 1024


class Entry:
    """One message in the queue (available or leased). Kept small: it exists per queued message.

    ``key`` orders delivery: the arrival sequence number, or ``(priority key, sequence)`` for
    priority queues. A returned message keeps its key, so it is "oldest first" again.
    ``gen`` counts the times the message went back into the main delivery order; references to
    it parked elsewhere (``layer.engine.routing``) are live only while their ``gen`` matches.
    """

    __slots__ = (
        "bookmark",
        "key",
        "timestamp",
        "deliveries",
        "cancels",
        "holder",
        "deadline",
        "state",
        "group",
        "ckey",
        "gen",
    )

    def __init__(
        self, bookmark: Bookmark, key: Any, timestamp: float, deliveries: int, cancels: int
    ) -> None:
        self.bookmark = bookmark
        self.key = key
        self.timestamp = timestamp
        self.deliveries = deliveries
        self.cancels = cancels
        self.holder: Any = None  # the Subscriber holding the lease
        self.deadline: float | None = None
        self.state = AVAILABLE
        self.group: Any = None
        self.ckey: Any = None
        self.gen = 0

    def __repr__(self) -> str:
        state = ("available", "leased", "done", "held", "delayed")[self.state]
        return f"Entry({self.bookmark}, {state}, deliveries={self.deliveries})"


class FifoOrder:
    """Available messages in arrival order.

    New arrivals come in key order, so they sit in a deque; only returned messages (whose key is
    older than the newest arrival) need the heap. The common path is therefore O(1) and costs one
    deque slot per message.
    """

    __slots__ = ("_fresh", "_returned")

    def __init__(self) -> None:
        self._fresh: deque[Entry] = deque()
        self._returned: list[tuple[Any, Entry]] = []

    def __len__(self) -> int:
        return len(self._fresh) + len(self._returned)

    def push_new(self, entry: Entry) -> None:
        self._fresh.append(entry)

    def push_returned(self, entry: Entry) -> None:
        heappush(self._returned, (entry.key, entry))

    def peek(self) -> Entry | None:
        """The next available entry, left in place, or None."""
        fresh, returned = self._fresh, self._returned
        while fresh and fresh[0].state != AVAILABLE:
            fresh.popleft()
        while returned and returned[0][1].state != AVAILABLE:
            heappop(returned)
        if returned and (not fresh or returned[0][0] < fresh[0].key):
            return returned[0][1]
        return fresh[0] if fresh else None

    def pop(self) -> Entry | None:
        """Remove and return the next available entry, or None."""
        fresh, returned = self._fresh, self._returned
        while fresh and fresh[0].state != AVAILABLE:
            fresh.popleft()
        while returned and returned[0][1].state != AVAILABLE:
            heappop(returned)
        if returned and (not fresh or returned[0][0] < fresh[0].key):
            return heappop(returned)[1]
        if fresh:
            return fresh.popleft()
        return None

    def browse(self, limit: int | None) -> list[Entry]:
        returned = sorted(item for item in self._returned if item[1].state == AVAILABLE)
        fresh = (e for e in self._fresh if e.state == AVAILABLE)
        merged = merge((e for _, e in returned), fresh, key=attrgetter("key"))
        return list(islice(merged, limit))

    def compact(self, live: int) -> None:
        if len(self._fresh) + len(self._returned) <= 2 * live + _SLACK:
            return
        self._fresh = deque(e for e in self._fresh if e.state == AVAILABLE)
        self._returned = [item for item in self._returned if item[1].state == AVAILABLE]
        heapify(self._returned)


class PriorityOrder:
    """Available messages by priority (highest first), then arrival order: one heap."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[Any, Entry]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push_new(self, entry: Entry) -> None:
        heappush(self._heap, (entry.key, entry))

    push_returned = push_new

    def peek(self) -> Entry | None:
        heap = self._heap
        while heap and heap[0][1].state != AVAILABLE:
            heappop(heap)
        return heap[0][1] if heap else None

    def pop(self) -> Entry | None:
        heap = self._heap
        while heap:
            entry = heappop(heap)[1]
            if entry.state == AVAILABLE:
                return entry
        return None

    def browse(self, limit: int | None) -> list[Entry]:
        items = sorted(item for item in self._heap if item[1].state == AVAILABLE)
        if limit is not None:
            items = items[:limit]
        return [entry for _, entry in items]

    def compact(self, live: int) -> None:
        if len(self._heap) <= 2 * live + _SLACK:
            return
        self._heap = [item for item in self._heap if item[1].state == AVAILABLE]
        heapify(self._heap)


class AgeIndex:
    """Queued messages by enqueue timestamp: for expiration and the oldest available message.

    Timestamps mostly arrive in order, so those go to a deque; an out-of-order arrival or a returned
    message goes to the heap. Leased messages are dropped when they reach the front (they cannot
    expire while leased); the engine pushes a message again whenever its lease ends.
    """

    __slots__ = ("_fifo", "_heap")

    def __init__(self) -> None:
        self._fifo: deque[Entry] = deque()
        self._heap: list[tuple[float, Any, Entry]] = []

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)

    def push(self, entry: Entry) -> None:
        fifo = self._fifo
        if not fifo or entry.timestamp >= fifo[-1].timestamp:
            fifo.append(entry)
        else:
            heappush(self._heap, (entry.timestamp, entry.key, entry))

    def _clean(self) -> None:
        fifo, heap = self._fifo, self._heap
        while fifo and fifo[0].state != AVAILABLE:
            fifo.popleft()
        while heap and heap[0][2].state != AVAILABLE:
            heappop(heap)

    def oldest(self) -> Entry | None:
        """The available entry with the smallest timestamp, left in place."""
        self._clean()
        fifo, heap = self._fifo, self._heap
        if heap and (not fifo or heap[0][0] < fifo[0].timestamp):
            return heap[0][2]
        return fifo[0] if fifo else None

    def pop_expired(self, cutoff: float) -> Entry | None:
        """Remove and return an available entry with ``timestamp <= cutoff``, or None."""
        entry = self.oldest()
        if entry is None or entry.timestamp > cutoff:
            return None
        fifo = self._fifo
        if fifo and fifo[0] is entry:
            fifo.popleft()
        else:
            heappop(self._heap)
        return entry

    def compact(self, live: int) -> None:
        if len(self._fifo) + len(self._heap) <= 2 * live + _SLACK:
            return
        self._fifo = deque(e for e in self._fifo if e.state != DONE)
        seen = {id(e) for e in self._fifo}
        heap = []
        for item in self._heap:
            entry = item[2]
            if entry.state != DONE and id(entry) not in seen:
                seen.add(id(entry))
                heap.append(item)
        heapify(heap)
        self._heap = heap


class LeaseIndex:
    """Lease deadlines: a heap of ``(deadline, key, entry)``; an item is live while the entry is
    leased with exactly that deadline (an extend pushes a new item and strands the old one)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, Any, Entry]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, entry: Entry, deadline: float) -> None:
        heappush(self._heap, (deadline, entry.key, entry))

    def pop_due(self, now: float) -> Entry | None:
        """Remove and return a leased entry whose deadline is ``<= now``, or None."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, _, entry = heappop(heap)
            if entry.state == LEASED and entry.deadline == deadline:
                return entry
        return None

    def compact(self, live: int) -> None:
        if len(self._heap) <= 2 * live + _SLACK:
            return
        kept: dict[int, tuple[float, Any, Entry]] = {}
        for item in self._heap:
            entry = item[2]
            if entry.state == LEASED and entry.deadline == item[0]:
                kept[id(entry)] = item
        self._heap = list(kept.values())
        heapify(self._heap)


class DelayIndex:
    """Delayed messages by the time they become available: a heap of ``(time, key, entry)``."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, Any, Entry]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, entry: Entry, when: float) -> None:
        heappush(self._heap, (when, entry.key, entry))

    def pop_due(self, now: float) -> Entry | None:
        """Remove and return a delayed entry whose time is ``<= now``, or None."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heappop(heap)[2]
            if entry.state == DELAYED:
                return entry
        return None

    def compact(self, live: int) -> None:
        if len(self._heap) <= 2 * live + _SLACK:
            return
        self._heap = [item for item in self._heap if item[2].state == DELAYED]
        heapify(self._heap)
