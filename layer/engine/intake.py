"""Arrivals into a queue engine: messages one at a time (``add``), or a fetched batch of plain
messages as one run (``add_run``). A part of ``QueueEngine`` over its ``Core``.

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
from collections.abc import Iterable, Sequence
from typing import Any

from layer.engine.core import Core
from layer.engine.index import Entry
from layer.engine.model import Arrival, Bookmark, DoneReason, TopicPartition
from layer.engine.runs import Run
from layer.exceptions import QueueError

_INF = float("inf")


class Intake:
    def __init__(self, core: Core) -> None:
        self._core = core

    def add(self, arrivals: Iterable[Arrival], now: float) -> None:
        """Arrivals in offset order per partition. The plain ones (see ``layer.engine.runs``)
        that come one after another, from consecutive offsets, join one run."""
        core = self._core
        expiration = core.expiration
        priority_queue = core.priority
        sort_queue = core.sort
        ttl_queue = core.ttl
        conflating = core.holding.conflate
        barriers = core.holding.barriers
        require, touch = core.partitions.require, core.partitions.touch
        run: Run | None = None  # the run being built
        times: array[float] = array("d")
        try:
            for arrival in arrivals:
                bm = arrival.bookmark
                part = require(bm)
                offset = bm.offset
                if offset < part.read_pos:
                    raise QueueError(
                        f"queue {core.name!r}: arrival {bm} is below the read position "
                        f"{part.read_pos} of its partition"
                    )
                if part.pending_heap:
                    part.read_to(offset)
                    if offset in part.pending:
                        # Acked before it was read (or restored done): it only counts for the mark.
                        part.take_pending(offset, bm)
                        touch(part)
                        if core.restored:
                            core.restored.pop(bm, None)
                        continue
                part.read_pos = offset + 1
                deliveries, cancels = arrival.deliveries, arrival.cancels
                if core.restored:
                    deliveries, cancels = core.restored.pop(bm, (deliveries, cancels))
                reason = core.limit_reason(deliveries, cancels) if deliveries or cancels else None
                timestamp = arrival.timestamp
                if reason is None and arrival.unparseable:
                    reason = DoneReason.UNPARSEABLE
                if reason is None and expiration is not None and now - timestamp >= expiration:
                    reason = DoneReason.EXPIRATION
                expires = arrival.expires_at if ttl_queue else None
                if reason is None and expires is not None and now >= expires:
                    reason = DoneReason.EXPIRATION
                if reason is not None:
                    if run is not None:
                        core.close_run(run, times)
                        run = None
                    part.append(offset, bm)
                    touch(part)
                    core.emit_done(bm, reason, deliveries, cancels, now)
                    continue
                rank: Any
                if priority_queue:
                    priority = arrival.priority
                    rank = _INF if priority is None else -priority
                else:
                    rank = None
                not_before = arrival.not_before
                if (
                    not sort_queue  # each message of a sorted queue has a key of its own
                    and not (deliveries or cancels)
                    and arrival.group is None
                    and (arrival.conflate_key is None or not conflating)
                    and not arrival.barrier
                    and not barriers
                    and (not_before is None or not_before <= now)
                    and expires is None
                ):
                    # plain: one more message of the run being built, or the first of a new one
                    if (
                        run is not None
                        and run.tp is part.tp
                        and offset == run.start + len(times)
                        and rank == run.rank
                        and timestamp >= times[-1]
                    ):
                        times.append(timestamp)
                        core.seq += 1
                        continue
                    if run is not None:
                        core.close_run(run, times)
                    times = array("d", (timestamp,))
                    run = Run(part.tp, offset, core.seq, rank, times)
                    core.seq += 1
                    part.append(offset, run)
                    continue
                if run is not None:
                    core.close_run(run, times)
                    run = None
                seq = core.seq
                core.seq = seq + 1
                key: object
                if sort_queue:  # sort_rank + (seq,), as one flat tuple: it is kept per message
                    value = arrival.sort_key
                    key = (1, "", timestamp, seq) if value is None else (0, value, timestamp, seq)
                else:
                    key = seq if rank is None else (rank, seq)
                entry = Entry(bm, key, timestamp, deliveries, cancels)
                part.append(offset, entry)
                if not part.dirty:
                    touch(part)
                if arrival.group is not None:
                    entry.group = arrival.group
                if expires is not None:
                    entry.expires = expires
                if arrival.conflate_key is not None and conflating:
                    core.conflate(entry, arrival.conflate_key, now)
                if arrival.barrier or barriers:
                    core.hold(entry, arrival.barrier)
                elif not_before is not None and not_before > now:
                    core.holding.delay(entry, not_before)
                else:
                    core.arrive(entry)
        finally:
            if run is not None:  # also when an arrival is refused: what came before it stays
                core.close_run(run, times)

    def add_run(
        self,
        partition: TopicPartition,
        start: int,
        timestamps: Sequence[float],
        now: float,
        priority: int | None = None,
    ) -> None:
        """See ``QueueEngine.add_run``: one run, unless one of the messages needs an entry of
        its own (then ``add`` of each)."""
        n = len(timestamps)
        if not n:
            return
        core = self._core
        part = core.partitions.get(partition)
        if start < part.read_pos:
            raise QueueError(
                f"queue {core.name!r}: run {partition.topic}/{partition.partition}/{start} is "
                f"below the read position {part.read_pos} of its partition"
            )
        if part.pending_heap:
            part.read_to(start)
        times = array("d", timestamps)
        expiration = core.expiration
        end = start + n
        tp = part.tp
        if (
            (core.restored and self._restored_within(tp, start, end))
            or core.holding.barriers
            or core.sort  # each message has a rank of its own (its timestamp)
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
        rank = (_INF if priority is None else -priority) if core.priority else None
        run = Run(part.tp, start, core.seq, rank, times)
        core.seq += n
        part.append(start, run)
        core.close_run(run, times)

    def _restored_within(self, tp: TopicPartition, start: int, end: int) -> bool:
        """Some message of ``[start, end)`` of ``tp`` still has restored counts."""
        core = self._core
        index = core.restored_index
        if index is None:
            index = core.restored_index = {}
            for bm in core.restored:
                index.setdefault((bm.topic, bm.partition), []).append(bm.offset)
            for found in index.values():
                found.sort()
        offsets = index.get((tp.topic, tp.partition))
        if not offsets:
            return False
        restored = core.restored
        i = bisect_left(offsets, start)
        while i < len(offsets) and offsets[i] < end:
            if Bookmark(tp.topic, tp.partition, offsets[i]) in restored:
                return True
            i += 1
        return False
