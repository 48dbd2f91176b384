"""Subscriptions: subscribe, replace, acks and close, for one queue or a regex of queue names.

A subscription to a regex (a queue name starting with ``^``, as for underlying topics) is one
subscription in every configured queue whose name matches. Its backlog is shared: the minimum of
the matched queues' ``max_per_subscription_backlog`` and its own ``max_backlog``, counted over
all of them. Before each queue dispatches, the round gives the subscription, in that queue, the
room left over by what it holds everywhere (``apply_backlogs``), so the total never exceeds the
backlog.

A subscription whose stream holds its backlog's worth of messages not yet written (its client
stopped reading: HTTP/2 flow control holds the writes) is *stalled*: it takes nothing new until
the stream drains. What it holds comes back when the leases run out, to subscriptions that read.

A bookmark names a message of a topic, and a topic may feed several queues: an ack goes to the
first of the subscription's queues that accepts it. Acks come as runs of offsets per partition
(as the wire carries them) and go to the engines so, without an object per message.
"""

from __future__ import annotations

import itertools
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from layer.api.errors import ErrorCode
from layer.api.service import AckFailure, DeliverySink, OffsetRuns
from layer.coordinator.runtime import QueueRuntime, SubscriptionState, lookup
from layer.engine.model import AckError, AckOp, Bookmark, Semantics, TopicPartition
from layer.exceptions import InvalidRequest, QLayerError, UnknownQueue
from layer.expr import compile_expression
from layer.state.base import Store

log = logging.getLogger(__name__)

Matcher = Callable[[Bookmark], bool] | None
# The longest extend or cancel delay a frame may ask (a year): beyond it, or not finite, the
# deadline would not fit the changelog's milliseconds.
MAX_SECONDS = 365 * 86400.0


@dataclass(frozen=True, slots=True)
class SubscriptionHandle:
    """What the API holds for one open subscription (a ``layer.api.service.Subscription``)."""

    _subscriptions: Subscriptions
    _state: SubscriptionState
    lease_period_s: float

    @property
    def id(self) -> str:
        return self._state.id

    @property
    def backlog(self) -> int:
        return self._state.backlog

    async def ack(
        self, op: AckOp, offsets: Sequence[OffsetRuns], seconds: float = 0.0
    ) -> list[AckFailure]:
        return await self._subscriptions.ack(self._state, op, offsets, seconds)

    async def replace(self, queue: str, max_backlog: int, filter: str | None) -> int:
        return await self._subscriptions.replace(self._state, queue, max_backlog, filter)

    async def close(self) -> None:
        self._subscriptions.close(self._state)


class Subscriptions:
    """The open subscriptions of the coordinator's queues, and what they may do.

    Given the coordinator's runtimes by name (the same dict: a reload changes them), its store
    (content filters read payloads), its clock, ``wake`` (there is work for a round),
    ``next_commit`` (done once the next round's changes are durable: an at-least-once ack is
    answered then), ``check_alive`` (raises while the coordinator stops or failed) and an
    ``instance`` name that makes subscription ids unique across restarts."""

    def __init__(
        self,
        runtimes: Mapping[str, QueueRuntime],
        store: Store,
        *,
        clock: Callable[[], float],
        wake: Callable[[], None],
        next_commit: Callable[[], Awaitable[None]],
        check_alive: Callable[[], None],
        instance: str,
        check_served: Callable[[str], None] | None = None,
    ) -> None:
        self._runtimes = runtimes
        self._store = store
        self._clock = clock
        self._wake = wake
        self._next_commit = next_commit
        self._check_alive = check_alive
        self._instance = instance
        # raises for a named queue another member of the cluster serves (``NotOwner`` naming
        # it): a replace to it is refused with where it is served, not as unknown
        self._check_served = check_served
        self._ids = itertools.count(1)

    def _resolve(self, queue: str) -> list[QueueRuntime]:
        """The queues a subscription to ``queue`` (a name, or a regex starting with ^) joins."""
        if not queue.startswith("^"):
            if self._check_served is not None:
                self._check_served(queue)
            return [lookup(self._runtimes, queue)]
        try:
            pattern = re.compile(queue)
        except re.error as exc:
            raise InvalidRequest(f"queue pattern {queue!r} is not a regex: {exc}") from None
        found = [rt for name, rt in sorted(self._runtimes.items()) if pattern.search(name)]
        if not found:
            raise UnknownQueue(
                f"queue pattern {queue!r} matches no configured queue"
                f" (configured: {', '.join(sorted(self._runtimes))})"
            )
        return found

    def matcher(self, rt: QueueRuntime, filter: str | None) -> Matcher:
        """A content filter as the engine's predicate (None: no filter); ``InvalidRequest`` for
        a queue whose messages are not documents."""
        if filter is None:
            return None
        expression = compile_expression(filter)  # ExpressionError: the caller's mistake
        if rt.exprs.reader is None and expression.uses_document:
            raise InvalidRequest(
                f"queue {rt.name!r} holds {rt.config.message_type} messages: "
                "filters on fields need json or avro (with avro_schema); KEY(), HEADER('name'),"
                " TIMESTAMP(), TOPIC() and PARTITION() read the Kafka record"
            )
        return rt.matcher(self._store, expression)

    def _prepare(
        self, queue: str, max_backlog: int, filter: str | None
    ) -> tuple[list[QueueRuntime], list[Matcher], int]:
        """Everything that can fail, checked before anything changes."""
        if max_backlog < 0:
            raise InvalidRequest(
                f"max_backlog must be 0 (barrier messages only) or more, got {max_backlog}"
            )
        rts = self._resolve(queue)
        matchers = [self.matcher(rt, filter) for rt in rts]
        backlog = min(max_backlog, *(rt.config.max_per_subscription_backlog for rt in rts))
        return rts, matchers, backlog

    async def subscribe(
        self,
        queue: str,
        max_backlog: int,
        sink: DeliverySink,
        client: str = "",
        filter: str | None = None,
    ) -> SubscriptionHandle:
        self._check_alive()
        rts, matchers, backlog = self._prepare(queue, max_backlog, filter)
        sub_id = f"{self._instance}-{next(self._ids)}"
        state = SubscriptionState(sub_id, queue, sink, backlog, client, filter=filter)
        now = self._clock()
        for rt, match in zip(rts, matchers, strict=True):
            rt.engine.subscribe(sub_id, backlog, now, match)
            rt.subscriptions[sub_id] = state
        state.queues = [rt.name for rt in rts]
        log.info(
            "queue=%s subscription=%s client=%s backlog=%d filter=%r queues=%d",
            queue,
            sub_id,
            client,
            backlog,
            filter,
            len(rts),
        )
        self._wake()
        lease_period = min(rt.config.lease_period for rt in rts)
        return SubscriptionHandle(self, state, lease_period)

    def apply_backlogs(self, rt: QueueRuntime) -> None:
        """Before ``rt`` dispatches: a stalled subscription may take nothing; a multi-queue one
        may take, here, what its shared backlog has left after what it holds in all its
        queues."""
        for sub in rt.subscriptions.values():
            stalled = 0 < sub.backlog <= sub.sink.unsent
            if stalled or sub.stalled or sub.stall_logged:
                _note_stall(rt.name, sub, stalled)
            if len(sub.queues) < 2:
                if stalled != sub.stalled:
                    rt.engine.set_backlog(sub.id, 0 if stalled else sub.backlog)
                    sub.stalled = stalled
                continue
            held = {name: self._runtimes[name].engine.held_by(sub.id) for name in sub.queues}
            sub.stalled = stalled
            room = 0 if stalled else max(0, sub.backlog - sum(held.values()))
            rt.engine.set_backlog(sub.id, held[rt.name] + room)

    async def replace(
        self, sub: SubscriptionState, queue: str, max_backlog: int, filter: str | None
    ) -> int:
        """Atomically: new queue(s), filter and backlog; leases stay with the subscription (in
        a queue it leaves too, paused there until they are acked or time out)."""
        self._check_alive()
        if sub.closed:
            raise InvalidRequest("the subscription is closed")
        rts, matchers, backlog = self._prepare(queue, max_backlog, filter)
        now = self._clock()
        names = [rt.name for rt in rts]
        for name in sub.queues:
            if name in names:
                continue
            old = self._runtimes[name]
            old.subscriptions.pop(sub.id, None)
            if old.engine.held_by(sub.id):
                old.engine.set_backlog(sub.id, 0)
                sub.draining.add(name)
            else:
                old.engine.disconnect(sub.id, now)
        for rt, match in zip(rts, matchers, strict=True):
            sub.draining.discard(rt.name)
            rt.subscriptions[sub.id] = sub
            rt.engine.subscribe(sub.id, backlog, now, match)
        sub.queue, sub.queues, sub.backlog, sub.filter = queue, names, backlog, filter
        sub.stalled = False  # the subscribe above set the backlog: the next round checks again
        log.info(
            "queue=%s subscription=%s replaced: backlog=%d filter=%r queues=%d",
            queue,
            sub.id,
            backlog,
            filter,
            len(names),
        )
        self._wake()
        return backlog

    async def ack(
        self, sub: SubscriptionState, op: AckOp, offsets: Sequence[OffsetRuns], seconds: float
    ) -> list[AckFailure]:
        self._check_alive()
        received = time.time()
        if sub.closed:
            return [
                AckFailure(t, ErrorCode.SUBSCRIPTION_CLOSED, "the subscription is closed")
                for runs in offsets
                for t in runs.bookmarks()
            ]
        if (op is AckOp.EXTEND and not seconds > 0) or not 0 <= seconds <= MAX_SECONDS:
            return [
                AckFailure(
                    t,
                    ErrorCode.INVALID_REQUEST,
                    f"{op} needs seconds in [0, {MAX_SECONDS:g}] (> 0 to extend), got {seconds}",
                )
                for runs in offsets
                for t in runs.bookmarks()
            ]
        now = self._clock()
        failures: list[AckFailure] = []
        accepted = 0
        for runs in offsets:
            refused = self._ack_in_queues(sub, runs, op, now, seconds)
            accepted += runs.count() - len(refused)
            prefix = f"{runs.topic}/{runs.partition}/"
            for offset, error in refused:
                text = prefix + str(offset)
                failures.append(AckFailure(text, ErrorCode(error), _ack_message(error, text)))
        self._wake()
        alo = any(
            self._runtimes[name].config.semantics == Semantics.AT_LEAST_ONCE for name in sub.queues
        )
        if accepted and op is not AckOp.EXTEND and alo:
            await self._next_commit()  # answered once the done records are committed
            stages = self._runtimes[sub.queue].stages if sub.queue in self._runtimes else None
            if stages is not None:
                stages.add("ack", time.time() - received, accepted)
        return failures

    def _ack_in_queues(
        self, sub: SubscriptionState, runs: OffsetRuns, op: AckOp, now: float, seconds: float
    ) -> list[tuple[int, AckError]]:
        """Each offset in the first queue that accepts it (the queues it holds leases in after
        a replace, too); when none does, the first queue's answer. Returns the refused ones."""
        tp = TopicPartition(runs.topic, runs.partition)
        refused: list[tuple[int, AckError]] | None = None
        for name in [*sub.queues, *sorted(sub.draining)]:
            engine = self._runtimes[name].engine
            if refused is None:
                refused = engine.ack_runs(sub.id, tp, runs.runs, op, now, seconds)
            elif refused:
                retry = [o for offset, _ in refused for o in (offset, offset)]
                again = dict(engine.ack_runs(sub.id, tp, retry, op, now, seconds))
                refused = [
                    (offset, again[offset] if error is AckError.UNKNOWN_BOOKMARK else error)
                    for offset, error in refused
                    if offset in again  # else accepted in this queue
                ]
            if name in sub.draining and not engine.held_by(sub.id):
                engine.disconnect(sub.id, now)
                sub.draining.discard(name)
        assert refused is not None
        return refused

    def close(self, sub: SubscriptionState) -> None:
        """Its leases go back to their queues (while the coordinator is alive)."""
        if sub.closed:
            return
        sub.closed = True
        alive = True
        try:
            self._check_alive()
        except QLayerError:
            alive = False
        now = self._clock()
        for name in [*sub.queues, *sub.draining]:
            rt = self._runtimes[name]
            rt.subscriptions.pop(sub.id, None)
            if alive:
                rt.engine.disconnect(sub.id, now)
        sub.draining.clear()
        if alive:
            self._wake()
        log.info("queue=%s subscription=%s closed", sub.queue, sub.id)


def _ack_message(error: object, bookmark: str) -> str:
    texts = {
        "unknown_bookmark": "is not a message of this queue, or is already done",
        "not_lease_holder": "is leased to another subscription (leasing is strict)",
        "not_leased": "is not leased",
    }
    return f"bookmark {bookmark} {texts.get(str(error), str(error))}"


#: How long a subscription stays stalled before it is logged. Under load a stream is often a
#: round's push behind its writer for a moment (its backlog's worth unsent until the loop writes
#: it): that pauses it as a stall does, but is no client that stopped reading, and logging each
#: such flip was hundreds of lines a second (3% of the coordinator's time in a throughput run).
STALL_LOG_AFTER = 2.0


def _note_stall(queue: str, sub: SubscriptionState, stalled: bool) -> None:
    """Log a stall once it has lasted ``STALL_LOG_AFTER``, and its end if it was logged."""
    if stalled:
        now = time.monotonic()
        if not sub.stalled:
            sub.stalled_since = now
        elif not sub.stall_logged and now - sub.stalled_since >= STALL_LOG_AFTER:
            sub.stall_logged = True
            log.warning(
                "queue=%s subscription=%s client=%s stalled: its client does not read"
                " (%d messages unsent for %.1fs)",
                queue,
                sub.id,
                sub.client,
                sub.sink.unsent,
                now - sub.stalled_since,
            )
    elif sub.stall_logged:
        sub.stall_logged = False
        log.info(
            "queue=%s subscription=%s client=%s reads again after %.1fs stalled",
            queue,
            sub.id,
            sub.client,
            time.monotonic() - sub.stalled_since,
        )
