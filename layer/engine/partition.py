"""Per-partition bookkeeping: read position, low-water mark, and the messages in between.

The messages read from a partition are kept in offset order in two parallel lists: ``offsets``
(for a C-speed bisect) and ``items``. An item is a ``Run`` (``layer.engine.runs``: the plain
messages of one arrival batch, keyed by its first offset), or one message: its ``Entry`` while it
lives, just its ``Bookmark`` once done (kept until the low-water mark passes it and a Forget is
due). Arrivals come in increasing offset order, so both lists grow at the end (only a run split by
an ack inside it inserts) and shrink at the front: the low-water mark is in the first live item,
found in amortized O(1).

Done records for offsets not read yet (remembered acks, restored done records) wait in ``pending``
until the read position passes them; then they join the lists as done items.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from heapq import heappop, heappush
from typing import Any

from layer.engine.index import Entry
from layer.engine.model import Bookmark, Forget, LowWater, TopicPartition
from layer.engine.runs import Run
from layer.exceptions import QueueError

# Trim the consumed front of the lists once it is this long and more than half of them.
_TRIM = 4096


class PartitionState:
    __slots__ = (
        "tp",
        "offsets",
        "items",
        "head",
        "read_pos",
        "high_watermark",
        "low_water",
        "emitted",
        "pending",
        "pending_heap",
        "forgets",
        "dirty",
    )

    def __init__(self, tp: TopicPartition, low_water: int) -> None:
        self.tp = tp
        self.offsets: list[int] = []
        self.items: list[Entry | Bookmark | Run] = []
        self.head = 0  # items before head are forgotten
        self.read_pos = low_water
        self.high_watermark = low_water
        self.low_water = low_water
        self.emitted = low_water  # the low-water mark last emitted (or restored)
        self.pending: set[int] = set()  # done offsets >= read_pos
        self.pending_heap: list[int] = []
        self.forgets: list[Forget] = []  # passed by low_water, not emitted yet
        self.dirty = False

    def remember(self, offset: int) -> bool:
        """Record a done offset not read yet; False if it was already recorded."""
        if offset in self.pending:
            return False
        self.pending.add(offset)
        heappush(self.pending_heap, offset)
        return True

    def read_to(self, offset: int) -> None:
        """Advance the read position to ``offset``; pending done offsets below it join the lists."""
        heap = self.pending_heap
        while heap and heap[0] < offset:
            done = heappop(heap)
            self.pending.discard(done)
            self.offsets.append(done)
            self.items.append(Bookmark(self.tp.topic, self.tp.partition, done))
        if offset > self.read_pos:
            self.read_pos = offset

    def find(self, offset: int) -> int:
        """The index of the item holding ``offset`` in the lists, or -1."""
        offsets = self.offsets
        i = bisect_right(offsets, offset, self.head) - 1
        if i < self.head:
            return -1
        item = self.items[i]
        if type(item) is Run:
            return i if offset < item.start + item.count else -1
        return i if offsets[i] == offset else -1

    def entry(self, offset: int) -> Entry | None:
        """The live, materialized entry at ``offset``, or None."""
        i = self.find(offset)
        if i < 0:
            return None
        item = self.items[i]
        if type(item) is Entry:
            return item
        if type(item) is Run:
            return item.detail.get(offset)
        return None

    def plain_run(self, offset: int) -> Run | None:
        """The run in which ``offset`` is a plain (available, never singled out) message."""
        i = self.find(offset)
        if i < 0:
            return None
        item = self.items[i]
        return item if type(item) is Run and item.is_plain(offset) else None

    def take(self, run: Run, offset: int) -> tuple[Entry, Run | None]:
        """Materialize the plain message at ``offset`` of ``run``; a split's back half joins
        the lists and is returned (for the caller's indexes)."""
        entry, tail = run.take(offset)
        if tail is not None:
            i = self.find(offset)
            self.offsets.insert(i + 1, tail.start)
            self.items.insert(i + 1, tail)
        return entry, tail

    def done(self, bm: Bookmark) -> None:
        """The live entry of ``bm`` is done."""
        i = self.find(bm.offset)
        item = self.items[i]
        if type(item) is Run:
            del item.detail[bm.offset]
        else:
            self.items[i] = bm

    def append(self, offset: int, item: Any) -> None:
        self.offsets.append(offset)
        self.items.append(item)

    def advance(self) -> None:
        """Move the low-water mark past the done items at the front (buffering their Forgets)."""
        items, head = self.items, self.head
        n = len(items)
        low = None
        while head < n:
            item = items[head]
            kind = type(item)
            if kind is Entry:
                low = self.offsets[head]
                break
            if kind is Run:
                run: Run = item  # type: ignore[assignment]
                low = run.low()
                passed = run.start + run.count if low is None else low
                first = run.start + run.forgotten
                if first < passed:
                    tp = self.tp
                    self.forgets.append(
                        Forget(Bookmark(tp.topic, tp.partition, first), passed - first)
                    )
                    run.forgotten = passed - run.start
                if low is not None:
                    break
            else:
                self.forgets.append(Forget(item))  # type: ignore[arg-type]
            head += 1
        self.low_water = low if low is not None else self.read_pos
        if head >= _TRIM and 2 * head > n:
            del self.offsets[:head]
            del self.items[:head]
            head = 0
        self.head = head

    def inactive(self) -> int:
        """Offsets in [read position, high watermark) not already done."""
        span = self.high_watermark - self.read_pos
        if span <= 0:
            return 0
        return span - sum(1 for o in self.pending if o < self.high_watermark)

    def take_pending(self, offset: int, bookmark: Bookmark) -> None:
        """The pending done ``offset`` (now the lowest pending) is read: it joins the lists."""
        heappop(self.pending_heap)
        self.pending.discard(offset)
        self.offsets.append(offset)
        self.items.append(bookmark)
        self.read_pos = offset + 1


class Partitions:
    """The partitions one queue reads, by topic and number, and which of them changed since the
    last drain (their low-water marks and Forgets are due then)."""

    __slots__ = ("queue", "by_topic", "all", "dirty")

    def __init__(self, queue: str) -> None:
        self.queue = queue  # its name, for errors
        self.by_topic: dict[str, dict[int, PartitionState]] = {}
        self.all: list[PartitionState] = []  # in the order started
        self.dirty: list[PartitionState] = []

    def start(self, tp: TopicPartition, low_water: int) -> PartitionState:
        by_partition = self.by_topic.setdefault(tp.topic, {})
        if tp.partition in by_partition:
            raise QueueError(f"queue {self.queue!r}: partition {tp} is already started")
        part = PartitionState(tp, low_water)
        by_partition[tp.partition] = part
        self.all.append(part)
        return part

    def find(self, topic: str, number: int) -> PartitionState | None:
        by_partition = self.by_topic.get(topic)
        return None if by_partition is None else by_partition.get(number)

    def lookup(self, bm: Bookmark) -> PartitionState | None:
        """The partition of ``bm``, None when it is not started."""
        by_partition = self.by_topic.get(bm.topic)
        return None if by_partition is None else by_partition.get(bm.partition)

    def require(self, bm: Bookmark) -> PartitionState:
        """The partition of ``bm``; ``QueueError`` when it is not started."""
        part = self.lookup(bm)
        if part is None:
            raise QueueError(
                f"queue {self.queue!r}: partition {bm.topic}/{bm.partition} of {bm} is not started"
            )
        return part

    def get(self, partition: TopicPartition) -> PartitionState:
        """``partition``'s state; ``QueueError`` when it is not started."""
        part = self.find(partition[0], partition[1])
        if part is None:
            raise QueueError(f"queue {self.queue!r}: partition {partition} is not started")
        return part

    def touch(self, part: PartitionState) -> None:
        """``part`` changed: its low-water mark is looked at in the next drain."""
        if not part.dirty:
            part.dirty = True
            self.dirty.append(part)

    def drain(self, changes: list[Any]) -> None:
        """The LowWater and Forgets of the partitions that changed, added to ``changes``."""
        for part in self.dirty:
            part.dirty = False
            part.advance()
            if part.low_water > part.emitted:
                part.emitted = part.low_water
                changes.append(LowWater(part.tp, part.low_water))
                changes.extend(part.forgets)
                part.forgets.clear()
        self.dirty.clear()

    def entries(self, state: int) -> Iterator[Entry]:
        """The messages in ``state``, in offset order per partition (a run's plain messages
        as entries made for the answer)."""
        for part in self.all:
            items = part.items
            for i in range(part.head, len(items)):
                item = items[i]
                if type(item) is Entry:
                    if item.state == state:
                        yield item
                elif type(item) is Run:
                    yield from item.entries(state)
