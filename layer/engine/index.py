"""The queue engine's per-message entry and its lazily invalidated indexes.

Every index here holds references to entries and never removes one eagerly: an entry that left an
index's concern (delivered, returned, done) stays in it until it reaches the front, where its
``state`` shows it is stale. Each index compacts itself when stale references outnumber live ones,
so memory stays proportional to the live messages and the cost stays amortized O(1) per change.
"""

from __future__ import annotations

from collections import deque
from heapq import heapify, heappop, heappush, heapreplace, merge
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
_INF = float("inf")


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
        "expires",
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
        self.expires: float | None = None  # its own expiry time (a per-message TTL)

    def __lt__(self, other: object) -> bool:
        # heaps hold entries and runs side by side: equal keys must not raise
        return False

    def __repr__(self) -> str:
        state = ("available", "leased", "done", "held", "delayed")[self.state]
        return f"Entry({self.bookmark}, {state}, deliveries={self.deliveries})"


def _live(item: Any) -> bool:
    """An index item (an entry, or a run of plain messages) still has something available."""
    if type(item) is Entry:
        return item.state == AVAILABLE
    return bool(item.lo < item.hi)


def _expand(item: Any) -> list[Entry]:
    """The available messages of an index item, as entries (a run's are made, not kept)."""
    if type(item) is Entry:
        return [item] if item.state == AVAILABLE else []
    return [item.make(i) for i in range(item.lo, item.hi)]


def _take(heap: list[tuple[Any, Any]]) -> Entry:
    """Pop the message at the top of a heap of ``(key, entry or run)`` (settled: see
    ``_settle``): an entry leaves the heap; a run gives its front and stays while it has more."""
    item = heap[0][1]
    if type(item) is Entry:
        heappop(heap)
        return item
    entry: Entry = item.take_front()
    if item.lo < item.hi:
        heapreplace(heap, (item.front_key(), item))
    else:
        heappop(heap)
    return entry


def _settle(heap: list[tuple[Any, Any]]) -> None:
    """Drop the dead items at the top of a ``(key, entry or run)`` heap and bring a run whose
    front moved on (taken by another index) back to its current key."""
    while heap:
        key, item = heap[0]
        if type(item) is Entry:
            if item.state == AVAILABLE:
                return
            heappop(heap)
        elif item.lo >= item.hi:
            heappop(heap)
        else:
            front = item.front_key()
            if front == key:
                return
            heapreplace(heap, (front, item))


class FifoOrder:
    """Available messages in arrival order.

    New arrivals come in key order, so they sit in a deque (an entry, or a run of plain messages
    whose keys are consecutive); only returned messages (whose key is older than the newest
    arrival) and the back halves of split runs need the heap. The common path is therefore O(1)
    and costs one deque slot per run.
    """

    __slots__ = ("_fresh", "_returned")

    def __init__(self) -> None:
        self._fresh: deque[Any] = deque()
        self._returned: list[tuple[Any, Any]] = []

    def __len__(self) -> int:
        return len(self._fresh) + len(self._returned)

    def push_new(self, item: Any) -> None:
        """An entry or a run, with keys above every one pushed before."""
        self._fresh.append(item)

    def push_returned(self, item: Any) -> None:
        key = item.key if type(item) is Entry else item.front_key()
        heappush(self._returned, (key, item))

    def _front(self) -> Any:
        fresh = self._fresh
        while fresh and not _live(fresh[0]):
            fresh.popleft()
        _settle(self._returned)
        if not fresh:
            return None
        item = fresh[0]
        return item.key if type(item) is Entry else item.front_key()

    def peek_key(self) -> Any:
        """The key of the next available message, or None."""
        fresh_key = self._front()
        returned = self._returned
        if returned and (fresh_key is None or returned[0][0] < fresh_key):
            return returned[0][0]
        return fresh_key

    def pop(self) -> Entry | None:
        """Remove and return the next available message (materialized), or None."""
        fresh_key = self._front()
        returned = self._returned
        if returned and (fresh_key is None or returned[0][0] < fresh_key):
            return _take(returned)
        if fresh_key is None:
            return None
        fresh = self._fresh
        item = fresh[0]
        if type(item) is Entry:
            return fresh.popleft()  # type: ignore[no-any-return]
        entry: Entry = item.take_front()
        if item.lo >= item.hi:
            fresh.popleft()
        return entry

    def pop_many(self, n: int) -> list[Entry]:
        """Up to ``n`` messages, as ``pop`` would give them one by one: a run at the front with
        nothing returned before it gives them in one piece."""
        out: list[Entry] = []
        fresh, returned = self._fresh, self._returned
        while len(out) < n:
            fresh_key = self._front()
            if returned and (fresh_key is None or returned[0][0] < fresh_key):
                out.append(_take(returned))
                continue
            if fresh_key is None:
                break
            item = fresh[0]
            if type(item) is Entry:
                out.append(fresh.popleft())
                continue
            # the run's messages up to the first key a returned message goes before
            take = min(n - len(out), item.hi - item.lo)
            if returned:
                take = 1
            out.extend(item.take_many(take))
            if item.lo >= item.hi:
                fresh.popleft()
        return out

    def browse(self, limit: int | None) -> list[Entry]:
        returned = sorted(
            (e.key, e) for _, item in self._returned if _live(item) for e in _expand(item)
        )
        fresh = (e for item in self._fresh for e in _expand(item))
        merged = merge((e for _, e in returned), fresh, key=attrgetter("key"))
        return list(islice(merged, limit))

    def compact(self, live: int) -> None:
        if len(self._fresh) + len(self._returned) <= 2 * live + _SLACK:
            return
        self._fresh = deque(item for item in self._fresh if _live(item))
        self._returned = [pair for pair in self._returned if _live(pair[1])]
        heapify(self._returned)


class PriorityOrder:
    """Available messages by priority (highest first), then arrival order: one heap of entries
    and runs (a run's messages share a priority)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[Any, Any]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push_new(self, item: Any) -> None:
        key = item.key if type(item) is Entry else item.front_key()
        heappush(self._heap, (key, item))

    push_returned = push_new

    def peek_key(self) -> Any:
        heap = self._heap
        _settle(heap)
        return heap[0][0] if heap else None

    def pop(self) -> Entry | None:
        heap = self._heap
        _settle(heap)
        return _take(heap) if heap else None

    def pop_many(self, n: int) -> list[Entry]:
        """Up to ``n`` messages, as ``pop`` gives them one by one."""
        out: list[Entry] = []
        heap = self._heap
        while len(out) < n:
            _settle(heap)
            if not heap:
                break
            out.append(_take(heap))
        return out

    def browse(self, limit: int | None) -> list[Entry]:
        items = sorted((e.key, e) for _, item in self._heap for e in _expand(item))
        if limit is not None:
            items = items[:limit]
        return [entry for _, entry in items]

    def compact(self, live: int) -> None:
        if len(self._heap) <= 2 * live + _SLACK:
            return
        self._heap = [pair for pair in self._heap if _live(pair[1])]
        heapify(self._heap)


class AgeIndex:
    """Queued messages by enqueue timestamp: for expiration and the oldest available message.

    Timestamps mostly arrive in order, so those go to a deque (entries, and runs: a run's
    timestamps do not go down, so its front is its oldest); an out-of-order arrival or a returned
    message goes to the heap. Leased messages are dropped when they reach the front (they cannot
    expire while leased); the engine pushes a message again whenever its lease ends.
    """

    __slots__ = ("_fifo", "_heap", "_last")

    def __init__(self) -> None:
        self._fifo: deque[Any] = deque()
        self._heap: list[tuple[float, Any, Any]] = []
        self._last = -_INF  # the newest timestamp in the deque

    def __len__(self) -> int:
        return len(self._fifo) + len(self._heap)

    def push(self, item: Any) -> None:
        if type(item) is Entry:
            first = last = item.timestamp
            key = item.key
        else:
            first, last = item.front_time(), item.times[-1]
            key = item.front_key()
        if not self._fifo or first >= self._last:
            self._fifo.append(item)
            self._last = last
        else:
            heappush(self._heap, (first, key, item))

    def _clean(self) -> None:
        fifo, heap = self._fifo, self._heap
        while fifo and not _live(fifo[0]):
            fifo.popleft()
        while heap:
            item = heap[0][2]
            if type(item) is Entry:
                if item.state == AVAILABLE:
                    return
                heappop(heap)
            elif item.lo >= item.hi:
                heappop(heap)
            elif item.front_time() == heap[0][0] and item.front_key() == heap[0][1]:
                return
            else:
                heapreplace(heap, (item.front_time(), item.front_key(), item))

    def _oldest(self) -> tuple[float, bool] | None:
        """The oldest available timestamp, and whether it is at the top of the heap."""
        self._clean()
        fifo, heap = self._fifo, self._heap
        first = None
        if fifo:
            item = fifo[0]
            first = item.timestamp if type(item) is Entry else item.front_time()
        if heap and (first is None or heap[0][0] < first):
            return heap[0][0], True
        return None if first is None else (first, False)

    def oldest_time(self) -> float | None:
        """The smallest timestamp of an available message."""
        found = self._oldest()
        return None if found is None else found[0]

    def pop_expired(self, cutoff: float) -> Entry | None:
        """Remove and return (materialized) an available message with ``timestamp <= cutoff``,
        or None."""
        found = self._oldest()
        if found is None or found[0] > cutoff:
            return None
        if found[1]:
            heap = self._heap
            item = heap[0][2]
            if type(item) is Entry:
                heappop(heap)
                return item
            entry: Entry = item.take_front()
            if item.lo < item.hi:
                heapreplace(heap, (item.front_time(), item.front_key(), item))
            else:
                heappop(heap)
            return entry
        fifo = self._fifo
        item = fifo[0]
        if type(item) is Entry:
            fifo.popleft()
            return item
        entry = item.take_front()
        if item.lo >= item.hi:
            fifo.popleft()
        return entry

    def compact(self, live: int) -> None:
        if len(self._fifo) + len(self._heap) <= 2 * live + _SLACK:
            return
        self._fifo = deque(e for e in self._fifo if _kept(e))
        seen = {id(e) for e in self._fifo}
        heap = []
        for item in self._heap:
            entry = item[2]
            if _kept(entry) and id(entry) not in seen:
                seen.add(id(entry))
                heap.append(item)
        heapify(heap)
        self._heap = heap


def _kept(item: Any) -> bool:
    """Whether the age index keeps an item when it compacts (leased entries may come back)."""
    if type(item) is Entry:
        return item.state != DONE
    return bool(item.lo < item.hi)


class LeaseIndex:
    """Lease deadlines. The leases of one dispatch share a deadline (now + the lease period)
    and deadlines mostly only grow: they go to a deque of batches ``(deadline, entries)`` in
    deadline order, one per deadline, not a heap item each; an earlier deadline than the last
    batch's (an extend by less than the lease period) goes to a heap of ``(deadline, key,
    entry)``. A reference is live while its entry is leased with exactly that deadline (an
    extend pushes the entry again and strands the old reference). Due leases come out by
    deadline, those of one deadline in the order they were pushed."""

    __slots__ = ("_batches", "_at", "_heap", "_size")

    def __init__(self) -> None:
        self._batches: deque[tuple[float, list[Entry]]] = deque()
        self._at = 0  # in the front batch, the position of the next entry to look at
        self._heap: list[tuple[float, Any, Entry]] = []
        self._size = 0  # references held

    def __len__(self) -> int:
        return self._size

    def push(self, entry: Entry, deadline: float) -> None:
        self._size += 1
        batches = self._batches
        if batches:
            last = batches[-1]
            if deadline == last[0]:
                last[1].append(entry)
                return
            if deadline < last[0]:
                heappush(self._heap, (deadline, entry.key, entry))
                return
        batches.append((deadline, [entry]))

    def push_many(self, entries: list[Entry], deadline: float) -> None:
        """``push`` of each of ``entries`` with one deadline."""
        if not entries:
            return
        batches = self._batches
        if batches and deadline <= batches[-1][0]:
            last = batches[-1]
            if deadline == last[0]:
                # the leases of one dispatch to several subscriptions share their deadline
                last[1].extend(entries)
                self._size += len(entries)
                return
            push = self.push
            for entry in entries:
                push(entry, deadline)
            return
        self._size += len(entries)
        batches.append((deadline, list(entries)))

    def pop_due(self, now: float) -> Entry | None:
        """Remove and return a leased entry whose deadline is ``<= now``, or None."""
        batches, heap = self._batches, self._heap
        while True:
            if batches and batches[0][0] <= now and (not heap or batches[0][0] <= heap[0][0]):
                deadline, entries = batches[0]
                at, n = self._at, len(entries)
                while at < n:
                    entry = entries[at]
                    at += 1
                    if entry.state == LEASED and entry.deadline == deadline:
                        self._size -= at - self._at
                        self._at = at
                        return entry
                self._size -= n - self._at
                batches.popleft()
                self._at = 0
                continue
            if heap and heap[0][0] <= now:
                deadline, _, entry = heappop(heap)
                self._size -= 1
                if entry.state == LEASED and entry.deadline == deadline:
                    return entry
                continue
            return None

    def compact(self, live: int) -> None:
        if self._size <= 2 * live + _SLACK:
            return
        kept: deque[tuple[float, list[Entry]]] = deque()
        size = 0
        at = self._at
        for deadline, entries in self._batches:
            live_ones = [
                e for e in islice(entries, at, None) if e.state == LEASED and e.deadline == deadline
            ]
            at = 0
            if live_ones:
                kept.append((deadline, live_ones))
                size += len(live_ones)
        self._batches, self._at = kept, 0
        # an entry pushed twice with one deadline (leased, returned and leased again at one
        # instant) is kept once
        seen: set[int] = set()
        heap = []
        for item in self._heap:
            entry = item[2]
            if entry.state == LEASED and entry.deadline == item[0] and id(entry) not in seen:
                seen.add(id(entry))
                heap.append(item)
        heapify(heap)
        self._heap = heap
        self._size = size + len(heap)


class ExpiryIndex:
    """Messages with an expiry time of their own (a per-message TTL): a heap of ``(time, key,
    entry)``. An item is pushed whenever its message becomes available (arrival, return,
    release from a barrier or a delay); only available messages are popped as expired, the
    others are dropped (a lease's end checks the time itself, and becoming available again
    pushes a new item)."""

    __slots__ = ("_heap",)

    def __init__(self) -> None:
        self._heap: list[tuple[float, Any, Entry]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, entry: Entry) -> None:
        if entry.expires is not None:
            heappush(self._heap, (entry.expires, entry.key, entry))

    def pop_due(self, now: float) -> Entry | None:
        """Remove and return an available entry whose expiry time is ``<= now``, or None."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            entry = heappop(heap)[2]
            if entry.state == AVAILABLE:
                return entry
        return None

    def compact(self, live: int) -> None:
        if len(self._heap) <= 2 * live + _SLACK:
            return
        self._heap = [item for item in self._heap if item[2].state != DONE]
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
