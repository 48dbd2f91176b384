"""The asyncio client: ``AsyncQueueClient`` and its ``AsyncSubscription`` async iterator.

Same surface and the same ack batching as the blocking client, on grpc.aio. A subscription
runs a reader task (server frames into a local buffer) and a writer task (the only one writing
to the stream); the flush timer is a ``loop.call_later``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Generator, Mapping, Sequence
from types import TracebackType
from typing import Any

import grpc
import grpc.aio

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

__all__ = ["AsyncMessage", "AsyncQueueClient", "AsyncSubscription"]

log = logging.getLogger(__name__)


class _End:
    pass


_END = _End()


class AsyncMessage(MessageBase):
    """A message of an ``AsyncSubscription``. ``await msg.ack()`` only queues the ack (it is
    batched); ``await msg.ack(wait=True)`` returns once it is durable or raises ``LeaseError``.
    Likewise ``cancel(delay)``, ``expire()`` and ``extend(seconds)``.

    On a barrier message (``barrier`` is true) all four are no-ops that send nothing: a barrier
    is never leased, so there is nothing to ack, return or extend."""

    __slots__ = ("_subscription",)

    def __init__(self, subscription: AsyncSubscription, delivered: DeliveredMessage) -> None:
        super().__init__(delivered)
        self._subscription = subscription

    async def ack(self, wait: bool = False, timeout: float | None = None) -> None:
        if not self.barrier:
            await self._subscription._operate(AckOp.ACK, self.bookmark, 0.0, wait, timeout)

    async def cancel(
        self, delay: float | None = None, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Return the message to the queue; with ``delay`` (seconds) it is redelivered no
        sooner than that. Raises ``ValueError`` for a negative delay."""
        seconds = cancel_seconds(delay)
        if not self.barrier:
            await self._subscription._operate(AckOp.CANCEL, self.bookmark, seconds, wait, timeout)

    async def expire(self, wait: bool = False, timeout: float | None = None) -> None:
        if not self.barrier:
            await self._subscription._operate(AckOp.EXPIRE, self.bookmark, 0.0, wait, timeout)

    async def extend(
        self, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        if not self.barrier:
            await self._subscription._operate(AckOp.EXTEND, self.bookmark, seconds, wait, timeout)


class AsyncSubscription:
    """An open subscription: ``async for msg in sub`` or ``await sub.next(timeout)``.

    Ack batching as in the blocking client: pending acks go out when the consumer waits for a
    message with none buffered, when a batch reaches ``ACK_BATCH_SIZE``, or after
    ``ACK_FLUSH_INTERVAL_S``.

    ``queue``, ``filter`` and ``max_backlog`` are the subscription's spec as requested,
    ``backlog`` the effective backlog the server granted; ``replace`` changes them."""

    def __init__(
        self,
        call: grpc.aio.StreamStreamCall,
        queue_name: str,
        max_backlog: int = 1,
        filter: str | None = None,
        timeout: float | None = None,
    ) -> None:
        self.queue = queue_name
        self.filter = filter
        self.max_backlog = max_backlog
        self.ack_failures: list[AckFailure] = []
        self.acked_count = 0
        self.id = ""
        self.backlog = 0
        self.lease_period_s = 0.0
        self._call = call
        self._acks: AckBatcher[asyncio.Future[None]] = AckBatcher()
        self._flushes: list[tuple[int, asyncio.Future[None]]] = []  # (request id, done)
        self._buffer: asyncio.Queue[AsyncMessage | _End] = asyncio.Queue()
        self._outgoing: asyncio.Queue[ClientFrame | None] = asyncio.Queue()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._error: QLayerError | None = None
        self._ended = False
        self._closing = False
        self._tasks: list[asyncio.Task[None]] = []
        self._timeout = timeout
        # request id -> the Replace sent and the replace() call waiting for its answer
        self._replacing: dict[int, tuple[Replace, asyncio.Future[int]]] = {}
        self._next_replace_id = 1

    async def _start(self, frame: Subscribe) -> None:
        # If the write fails the server ended the call already; read() reports why.
        with contextlib.suppress(grpc.RpcError, asyncio.InvalidStateError):
            await self._call.write(frame)
        try:
            first = await self._call.read()
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc
        if not isinstance(first, Subscribed):
            self._call.cancel()
            raise ClientError(f"expected Subscribed from the server, got {first!r}")
        self.id, self.backlog = first.subscription_id, first.backlog
        self.lease_period_s = first.lease_period_s
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read()), loop.create_task(self._write())]

    # --- consuming ----------------------------------------------------------------------------

    async def next(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message; None after ``timeout`` seconds or once the subscription is closed.
        Raises ``ClientError`` if the stream failed."""
        if self._buffer.empty():
            self._send_pending()  # about to wait: the server must see our acks first
        try:
            item = await asyncio.wait_for(self._buffer.get(), timeout)
        except TimeoutError:
            return None
        if isinstance(item, _End):
            self._buffer.put_nowait(item)
            if self._error is not None:
                raise ClientError(str(self._error)) from self._error
            return None
        return item

    def __aiter__(self) -> AsyncIterator[AsyncMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AsyncMessage]:
        while (message := await self.next()) is not None:
            yield message

    @property
    def closed(self) -> bool:
        return self._ended

    # --- replacing ----------------------------------------------------------------------------

    async def replace(
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
        if self._ended:
            raise ClientError(f"subscription to {self.queue!r} is closed; replace not sent")
        request_id = self._next_replace_id
        current = (self.queue, self.max_backlog, self.filter)
        frame = replace_request(request_id, current, queue, filter, max_backlog)
        self._next_replace_id += 1
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._replacing[request_id] = (frame, future)
        self._send_pending()  # acks queued before the replace reach the server before it
        self._outgoing.put_nowait(frame)
        wait = self._timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(future, wait)
        except TimeoutError:
            raise TimeoutError(f"replace not confirmed within {wait} s") from None

    def _replace_answered(self, frame: Replaced | Error) -> bool:
        """Complete the replace() that ``frame`` answers; False if it answers none."""
        if frame.request_id is None:
            return False
        pending = self._replacing.pop(frame.request_id, None)
        if pending is None:
            return False
        sent, future = pending
        if isinstance(frame, Replaced):
            # set even if the caller gave up waiting: this is the subscription now
            self.queue, self.filter = sent.queue, sent.filter
            self.max_backlog, self.backlog = sent.max_backlog, frame.backlog
        if future.done():
            return True
        if isinstance(frame, Replaced):
            future.set_result(frame.backlog)
        else:
            future.set_exception(replace_error(frame))
        return True

    # --- acks ---------------------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Send pending acks and wait until the server answered every ack sent so far."""
        self._send_pending()
        confirmed = asyncio.get_running_loop().create_future()
        self._flushes.append((self._acks.last_request_id, confirmed))
        self._check_flushes()
        try:
            await asyncio.wait_for(confirmed, timeout)
        except TimeoutError:
            raise TimeoutError(f"acks not confirmed within {timeout} s") from None
        if self._ended and self._error is not None:
            raise ClientError(f"subscription ended: {self._error}") from self._error

    async def ack(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Ack a message by bookmark (``topic/partition/offset``)."""
        await self._operate(AckOp.ACK, bookmark, 0.0, wait, timeout)

    async def cancel(
        self,
        bookmark: str,
        delay: float | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Return a leased message to the queue by bookmark (its cancel count goes up); with
        ``delay`` (seconds) it is redelivered no sooner than that. ``ValueError`` if negative."""
        await self._operate(AckOp.CANCEL, bookmark, cancel_seconds(delay), wait, timeout)

    async def expire(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Remove a message by bookmark and dead-letter it."""
        await self._operate(AckOp.EXPIRE, bookmark, 0.0, wait, timeout)

    async def extend(
        self, bookmark: str, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Move a lease's deadline to ``seconds`` from now."""
        await self._operate(AckOp.EXTEND, bookmark, seconds, wait, timeout)

    async def _operate(
        self, op: AckOp, bookmark: str, seconds: float, wait: bool, timeout: float | None
    ) -> None:
        if self._ended:
            raise ClientError(f"subscription to {self.queue!r} is closed; {op} not sent")
        waiter: asyncio.Future[None] | None = (
            asyncio.get_running_loop().create_future() if wait else None
        )
        size = self._acks.add(op, bookmark, seconds, waiter)
        if wait or size >= ACK_BATCH_SIZE:
            self._send_pending()
        elif self._flush_timer is None:
            loop = asyncio.get_running_loop()
            self._flush_timer = loop.call_later(ACK_FLUSH_INTERVAL_S, self._send_pending)
        if waiter is not None:
            await asyncio.wait_for(waiter, timeout)

    def _send_pending(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if self._ended:
            return
        for frame in self._acks.take():
            self._outgoing.put_nowait(frame)

    # --- the stream ---------------------------------------------------------------------------

    async def _write(self) -> None:
        try:
            while (frame := await self._outgoing.get()) is not None:
                await self._call.write(frame)
            await self._call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the reader sees the call fail and ends the subscription
            log.debug("subscription write ended queue=%s error=%r", self.queue, exc)

    async def _read(self) -> None:
        error: QLayerError | None = None
        try:
            while (frame := await self._call.read()) is not grpc.aio.EOF:
                if isinstance(frame, Messages):
                    for delivered in frame.messages:
                        self._buffer.put_nowait(AsyncMessage(self, delivered))
                elif isinstance(frame, AckResult):
                    self._resolve(frame)
                elif isinstance(frame, Replaced):
                    self._replace_answered(frame)
                elif isinstance(frame, Error) and not self._replace_answered(frame):
                    log.warning(
                        "server reported an error queue=%s code=%s message=%s",
                        self.queue,
                        frame.code,
                        frame.message,
                    )
        except asyncio.CancelledError:
            self._end(ClientError("subscription reader cancelled"))
            raise
        except grpc.RpcError as exc:
            if not self._closing:  # once closing, how the call ended no longer matters
                error = error_from_rpc(exc)
        except Exception as exc:
            error = ClientError(f"subscription stream failed: {exc}")
        self._end(error)

    def _check_flushes(self) -> None:
        waiting = []
        for target, confirmed in self._flushes:
            if self._ended or not self._acks.in_flight_through(target):
                if not confirmed.done():
                    confirmed.set_result(None)
            else:
                waiting.append((target, confirmed))
        self._flushes = waiting

    def _resolve(self, result: AckResult) -> None:
        resolution = self._acks.resolve(result)
        self.acked_count += resolution.acked
        self.ack_failures.extend(resolution.unwaited_failures)
        for failure in resolution.unwaited_failures:
            log.warning(
                "ack refused queue=%s bookmark=%s error=%s message=%s",
                self.queue,
                failure.bookmark,
                failure.error,
                failure.message,
            )
        for waiter, refusal in resolution.done:
            if waiter.done():  # its caller gave up waiting
                continue
            if refusal is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(lease_error(refusal))
        self._check_flushes()

    def _end(self, error: QLayerError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        if error is not None and not self._closing:
            log.warning("subscription ended queue=%s error=%s", self.queue, error)
        lost = ClientError(f"subscription ended before the server confirmed the ack ({error})")
        for waiter in self._acks.abandon():
            if not waiter.done():
                waiter.set_exception(lost)
        unanswered = ClientError(
            f"subscription ended before the server answered the replace ({error})"
        )
        for _, future in self._replacing.values():
            if not future.done():
                future.set_exception(unanswered)
        self._replacing.clear()
        self._buffer.put_nowait(_END)
        self._outgoing.put_nowait(None)
        self._check_flushes()

    # --- closing ------------------------------------------------------------------------------

    async def close(self, timeout: float = 5.0) -> None:
        """Send pending acks (waiting up to ``timeout`` for confirmation), end the stream; the
        server returns every message still leased to this subscription. Idempotent."""
        if self._closing:
            return
        try:
            await self.flush(timeout)
        except (TimeoutError, ClientError) as exc:
            log.warning("acks unconfirmed at close queue=%s error=%s", self.queue, exc)
        self._closing = True
        if not self._ended:
            self._outgoing.put_nowait(Close())
            self._outgoing.put_nowait(None)
        done, pending = await asyncio.wait(self._tasks, timeout=timeout)
        self._call.cancel()
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        self._end(None)

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _Subscribing:
    """``await client.subscribe(...)`` or ``async with client.subscribe(...) as sub``."""

    def __init__(
        self, client: AsyncQueueClient, queue: str, max_backlog: int, filter: str | None
    ) -> None:
        self._client, self._queue, self._max_backlog = client, queue, max_backlog
        self._filter = filter
        self._subscription: AsyncSubscription | None = None

    def __await__(self) -> Generator[Any, None, AsyncSubscription]:
        return self._client._open(self._queue, self._max_backlog, self._filter).__await__()

    async def __aenter__(self) -> AsyncSubscription:
        self._subscription = await self._client._open(self._queue, self._max_backlog, self._filter)
        return self._subscription

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._subscription is not None:
            await self._subscription.close()


class AsyncQueueClient:
    """An asyncio client: ``async with AsyncQueueClient("host:7070") as client``."""

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
            self._channel = grpc.aio.secure_channel(target, creds, options=CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
        self._subscriptions: list[AsyncSubscription] = []
        self._subscribe = self._channel.stream_stream(
            SERVICE + "Subscribe",
            request_serializer=CLIENT_FRAME_CODEC.encode,
            response_deserializer=SERVER_FRAME_CODEC.decode,
        )
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
    ) -> _Subscribing:
        """Open a subscription: ``sub = await client.subscribe(q)`` or
        ``async with client.subscribe(q) as sub``. With ``filter`` (a content filter such as
        ``"/symbol = 'IBM' AND /qty > 100"``) only matching messages are delivered. A
        ``queue`` starting with ``^`` is a regex of queue names: one subscription in every
        matching queue, sharing one backlog (``msg.queue`` says where a message came from).
        Raises ``UnknownQueue``, or ``InvalidRequest`` for a bad backlog or filter (the message
        names the column)."""
        return _Subscribing(self, queue, max_backlog, filter)

    async def _open(
        self, queue: str, max_backlog: int, filter: str | None = None
    ) -> AsyncSubscription:
        call = self._subscribe(metadata=self._metadata)
        subscription = AsyncSubscription(call, queue, max_backlog, filter, self._timeout)
        start = subscription._start(Subscribe(queue, max_backlog, self._client_name, filter))
        try:
            await asyncio.wait_for(start, self._timeout)
        except TimeoutError:
            call.cancel()
            raise ClientError(f"no answer to subscribing to queue {queue!r}") from None
        except BaseException:
            call.cancel()
            raise
        self._subscriptions = [s for s in self._subscriptions if not s.closed]
        self._subscriptions.append(subscription)
        return subscription

    async def publish(
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
        reply = await self._call(self._publish, request)
        return str(reply.bookmark)

    async def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[BrowsedMessage]:
        """The queue's available messages in delivery order, read-only: nothing is leased or
        changed. ``filter`` keeps only matching messages (e.g. ``"/qty > 100"``), ``limit`` at
        most that many. Raises ``UnknownQueue``, ``InvalidRequest`` for a bad filter."""
        check_limit(limit)
        reply = await self._call(self._browse, Browse(queue, filter, limit))
        return [BrowsedMessage.of(m) for m in reply.messages]

    async def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """Ack every deliverable message of the queue matching ``filter`` (with ``expire``:
        expire and dead-letter them instead), as no subscription in particular; durable when it
        returns. Messages leased to a subscription under strict leasing are skipped. Raises
        ``UnknownQueue``, ``InvalidRequest`` for a bad filter."""
        reply = await self._call(self._ack_where, AckWhere(queue, filter, expire))
        return AckWhereResult(reply.acked, reply.skipped)

    async def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """Move the queue's dead letters (those matching ``filter``, at most ``limit``) back
        into it: each is published again as a new message with fresh delivery counts, and
        recorded, so a dead letter is never redriven twice. Durable when it returns. Raises
        ``UnknownQueue``, ``InvalidRequest`` (no dead-letter topic, a bad filter)."""
        check_limit(limit)
        reply = await self._call(self._redrive, Redrive(queue, filter, limit))
        return RedriveResult(reply.moved, reply.already, reply.unmatched)

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        return list((await self._call(self._stats, Stats(queue))).queues)

    async def queues(self) -> list[QueueInfo]:
        return list((await self._call(self._queues, ListQueues())).queues)

    async def _call(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as exc:
            raise error_from_rpc(exc) from exc

    async def close(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            await subscription.close()
        await self._channel.close()

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
