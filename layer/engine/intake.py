"""Whole batches into a queue engine: a fetched batch of plain messages as one run (a
``QueueEngine`` mixin).

``add`` takes an ``Arrival`` per message; the coordinator's ingest knows more: when a queue's
configuration gives its messages nothing of their own (no group, conflation or barrier
expression, no delay), the consecutive offsets it admits from one partition are one run of plain
messages (``layer.engine.runs``), and ``add_run`` takes them as the offset they start at and
their timestamps. What needs a message of its own (an ack remembered before the read, a restored
delivery count, an expired or out-of-order timestamp, a pending barrier) goes through ``add``, so
both ways give the same state.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Sequence

from layer.engine.base import EngineBase
from layer.engine.model import Arrival, Bookmark, TopicPartition
from layer.engine.runs import Run
from layer.exceptions import QueueError

_INF = float("inf")


class Intake(EngineBase):
    def add_run(
        self,
        partition: TopicPartition,
        start: int,
        timestamps: Sequence[float],
        now: float,
        priority: int | None = None,
    ) -> None:
        """The plain messages at offsets ``start, start + 1, ...`` of ``partition`` (one per
        timestamp), all of ``priority``: the same as ``add`` of an ``Arrival`` for each."""
        n = len(timestamps)
        if not n:
            return
        part = self._partition(partition)
        if start < part.read_pos:
            raise QueueError(
                f"queue {self.name!r}: run {partition.topic}/{partition.partition}/{start} is "
                f"below the read position {part.read_pos} of its partition"
            )
        if part.pending_heap:
            part.read_to(start)
        times = array("d", timestamps)
        expiration = self._expiration
        end = start + n
        tp = part.tp
        if (
            (self._restored and self._restored_within(tp, start, end))
            or self._barriers
            or self._sort  # each message has a rank of its own (its timestamp)
            or (part.pending_heap and part.pending_heap[0] < end)
            or (expiration is not None and now - min(times) >= expiration)
            or times != array("d", sorted(times))
        ):
            self.add(
                [
                    Arrival(Bookmark(tp.topic, tp.partition, start + i), t, priority)
                    for i, t in enumerate(timestamps)
                ],
                now,
            )
            return
        part.read_pos = end
        rank = (_INF if priority is None else -priority) if self._priority else None
        run = Run(part.tp, start, self._seq, rank, times)
        self._seq += n
        part.append(start, run)
        self._close_run(run, times)

    def _restored_within(self, tp: TopicPartition, start: int, end: int) -> bool:
        """Some message of ``[start, end)`` of ``tp`` still has restored counts."""
        index = self._restored_index
        if index is None:
            index = self._restored_index = {}
            for bm in self._restored:
                index.setdefault((bm.topic, bm.partition), []).append(bm.offset)
            for found in index.values():
                found.sort()
        offsets = index.get((tp.topic, tp.partition))
        if not offsets:
            return False
        restored = self._restored
        i = bisect_left(offsets, start)
        while i < len(offsets) and offsets[i] < end:
            if Bookmark(tp.topic, tp.partition, offsets[i]) in restored:
                return True
            i += 1
        return False
