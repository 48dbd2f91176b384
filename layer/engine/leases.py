"""How leases end: acks, cancels, expires, extends and timeouts (a ``QueueEngine`` mixin)."""

from __future__ import annotations

from layer.engine.base import EngineBase
from layer.engine.fairness import Subscriber
from layer.engine.index import DONE, LEASED, Entry
from layer.engine.model import (
    AckError,
    AckOp,
    Bookmark,
    Done,
    DoneReason,
    Returned,
    ReturnReason,
)
from layer.engine.partition import PartitionState
from layer.engine.runs import Run

_UNKNOWN = AckError.UNKNOWN_BOOKMARK
_NOT_HOLDER = AckError.NOT_LEASE_HOLDER
_NOT_LEASED = AckError.NOT_LEASED


class Leases(EngineBase):
    def _release(self, entry: Entry) -> None:
        """End ``entry``'s lease in the bookkeeping (no effect emitted)."""
        sub: Subscriber = entry.holder
        del sub.leases[entry]
        sub.outstanding -= 1
        if sub.name in self._subs:
            self._repick(sub)
            self._router.returned(sub, entry.group)
        self._leased -= 1
        entry.holder = None
        entry.deadline = None

    def _end_lease(
        self, entry: Entry, reason: ReturnReason, now: float, delay: float = 0.0
    ) -> None:
        """A lease ends without ack: the message is returned, or done when a limit is reached."""
        if reason is ReturnReason.CANCEL:
            entry.cancels += 1
        done = self._limit_reason(entry.deliveries, entry.cancels)
        expiration = self._expiration
        if done is None and expiration is not None and now - entry.timestamp >= expiration:
            done = DoneReason.EXPIRATION
        if done is None and entry.expires is not None and now >= entry.expires:
            done = DoneReason.EXPIRATION  # its own TTL passed while it was leased
        if done is None and entry.ckey is not None and self._latest.get(entry.ckey) is not entry:
            done = DoneReason.CONFLATED  # a newer message with its key arrived meanwhile
        if done is not None:
            self._finish(entry, done, now)
            return
        self._release(entry)
        if reason is ReturnReason.TIMEOUT:
            delay = self.settings.backoff(entry.deliveries)
        not_before = now + delay if delay > 0 else None
        if not_before is None:
            self._make_available(entry)
        else:
            self._delay(entry, not_before)
        self._changes.append(
            Returned(entry.bookmark, reason, entry.deliveries, entry.cancels, not_before)
        )

    def _take(self, part: PartitionState, run: Run, offset: int) -> Entry:
        """Single out the plain message at ``offset`` (to finish it at once: it is not put in
        the indexes); the back half of a split run is indexed."""
        entry, tail = part.take(run, offset)
        if tail is not None and tail.lo < tail.hi:
            self._order.push_returned(tail)
            self._ages.push(tail)
        return entry

    def _ack_one(
        self, sub: Subscriber | None, bm: Bookmark, op: AckOp, now: float, seconds: float
    ) -> AckError | None:
        part = self._lookup(bm)
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
        entry = part.entry(offset)
        if entry is None and (run := part.plain_run(offset)) is not None:
            # available, never singled out: nobody holds it
            if op is not AckOp.ACK and op is not AckOp.EXPIRE:
                return _NOT_LEASED
            if self._strict and sub is not None:
                return _NOT_HOLDER
            entry = self._take(part, run, offset)
        if entry is None:
            if (
                op is AckOp.ACK
                and part.read_pos <= offset < part.high_watermark
                and part.remember(offset)
            ):
                bm = Bookmark(part.tp.topic, part.tp.partition, offset)
                deliveries, cancels = self._restored.pop(bm, (0, 0))
                self._emit_done(bm, DoneReason.ACKED, deliveries, cancels, now)
                return None
            return _UNKNOWN
        holder = entry.holder
        if op is AckOp.ACK or op is AckOp.EXPIRE:
            if self._strict and holder is not sub and (sub is not None or holder is not None):
                return _NOT_HOLDER
            reason = DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
            self._finish(entry, reason, now, part)
            return None
        if holder is None:
            return _NOT_LEASED
        if self._strict and holder is not sub:
            return _NOT_HOLDER
        if op is AckOp.CANCEL:
            self._end_lease(entry, ReturnReason.CANCEL, now, seconds)
        else:
            deadline = now + seconds
            entry.deadline = deadline
            self._leases.push(entry, deadline)
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
        changes = self._changes
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
        """What ``_release`` and ``_emit_done`` do per message, for ``n`` of ``_ack_span``'s."""
        sub.outstanding -= n
        self._leased -= n
        self._done_total += n
        if reason.dead_letter:
            self._dead_total += n
        if sub.name in self._subs:
            self._repick(sub)
        self._touch(part)

    def _repick(self, sub: Subscriber) -> None:
        """The picker learns ``sub``'s room changed: now, or at the end of a deferred pass."""
        deferred = self._deferred
        if deferred is None:
            self._picker.update(sub)
        else:
            deferred[sub.index] = sub

    def _release_slot(self, sub: Subscriber, bm: Bookmark) -> AckError | None:
        """At-most-once: an ack only gives the subscription its backlog slot back."""
        if bm not in sub.handed:
            return _UNKNOWN
        group = sub.handed.pop(bm)
        sub.outstanding -= 1
        self._picker.update(sub)
        self._router.returned(sub, group)
        return None

    def _amo_finish(self, bm: Bookmark, op: AckOp, now: float) -> AckError | None:
        """At-most-once, on behalf of no subscription (ack by filter): finish a queued message."""
        part = self._lookup(bm)
        entry = None if part is None else part.entry(bm.offset)
        if entry is None and part is not None and op in (AckOp.ACK, AckOp.EXPIRE):
            run = part.plain_run(bm.offset)
            if run is not None:
                entry = self._take(part, run, bm.offset)
        if entry is None or op not in (AckOp.ACK, AckOp.EXPIRE):
            return _UNKNOWN
        reason = DoneReason.ACKED if op is AckOp.ACK else DoneReason.CONSUMER_EXPIRE
        self._finish(entry, reason, now)
        return None
