"""Per-partition bookkeeping: read position, low-water mark, and the messages in between.

The messages read from a partition are kept in offset order in two parallel lists: ``offsets``
(for a C-speed bisect) and ``items``, where a live message is its ``Entry`` and a done one is just
its ``Bookmark`` (the entry is released; the bookmark is kept until the low-water mark passes it and
a Forget is due). Arrivals come in increasing offset order, so both lists only ever grow at the
end and shrink at the front: the low-water mark is the first live item, found in amortized O(1).

Done records for offsets not read yet (remembered acks, restored done records) wait in ``pending``
until the read position passes them; then they join the lists as done items.
"""

from __future__ import annotations

from bisect import bisect_left
from heapq import heappop, heappush

from layer.engine.index import Entry
from layer.engine.model import Bookmark, TopicPartition

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
        self.items: list[Entry | Bookmark] = []
        self.head = 0  # items before head are forgotten
        self.read_pos = low_water
        self.high_watermark = low_water
        self.low_water = low_water
        self.emitted = low_water  # the low-water mark last emitted (or restored)
        self.pending: set[int] = set()  # done offsets >= read_pos
        self.pending_heap: list[int] = []
        self.forgets: list[Bookmark] = []  # passed by low_water, Forget not emitted yet
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
        """The index of ``offset`` in the lists, or -1."""
        offsets = self.offsets
        i = bisect_left(offsets, offset, self.head)
        if i < len(offsets) and offsets[i] == offset:
            return i
        return -1

    def entry(self, offset: int) -> Entry | None:
        """The live entry at ``offset``, or None."""
        i = self.find(offset)
        if i < 0:
            return None
        item = self.items[i]
        return item if type(item) is Entry else None

    def advance(self) -> None:
        """Move the low-water mark past the done items at the front (buffering their Forgets)."""
        items, head = self.items, self.head
        n = len(items)
        while head < n:
            item = items[head]
            if type(item) is Entry:
                break
            self.forgets.append(item)  # type: ignore[arg-type]
            head += 1
        self.low_water = self.offsets[head] if head < n else self.read_pos
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
