"""Runs: the queued messages nothing singles out, kept per run of offsets instead of per message.

A ``Run`` covers the consecutive offsets ``[start, start + count)`` of one partition that arrived
together as plain messages: never delivered, no group, no conflation key, no barrier, no delay,
one priority, timestamps that do not go down. Their delivery keys are consecutive too (``seq0 +
i``, or ``(rank, seq0 + i)`` on a priority queue), so a run costs one object plus 8 bytes (its
timestamp) per message.

Inside a run, the messages ``[lo, hi)`` (indexes from ``start``) are still plain: available, in
the queue, with no object of their own. A message leaves the plain region only at its ends (the
delivery order and the expiration order both take a run's front; an ack of a message nobody
holds takes it wherever it is, splitting the run in two when it sits inside): it then becomes an
``Entry`` (materialized), kept in ``detail`` while it lives. An offset of the run that is neither
plain nor in ``detail`` is done. So a run's memory follows what differs, and a run whose messages
are all done costs nothing per message while it waits for the low-water mark to pass it (its
Forgets are made then, for the offsets the mark has passed).
"""

from __future__ import annotations

from array import array
from typing import Any

from layer.engine.index import AVAILABLE, Entry
from layer.engine.model import Bookmark, TopicPartition


class Run:
    __slots__ = ("tp", "start", "count", "lo", "hi", "seq0", "rank", "times", "detail", "forgotten")

    def __init__(
        self, tp: TopicPartition, start: int, seq0: int, rank: float | None, times: array[float]
    ) -> None:
        self.tp = tp
        self.start = start
        self.count = len(times)
        self.lo = 0
        self.hi = len(times)
        self.seq0 = seq0
        self.rank = rank  # the priority rank (priority queues), None in arrival order
        self.times = times
        self.detail: dict[int, Entry] = {}  # offset -> the materialized messages that live
        self.forgotten = 0  # the low-water mark passed [start, start + forgotten): Forgets made

    def __repr__(self) -> str:
        return (
            f"Run({self.tp.topic}/{self.tp.partition}/{self.start}+{self.count}, "
            f"plain=[{self.lo}, {self.hi}), materialized={len(self.detail)})"
        )

    def __lt__(self, other: object) -> bool:
        # heaps hold runs and entries side by side: equal keys must not raise
        return False

    @property
    def end(self) -> int:
        return self.start + self.count

    def key_at(self, i: int) -> Any:
        rank = self.rank
        return self.seq0 + i if rank is None else (rank, self.seq0 + i)

    def front_key(self) -> Any:
        return self.key_at(self.lo)

    def front_time(self) -> float:
        return self.times[self.lo]

    def plain(self) -> int:
        return self.hi - self.lo

    def is_plain(self, offset: int) -> bool:
        return self.lo <= offset - self.start < self.hi

    def live(self) -> bool:
        return self.lo < self.hi or bool(self.detail)

    def low(self) -> int | None:
        """The lowest offset of the run still in the queue (None: all done)."""
        low = self.start + self.lo if self.lo < self.hi else None
        if self.detail:
            least = min(self.detail)
            if low is None or least < low:
                low = least
        return low

    def make(self, i: int) -> Entry:
        """An entry for plain message ``i`` (not kept: see ``take_front``/``take``)."""
        tp = self.tp
        return Entry(
            Bookmark(tp.topic, tp.partition, self.start + i), self.key_at(i), self.times[i], 0, 0
        )

    def take_front(self) -> Entry:
        """Materialize the first plain message (the run must have one)."""
        i = self.lo
        self.lo = i + 1
        entry = self.make(i)
        self.detail[self.start + i] = entry
        return entry

    def take_many(self, n: int) -> list[Entry]:
        """Materialize the first ``n`` plain messages (the run must have them): ``take_front``
        ``n`` times, without a call per message."""
        i = self.lo
        end = i + n
        self.lo = end
        tp = self.tp
        topic, partition = tp.topic, tp.partition
        start, seq0, rank, times = self.start, self.seq0, self.rank, self.times
        # the bookmarks made by tuple's own constructor: a NamedTuple's ``__new__`` is a
        # Python function, a call per message
        new = tuple.__new__
        if rank is None:
            entries = [
                Entry(new(Bookmark, (topic, partition, start + j)), seq0 + j, times[j], 0, 0)
                for j in range(i, end)
            ]
        else:
            entries = [
                Entry(
                    new(Bookmark, (topic, partition, start + j)), (rank, seq0 + j), times[j], 0, 0
                )
                for j in range(i, end)
            ]
        self.detail.update(zip(range(start + i, start + end), entries, strict=True))
        return entries

    def take(self, offset: int) -> tuple[Entry, Run | None]:
        """Materialize the plain message at ``offset``. One inside the plain region splits the
        run: the part after it is returned as a new run (the caller indexes it)."""
        i = offset - self.start
        if i == self.lo:
            return self.take_front(), None
        entry = self.make(i)
        if i == self.hi - 1:
            self.hi = i
            self.detail[offset] = entry
            return entry, None
        tail = Run(self.tp, offset + 1, self.seq0 + i + 1, self.rank, self.times[i + 1 :])
        tail.hi = self.hi - (i + 1)
        moved = [o for o in self.detail if o > offset]
        for o in moved:
            tail.detail[o] = self.detail.pop(o)
        del self.times[i + 1 :]
        self.count = i + 1
        self.hi = i
        self.detail[offset] = entry
        return entry, tail

    def entries(self, state: int | None = None) -> list[Entry]:
        """The run's live messages in offset order, plain ones as fresh entries (not kept);
        ``state``: only those in that state (plain ones are available)."""
        out = [e for e in self.detail.values() if state is None or e.state == state]
        if state is None or state == AVAILABLE:
            out.extend(self.make(i) for i in range(self.lo, self.hi))
        out.sort(key=lambda e: e.bookmark.offset)
        return out
