"""The I/O-free core of a subscription, shared by the blocking and the asyncio client.

It holds everything about a subscription that is not threads, tasks or sockets: the spec (queue,
filter, backlog) as replaces change it, the ack batches and what they resolve to, the server
frames and what each one means, and what to do when the connection drops: which address next,
after how long (exponential backoff with jitter), which acks are now unconfirmed. The faces
(``sync.py``, ``aio.py``) own the stream and call in with what happened; the core answers with
what to complete and what to send, and never blocks.

Leases do not survive a connection: the coordinator returns them when the stream ends. So each
connection is an *epoch*; a message remembers the epoch it came in, and an operation on a
message of an earlier epoch is not sent as if its lease were held (``LeaseLost`` or counted in
``unconfirmed_acks``): the message comes back, at-least-once.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from layer.api.frames import (
    Ack,
    AckResult,
    Batch,
    Check,
    Checked,
    Error,
    Messages,
    Replace,
    Replaced,
    ServerFrame,
    Subscribe,
    Subscribed,
)
from layer.api.service import AckFailure, DeliveredMessage
from layer.client._common import (
    CHANNEL_OPTIONS,
    AckBatcher,
    Keep,
    lease_error,
    parse_bookmark,
    replace_error,
    replace_request,
)
from layer.client._late import LateFrames
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import (
    BrokerError,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    InvalidRequest,
    LeaseLost,
    PublishUncertain,
    QLayerError,
)

__all__ = [
    "CONNECT_TIMEOUT",
    "Addresses",
    "Backoff",
    "End",
    "Outcome",
    "ReconnectPolicy",
    "Reconnected",
    "Retry",
    "SubscriptionCore",
]

log = logging.getLogger("layer.client")

# How long one connection attempt may take by default (TCP connect and the server's HTTP/2
# SETTINGS): long enough for a coordinator on a loaded machine to answer, short enough that an
# address that accepts but never answers (a stopped process) is left for the next one soon.
CONNECT_TIMEOUT = 5.0

W = TypeVar("W")


class Addresses:
    """The server addresses of a client, in the order to try them, and the current one.

    ``"h1:7070,h2:7070"`` or a list; blanks around commas are ignored. Shared by a client's
    unary calls and its subscriptions: when one finds an address down, the others start from
    the next one too."""

    def __init__(self, target: str | Sequence[str]) -> None:
        parts = target.split(",") if isinstance(target, str) else list(target)
        self.all = tuple(p.strip() for p in parts if p.strip())
        if not self.all:
            raise InvalidRequest(f"no server address in {target!r}: give host:port[,host:port...]")
        self._current = 0

    @property
    def current(self) -> str:
        return self.all[self._current]

    def failed(self, address: str) -> str:
        """``address`` is down: move on from it (if it is still the current one); returns the
        address to try next."""
        if self.all[self._current] == address:
            self._current = (self._current + 1) % len(self.all)
        return self.current

    def learn(self, addresses: Iterable[str]) -> None:
        """Add addresses learned from a cluster's members (after those given), so a client
        given one member still has the others when that one is gone."""
        new = [a for a in dict.fromkeys(addresses) if a and a not in self.all]
        if new:
            self.all = (*self.all, *new)
            log.info("learned cluster member addresses %s", ",".join(new))

    def rotation(self) -> list[str]:
        """Every address once, the current one first."""
        n = self._current
        return [*self.all[n:], *self.all[:n]]


#: a subscription that lost its owner in a cluster asks the members where its queue went at
#: least this often (seconds) ...
FOLLOW_ASK_S = 0.25
#: ... for this long after the loss; then with the policy's backoff (the cluster may be down)
FOLLOW_FAST_S = 15.0


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """How a subscription reconnects. ``enabled=False``: a dropped connection ends it with the
    error (no reconnect). Waits start at ``initial_delay`` and double up to ``max_delay``, each
    jittered to between half and all of it; ``give_up_after`` seconds without a connection end
    the subscription with ``ConnectionLost`` (None: never give up). ``connect_timeout``: how
    long one connection attempt (TCP, then the server's HTTP/2 SETTINGS) may take before the
    address counts as down (``ConnectFailed``) and the next one is tried."""

    enabled: bool = True
    initial_delay: float = 0.1
    max_delay: float = 5.0
    give_up_after: float | None = None
    multiplier: float = 2.0
    connect_timeout: float = CONNECT_TIMEOUT

    def __post_init__(self) -> None:
        if not 0 <= self.initial_delay <= self.max_delay:
            raise ValueError(
                f"reconnect waits need 0 <= initial_delay <= max_delay, got "
                f"{self.initial_delay} and {self.max_delay}"
            )
        if self.give_up_after is not None and not self.give_up_after > 0:
            raise ValueError(f"give_up_after must be > 0 seconds, got {self.give_up_after}")
        if not self.connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, got {self.connect_timeout}")


class Backoff:
    """Exponential backoff with "equal jitter": the n-th wait is uniformly between half and all
    of ``min(max_delay, initial_delay * multiplier**n)``, so many clients that lost the same
    server do not come back in lock-step, and none hammers it."""

    def __init__(self, policy: ReconnectPolicy, rng: random.Random | None = None) -> None:
        self._policy = policy
        self._rng = rng or random.Random()
        self.attempts = 0

    def next_delay(self) -> float:
        p = self._policy
        base = min(p.max_delay, p.initial_delay * p.multiplier ** min(self.attempts, 64))
        self.attempts += 1
        return base / 2 + self._rng.uniform(0, base / 2)

    def reset(self) -> None:
        self.attempts = 0

    def jitter(self, most: float) -> float:
        """A uniform wait between 0 and ``most``."""
        return self._rng.uniform(0, most)


@dataclass(frozen=True, slots=True)
class Reconnected:
    """What ``on_reconnect`` is called with: the subscription's queue, the address it is now
    connected to, how long it was without a connection, the operations left unconfirmed by the
    drop and why the connection was lost."""

    queue: str
    address: str
    downtime_s: float
    unconfirmed_acks: int
    error: QLayerError | None


@dataclass(frozen=True, slots=True)
class Retry:
    """Reconnect to ``address`` after ``delay`` seconds."""

    delay: float
    address: str


@dataclass(frozen=True, slots=True)
class End:
    """The subscription is over; ``error`` (None for a normal end) is what the consumer sees."""

    error: QLayerError | None


@dataclass(slots=True)
class Outcome(Generic[W]):
    """What the face must do after a call into the core: hand ``messages`` to the consumer and
    complete each waiter in ``done`` with its value, or its exception when that is not None."""

    messages: list[DeliveredMessage] = field(default_factory=list)
    done: list[tuple[W, Any, BaseException | None]] = field(default_factory=list)


def is_connection_error(error: QLayerError | None) -> bool:
    """Worth reconnecting for: the connection (or the coordinator's to Kafka) failed."""
    return isinstance(error, ConnectionLost | BrokerError)


class SubscriptionCore(Generic[W]):
    """One subscription's state across connections; ``W`` is the face's waiter (a future)."""

    def __init__(
        self,
        queue: str,
        max_backlog: int,
        filter: str | None,
        client_name: str,
        addresses: Addresses,
        policy: ReconnectPolicy,
        rng: random.Random | None = None,
    ) -> None:
        self.queue = queue
        self.filter = filter
        self.max_backlog = max_backlog
        self.backlog = 0
        self.id = ""
        self.lease_period_s = 0.0
        self.client_name = client_name
        self.addresses = addresses
        self.address = addresses.current
        self.policy = policy
        self.epoch = 0  # one per connection: a message's lease lives only as long as its epoch
        self.connected = False
        self.ended = False
        self.closing = False
        self.error: QLayerError | None = None
        self.acked_count = 0
        self.ack_failures: list[AckFailure] = []
        self.unconfirmed_acks = 0  # operations a dropped connection left unconfirmed
        self.reconnects = 0
        self._backoff = Backoff(policy, rng)
        self._acks: AckBatcher[W] = AckBatcher()
        # request id -> the Replace sent and the waiter of the replace() call
        self._replacing: dict[int, tuple[Replace, W]] = {}
        self._next_replace_id = 1
        self._lost_at: float | None = None  # when the connection dropped (monotonic)
        self._lost_error: QLayerError | None = None
        self._lost_ops = 0  # unconfirmed by drops so far (flush compares before and after)
        self._stale_logged = 0  # the last epoch an operation on an older message was logged in
        self.late = LateFrames(queue)  # frames held until the server says they are current

    # --- the connection -----------------------------------------------------------------------

    def subscribe_frame(self) -> Subscribe:
        """The first frame of a connection: the spec as it is now, replaces included."""
        return Subscribe(
            self.queue,
            self.max_backlog,
            self.client_name,
            self.filter,
            batch_frames=True,
            message_columns=True,
            common_columns=True,
        )

    def on_subscribed(
        self, frame: Subscribed, address: str, now: float, sent_at: float | None = None
    ) -> Reconnected | None:
        """The server confirmed the subscription on ``address`` (its Subscribe sent at
        ``sent_at``, this clock); for a re-subscription, what to report (log line and
        ``on_reconnect``)."""
        self.id, self.backlog, self.lease_period_s = (
            frame.subscription_id,
            frame.backlog,
            frame.lease_period_s,
        )
        self.late.subscribed(frame, sent_at)
        self.address = address
        self.connected = True
        self._backoff.reset()
        if self._lost_at is None:
            return None
        event = Reconnected(
            self.queue, address, now - self._lost_at, self.unconfirmed_acks, self._lost_error
        )
        self._lost_at, self._lost_error = None, None
        self.reconnects += 1
        log.warning(
            "subscription reconnected queue=%s address=%s after=%.1fs unconfirmed_acks=%d error=%s",
            self.queue,
            address,
            event.downtime_s,
            event.unconfirmed_acks,
            event.error,
            extra={"queue": self.queue, "address": address, "downtime_s": event.downtime_s},
        )
        return event

    def lost(
        self, error: QLayerError | None, now: float, moved: bool = False, clustered: bool = False
    ) -> tuple[Outcome[W], Retry | End]:
        """The stream ended (or a reconnect attempt failed) with ``error``: reconnect, or end.
        ``moved``: the error says the queue is served by another member of the cluster now
        (the face checked): reconnect as for a dropped connection, to its new owner.
        ``clustered``: the client talks to a cluster, whose members say where the queue went:
        for the first ``FOLLOW_FAST_S`` the waits between asks stay under ``FOLLOW_ASK_S``
        (a failover takes seconds; the question is answered from memory)."""
        self.connected = False
        if self.closing or self.ended:
            return self.end(None), End(None)
        if error is None and self.policy.enabled:
            error = ConnectionLost("the server ended the stream")
        if not (self.policy.enabled and (moved or is_connection_error(error))):
            return self.end(error), End(error)
        out: Outcome[W] = Outcome()
        if self._lost_at is None:
            self._drop_connection(error, now, out, moved)
        assert self._lost_at is not None
        waited = now - self._lost_at
        give_up = self.policy.give_up_after
        if give_up is not None and waited >= give_up:
            gave_up = ConnectionLost(
                f"no connection to {', '.join(self.addresses.all)} for {waited:.1f}s "
                f"(give_up_after={give_up:g}s); last error: {error}"
            )
            ended = self.end(gave_up)
            ended.done[:0] = out.done
            return ended, End(gave_up)
        # a member that refused or handed the queue over is not down: only a failed one is
        # left for the next address
        address = self.addresses.current if moved else self.addresses.failed(self.address)
        self.address = address
        delay = self._backoff.next_delay()
        if clustered and waited < FOLLOW_FAST_S:
            delay = min(delay, FOLLOW_ASK_S / 2 + self._backoff.jitter(FOLLOW_ASK_S / 2))
        if give_up is not None:
            delay = min(delay, max(0.0, give_up - waited))
        log.debug(
            "subscription reconnecting queue=%s address=%s in=%.2fs attempt=%d error=%s",
            self.queue,
            address,
            delay,
            self._backoff.attempts,
            error,
        )
        return out, Retry(delay, address)

    def _drop_connection(
        self, error: QLayerError | None, now: float, out: Outcome[W], moved: bool = False
    ) -> None:
        """A connection that served ended: its leases are gone, so are its acks' answers."""
        self._lost_at, self._lost_error = now, error
        self.late.reset()
        self.epoch += 1
        waiters, unwaited = self._acks.abandon()
        if moved:
            lost = LeaseLost(
                f"queue {self.queue!r} moved to another member of the cluster before "
                f"{self.address} confirmed the operation ({error}); its new owner will "
                f"deliver the message again"
            )
        else:
            lost = LeaseLost(
                f"the connection to {self.address} dropped before the server confirmed the "
                f"operation ({error}); the message will be delivered again"
            )
        out.done.extend((w, None, lost) for w in waiters)
        self.unconfirmed_acks += unwaited
        self._lost_ops += unwaited + len(waiters)
        unanswered = ConnectionLost(
            f"the connection dropped before the server answered the replace ({error}); the "
            f"subscription continues as queue={self.queue!r} filter={self.filter!r} "
            f"max_backlog={self.max_backlog}: replace again"
        )
        out.done.extend((w, None, unanswered) for _, w in self._replacing.values())
        self._replacing.clear()

    def end(self, error: QLayerError | None) -> Outcome[W]:
        """The subscription is over (closed, or failed for good): fail whatever waits."""
        out: Outcome[W] = Outcome()
        if self.ended:
            return out
        self.ended, self.connected, self.error = True, False, error
        self.late.reset()
        waiters, _ = self._acks.abandon()
        lost = ClientError(f"subscription ended before the server confirmed the ack ({error})")
        out.done.extend((w, None, lost) for w in waiters)
        unanswered = ClientError(
            f"subscription ended before the server answered the replace ({error})"
        )
        out.done.extend((w, None, unanswered) for _, w in self._replacing.values())
        self._replacing.clear()
        if error is not None and not self.closing:
            log.warning(
                "subscription ended queue=%s error=%s",
                self.queue,
                error,
                extra={"queue": self.queue},
            )
        return out

    # --- frames from the server ---------------------------------------------------------------

    def on_frame(self, frame: ServerFrame, now: float = 0.0) -> Outcome[W]:
        """A frame arrived at ``now`` (this clock; a late one is held, ``LateFrames``: the
        face sends ``take_checks()`` after each call)."""
        out: Outcome[W] = Outcome()
        if isinstance(frame, Batch):  # several frames in one gRPC message: each in turn
            for inner in frame.frames:
                self._take_frame(inner, out, now)
        else:
            self._take_frame(frame, out, now)
        return out

    def take_checks(self) -> list[Check]:
        return self.late.take_checks()

    def _take_frame(self, frame: ServerFrame, out: Outcome[W], now: float) -> None:
        if isinstance(frame, Messages | Checked):
            if isinstance(frame, Messages):
                messages = self.late.messages(frame, now)
            else:
                messages = self.late.answered(frame, now)
            if messages:
                out.messages = out.messages + messages if out.messages else messages
        elif isinstance(frame, AckResult):
            self._resolve(frame, out)
        elif isinstance(frame, Replaced | Error) and self._replace_answered(frame, out):
            pass
        elif isinstance(frame, Error):
            log.warning(
                "server reported an error queue=%s code=%s message=%s",
                self.queue,
                frame.code,
                frame.message,
                extra={"queue": self.queue, "code": str(frame.code)},
            )

    def _resolve(self, result: AckResult, out: Outcome[W]) -> None:
        resolution = self._acks.resolve(result)
        for failure in resolution.unwaited_failures:
            self._unwaited_failure(failure)
        self.acked_count += resolution.acked
        for waiter, refusal in resolution.done:
            out.done.append((waiter, None, None if refusal is None else lease_error(refusal)))

    def _unwaited_failure(self, failure: AckFailure) -> None:
        """A refusal nobody waits for: logged, and kept in ``ack_failures``."""
        log.warning(
            "ack refused queue=%s bookmark=%s error=%s message=%s",
            self.queue,
            failure.bookmark,
            failure.error,
            failure.message,
            extra={"queue": self.queue, "bookmark": failure.bookmark},
        )
        self.ack_failures.append(failure)

    def _replace_answered(self, frame: Replaced | Error, out: Outcome[W]) -> bool:
        if frame.request_id is None:
            return False
        pending = self._replacing.pop(frame.request_id, None)
        if pending is None:
            return False
        sent, waiter = pending
        if isinstance(frame, Replaced):
            # set even if the caller gave up waiting: this is the subscription now
            self.queue, self.filter = sent.queue, sent.filter
            self.max_backlog, self.backlog = sent.max_backlog, frame.backlog
            out.done.append((waiter, frame.backlog, None))
        else:
            out.done.append((waiter, None, replace_error(frame)))
        return True

    # --- requests from the consumer -----------------------------------------------------------

    def operate(
        self,
        op: AckOp,
        bookmark: Bookmark | str,
        seconds: float,
        waiter: W | None,
        epoch: int | None,
    ) -> tuple[int, Outcome[W]]:
        """Queue one operation; returns the size of its batch (0: not queued) and what to
        complete now. ``epoch`` is the epoch of the message operated on (None: by bookmark).
        A bookmark text that does not parse is refused at once (``malformed_bookmark``), as
        the server would: the wire carries offsets, not text."""
        if self.ended:
            raise ClientError(f"subscription to {self.queue!r} is closed; {op} not sent")
        out: Outcome[W] = Outcome()
        if isinstance(bookmark, str):
            parsed = parse_bookmark(bookmark)
            if isinstance(parsed, AckFailure):
                if waiter is not None:
                    out.done.append((waiter, None, lease_error(parsed)))
                else:
                    self._unwaited_failure(parsed)
                return 0, out
            bookmark = parsed
        if epoch is not None and epoch != self.epoch:
            # Its lease ended with the connection it came on; sending the ack now could ack a
            # redelivery someone else holds, or be refused: say what happened instead.
            if waiter is not None:
                out.done.append((waiter, None, self._stale(op, bookmark)))
            else:
                self._stale_unwaited(op, bookmark)
            return 0, out
        return self._acks.add(op, bookmark, seconds, waiter), out

    def operate_unwaited(self, op: AckOp, bookmark: Bookmark, seconds: float, epoch: int) -> int:
        """``operate`` for the usual case, a message's own operation nobody waits for (a
        consumer's ``msg.ack()``): nothing to complete, so no ``Outcome``; returns the size of
        its batch (0: not queued, its lease ended with an earlier connection)."""
        if self.ended:
            raise ClientError(f"subscription to {self.queue!r} is closed; {op} not sent")
        if epoch != self.epoch:
            self._stale_unwaited(op, bookmark)
            return 0
        return self._acks.add(op, bookmark, seconds, None)

    def _stale_unwaited(self, op: AckOp, bookmark: Bookmark) -> None:
        """An operation nobody waits for on a message of an earlier connection: not sent,
        counted in ``unconfirmed_acks`` (and logged once a connection)."""
        self.unconfirmed_acks += 1
        if self._stale_logged != self.epoch:
            self._stale_logged = self.epoch
            log.warning(
                "operation on a message delivered before a reconnect not sent "
                "queue=%s bookmark=%s op=%s: its lease ended with the connection",
                self.queue,
                bookmark,
                op,
                extra={"queue": self.queue, "bookmark": bookmark},
            )

    def _stale(self, op: AckOp, bookmark: Bookmark | str) -> LeaseLost:
        return LeaseLost(
            f"{bookmark}: delivered on an earlier connection; its lease ended with that "
            f"connection (dropped, or its queue moved to another member of the cluster), so "
            f"the {op} was not sent and the message will be delivered again"
        )

    @property
    def pending(self) -> int:
        return self._acks.pending

    @property
    def first_pending_at(self) -> float:
        return self._acks.first_pending_at

    @property
    def in_flight(self) -> int:
        """Ack batches sent and not answered yet (a ``flush()`` waits for some of them)."""
        return self._acks.in_flight

    def take(self) -> list[Ack]:
        """The pending ack batches to send now (none while there is no connection)."""
        return self._acks.take() if self.connected and not self.ended else []

    def replace(
        self,
        waiter: W,
        queue: str | None,
        filter: str | None | Keep,
        max_backlog: int | None,
    ) -> list[Ack | Replace]:
        """The frames to send for a replace() call: pending acks first, then the Replace."""
        if self.ended:
            raise ClientError(f"subscription to {self.queue!r} is closed; replace not sent")
        if not self.connected:
            raise ConnectionLost(
                f"subscription to {self.queue!r} is reconnecting; replace not sent: try again"
            )
        current = (self.queue, self.max_backlog, self.filter)
        frame = replace_request(self._next_replace_id, current, queue, filter, max_backlog)
        self._next_replace_id += 1
        self._replacing[frame.request_id] = (frame, waiter)
        return [*self.take(), frame]

    def flush_mark(self) -> tuple[int, int]:
        """Where a flush() starts: (the last ack request sent, operations lost so far)."""
        return self._acks.last_request_id, self._lost_ops

    def flushed(self, mark: tuple[int, int]) -> bool:
        return self.ended or not self._acks.in_flight_through(mark[0])

    def flush_error(self, mark: tuple[int, int]) -> QLayerError | None:
        """Why a flush() that started at ``mark`` did not confirm everything (None: it did)."""
        lost = self._lost_ops - mark[1]
        if lost:
            return LeaseLost(
                f"{lost} operations on {self.queue!r} were not confirmed before the connection "
                f"dropped (or the queue moved to another member of the cluster); their messages "
                f"will be delivered again"
            )
        if self.ended and self.error is not None:
            return ClientError(f"subscription ended: {self.error}")
        return None


def unary_failure(
    error: QLayerError,
    address: str,
    addresses: Addresses,
    policy: ReconnectPolicy,
    idempotent: bool,
) -> QLayerError | None:
    """A unary call to ``address`` failed with ``error``: the error to raise now, or None to
    try the next address. A call that may have reached the server and is not idempotent (a
    publish) is never sent twice: it raises ``PublishUncertain``. One that never connected
    (``ConnectFailed``) was not sent at all: it goes to the next address like any other."""
    if not (policy.enabled and isinstance(error, ConnectionLost)):
        return error
    if not idempotent and not isinstance(error, ConnectFailed):  # it may have been sent
        addresses.failed(address)  # the next call starts elsewhere
        return PublishUncertain(
            f"the connection to {address} failed during the publish ({error}): it may or may "
            f"not have reached Kafka; publish again only if a duplicate is acceptable"
        )
    addresses.failed(address)
    return None


def call_back(callback: Callable[[Reconnected], Any] | None, event: Reconnected | None) -> Any:
    """Run the user's ``on_reconnect``; its failure is logged, never fatal to the subscription."""
    if callback is None or event is None:
        return None
    try:
        return callback(event)
    except Exception:
        log.exception("on_reconnect callback failed queue=%s", event.queue)
        return None


def channel_options(policy: ReconnectPolicy, call_timeout: float | None) -> list[tuple[str, int]]:
    """gRPC channel options: ours, plus grpc's own reconnect backoff kept within the policy's
    cap (its default grows to 120 s, and a channel waiting out its backoff fails every call at
    once, so our reconnects would find a coordinator that is back only minutes later), and the
    connect timeout.

    grpc core takes ``grpc.min_reconnect_backoff_ms`` as MIN_CONNECT_TIMEOUT, the time each
    connection attempt is given (not a wait between attempts: those are the initial and max
    backoff), so it carries ``policy.connect_timeout``; set to the 100 ms of the first backoff,
    a coordinator answering later than that under load was never reached. It is kept to half
    the calls' ``call_timeout``: a call to an address that accepts but does not answer then
    fails with ``ConnectFailed`` (not sent: the next address is tried) before its own deadline,
    so a DEADLINE_EXCEEDED means the call was on a connection, maybe sent."""
    cap_ms = max(100, int(policy.max_delay * 1000))
    connect = policy.connect_timeout
    if call_timeout is not None:
        connect = min(connect, call_timeout / 2)
    return [
        *CHANNEL_OPTIONS,
        ("grpc.initial_reconnect_backoff_ms", min(cap_ms, 100)),
        ("grpc.min_reconnect_backoff_ms", max(100, int(connect * 1000))),
        ("grpc.max_reconnect_backoff_ms", cap_ms),
    ]


class SubscriptionFields:
    """What a subscription shows of its state, the same in both faces: ``queue``, ``filter``
    and ``max_backlog`` are the spec as requested (replaces included), ``backlog`` what the
    server granted; ``acked_count`` acks confirmed, ``ack_failures`` refusals nobody waited
    for, ``unconfirmed_acks`` operations a dropped connection left unconfirmed (their messages
    come back), ``stale_dropped`` messages of late frames it never handed over (a cluster
    member woken from a stop), ``reconnects`` how often it reconnected and ``address`` where it
    is now."""

    _core: SubscriptionCore[Any]

    @property
    def queue(self) -> str:
        return self._core.queue

    @property
    def filter(self) -> str | None:
        return self._core.filter

    @property
    def max_backlog(self) -> int:
        return self._core.max_backlog

    @property
    def backlog(self) -> int:
        return self._core.backlog

    @property
    def id(self) -> str:
        return self._core.id

    @property
    def lease_period_s(self) -> float:
        return self._core.lease_period_s

    @property
    def acked_count(self) -> int:
        return self._core.acked_count

    @property
    def ack_failures(self) -> list[AckFailure]:
        return self._core.ack_failures

    @property
    def unconfirmed_acks(self) -> int:
        return self._core.unconfirmed_acks

    @property
    def reconnects(self) -> int:
        return self._core.reconnects

    @property
    def address(self) -> str:
        return self._core.address

    @property
    def stale_dropped(self) -> int:
        """Messages of frames that came late and were never handed to the consumer: the
        server, asked, said it no longer owned them (a cluster member woken from a stop), or
        the connection ended before it answered (``layer.client._late``)."""
        return self._core.late.dropped

    @property
    def closed(self) -> bool:
        return self._core.ended
