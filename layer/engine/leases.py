"""How a consumer ends its leases: acks, cancels, expires and extends, one bookmark at a time
(``ack``) or as offset runs of one partition (``ack_runs``). A part of ``QueueEngine`` over its
``Core``, whose transitions (``finish``, ``end_lease``) end each lease."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from layer.engine.core import Core
from layer.engine.fairness import Subscriber
from layer.engine.index import DONE, LEASED, Entry
from layer.engine.model import (
    AckError,
    AckOp,
    AckOutcome,
    Bookmark,
    Done,
    DoneReason,
    ReturnReason,
    TopicPartition,
)
from layer.engine.partition import PartitionState
from layer.engine.runs import Run

_UNKNOWN = AckError.UNKNOWN_BOOKMARK
_NOT_HOLDER = AckError.NOT_LEASE_HOLDER
_NOT_LEASED = AckError.NOT_LEASED


class Acks:
    def __init__(self, core: Core) -> None:
        self._core = core

    def ack(
        self,
        subscription: str | None,
        bookmarks: Iterable[Bookmark],
        op: AckOp,
        now: float,
        seconds: float = 0.0,
    ) -> list[AckOutcome]:
        """See ``QueueEngine.ack``."""
        core = self._core
        sub = None if subscription is None else core.subscriber(subscription)
        if seconds < 0:
            raise ValueError(f"queue {core.name!r}: {op} by {seconds} seconds (must be >= 0)")
        if not core.alo:
            if sub is None:
                return [AckOutcome(bm, self._amo_finish(bm, op, now)) for bm in bookmarks]
            return [AckOutcome(bm, self._release_slot(sub, bm)) for bm in bookmarks]
        return [AckOutcome(bm, self._ack_one(sub, bm, op, now, seconds)) for bm in bookmarks]

    def ack_runs(
        self,
        subscription: str | None,
        partition: TopicPartition,
        runs: Sequence[int],
        op: AckOp,
        now: float,
        seconds: float = 0.0,
    ) -> list[tuple[int, AckError]]:
        """See ``QueueEngine.ack_runs``."""
        core = self._core
        sub = None if subscription is None else core.subscriber(subscription)
        if seconds < 0:
            raise ValueError(f"queue {core.name!r}: {op} by {seconds} seconds (must be >= 0)")
        topic, number = partition
        failures: list[tuple[int, AckError]] = []
        if not core.alo:
            for i in range(0, len(runs), 2):
                for offset in range(runs[i], runs[i + 1] + 1):
                    bm = Bookmark(topic, number, offset)
                    if sub is None:
                        error = self._amo_finish(bm, op, now)
                    else:
                        error = self._release_slot(sub, bm)
                    if error is not None:
                        failures.append((offset, error))
            return failures
        part = core.partitions.find(topic, number)
        if part is None:
            for i in range(0, len(runs), 2):
                failures.extend((o, _UNKNOWN) for o in range(runs[i], runs[i + 1] + 1))
            return failures
        ack_span = self._ack_span
        # The picker hears of the freed slots once per subscription, when the batch is
        # through, not once per message: nothing picks while acks are taken.
        deferred: dict[int, Subscriber] = {}
        core.deferred = deferred
        try:
            for i in range(0, len(runs), 2):
                ack_span(sub, part, runs[i], runs[i + 1], op, now, seconds, failures)
        finally:
            core.deferred = None
            for freed in deferred.values():
                if freed.name in core.subs:
                    core.picker.update(freed)
        return failures

    def _take(self, part: PartitionState, run: Run, offset: int) -> Entry:
        """Single out the plain message at ``offset`` (to finish it at once: it is not put in
        the indexes); the back half of a split run is indexed."""
        entry, tail = part.take(run, offset)
        if tail is not None and tail.lo < tail.hi:
            self._core.order.push_returned(tail)
            self._core.ages.push(tail)
        return entry

    def _ack_one(
        self, sub: Subscriber | None, bm: Bookmark, op: AckOp, now: float, seconds: float
    ) -> AckError | None:
        part = self._core.partitions.lookup(bm)
        if part is None:
            return _UNKNOWN
        return self._ack_at(sub, part, bm.offset, op, now, seconds)

    def _ack_at(
        self,
        sub: Subscriber | None,
        part: PartitionState,
        offset: int,
        op: AckOp,
        now: float,
        seconds: float,
    ) -> AckError | None:
        """``op`` on the message at ``offset`` of ``part``; its error, None when accepted."""
        core = self._core
        entry = part.entry(offset)
        if entry is None and (run := part.plain_run(offset)) is not None:
            # available, never singled out: nobody holds it
            if op is not AckOp.ACK and op is not AckOp.EXPIRE:
                return _NOT_LEASED
            if core.strict and sub is not None:
                return _NOT_HOLDER
            entry = self._take(part, run, offset)
        if entry is None:
            if (
                op is AckOp.ACK
                and part.read_pos <= offset < part.high_watermark
                and part.remember(offset)
            ):
                bm = Bookmark(part.tp.topic, part.tp.partition, offset)
                deliveries, cancels = core.restored.pop(bm, (0, 0))
                core.emit_done(bm, DoneReason.ACKED, deliveries, cancels, now)
                return None
            return _UNKNOWN
        holder = entry.holder
        if op is AckOp.ACK or op is AckOp.EXPIRE:
            if core.strict and holder is not sub and (sub is not None or holder is not None):
                return _NOT_HOLDER
            reason = DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
            core.finish(entry, reason, now, part)
            return None
        if holder is None:
            return _NOT_LEASED
        if core.strict and holder is not sub:
            return _NOT_HOLDER
        if op is AckOp.CANCEL:
            core.end_lease(entry, ReturnReason.CANCEL, now, seconds)
        else:
            deadline = now + seconds
            entry.deadline = deadline
            core.leases.push(entry, deadline)
        return None

    def _ack_span(
        self,
        sub: Subscriber | None,
        part: PartitionState,
        first: int,
        last: int,
        op: AckOp,
        now: float,
        seconds: float,
        failures: list[tuple[int, AckError]],
    ) -> None:
        """``_ack_at`` of each offset of ``[first, last]`` in order, the refused ones added to
        ``failures``. An ack or expire of the subscription's own leases in a run (what a
        consumer sends back: the messages it was handed, in order) is taken a span at a time:
        one lookup for the part of the span a run holds, each lease ended and its Done made in
        one loop, the counters and the picker told once. What is not that (another holder, a
        group or conflation key, no entry) goes through ``_ack_at``."""
        ack_at = self._ack_at
        if sub is None or (op is not AckOp.ACK and op is not AckOp.EXPIRE):
            for offset in range(first, last + 1):
                error = ack_at(sub, part, offset, op, now, seconds)
                if error is not None:
                    failures.append((offset, error))
            return
        reason = DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
        leases = sub.leases
        changes = self._core.changes
        items = part.items
        done = 0
        offset = first
        # consecutive offsets done alike are one Done of their run (``Done.count``): ``span``
        # grows while each message is the offset after it, with its counts
        span: Done | None = None
        span_next = span_n = span_cancels = -1
        try:
            while offset <= last:
                i = part.find(offset)
                run = items[i] if i >= 0 else None
                if type(run) is Run:
                    detail = run.detail
                    end = min(last + 1, run.start + run.count)
                    for o in range(offset, end):
                        entry = detail.get(o)
                        if (
                            entry is None
                            or entry.holder is not sub
                            or entry.state != LEASED
                            or entry.group is not None
                            or entry.ckey is not None
                        ):
                            offset = o  # taken one at a time below
                            break
                        del leases[entry]
                        del detail[o]
                        entry.holder = None
                        entry.deadline = None
                        entry.state = DONE
                        n = entry.deliveries
                        cancels = entry.cancels
                        if o == span_next and n == span_n and cancels == span_cancels:
                            span.count += 1  # type: ignore[union-attr]  # still being built
                            span_next += 1
                        else:
                            span = Done(entry.bookmark, reason, n, cancels, now)
                            changes.append(span)
                            span_next, span_n, span_cancels = o + 1, n, cancels
                        done += 1
                    else:
                        offset = end
                        continue
                if done:  # the counters right before anything reads them
                    self._spanned(sub, part, reason, done)
                    done = 0
                span_next = -1  # whatever ``_ack_at`` emits comes between
                error = ack_at(sub, part, offset, op, now, seconds)
                if error is not None:
                    failures.append((offset, error))
                offset += 1
        finally:
            if done:
                self._spanned(sub, part, reason, done)

    def _spanned(self, sub: Subscriber, part: PartitionState, reason: DoneReason, n: int) -> None:
        """What ``Core.release`` and ``Core.emit_done`` do per message, for ``n`` of
        ``_ack_span``'s."""
        core = self._core
        sub.outstanding -= n
        core.leased -= n
        core.done_total += n
        if reason.dead_letter:
            core.dead_total += n
        if sub.name in core.subs:
            core.repick(sub)
        core.partitions.touch(part)

    def _release_slot(self, sub: Subscriber, bm: Bookmark) -> AckError | None:
        """At-most-once: an ack only gives the subscription its backlog slot back."""
        if bm not in sub.handed:
            return _UNKNOWN
        group = sub.handed.pop(bm)
        sub.outstanding -= 1
        self._core.picker.update(sub)
        self._core.router.returned(sub, group)
        return None

    def _amo_finish(self, bm: Bookmark, op: AckOp, now: float) -> AckError | None:
        """At-most-once, on behalf of no subscription (ack by filter): finish a queued message."""
        part = self._core.partitions.lookup(bm)
        entry = None if part is None else part.entry(bm.offset)
        if entry is None and part is not None and op in (AckOp.ACK, AckOp.EXPIRE):
            run = part.plain_run(bm.offset)
            if run is not None:
                entry = self._take(part, run, bm.offset)
        if entry is None or op not in (AckOp.ACK, AckOp.EXPIRE):
            return _UNKNOWN
        reason = DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
        self._core.finish(entry, reason, now)
        return None
