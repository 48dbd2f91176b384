"""The blocking client: ``QueueClient`` and its ``Subscription`` iterator.

A subscription is one gRPC stream. Three threads serve it: grpc's own thread draining the
request queue onto the stream, a reader moving server frames into a local buffer, and a flusher
sending pending acks at most ``ACK_FLUSH_INTERVAL_S`` after the first one was queued.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from types import TracebackType
from typing import Any

import grpc

from layer.api.frames import (
    ACK_WHERE_CODEC,
    ACK_WHERE_REPLY_CODEC,
    BROWSE_CODEC,
    BROWSE_REPLY_CODEC,
    CLIENT_FRAME_CODEC,
    LIST_QUEUES_CODEC,
    PUBLISH_CODEC,
    PUBLISHED_CODEC,
    QUEUE_LIST_CODEC,
    REDRIVE_CODEC,
    REDRIVE_REPLY_CODEC,
    SERVER_FRAME_CODEC,
    STATS_CODEC,
    STATS_REPLY_CODEC,
    AckResult,
    AckWhere,
    Browse,
    ClientFrame,
    Close,
    Error,
    ListQueues,
    Messages,
    Redrive,
    Replace,
    Replaced,
    Stats,
    Subscribe,
    Subscribed,
)
from layer.api.service import (
    AckFailure,
    AckWhereResult,
    DeliveredMessage,
    QueueInfo,
    QueueStats,
    RedriveResult,
)
from layer.client._common import (
    ACK_BATCH_SIZE,
    ACK_FLUSH_INTERVAL_S,
    CHANNEL_OPTIONS,
    KEEP,
    SERVICE,
    AckBatcher,
    BrowsedMessage,
    Keep,
    MessageBase,
    call_metadata,
    cancel_seconds,
    check_limit,
    default_client_name,
    error_from_rpc,
    lease_error,
    publish_request,
    replace_error,
    replace_request,
)
from layer.engine.model import AckOp
from layer.exceptions import ClientError, QLayerError

__all__ = ["Message", "QueueClient", "Subscription"]

log = logging.getLogger(__name__)


class _End:
    pass


_END = _End()


class Message(MessageBase):
    """A message of a blocking ``Subscription``.

    ``ack()``, ``cancel(delay)``, ``expire()`` and ``extend(seconds)`` only queue the operation:
    it is sent with others in one batch. With ``wait=True`` the call returns once the server made
    it durable, or raises ``LeaseError`` (``UnknownBookmark``, ``NotLeaseHolder``) if refused.

    On a barrier message (``barrier`` is true) all four are no-ops that send nothing: a barrier
    is never leased, so there is nothing to ack, return or extend.
    """

    __slots__ = ("_subscription",)

    def __init__(self, subscription: Subscription, delivered: DeliveredMessage) -> None:
        super().__init__(delivered)
        self._subscription = subscription

    def ack(self, wait: bool = False, timeout: float | None = None) -> None:
        if not self.barrier:
            self._subscription._operate(AckOp.ACK, self.bookmark, 0.0, wait, timeout)

    def cancel(
        self, delay: float | None = None, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Return the message to the queue; with ``delay`` (seconds) it is redelivered no
        sooner than that. Raises ``ValueError`` for a negative delay."""
        seconds = cancel_seconds(delay)
        if not self.barrier:
            self._subscription._operate(AckOp.CANCEL, self.bookmark, seconds, wait, timeout)

    def expire(self, wait: bool = False, timeout: float | None = None) -> None:
        if not self.barrier:
            self._subscription._operate(AckOp.EXPIRE, self.bookmark, 0.0, wait, timeout)

    def extend(self, seconds: float, wait: bool = False, timeout: float | None = None) -> None:
        if not self.barrier:
            self._subscription._operate(AckOp.EXTEND, self.bookmark, seconds, wait, timeout)


class Subscription:
    """An open subscription: iterate it (or call ``next``) for messages.

    Acks are batched: pending ones are sent when the consumer asks for a message and none is
    buffered (before blocking), when a batch reaches ``ACK_BATCH_SIZE``, or after
    ``ACK_FLUSH_INTERVAL_S``. Refusals nobody waited for land in ``ack_failures`` (and the log).

    ``queue``, ``filter`` and ``max_backlog`` are the subscription's spec as requested,
    ``backlog`` the effective backlog the server granted; ``replace`` changes them.
    """

    def __init__(
        self,
        channel: grpc.Channel,
        queue_name: str,
        max_backlog: int,
        metadata: tuple[tuple[str, str], ...],
        client_name: str,
        timeout: float | None,
        filter: str | None = None,
    ) -> None:
        self.queue = queue_name
        self.filter = filter
        self.max_backlog = max_backlog
        self.ack_failures: list[AckFailure] = []
        self.acked_count = 0
        self._timeout = timeout
        self._cond = threading.Condition()
        self._acks: AckBatcher[Future[None]] = AckBatcher()
        # request id -> the Replace sent and the replace() call waiting for its answer
        self._replacing: dict[int, tuple[Replace, Future[int]]] = {}
        self._next_replace_id = 1
        self._requests: queue.Queue[ClientFrame | None] = queue.Queue()
        self._buffer: queue.Queue[Message | _End] = queue.Queue()
        self._subscribed: Future[Subscribed] = Future()
        self._error: QLayerError | None = None
        self._ended = False
        self._closing = False
        stub = channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=CLIENT_FRAME_CODEC.encode,
            response_deserializer=SERVER_FRAME_CODEC.decode,
        )
        self._requests.put(Subscribe(queue_name, max_backlog, client_name, filter))
        self._call = stub(iter(self._requests.get, None), metadata=metadata)
        self._reader = threading.Thread(
            target=self._read, name=f"qlayer-sub-reader-{queue_name}", daemon=True
        )
        self._reader.start()
        try:
            subscribed = self._subscribed.result(timeout)
        except TimeoutError:
            self._shutdown()
            raise ClientError(f"no answer to subscribing to queue {queue_name!r}") from None
        except BaseException:
            self._shutdown()
            raise
        self.id = subscribed.subscription_id
        self.backlog = subscribed.backlog
        self.lease_period_s = subscribed.lease_period_s
        self._flusher = threading.Thread(
            target=self._flush_loop, name=f"qlayer-sub-flusher-{queue_name}", daemon=True
        )
        self._flusher.start()

    # --- consuming ----------------------------------------------------------------------------

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message; None after ``timeout`` seconds or once the subscription is closed.
        Raises ``ClientError`` if the stream failed."""
        if self._buffer.empty():
            # About to block: whatever the consumer acked must reach the server first, or a
            # small backlog would never free up.
            self._send_pending()
        try:
            item = self._buffer.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, _End):
            self._buffer.put(item)  # every later call sees the end too
            if self._error is not None:
                raise ClientError(str(self._error)) from self._error
            return None
        return item

    def __iter__(self) -> Iterator[Message]:
        while (message := self.next()) is not None:
            yield message

    @property
    def closed(self) -> bool:
        return self._ended

    # --- replacing ----------------------------------------------------------------------------

    def replace(
        self,
        queue: str | None = None,
        filter: str | None | Keep = KEEP,
        max_backlog: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Replace the subscription in one step: another ``queue``, content ``filter`` or
        ``max_backlog``; what is left out stays as it is (``filter=None`` removes the filter).
        Messages leased so far stay leased and can still be acked. Returns the new effective
        backlog; ``queue``, ``filter``, ``max_backlog`` and ``backlog`` then show the new spec.

        A refused replace raises ``UnknownQueue`` or ``InvalidRequest`` (a bad filter: the message
        names the expression and the column) and leaves the subscription as it was. Waits
        ``timeout`` seconds (default: the client's timeout), then raises ``TimeoutError`` (the
        replace may still take effect). ``ClientError`` if the subscription ended.
        """
        future: Future[int] = Future()
        with self._cond:
            if self._ended:
                raise ClientError(f"subscription to {self.queue!r} is closed; replace not sent")
            request_id = self._next_replace_id
            current = (self.queue, self.max_backlog, self.filter)
            frame = replace_request(request_id, current, queue, filter, max_backlog)
            self._next_replace_id += 1
            self._replacing[request_id] = (frame, future)
            self._send_locked()  # acks queued before the replace reach the server before it
            self._requests.put(frame)
        wait = self._timeout if timeout is None else timeout
        try:
            return future.result(wait)
        except TimeoutError:
            raise TimeoutError(f"replace not confirmed within {wait} s") from None

    def _replace_answered(self, frame: Replaced | Error) -> bool:
        """Complete the replace() that ``frame`` answers; False if it answers none."""
        if frame.request_id is None:
            return False
        with self._cond:
            pending = self._replacing.pop(frame.request_id, None)
            if pending is None:
                return False
            sent, future = pending
            if isinstance(frame, Replaced):
                self.queue, self.filter = sent.queue, sent.filter
                self.max_backlog, self.backlog = sent.max_backlog, frame.backlog
        if isinstance(frame, Replaced):
            future.set_result(frame.backlog)
        else:
            future.set_exception(replace_error(frame))
        return True

    # --- acks ---------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send pending acks and wait until the server answered every ack sent so far.
        Raises ``TimeoutError`` after ``timeout`` seconds, ``ClientError`` if the stream ended."""
        with self._cond:
            self._send_locked()
            target = self._acks.last_request_id
            if not self._cond.wait_for(
                lambda: self._ended or not self._acks.in_flight_through(target), timeout
            ):
                raise TimeoutError(f"acks not confirmed within {timeout} s")
            if self._ended and self._error is not None:
                raise ClientError(f"subscription ended: {self._error}") from self._error

    def ack(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Ack a message by bookmark (``topic/partition/offset``): one this subscription holds,
        any message of the queue where its leasing is lenient, or one not active yet."""
        self._operate(AckOp.ACK, bookmark, 0.0, wait, timeout)

    def cancel(
        self,
        bookmark: str,
        delay: float | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Return a leased message to the queue by bookmark (its cancel count goes up); with
        ``delay`` (seconds) it is redelivered no sooner than that. ``ValueError`` if negative."""
        self._operate(AckOp.CANCEL, bookmark, cancel_seconds(delay), wait, timeout)

    def expire(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Remove a message by bookmark and dead-letter it."""
        self._operate(AckOp.EXPIRE, bookmark, 0.0, wait, timeout)

    def extend(
        self, bookmark: str, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Move a lease's deadline to ``seconds`` from now."""
        self._operate(AckOp.EXTEND, bookmark, seconds, wait, timeout)

    def _operate(
        self, op: AckOp, bookmark: str, seconds: float, wait: bool, timeout: float | None
    ) -> None:
        waiter: Future[None] | None = Future() if wait else None
        with self._cond:
            if self._ended:
                raise ClientError(f"subscription to {self.queue!r} is closed; {op} not sent")
            size = self._acks.add(op, bookmark, seconds, waiter)
            if wait or size >= ACK_BATCH_SIZE:
                self._send_locked()
            elif size == 1:
                self._cond.notify_all()  # start the flusher's clock
        if waiter is not None:
            waiter.result(timeout)  # raises the LeaseError, ClientError or TimeoutError

    def _send_pending(self) -> None:
        with self._cond:
            self._send_locked()

    def _send_locked(self) -> None:
        if self._ended:
            return
        for frame in self._acks.take():
            self._requests.put(frame)

    def _flush_loop(self) -> None:
        with self._cond:
            while not self._ended:
                if not self._acks.pending:
                    self._cond.wait()
                    continue
                delay = self._acks.first_pending_at + ACK_FLUSH_INTERVAL_S - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._send_locked()

    # --- the stream ---------------------------------------------------------------------------

    def _read(self) -> None:
        error: QLayerError | None = None
        try:
            for frame in self._call:
                if isinstance(frame, Messages):
                    for delivered in frame.messages:
                        self._buffer.put(Message(self, delivered))
                elif isinstance(frame, AckResult):
                    self._resolve(frame)
                elif isinstance(frame, Subscribed):
                    self._subscribed.set_result(frame)
                elif isinstance(frame, Replaced):
                    self._replace_answered(frame)
                elif isinstance(frame, Error) and not self._replace_answered(frame):
                    log.warning(
                        "server reported an error queue=%s code=%s message=%s",
                        self.queue,
                        frame.code,
                        frame.message,
                    )
        except grpc.RpcError as exc:
            if not self._closing:  # once closing, how the call ended no longer matters
                error = error_from_rpc(exc)
        except Exception as exc:  # a frame that did not decode, mostly
            error = ClientError(f"subscription stream failed: {exc}")
        if error is None and not self._subscribed.done():
            error = ClientError("the server ended the stream before confirming the subscription")
        self._end(error)

    def _resolve(self, result: AckResult) -> None:
        with self._cond:
            resolution = self._acks.resolve(result)
            for failure in resolution.unwaited_failures:
                log.warning(
                    "ack refused queue=%s bookmark=%s error=%s message=%s",
                    self.queue,
                    failure.bookmark,
                    failure.error,
                    failure.message,
                )
            self.acked_count += resolution.acked
            self.ack_failures.extend(resolution.unwaited_failures)
            self._cond.notify_all()
        for waiter, refusal in resolution.done:
            if refusal is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(lease_error(refusal))

    def _end(self, error: QLayerError | None) -> None:
        with self._cond:
            if self._ended:
                return
            self._ended = True
            self._error = error
            waiters = self._acks.abandon()
            replacing = [future for _, future in self._replacing.values()]
            self._replacing.clear()
            self._cond.notify_all()
        if error is not None and not self._closing:
            log.warning("subscription ended queue=%s error=%s", self.queue, error)
        lost = ClientError(f"subscription ended before the server confirmed the ack ({error})")
        for waiter in waiters:
            waiter.set_exception(lost)
        for future in replacing:
            future.set_exception(
                ClientError(f"subscription ended before the server answered the replace ({error})")
            )
        if not self._subscribed.done():
            self._subscribed.set_exception(error or ClientError("subscription ended"))
        self._buffer.put(_END)
        self._requests.put(None)  # ends grpc's request-iterator thread

    # --- closing ------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Send pending acks (waiting up to ``timeout`` for their confirmation), end the stream;
        the server returns every message still leased to this subscription. Idempotent."""
        if self._closing:
            return
        try:
            self.flush(timeout)
        except (TimeoutError, ClientError) as exc:
            log.warning("acks unconfirmed at close queue=%s error=%s", self.queue, exc)
        self._closing = True
        if not self._ended:
            self._requests.put(Close())
            self._requests.put(None)
        self._reader.join(timeout)
        self._shutdown()

    def _shutdown(self) -> None:
        self._closing = True
        self._call.cancel()
        self._reader.join(1.0)
        self._end(None)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class QueueClient:
    """A blocking client: ``QueueClient("host:7070", token=...)``, best used as a context
    manager (``close()`` closes every subscription, then the channel)."""

    def __init__(
        self,
        target: str,
        token: str | None = None,
        tls_root_cert: bytes | None = None,
        *,
        client_name: str | None = None,
        timeout: float | None = 30.0,
    ) -> None:
        self.target = target
        self._metadata = call_metadata(token)
        self._client_name = client_name or default_client_name()
        self._timeout = timeout
        if tls_root_cert is not None:
            creds = grpc.ssl_channel_credentials(root_certificates=tls_root_cert)
            self._channel = grpc.secure_channel(target, creds, options=CHANNEL_OPTIONS)
        else:
            self._channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._subscriptions: list[Subscription] = []
        self._lock = threading.Lock()
        self._publish = self._channel.unary_unary(
            SERVICE + "Publish",
            request_serializer=PUBLISH_CODEC.encode,
            response_deserializer=PUBLISHED_CODEC.decode,
        )
        self._stats = self._channel.unary_unary(
            SERVICE + "Stats",
            request_serializer=STATS_CODEC.encode,
            response_deserializer=STATS_REPLY_CODEC.decode,
        )
        self._queues = self._channel.unary_unary(
            SERVICE + "ListQueues",
            request_serializer=LIST_QUEUES_CODEC.encode,
            response_deserializer=QUEUE_LIST_CODEC.decode,
        )
        self._browse = self._channel.unary_unary(
            SERVICE + "Browse",
            request_serializer=BROWSE_CODEC.encode,
            response_deserializer=BROWSE_REPLY_CODEC.decode,
        )
        self._ack_where = self._channel.unary_unary(
            SERVICE + "AckWhere",
            request_serializer=ACK_WHERE_CODEC.encode,
            response_deserializer=ACK_WHERE_REPLY_CODEC.decode,
        )
        self._redrive = self._channel.unary_unary(
            SERVICE + "Redrive",
            request_serializer=REDRIVE_CODEC.encode,
            response_deserializer=REDRIVE_REPLY_CODEC.decode,
        )

    def subscribe(
        self, queue: str, max_backlog: int = 1, filter: str | None = None
    ) -> Subscription:
        """Open a subscription; at most ``max_backlog`` messages (capped by the queue) are
        leased to it and unacknowledged at a time. With ``filter`` (a content filter such as
        ``"/symbol = 'IBM' AND /qty > 100"``) only matching messages are delivered. A
        ``queue`` starting with ``^`` is a regex of queue names: one subscription in every
        matching queue, sharing one backlog (``msg.queue`` says where a message came from).
        Raises ``UnknownQueue``, or ``InvalidRequest`` for a bad backlog or filter (the message
        names the column)."""
        subscription = Subscription(
            self._channel,
            queue,
            max_backlog,
            self._metadata,
            self._client_name,
            self._timeout,
            filter,
        )
        with self._lock:
            self._subscriptions = [s for s in self._subscriptions if not s.closed]
            self._subscriptions.append(subscription)
        return subscription

    def publish(
        self,
        queue: str,
        data: bytes | str | Mapping[str, Any],
        key: bytes | str | None = None,
        headers: Sequence[tuple[str, bytes | str | None]]
        | Mapping[str, bytes | str | None]
        | None = None,
        deliver_after: float | None = None,
        delay: float | None = None,
    ) -> str:
        """Publish to the queue's publish target (a dict is sent as JSON); returns the bookmark
        once the broker has the message.

        ``deliver_after`` (a UNIX time in seconds) or ``delay`` (seconds from now; not both)
        keeps the message from being delivered before then. It travels as the header
        ``deliver_after``: the absolute UNIX time in seconds as an ASCII decimal string, e.g.
        ``b"1763800000.250"``; a plain Kafka producer can set that header itself. ``ValueError``
        for both, a negative delay or a header of that name given as well."""
        request = publish_request(queue, data, key, headers, deliver_after, delay)
        reply = self._call(self._publish, request)
        return str(reply.bookmark)

    def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[BrowsedMessage]:
        """The queue's available messages in delivery order, read-only: nothing is leased or
        changed. ``filter`` keeps only matching messages (e.g. ``"/qty > 100"``), ``limit`` at
        most that many. Raises ``UnknownQueue``, ``InvalidRequest`` for a bad filter."""
        check_limit(limit)
        reply = self._call(self._browse, Browse(queue, filter, limit))
        return [BrowsedMessage.of(m) for m in reply.messages]

    def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """Ack every deliverable message of the queue matching ``filter`` (with ``expire``:
        expire and dead-letter them instead), as no subscription in particular; durable when it
        returns. Messages leased to a subscription under strict leasing are skipped. Raises
        ``UnknownQueue``, ``InvalidRequest`` for a bad filter."""
        reply = self._call(self._ack_where, AckWhere(queue, filter, expire))
        return AckWhereResult(reply.acked, reply.skipped)

    def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """Move the queue's dead letters (those matching ``filter``, at most ``limit``) back
        into it: each is published again as a new message with fresh delivery counts, and
        recorded, so a dead letter is never redriven twice. Durable when it returns. Raises
        ``UnknownQueue``, ``InvalidRequest`` (no dead-letter topic, a bad filter)."""
        check_limit(limit)
        reply = self._call(self._redrive, Redrive(queue, filter, limit))
        return RedriveResult(reply.moved, reply.already, reply.unmatched)

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Stats of one queue, or of every queue."""
        return list(self._call(self._stats, Stats(queue)).queues)

    def queues(self) -> list[QueueInfo]:
        """The configured queues."""
        return list(self._call(self._queues, ListQueues()).queues)

    def _call(self, method: Any, request: Any) -> Any:
        try:
            return method(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc

    def close(self) -> None:
        with self._lock:
            subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.close()
        self._channel.close()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
