"""The asyncio client: ``AsyncQueueClient`` and its ``AsyncSubscription`` async iterator.

A thin driver of ``layer.client._core`` on grpc.aio, with the same surface, batching and
reconnects as the blocking client. A subscription runs one task per connection pair: a reader
(server frames into a local buffer; on a dropped connection it waits out the backoff and opens
the next one) and a writer (the only one writing to a stream); the flush timer is a
``loop.call_later``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, cast

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2

from layer.api.errors import error_from_rpc
from layer.api.frames import (
    CLIENT_FRAME_CODEC,
    SERVER_FRAME_CODEC,
    AckWhere,
    AlterQueue,
    Browse,
    ClientFrame,
    Close,
    ClusterRequest,
    CreateQueue,
    CreateTemporaryQueue,
    DeadLetters,
    DeleteQueue,
    ListDefinitions,
    ListQueues,
    Redrive,
    Reload,
    Stats,
    Subscribed,
)
from layer.api.service import (
    AckWhereResult,
    ClusterInfo,
    ClusterStats,
    DeadLetter,
    DeliveredMessage,
    QueueDefinitionInfo,
    QueueInfo,
    QueueStats,
    RedriveResult,
    ReloadResult,
)
from layer.client._common import (
    ACK_BATCH_SIZE,
    ACK_FLUSH_INTERVAL_S,
    KEEP,
    REPLAY_CODECS,
    REPLAY_METHOD,
    SERVICE,
    SUBSCRIBE_METHOD,
    UNARY_METHODS,
    BrowsedMessage,
    Keep,
    MessageBase,
    Since,
    call_metadata,
    cancel_seconds,
    check_limit,
    default_client_name,
    publish_request,
    replay_request,
    tls_credentials,
    with_tls_hint,
)
from layer.client._core import (
    CONNECT_TIMEOUT,
    Addresses,
    Backoff,
    Outcome,
    Reconnected,
    ReconnectPolicy,
    Retry,
    SubscriptionCore,
    SubscriptionFields,
    call_back,
    channel_options,
    is_connection_error,
    unary_failure,
)
from layer.client._follow import (
    ASK_S,
    FOLLOW_FIRST_S,
    HEALTH_METHOD,
    PROBE_S,
    ClusterView,
    HungOwner,
    Located,
    locate_timeout,
    moved_unless_asked,
    others,
)
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import ClientError, ConnectionLost, NotOwner, PartitionedQueue, QLayerError
from layer.toml_values import toml_literal

__all__ = ["AsyncMessage", "AsyncQueueClient", "AsyncSubscription"]

log = logging.getLogger(__name__)

_END = object()
_Waiter = asyncio.Future[Any]


class AsyncMessage(MessageBase):
    """A message of an ``AsyncSubscription``. ``await msg.ack()`` only queues the ack (it is
    batched); ``await msg.ack(wait=True)`` returns once it is durable or raises ``LeaseError``
    (``LeaseLost`` if the connection dropped first). Likewise ``cancel(delay)``, ``expire()``
    and ``extend(seconds)``; on a barrier message all four are no-ops."""

    __slots__ = ("_epoch", "_subscription")

    def __init__(
        self, subscription: AsyncSubscription, delivered: DeliveredMessage, epoch: int = 0
    ) -> None:
        # MessageBase's two fields set here, not through its __init__: one call less a message
        self._d = delivered
        self._id = delivered.bookmark
        self._subscription = subscription
        self._epoch = epoch

    async def ack(self, wait: bool = False, timeout: float | None = None) -> None:
        if wait:
            await self._op(AckOp.ACK, 0.0, wait, timeout)
        elif not self._d.barrier:  # the usual ``await msg.ack()``: straight to the batch
            self._subscription._queue_op(AckOp.ACK, self._id, 0.0, self._epoch)

    async def cancel(
        self, delay: float | None = None, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Return the message to the queue, redelivered no sooner than ``delay`` seconds."""
        await self._op(AckOp.CANCEL, cancel_seconds(delay), wait, timeout)

    async def expire(self, wait: bool = False, timeout: float | None = None) -> None:
        await self._op(AckOp.EXPIRE, 0.0, wait, timeout)

    async def extend(
        self, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        await self._op(AckOp.EXTEND, seconds, wait, timeout)

    async def _op(self, op: AckOp, seconds: float, wait: bool, timeout: float | None) -> None:
        if self._d.barrier:
            return
        if wait:
            await self._subscription._operate(op, self._id, seconds, wait, timeout, self._epoch)
        else:  # the usual ``await msg.ack()``: queued, nothing to wait for or complete
            self._subscription._queue_op(op, self._id, seconds, self._epoch)


class AsyncSubscription(SubscriptionFields):
    """An open subscription: ``async for msg in sub`` or ``await sub.next(timeout)``; the same
    batching, replace and reconnects as the blocking ``Subscription``."""

    def __init__(
        self,
        client: AsyncQueueClient,
        queue_name: str,
        max_backlog: int,
        filter: str | None,
        buffer: asyncio.Queue[Any] | None = None,
    ) -> None:
        self._client = client
        self._core: SubscriptionCore[_Waiter] = SubscriptionCore(
            queue_name, max_backlog, filter, client._client_name, client._addresses, client._policy
        )
        self._timeout = client._timeout
        # a frame's messages go through the queue as one list, taken one by one from _ready;
        # a shard's subscription shares its partitioned subscription's buffer (and says which
        # one ended: ``Ended``)
        self._buffer: asyncio.Queue[Any] = asyncio.Queue() if buffer is None else buffer
        self._ready: deque[AsyncMessage] = deque()
        self._end: object = _END if buffer is None else Ended(self)
        self._outgoing: asyncio.Queue[ClientFrame | None] = asyncio.Queue()
        self._call: Any = None
        self._moved_to: str | None = None  # the stream was given up for this owner (_watch)
        self._watcher: asyncio.Task[None] | None = None
        self._flush_timer: asyncio.TimerHandle | None = None
        self._changed = asyncio.Event()  # set on every change a flush() may wait for
        self._opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task: asyncio.Task[None] | None = None

    async def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            await asyncio.wait_for(asyncio.shield(self._opened), self._timeout)
        except TimeoutError:
            await self._shutdown()
            raise ClientError(f"no answer to subscribing to queue {self.queue!r}") from None
        except BaseException:
            await self._shutdown()
            raise
        client = self._client
        if client._view.clustered and client._policy.enabled and not self.queue.startswith("^"):
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    # --- consuming ----------------------------------------------------------------------------

    async def next(self, timeout: float | None = None) -> AsyncMessage | None:
        """The next message; None after ``timeout`` seconds or once the subscription is closed.
        Raises the error that ended it."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        ready = self._ready
        while True:
            if ready:
                item = ready.popleft()
                if item.barrier or item._epoch == self._core.epoch:
                    return item  # else its lease ended with its connection: it will come back
                continue
            if self._buffer.empty():
                self._send_pending()  # about to wait: the server must see our acks first
            if not self._buffer.empty():  # a frame already in: no wait, no timer
                batch = self._buffer.get_nowait()
            else:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    batch = await asyncio.wait_for(self._buffer.get(), wait)
                except TimeoutError:
                    return None
            if batch is _END:
                self._buffer.put_nowait(batch)
                if self._core.error is not None:
                    raise self._core.error.with_traceback(None)
                return None
            ready.extend(batch)

    def __aiter__(self) -> AsyncIterator[AsyncMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AsyncMessage]:
        while (message := await self.next()) is not None:
            yield message

    # --- replacing ----------------------------------------------------------------------------

    async def replace(
        self,
        queue: str | None = None,
        filter: str | None | Keep = KEEP,
        max_backlog: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """As ``Subscription.replace``: returns the new effective backlog."""
        future: _Waiter = asyncio.get_running_loop().create_future()
        for frame in self._core.replace(future, queue, filter, max_backlog):
            self._outgoing.put_nowait(frame)
        wait = self._timeout if timeout is None else timeout
        try:
            return int(await asyncio.wait_for(future, wait))
        except TimeoutError:
            raise TimeoutError(f"replace not confirmed within {wait} s") from None

    # --- acks ---------------------------------------------------------------------------------

    async def flush(self, timeout: float | None = None) -> None:
        """Send pending acks and wait until the server answered every ack sent so far;
        ``LeaseLost`` if a dropped connection left some unconfirmed."""
        self._send_pending()
        mark = self._core.flush_mark()

        async def confirmed() -> None:
            while not self._core.flushed(mark):
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(confirmed(), timeout)
        except TimeoutError:
            raise TimeoutError(f"acks not confirmed within {timeout} s") from None
        error = self._core.flush_error(mark)
        if error is not None:
            raise error

    async def ack(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Ack a message by bookmark (``topic/partition/offset``)."""
        await self._operate(AckOp.ACK, bookmark, 0.0, wait, timeout, None)

    async def cancel(
        self,
        bookmark: str,
        delay: float | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Return a leased message to the queue by bookmark, after ``delay`` seconds."""
        await self._operate(AckOp.CANCEL, bookmark, cancel_seconds(delay), wait, timeout, None)

    async def expire(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Remove a message by bookmark and dead-letter it."""
        await self._operate(AckOp.EXPIRE, bookmark, 0.0, wait, timeout, None)

    async def extend(
        self, bookmark: str, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Move a lease's deadline to ``seconds`` from now."""
        await self._operate(AckOp.EXTEND, bookmark, seconds, wait, timeout, None)

    async def _operate(
        self,
        op: AckOp,
        bookmark: Bookmark | str,
        seconds: float,
        wait: bool,
        timeout: float | None,
        epoch: int | None,
    ) -> None:
        loop = asyncio.get_running_loop()
        waiter: _Waiter | None = loop.create_future() if wait else None
        size, out = self._core.operate(op, bookmark, seconds, waiter, epoch)
        self._apply(out)
        if size and (wait or size >= ACK_BATCH_SIZE):
            self._send_pending()
        elif size and self._flush_timer is None:
            self._flush_timer = loop.call_later(ACK_FLUSH_INTERVAL_S, self._send_pending)
        if waiter is not None:
            await asyncio.wait_for(waiter, timeout)

    def _queue_op(self, op: AckOp, bookmark: Bookmark, seconds: float, epoch: int) -> None:
        """``_operate`` without a waiter, for a message's own operation (``msg.ack()``)."""
        size = self._core.operate_unwaited(op, bookmark, seconds, epoch)
        if size >= ACK_BATCH_SIZE:
            self._send_pending()
        elif size and self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(
                ACK_FLUSH_INTERVAL_S, self._send_pending
            )

    def _send_pending(self) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        for frame in self._core.take():
            self._outgoing.put_nowait(frame)

    # --- the connection -----------------------------------------------------------------------

    def _apply(self, out: Outcome[_Waiter]) -> None:
        if out.messages:  # one queue item a frame, not one a message
            epoch = self._core.epoch
            self._buffer.put_nowait([AsyncMessage(self, d, epoch) for d in out.messages])
        for waiter, value, error in out.done:
            if waiter.done():  # its caller gave up waiting
                continue
            if error is None:
                waiter.set_result(value)
            else:
                waiter.set_exception(error)
        self._changed.set()

    async def _run(self) -> None:
        """Connect, serve, and on a dropped connection wait and re-connect, until the end. In
        a cluster each connection goes to the owner of the queue, as the members say."""
        client, core = self._client, self._core
        untried = core.addresses.rotation()
        address = client._view.owner(core.queue) or untried[0]
        untried = [a for a in untried if a != address]
        hops = Backoff(core.policy)  # the first subscribe's waits for a queue that is moving
        follow_until = time.monotonic() + (self._timeout or FOLLOW_FIRST_S)
        try:
            while True:
                error = await self._serve(address)
                moved_to, self._moved_to = self._moved_to, None
                if moved_to is not None:
                    error = NotOwner(
                        f"{address} does not answer; {moved_to} serves {core.queue!r} now"
                    )
                moved = await self._moved(error, address)
                if not self._opened.done():  # the first subscribe: every address once
                    if moved and time.monotonic() < follow_until:
                        located = await client._locate(core.queue, address)
                        target = located.address if located is not None else None
                        if target is None or target == address:
                            await asyncio.sleep(hops.next_delay())
                        address = target or core.addresses.current
                        continue
                    if error is not None and is_connection_error(error) and untried:
                        core.addresses.failed(address)
                        address = untried.pop(0)
                        continue
                    self._apply(core.end(None))
                    self._opened.set_exception(error or ClientError("subscription ended"))
                    break
                out, decision = core.lost(error, time.monotonic(), moved, client._view.clustered)
                self._apply(out)
                if not isinstance(decision, Retry):
                    break
                await asyncio.sleep(decision.delay)
                target = decision.address
                if moved_to is not None:
                    address = moved_to  # it said it serves the queue (_watch)
                    continue
                if client._view.clustered or moved:
                    located = await client._locate(core.queue, address if moved else None)
                    if located is not None and located.address is not None:
                        target = located.address
                address = target
        finally:
            self._buffer.put_nowait(self._end)

    async def _moved(self, error: QLayerError | None, address: str) -> bool:
        """As ``Subscription._moved``: is the queue served by another member now?"""
        known = moved_unless_asked(self._core, error, self._client._view.clustered)
        if known is not None:
            return known
        located = await self._client._locate(self._core.queue, address)
        return located is None or located.defined  # no member answered: look again later

    async def _serve(self, address: str) -> QLayerError | None:
        """One connection to ``address``: subscribe, then move frames until it ends."""
        stub = self._client._channel(address).stream_stream(
            SUBSCRIBE_METHOD,
            request_serializer=CLIENT_FRAME_CODEC.encode,
            response_deserializer=SERVER_FRAME_CODEC.decode,
        )
        outgoing: asyncio.Queue[ClientFrame | None] = asyncio.Queue()
        self._outgoing = outgoing
        sent_at = time.monotonic()  # the Subscribe goes after it (LateFrames' clock bound)
        self._call = call = stub(metadata=self._client._metadata)
        writer = asyncio.get_running_loop().create_task(self._write(call, outgoing))
        outgoing.put_nowait(self._core.subscribe_frame())
        error: QLayerError | None = None
        subscribed = False
        try:
            while True:
                wait = None if subscribed else self._timeout
                try:
                    frame = await asyncio.wait_for(call.read(), wait)
                except TimeoutError:  # no Subscribed in time: try elsewhere
                    call.cancel()
                    error = ConnectionLost(f"no answer from {address} to subscribing")
                    break
                if frame is grpc.aio.EOF:
                    break
                if isinstance(frame, Subscribed):
                    subscribed = True
                    event = self._core.on_subscribed(frame, address, time.monotonic(), sent_at)
                    self._send_pending()  # acks by bookmark queued while reconnecting
                    self._changed.set()
                    if not self._opened.done():
                        # learn the cluster's members (nothing to follow without reconnects)
                        if self._core.policy.enabled and not self._client._view.asked:
                            await self._client._locate(self._core.queue, address, only=True)
                        self._opened.set_result(None)
                    await self._on_reconnect(event)
                    continue
                self._apply(self._core.on_frame(frame, time.monotonic()))
                for check in self._core.take_checks():
                    outgoing.put_nowait(check)
        except grpc.RpcError as exc:
            if not self._core.closing:  # once closing, how the call ended no longer matters
                error = await self._stream_error(exc, writer, address)
        except asyncio.CancelledError:
            call.cancel()
            task = asyncio.current_task()
            if self._moved_to is None or (task is not None and task.cancelling()):
                raise
            # _watch cancelled the call (grpc's read raises this): its member hangs
        except Exception as exc:
            error = ClientError(f"subscription stream failed: {exc}")
        finally:
            outgoing.put_nowait(None)
            if not writer.done():
                writer.cancel()
        if error is None and not subscribed and not self._core.closing:
            error = ConnectionLost(f"{address} ended the stream before confirming the subscription")
        return error

    @staticmethod
    async def _write(call: Any, outgoing: asyncio.Queue[ClientFrame | None]) -> bool:
        """Send the frames queued, until None; True if a write failed (the call ended)."""
        try:
            while (frame := await outgoing.get()) is not None:
                await call.write(frame)
            await call.done_writing()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the reader sees the call fail and handles it
            log.debug("subscription write ended error=%r", exc)
            return True
        return False

    @staticmethod
    async def _stream_error(
        exc: grpc.RpcError, writer: asyncio.Task[bool], address: str
    ) -> QLayerError:
        """What a stream that failed with ``exc`` ended with. grpc's asyncio face reports a
        write that fails because the connection dropped (a coordinator SIGKILLed while an ack
        was being sent) as ``INTERNAL: Internal error from Core``, in place of the status the
        call ended with (grpc/grpc#36066): a stream that ended so after a failed write, with
        no qlayer code (every refusal of a coordinator carries one), lost its connection and
        is reconnected as such, not ended."""
        error = error_from_rpc(exc)
        if type(error) is ClientError and exc.code() == grpc.StatusCode.INTERNAL:
            await asyncio.wait([writer], timeout=1.0)  # the failed write ends it at once
            if writer.done() and not writer.cancelled() and writer.result():
                return ConnectionLost(f"the connection to {address} dropped under a write: {error}")
        return error

    async def _watch(self) -> None:
        """As ``Subscription._watch``: give the stream up when its member hangs and another
        member serves the queue now (``HungOwner``)."""
        client, core = self._client, self._core
        watch = HungOwner(core.queue)
        while not core.closing:
            await asyncio.sleep(watch.next_wait())
            call, address = self._call, core.address
            if not core.connected or core.closing:
                watch.probed(None)
                continue
            asked = others(core.addresses, address) if watch.asking else []
            try:
                code, *answers = await asyncio.gather(
                    client._probe(address), *(client._ask(a) for a in asked)
                )
            except (grpc.aio.UsageError, ValueError):  # the client closed its channels
                return
            watch.probed(code)
            target = watch.moved_to(
                [(a, info) for a, info in zip(asked, answers, strict=True) if info is not None]
            )
            if target is None or self._call is not call or not core.connected or core.closing:
                continue
            self._moved_to = target
            log.warning(
                "subscription leaves a member that does not answer queue=%s address=%s owner=%s",
                core.queue,
                address,
                target,
            )
            call.cancel()

    async def _on_reconnect(self, event: Reconnected | None) -> None:
        result = call_back(self._client._on_reconnect, event)
        if inspect.isawaitable(result):
            try:
                await result
            except Exception:
                log.exception("on_reconnect callback failed queue=%s", self.queue)

    # --- closing ------------------------------------------------------------------------------

    async def close(self, timeout: float = 5.0) -> None:
        """Send pending acks (waiting up to ``timeout`` for confirmation), end the stream; the
        server returns every message still leased to this subscription. Idempotent."""
        if self._core.closing:
            return
        try:
            await self.flush(timeout)
        except (TimeoutError, QLayerError) as exc:
            log.warning("acks unconfirmed at close queue=%s error=%s", self.queue, exc)
        self._core.closing = True
        if self._core.connected:
            self._outgoing.put_nowait(Close())
            self._outgoing.put_nowait(None)
        if self._task is not None:
            await asyncio.wait([self._task], timeout=timeout)
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._core.closing = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self._call is not None:
            self._call.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._apply(self._core.end(None))
        self._buffer.put_nowait(self._end)

    async def __aenter__(self) -> AsyncSubscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class Ended:
    """The end of one shard's subscription, in the buffer a partitioned subscription shares."""

    __slots__ = ("subscription",)

    def __init__(self, subscription: AsyncSubscription) -> None:
        self.subscription = subscription


class _Subscribing:
    """``await client.subscribe(...)`` or ``async with client.subscribe(...) as sub``."""

    def __init__(
        self, client: AsyncQueueClient, queue: str, max_backlog: int, filter: str | None
    ) -> None:
        self._client, self._queue, self._max_backlog = client, queue, max_backlog
        self._filter = filter
        self._subscription: AsyncSubscription | AsyncMergedSubscription | None = None

    def __await__(
        self,
    ) -> Generator[Any, None, AsyncSubscription | AsyncMergedSubscription]:
        return self._client._open(self._queue, self._max_backlog, self._filter).__await__()

    async def __aenter__(self) -> AsyncSubscription | AsyncMergedSubscription:
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
    """An asyncio client: ``async with AsyncQueueClient("h1:7070,h2:7070") as client``. The
    options, reconnects and publish rule are those of ``QueueClient``; ``on_reconnect`` may be
    a coroutine function."""

    def __init__(
        self,
        target: str | Sequence[str],
        token: str | None = None,
        tls_root_cert: bytes | None = None,
        *,
        client_name: str | None = None,
        timeout: float | None = 30.0,
        reconnect: bool = True,
        reconnect_max_delay: float = 5.0,
        reconnect_give_up_after: float | None = None,
        on_reconnect: Callable[[Reconnected], Any] | None = None,
        tls_client_cert: tuple[bytes, bytes] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self._addresses = Addresses(target)
        self.target = ",".join(self._addresses.all)
        self._policy = ReconnectPolicy(
            enabled=reconnect,
            initial_delay=min(0.1, reconnect_max_delay),
            max_delay=reconnect_max_delay,
            give_up_after=reconnect_give_up_after,
            connect_timeout=connect_timeout,
        )
        self._on_reconnect = on_reconnect
        self._metadata = call_metadata(token)
        self._client_name = client_name or default_client_name()
        self._timeout = timeout
        self._tls_root_cert = tls_root_cert
        # (certificate chain PEM, private key PEM): mutual TLS, the subject names the principal
        self._tls_client_cert = tls_client_cert
        self._tls = tls_root_cert is not None or tls_client_cert is not None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._subscriptions: list[AsyncSubscription | AsyncMergedSubscription] = []
        self._view = ClusterView(self._addresses)
        self._locate_timeout = locate_timeout(self._policy, timeout)

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            options = channel_options(self._policy, self._timeout)
            if self._tls_root_cert is not None or self._tls_client_cert is not None:
                creds = tls_credentials(self._tls_root_cert, self._tls_client_cert)
                channel = grpc.aio.secure_channel(address, creds, options=options)
            else:
                channel = grpc.aio.insecure_channel(address, options=options)
            self._channels[address] = channel
        return channel

    def subscribe(
        self, queue: str, max_backlog: int = 1, filter: str | None = None
    ) -> _Subscribing:
        """Open a subscription: ``sub = await client.subscribe(q)`` or
        ``async with client.subscribe(q) as sub``; see ``QueueClient.subscribe``."""
        return _Subscribing(self, queue, max_backlog, filter)

    async def _open(
        self, queue: str, max_backlog: int, filter: str | None = None
    ) -> AsyncSubscription | AsyncMergedSubscription:
        subscription: AsyncSubscription | AsyncMergedSubscription
        streams = await self._regex_streams(queue) if queue.startswith("^") else None
        shards = [] if queue.startswith("^") else self._view.shards_of(queue)
        if streams is not None:
            subscription = await AsyncRegexSubscription.open(
                self, queue, streams, max_backlog, filter
            )
        elif not shards:
            subscription = AsyncSubscription(self, queue, max_backlog, filter)
            try:
                await subscription._start()
            except PartitionedQueue:
                # created since this client last asked: its shards, as the cluster has them now
                shards = self._view.learn_shards(await self.cluster(), queue)
                if not shards:
                    raise
        if shards:
            subscription = await AsyncPartitionedSubscription.open(
                self, queue, shards, max_backlog, filter
            )
        self._subscriptions = [s for s in self._subscriptions if not s.closed]
        self._subscriptions.append(subscription)
        return subscription

    async def _regex_streams(self, regex: str) -> list[str] | None:
        """As ``QueueClient._regex_streams``."""
        if await self._locate(regex) is None:
            return None
        return self._view.regex_streams(regex)

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
        """As ``QueueClient.publish``: the bookmark once the broker has the message."""
        request = publish_request(queue, data, key, headers, deliver_after, delay)
        return str((await self._call("Publish", request, idempotent=False)).bookmark)

    async def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[BrowsedMessage]:
        """As ``QueueClient.browse``: available messages, read-only."""
        check_limit(limit)
        reply = await self._call("Browse", Browse(queue, filter, limit))
        return [BrowsedMessage.of(m) for m in reply.messages]

    async def replay(
        self,
        queue: str,
        since: Since = None,
        until: datetime | float | None = None,
        *,
        follow: bool = False,
        filter: str | None = None,
    ) -> AsyncGenerator[BrowsedMessage, None]:
        """As ``QueueClient.replay``: ``async for msg in client.replay(...)``."""
        request = replay_request(queue, since, until, follow, filter)
        encode, decode = REPLAY_CODECS
        address = self._addresses.rotation()[0]
        method = self._channel(address).unary_stream(
            REPLAY_METHOD, request_serializer=encode.encode, response_deserializer=decode.decode
        )
        call = method(request, metadata=self._metadata)
        try:
            async for reply in call:
                for m in reply.messages:
                    yield BrowsedMessage.of(m)
        except grpc.RpcError as exc:
            raise with_tls_hint(error_from_rpc(exc), self._tls) from exc
        finally:
            call.cancel()  # the server stops reading at once

    async def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """As ``QueueClient.ack_where``."""
        reply = await self._call("AckWhere", AckWhere(queue, filter, expire))
        return AckWhereResult(reply.acked, reply.skipped)

    async def dead_letters(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """As ``QueueClient.dead_letters``."""
        check_limit(limit)
        reply = await self._call("DeadLetters", DeadLetters(queue, filter, limit))
        return list(reply.letters)

    async def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """As ``QueueClient.redrive``."""
        check_limit(limit)
        reply = await self._call("Redrive", Redrive(queue, filter, limit))
        return RedriveResult(reply.moved, reply.already, reply.unmatched)

    async def reload(self) -> ReloadResult:
        """Have the coordinator read its config file again and apply it, all or nothing. An
        admin call: where the coordinator has an ``admin_token``, this client's token must be
        it. Returns what it did (``applied`` False: something was refused and nothing changed;
        ``lines()`` is the summary); raises ``ConfigError`` for a file that does not load.
        Not retried on another address: each coordinator reads its own file."""
        reply = await self._call("Reload", Reload(), idempotent=False)
        result: ReloadResult = reply.result
        return result

    async def create_queue(self, options: Mapping[str, object]) -> QueueDefinitionInfo:
        """As ``QueueClient.create_queue``."""
        request = CreateQueue({k: toml_literal(v) for k, v in options.items()})
        reply = await self._call("CreateQueue", request, idempotent=False)
        return cast(QueueDefinitionInfo, reply.definition)

    async def create_temporary_queue(
        self, name: str, underlying_topic: str, **options: object
    ) -> QueueDefinitionInfo:
        """As ``QueueClient.create_temporary_queue``."""
        table = {"underlying_topic": underlying_topic, **options}
        request = CreateTemporaryQueue(name, {k: toml_literal(v) for k, v in table.items()})
        reply = await self._call("CreateTemporaryQueue", request, idempotent=False)
        return cast(QueueDefinitionInfo, reply.definition)

    async def alter_queue(self, name: str, options: Mapping[str, object]) -> QueueDefinitionInfo:
        """As ``QueueClient.alter_queue``."""
        request = AlterQueue(name, {k: toml_literal(v) for k, v in options.items()})
        reply = await self._call("AlterQueue", request, idempotent=False)
        return cast(QueueDefinitionInfo, reply.definition)

    async def delete_queue(self, name: str, force: bool = False) -> None:
        """As ``QueueClient.delete_queue``."""
        await self._call("DeleteQueue", DeleteQueue(name, force), idempotent=False)

    async def queue_definitions(self) -> list[QueueDefinitionInfo]:
        """As ``QueueClient.queue_definitions``."""
        return list((await self._call("ListDefinitions", ListDefinitions())).definitions)

    async def cluster(self) -> ClusterInfo:
        """As ``QueueClient.cluster``."""
        return cast(ClusterInfo, await self._call("Cluster", ClusterRequest()))

    async def _probe(self, address: str) -> grpc.StatusCode | None:
        """As ``QueueClient._probe``: None if the member at ``address`` answered a health
        check within ``PROBE_S``, else how the call ended."""
        method = self._channel(address).unary_unary(
            HEALTH_METHOD,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        try:
            await method(health_pb2.HealthCheckRequest(), timeout=PROBE_S)
        except grpc.RpcError as exc:
            return cast(grpc.StatusCode, exc.code())
        return None

    async def _ask(self, address: str) -> ClusterInfo | None:
        """The ``Cluster`` answer of the member at ``address`` (None: none within ``ASK_S``)."""
        encode, decode = UNARY_METHODS["Cluster"]
        method = self._channel(address).unary_unary(
            SERVICE + "Cluster",
            request_serializer=encode.encode,
            response_deserializer=decode.decode,
        )
        try:
            return cast(
                ClusterInfo, await method(ClusterRequest(), metadata=self._metadata, timeout=ASK_S)
            )
        except grpc.RpcError:
            return None

    async def _locate(
        self, queue: str, first: str | None = None, only: bool = False
    ) -> Located | None:
        """As ``QueueClient._locate``: where ``queue`` is served, as the first member that
        answers says (``first`` first; ``only``: that one alone)."""
        order = self._addresses.rotation()
        if first is not None:
            order = [first] if only else [first, *(a for a in order if a != first)]
        encode, decode = UNARY_METHODS["Cluster"]
        for address in order:
            method = self._channel(address).unary_unary(
                SERVICE + "Cluster",
                request_serializer=encode.encode,
                response_deserializer=decode.decode,
            )
            try:
                info = await method(
                    ClusterRequest(), metadata=self._metadata, timeout=self._locate_timeout
                )
            except grpc.RpcError as exc:
                log.debug("cluster call to %s failed: %s", address, error_from_rpc(exc))
                continue
            return self._view.locate(cast(ClusterInfo, info), address, queue)
        self._view.asked = True
        return None

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        return list((await self._call("Stats", Stats(queue))).queues)

    async def cluster_stats(self) -> ClusterStats:
        """As ``QueueClient.cluster_stats``."""
        reply = await self._call("Stats", Stats(None))
        return ClusterStats(list(reply.queues), list(reply.missing))

    async def queues(self) -> list[QueueInfo]:
        return list((await self._call("ListQueues", ListQueues())).queues)

    async def _call(self, name: str, request: Any, idempotent: bool = True) -> Any:
        encode, decode = UNARY_METHODS[name]
        error: QLayerError | None = None
        for address in self._addresses.rotation():
            method = self._channel(address).unary_unary(
                SERVICE + name,
                request_serializer=encode.encode,
                response_deserializer=decode.decode,
            )
            try:
                return await method(request, metadata=self._metadata, timeout=self._timeout)
            except grpc.RpcError as exc:
                error = with_tls_hint(error_from_rpc(exc), self._tls)
                raised = unary_failure(error, address, self._addresses, self._policy, idempotent)
                if raised is not None:
                    raise raised from exc
        assert error is not None
        raise error

    async def close(self) -> None:
        subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            await subscription.close()
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


# the merged faces of several streams (imported last: they build on AsyncSubscription)
from layer.client.partitioned import (  # noqa: E402
    AsyncMergedSubscription,
    AsyncPartitionedSubscription,
    AsyncRegexSubscription,
)
