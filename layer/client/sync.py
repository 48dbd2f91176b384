"""The blocking client: ``QueueClient`` and its ``Subscription`` iterator.

A thin driver of ``layer.client._core``: the core decides, this module owns the threads. A
subscription has a runner thread (opens the stream, moves server frames into a local buffer,
and when the connection drops waits out the backoff and re-opens it on the next address), a
flusher thread (sends pending acks at most ``ACK_FLUSH_INTERVAL_S`` after the first one was
queued) and grpc's own thread draining each connection's request queue onto its stream.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime
from types import TracebackType
from typing import Any, cast

import grpc
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

__all__ = ["Message", "QueueClient", "Subscription"]

log = logging.getLogger(__name__)

_END = object()
_Waiter = Future[Any]


class Message(MessageBase):
    """A message of a blocking ``Subscription``.

    ``ack()``, ``cancel(delay)``, ``expire()`` and ``extend(seconds)`` only queue the operation:
    it is sent with others in one batch. With ``wait=True`` the call returns once the server made
    it durable, or raises ``LeaseError`` (``UnknownBookmark``, ``NotLeaseHolder``) if refused,
    ``LeaseLost`` if the connection dropped first (the message will be delivered again).

    On a barrier message (``barrier`` is true) all four are no-ops that send nothing: a barrier
    is never leased, so there is nothing to ack, return or extend.
    """

    __slots__ = ("_epoch", "_subscription")

    def __init__(
        self, subscription: Subscription, delivered: DeliveredMessage, epoch: int = 0
    ) -> None:
        # MessageBase's two fields set here, not through its __init__: one call less a message
        self._d = delivered
        self._id = delivered.bookmark
        self._subscription = subscription
        self._epoch = epoch

    def ack(self, wait: bool = False, timeout: float | None = None) -> None:
        if wait:
            self._op(AckOp.ACK, 0.0, wait, timeout)
        elif not self._d.barrier:  # the usual msg.ack(): straight to the batch
            self._subscription._queue_op(AckOp.ACK, self._id, 0.0, self._epoch)

    def cancel(
        self, delay: float | None = None, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Return the message to the queue; with ``delay`` (seconds) it is redelivered no
        sooner than that. Raises ``ValueError`` for a negative delay."""
        self._op(AckOp.CANCEL, cancel_seconds(delay), wait, timeout)

    def expire(self, wait: bool = False, timeout: float | None = None) -> None:
        self._op(AckOp.EXPIRE, 0.0, wait, timeout)

    def extend(self, seconds: float, wait: bool = False, timeout: float | None = None) -> None:
        self._op(AckOp.EXTEND, seconds, wait, timeout)

    def _op(self, op: AckOp, seconds: float, wait: bool, timeout: float | None) -> None:
        if self._d.barrier:
            return
        if wait:
            self._subscription._operate(op, self._id, seconds, wait, timeout, self._epoch)
        else:  # the usual msg.ack(): queued under the lock, nothing to wait for or complete
            self._subscription._queue_op(op, self._id, seconds, self._epoch)


class Subscription(SubscriptionFields):
    """An open subscription: iterate it (or call ``next``) for messages.

    Acks are batched: pending ones are sent when the consumer asks for a message and none is
    buffered (before blocking), when a batch reaches ``ACK_BATCH_SIZE``, or after
    ``ACK_FLUSH_INTERVAL_S``. Refusals nobody waited for land in ``ack_failures`` (and the log).

    When the connection drops the subscription re-opens itself with the same spec on the next
    address (unless the client has ``reconnect=False``) and iteration goes on; operations the
    drop left unconfirmed are counted in ``unconfirmed_acks``, and their messages come back.
    """

    def __init__(
        self,
        client: QueueClient,
        queue_name: str,
        max_backlog: int,
        filter: str | None,
        buffer: queue.Queue[Any] | None = None,
    ) -> None:
        self._client = client
        self._core: SubscriptionCore[_Waiter] = SubscriptionCore(
            queue_name, max_backlog, filter, client._client_name, client._addresses, client._policy
        )
        self._timeout = client._timeout
        # _mutex is _cond's lock: the hot paths take it without Condition's own method call
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        # a frame's messages go through the queue as one list, taken one by one from _ready
        # a shard's subscription shares its partitioned subscription's buffer (and says which
        # one ended: ``Ended``)
        self._buffer: queue.Queue[Any] = queue.Queue() if buffer is None else buffer
        self._end: object = _END if buffer is None else Ended(self)
        self._ready: deque[Message] = deque()
        self._requests: queue.Queue[ClientFrame | None] = queue.Queue()
        self._call: Any = None
        self._moved_to: str | None = None  # the stream was given up for this owner (_watch)
        self._opened: Future[None] = Future()
        self._runner = threading.Thread(
            target=self._run, name=f"qlayer-sub-{queue_name}", daemon=True
        )
        self._runner.start()
        try:
            self._opened.result(None if self._timeout is None else self._timeout * 2)
        except TimeoutError:
            self._shutdown()
            raise ClientError(f"no answer to subscribing to queue {queue_name!r}") from None
        except BaseException:
            self._shutdown()
            raise
        self._flusher = threading.Thread(
            target=self._flush_loop, name=f"qlayer-sub-flusher-{queue_name}", daemon=True
        )
        self._flusher.start()
        if client._view.clustered and client._policy.enabled and not queue_name.startswith("^"):
            threading.Thread(
                target=self._watch, name=f"qlayer-sub-watch-{queue_name}", daemon=True
            ).start()

    # --- consuming ----------------------------------------------------------------------------

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message; None after ``timeout`` seconds or once the subscription is closed.
        Raises the error that ended it (``ConnectionLost`` with ``reconnect=False``...)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        ready = self._ready
        while True:
            if ready:
                try:
                    item = ready.popleft()
                except IndexError:  # another thread took the last one
                    continue
                if item._d.barrier or item._epoch == self._core.epoch:
                    return item  # else its lease ended with its connection: it will come back
                continue
            if self._buffer.empty():
                # About to block: whatever the consumer acked must reach the server first, or a
                # small backlog would never free up.
                self._send_pending()
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                batch = self._buffer.get(timeout=wait)
            except queue.Empty:
                return None
            if batch is _END:
                self._buffer.put(batch)  # every later call sees the end too
                if self._core.error is not None:
                    raise self._core.error.with_traceback(None)
                return None
            ready.extend(batch)

    def __iter__(self) -> Iterator[Message]:
        while (message := self.next()) is not None:
            yield message

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
        backlog; ``queue``, ``filter``, ``max_backlog`` and ``backlog`` then show the new spec
        (a reconnect re-subscribes with it).

        A refused replace raises ``UnknownQueue`` or ``InvalidRequest`` (a bad filter: the message
        names the expression and the column) and leaves the subscription as it was. Waits
        ``timeout`` seconds (default: the client's timeout), then raises ``TimeoutError`` (the
        replace may still take effect). ``ConnectionLost`` if the connection dropped before the
        answer (the subscription goes on with its old spec), ``ClientError`` if it ended.
        """
        future: _Waiter = Future()
        with self._cond:
            for frame in self._core.replace(future, queue, filter, max_backlog):
                self._requests.put(frame)
        wait = self._timeout if timeout is None else timeout
        try:
            return int(future.result(wait))
        except TimeoutError:
            raise TimeoutError(f"replace not confirmed within {wait} s") from None

    # --- acks ---------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send pending acks and wait until the server answered every ack sent so far.
        Raises ``TimeoutError`` after ``timeout`` seconds, ``LeaseLost`` if a dropped
        connection left some unconfirmed, ``ClientError`` if the subscription ended."""
        with self._cond:
            self._send_locked()
            mark = self._core.flush_mark()
            if not self._cond.wait_for(lambda: self._core.flushed(mark), timeout):
                raise TimeoutError(f"acks not confirmed within {timeout} s")
            error = self._core.flush_error(mark)
        if error is not None:
            raise error

    def ack(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Ack a message by bookmark (``topic/partition/offset``): one this subscription holds,
        any message of the queue where its leasing is lenient, or one not active yet."""
        self._operate(AckOp.ACK, bookmark, 0.0, wait, timeout, None)

    def cancel(
        self,
        bookmark: str,
        delay: float | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Return a leased message to the queue by bookmark (its cancel count goes up); with
        ``delay`` (seconds) it is redelivered no sooner than that. ``ValueError`` if negative."""
        self._operate(AckOp.CANCEL, bookmark, cancel_seconds(delay), wait, timeout, None)

    def expire(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        """Remove a message by bookmark and dead-letter it."""
        self._operate(AckOp.EXPIRE, bookmark, 0.0, wait, timeout, None)

    def extend(
        self, bookmark: str, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        """Move a lease's deadline to ``seconds`` from now."""
        self._operate(AckOp.EXTEND, bookmark, seconds, wait, timeout, None)

    def _operate(
        self,
        op: AckOp,
        bookmark: Bookmark | str,
        seconds: float,
        wait: bool,
        timeout: float | None,
        epoch: int | None,
    ) -> None:
        waiter: _Waiter | None = Future() if wait else None
        with self._cond:
            size, out = self._core.operate(op, bookmark, seconds, waiter, epoch)
            if size and (wait or size >= ACK_BATCH_SIZE):
                self._send_locked()
            elif size == 1:
                self._cond.notify_all()  # start the flusher's clock
        self._apply(out)
        if waiter is not None:
            waiter.result(timeout)  # raises the LeaseError, ClientError or TimeoutError

    def _queue_op(self, op: AckOp, bookmark: Bookmark, seconds: float, epoch: int) -> None:
        """``_operate`` without a waiter, for a message's own operation (``msg.ack()``)."""
        with self._mutex:
            size = self._core.operate_unwaited(op, bookmark, seconds, epoch)
            if size >= ACK_BATCH_SIZE:
                self._send_locked()
            elif size == 1:
                self._cond.notify_all()  # start the flusher's clock

    def _send_pending(self) -> None:
        with self._cond:
            self._send_locked()

    def _send_locked(self) -> None:
        for frame in self._core.take():
            self._requests.put(frame)

    def _flush_loop(self) -> None:
        with self._cond:
            while not self._core.ended:
                if not self._core.pending or not self._core.connected:
                    self._cond.wait()
                    continue
                delay = self._core.first_pending_at + ACK_FLUSH_INTERVAL_S - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                self._send_locked()

    # --- the connection -----------------------------------------------------------------------

    def _apply(self, out: Outcome[_Waiter]) -> None:
        if out.messages:
            epoch = self._core.epoch
            self._buffer.put([Message(self, delivered, epoch) for delivered in out.messages])
        for waiter, value, error in out.done:
            if error is None:
                waiter.set_result(value)
            else:
                waiter.set_exception(error)

    def _run(self) -> None:
        """Connect, serve, and on a dropped connection wait and re-connect, until the end. In
        a cluster each connection goes to the owner of the queue, as the members say."""
        client, core = self._client, self._core
        untried = core.addresses.rotation()
        address = client._view.owner(core.queue) or untried[0]
        untried = [a for a in untried if a != address]
        hops = Backoff(core.policy)  # the first subscribe's waits for a queue that is moving
        follow_until = time.monotonic() + (self._timeout or FOLLOW_FIRST_S)
        while True:
            error = self._serve(address)
            moved_to, self._moved_to = self._moved_to, None
            if moved_to is not None:
                error = NotOwner(f"{address} does not answer; {moved_to} serves {core.queue!r} now")
            moved = self._moved(error, address)
            if not self._opened.done():  # the first subscribe: every address once, at once
                if moved and time.monotonic() < follow_until:
                    located = client._locate(core.queue, address)
                    target = located.address if located is not None else None
                    if (target is None or target == address) and self._pause(hops.next_delay()):
                        target = None
                    address = target or core.addresses.current
                    continue
                if error is not None and is_connection_error(error) and untried:
                    core.addresses.failed(address)
                    address = untried.pop(0)
                    continue
                with self._cond:
                    core.end(None)
                    self._cond.notify_all()
                self._opened.set_exception(error or ClientError("subscription ended"))
                break
            with self._cond:
                out, decision = core.lost(error, time.monotonic(), moved, client._view.clustered)
                self._cond.notify_all()
            self._apply(out)
            if not isinstance(decision, Retry):
                break
            if self._pause(decision.delay) or moved_to is not None:
                address = moved_to or decision.address
                continue  # closing: the next serve returns at once and lost() ends it
            if client._view.clustered or moved:
                located = client._locate(core.queue, address if moved else None)
                if located is not None and located.address is not None:
                    decision = Retry(decision.delay, located.address)
            address = decision.address
        self._buffer.put(self._end)

    def _pause(self, delay: float) -> bool:
        """Wait ``delay`` seconds, or less if the subscription is closed; True if closed."""
        with self._cond:
            return self._cond.wait_for(lambda: self._core.closing, delay)

    def _moved(self, error: QLayerError | None, address: str) -> bool:
        """Did the stream to ``address`` end because the queue is served by another member of
        the cluster now? ``NotOwner`` says so; a ``QueueRemoved`` (moved, or deleted) is
        checked with a ``Cluster`` call: moved if the cluster still has the queue."""
        known = moved_unless_asked(self._core, error, self._client._view.clustered)
        if known is not None:
            return known
        located = self._client._locate(self._core.queue, address)
        return located is None or located.defined  # no member answered: look again later

    def _serve(self, address: str) -> QLayerError | None:
        """One connection to ``address``: subscribe, then move frames until it ends."""
        requests: queue.Queue[ClientFrame | None] = queue.Queue()
        requests.put(self._core.subscribe_frame())
        stub = self._client._channel(address).stream_stream(
            SUBSCRIBE_METHOD,
            request_serializer=CLIENT_FRAME_CODEC.encode,
            response_deserializer=SERVER_FRAME_CODEC.decode,
        )
        with self._cond:
            if self._core.closing:
                return None
            self._requests = requests
            sent_at = time.monotonic()  # the Subscribe goes after it (LateFrames' clock bound)
            self._call = call = stub(iter(requests.get, None), metadata=self._client._metadata)
        # No Subscribed in time: give up on this address (a reconnect tries the next one).
        timer = threading.Timer(self._timeout or 1e9, call.cancel)
        timer.daemon = True
        timer.start()
        error: QLayerError | None = None
        subscribed = False
        try:
            for frame in call:
                if isinstance(frame, Subscribed):
                    timer.cancel()
                    subscribed = True
                    with self._cond:
                        event = self._core.on_subscribed(frame, address, time.monotonic(), sent_at)
                        self._send_locked()  # acks by bookmark queued while reconnecting
                        self._cond.notify_all()
                    if not self._opened.done():
                        # learn the cluster's members (nothing to follow without reconnects)
                        if self._core.policy.enabled and not self._client._view.asked:
                            self._client._locate(self._core.queue, address, only=True)
                        self._opened.set_result(None)
                    self._on_reconnect(event)
                    continue
                with self._cond:
                    in_flight = self._core.in_flight
                    out = self._core.on_frame(frame, time.monotonic())
                    for check in self._core.take_checks():
                        requests.put(check)
                    if out.done or self._core.in_flight != in_flight:
                        # acks answered (a flush() may wait for them) or a replace: not for
                        # every frame, which would wake the flusher for nothing
                        self._cond.notify_all()
                self._apply(out)
        except grpc.RpcError as exc:
            if not self._core.closing:  # once closing, how the call ended no longer matters
                error = error_from_rpc(exc)
        except Exception as exc:  # a frame that did not decode, mostly
            error = ClientError(f"subscription stream failed: {exc}")
        finally:
            timer.cancel()
            requests.put(None)  # ends grpc's request-iterator thread
        if error is None and not subscribed and not self._core.closing:
            error = ConnectionLost(f"{address} ended the stream before confirming the subscription")
        return error

    def _on_reconnect(self, event: Reconnected | None) -> None:
        call_back(self._client._on_reconnect, event)

    def _watch(self) -> None:
        """Give the stream up when its member hangs and another member serves the queue now
        (``HungOwner``): its leases come again from the new owner."""
        watch = HungOwner(self._core.queue)
        while not self._pause(watch.next_wait()):
            try:
                self._watch_once(watch)
            except ValueError:  # the client closed its channels meanwhile
                return

    def _watch_once(self, watch: HungOwner) -> None:
        client, core = self._client, self._core
        with self._cond:
            call, address = self._call, core.address
            if not core.connected:
                watch.probed(None)
                return
        asks = (
            [(a, client._ask(a)) for a in others(core.addresses, address)] if watch.asking else []
        )
        watch.probed(client._probe(address))
        answers = []
        for asked, future in asks:
            try:
                answers.append((asked, cast(ClusterInfo, future.result())))
            except grpc.RpcError:
                continue
        target = watch.moved_to(answers)
        if target is None:
            return
        with self._cond:
            if self._call is not call or not core.connected or core.closing:
                return
            self._moved_to = target
        log.warning(
            "subscription leaves a member that does not answer queue=%s address=%s owner=%s",
            core.queue,
            address,
            target,
        )
        call.cancel()

    # --- closing ------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Send pending acks (waiting up to ``timeout`` for their confirmation), end the stream;
        the server returns every message still leased to this subscription. Idempotent."""
        if self._core.closing:
            return
        try:
            self.flush(timeout)
        except (TimeoutError, QLayerError) as exc:
            log.warning("acks unconfirmed at close queue=%s error=%s", self.queue, exc)
        with self._cond:
            self._core.closing = True
            self._cond.notify_all()
            if self._core.connected:
                self._requests.put(Close())
                self._requests.put(None)
        self._runner.join(timeout)
        self._shutdown()

    def _shutdown(self) -> None:
        with self._cond:
            self._core.closing = True
            call = self._call
            self._cond.notify_all()
        if call is not None:
            call.cancel()
        self._runner.join(1.0)
        with self._cond:
            out = self._core.end(None)
            self._cond.notify_all()
        self._apply(out)
        self._buffer.put(self._end)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Ended:
    """The end of one shard's subscription, in the buffer a partitioned subscription shares."""

    __slots__ = ("subscription",)

    def __init__(self, subscription: Subscription) -> None:
        self.subscription = subscription


class QueueClient:
    """A blocking client, best used as a context manager (``close()`` closes every
    subscription, then the channels).

    ``target`` is ``"host:7070"``, several as ``"h1:7070,h2:7070"`` or a list: when one is down
    the next is tried. With ``reconnect`` (the default) a subscription whose connection drops
    re-opens itself with backoff and jitter (waits up to ``reconnect_max_delay`` seconds;
    ``reconnect_give_up_after`` seconds without a connection end it, default never) and calls
    ``on_reconnect(Reconnected)`` each time; unary calls other than ``publish`` try the next
    address. A publish is sent once: a connection that fails under it raises
    ``PublishUncertain`` (it may have reached Kafka). ``reconnect=False``: the error reaches
    the caller as ``ConnectionLost``. ``connect_timeout`` (seconds, at most half of
    ``timeout``) is how long one connection attempt may take: an address that accepts but does
    not answer within it counts as down.
    """

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
        self._channels: dict[str, grpc.Channel] = {}
        self._subscriptions: list[Subscription | MergedSubscription] = []
        self._lock = threading.Lock()
        self._view = ClusterView(self._addresses)
        self._locate_timeout = locate_timeout(self._policy, timeout)

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            channel = self._channels.get(address)
            if channel is None:
                options = channel_options(self._policy, self._timeout)
                if self._tls_root_cert is not None or self._tls_client_cert is not None:
                    creds = tls_credentials(self._tls_root_cert, self._tls_client_cert)
                    channel = grpc.secure_channel(address, creds, options=options)
                else:
                    channel = grpc.insecure_channel(address, options=options)
                self._channels[address] = channel
            return channel

    def subscribe(
        self, queue: str, max_backlog: int = 1, filter: str | None = None
    ) -> Subscription | MergedSubscription:
        """Open a subscription; at most ``max_backlog`` messages (capped by the queue) are
        leased to it and unacknowledged at a time. With ``filter`` (a content filter such as
        ``"/symbol = 'IBM' AND /qty > 100"``) only matching messages are delivered. A
        ``queue`` starting with ``^`` is a regex of queue names: one subscription in every
        matching queue, sharing one backlog (``msg.queue`` says where a message came from).
        Raises ``UnknownQueue``, ``InvalidRequest`` for a bad backlog or filter (the message
        names the column), ``ConnectionLost`` if no address answers.

        A partitioned queue (``distribution = "partitioned"``) gets one stream per shard,
        each on the member that serves it and following it, merged into one iterator
        (``PartitionedSubscription``; ``max_backlog`` holds per shard). In a cluster a regex
        gets one such stream per matching queue (``RegexSubscription``; ``max_backlog`` split
        over them, at least 1 each)."""
        subscription: Subscription | MergedSubscription
        if queue.startswith("^"):
            streams = self._regex_streams(queue)
            if streams is not None:
                subscription = RegexSubscription(self, queue, streams, max_backlog, filter)
            else:
                subscription = Subscription(self, queue, max_backlog, filter)
        elif shards := self._view.shards_of(queue):
            subscription = PartitionedSubscription(self, queue, shards, max_backlog, filter)
        else:
            try:
                subscription = Subscription(self, queue, max_backlog, filter)
            except PartitionedQueue:
                # created since this client last asked: its shards, as the cluster has them now
                shards = self._view.learn_shards(self.cluster(), queue)
                if not shards:
                    raise
                subscription = PartitionedSubscription(self, queue, shards, max_backlog, filter)
        with self._lock:
            self._subscriptions = [s for s in self._subscriptions if not s.closed]
            self._subscriptions.append(subscription)
        return subscription

    def _regex_streams(self, regex: str) -> list[str] | None:
        """The queues a subscription to ``regex`` opens a stream on, from the cluster's queue
        list as a member says now; None for a coordinator alone (it resolves the regex itself,
        in one subscription) or when no member answers (the subscribe says why)."""
        if self._locate(regex) is None:
            return None
        return self._view.regex_streams(regex)

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
        once the broker has the message. ``PublishUncertain`` if the connection failed under
        it: it may or may not have reached Kafka.

        ``deliver_after`` (a UNIX time in seconds) or ``delay`` (seconds from now; not both)
        keeps the message from being delivered before then. It travels as the header
        ``deliver_after``: the absolute UNIX time in seconds as an ASCII decimal string, e.g.
        ``b"1763800000.250"``; a plain Kafka producer can set that header itself. ``ValueError``
        for both, a negative delay or a header of that name given as well."""
        request = publish_request(queue, data, key, headers, deliver_after, delay)
        return str(self._call("Publish", request, idempotent=False).bookmark)

    def browse(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[BrowsedMessage]:
        """The queue's available messages in delivery order, read-only: nothing is leased or
        changed. ``filter`` keeps only matching messages (e.g. ``"/qty > 100"``), ``limit`` at
        most that many. Raises ``UnknownQueue``, ``InvalidRequest`` for a bad filter."""
        check_limit(limit)
        reply = self._call("Browse", Browse(queue, filter, limit))
        return [BrowsedMessage.of(m) for m in reply.messages]

    def replay(
        self,
        queue: str,
        since: Since = None,
        until: datetime | float | None = None,
        *,
        follow: bool = False,
        filter: str | None = None,
    ) -> Generator[BrowsedMessage, None, None]:
        """Replay through the queue's name (AMPS's bookmark subscription to a queue): the
        records of its underlying topics as plain publish/subscribe, read-only. Nothing is
        leased or acked, and the queue's state (its messages, stats, changelog) is untouched.

        ``since``: a bookmark ``"topic/partition/offset"`` (that partition replays after it;
        give one per partition as a list, the partitions not named replay from their
        beginning), or a time (an aware ``datetime`` or epoch seconds), or None (from the
        beginning). ``until``: stop before records at or after this time. Without ``follow`` the
        replay ends at the end each partition had when it began; with it, it goes on (until
        ``until``, or until the iterator is closed). ``filter``: only the records it matches
        (payload fields, ``KEY()``, ``HEADER('name')``, ...). Each
        item is a ``BrowsedMessage`` (``deliveries`` 0; ``parse_error`` set for a payload that
        does not parse as the queue's type). Raises, while iterating, ``UnknownQueue``,
        ``InvalidRequest`` (a bad bookmark or filter), ``PermissionDenied``."""
        request = replay_request(queue, since, until, follow, filter)
        encode, decode = REPLAY_CODECS
        address = self._addresses.rotation()[0]
        method = self._channel(address).unary_stream(
            REPLAY_METHOD, request_serializer=encode.encode, response_deserializer=decode.decode
        )
        call = method(request, metadata=self._metadata)
        try:
            for reply in call:
                for m in reply.messages:
                    yield BrowsedMessage.of(m)
        except grpc.RpcError as exc:
            raise with_tls_hint(error_from_rpc(exc), self._tls) from exc
        finally:
            call.cancel()  # the server stops reading at once

    def ack_where(self, queue: str, filter: str, expire: bool = False) -> AckWhereResult:
        """Ack every deliverable message of the queue matching ``filter`` (with ``expire``:
        expire and dead-letter them instead), as no subscription in particular; durable when it
        returns. Messages leased to a subscription under strict leasing are skipped. Raises
        ``UnknownQueue``, ``InvalidRequest`` for a bad filter."""
        reply = self._call("AckWhere", AckWhere(queue, filter, expire))
        return AckWhereResult(reply.acked, reply.skipped)

    def dead_letters(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> list[DeadLetter]:
        """The queue's dead letters, decoded (reason, detail, counts, original bookmark, payload),
        in the order they were dead-lettered; those matching ``filter``, at most ``limit``.
        Read-only. Raises ``UnknownQueue``, ``InvalidRequest`` (no dead-letter topic, a bad
        filter)."""
        check_limit(limit)
        reply = self._call("DeadLetters", DeadLetters(queue, filter, limit))
        return list(reply.letters)

    def redrive(
        self, queue: str, filter: str | None = None, limit: int | None = None
    ) -> RedriveResult:
        """Move the queue's dead letters (those matching ``filter``, at most ``limit``) back
        into it: each is published again as a new message with fresh delivery counts, and
        recorded, so a dead letter is never redriven twice. Durable when it returns. Raises
        ``UnknownQueue``, ``InvalidRequest`` (no dead-letter topic, a bad filter)."""
        check_limit(limit)
        reply = self._call("Redrive", Redrive(queue, filter, limit))
        return RedriveResult(reply.moved, reply.already, reply.unmatched)

    def reload(self) -> ReloadResult:
        """Have the coordinator read its config file again and apply it, all or nothing. An
        admin call: where the coordinator has an ``admin_token``, this client's token must be
        it. Returns what it did (``applied`` False: something was refused and nothing changed;
        ``lines()`` is the summary); raises ``ConfigError`` for a file that does not load.
        Not retried on another address: each coordinator reads its own file."""
        reply = self._call("Reload", Reload(), idempotent=False)
        result: ReloadResult = reply.result
        return result

    def create_queue(self, options: Mapping[str, object]) -> QueueDefinitionInfo:
        """Define a queue for the whole cluster (an admin call): ``options`` is its
        ``[[queue]]`` table (``name`` and ``underlying_topic`` required), values as TOML has
        them. Returns once this
        coordinator serves it. Raises ``ConfigError`` as the config file's loading does,
        ``QueueExists``."""
        reply = self._call(
            "CreateQueue",
            CreateQueue({k: toml_literal(v) for k, v in options.items()}),
            idempotent=False,
        )
        return cast(QueueDefinitionInfo, reply.definition)

    def create_temporary_queue(
        self, name: str, underlying_topic: str, **options: object
    ) -> QueueDefinitionInfo:
        """A temporary queue over ``underlying_topic`` (e.g. this client's replies), with any
        other ``[[queue]]`` options: it needs ``consume`` on ``name``, not admin, and is
        deleted, with its state, once no subscription has been open on it for the
        coordinator's ``temporary_queue_grace`` (60 s): subscribe to it soon, and a client that
        reconnects within the grace keeps it. Raises as ``create_queue``."""
        table = {"underlying_topic": underlying_topic, **options}
        request = CreateTemporaryQueue(name, {k: toml_literal(v) for k, v in table.items()})
        reply = self._call("CreateTemporaryQueue", request, idempotent=False)
        return cast(QueueDefinitionInfo, reply.definition)

    def alter_queue(self, name: str, options: Mapping[str, object]) -> QueueDefinitionInfo:
        """New values of a queue's options (an admin call); live once it returns. Raises
        ``ConfigError`` for an invalid value or an option that cannot change live (nothing
        changes), ``UnknownQueue``."""
        reply = self._call(
            "AlterQueue",
            AlterQueue(name, {k: toml_literal(v) for k, v in options.items()}),
            idempotent=False,
        )
        return cast(QueueDefinitionInfo, reply.definition)

    def delete_queue(self, name: str, force: bool = False) -> None:
        """Delete a queue for the whole cluster (an admin call). Raises ``QueueBusy`` while it
        has leased messages unless ``force``, ``UnknownQueue``."""
        self._call("DeleteQueue", DeleteQueue(name, force), idempotent=False)

    def queue_definitions(self) -> list[QueueDefinitionInfo]:
        """The cluster's queue definitions (those this client may browse)."""
        return list(self._call("ListDefinitions", ListDefinitions()).definitions)

    def cluster(self) -> ClusterInfo:
        """The cluster: its members with their addresses and the member serving each queue
        (a coordinator alone: itself, serving every queue)."""
        return cast(ClusterInfo, self._call("Cluster", ClusterRequest()))

    def _probe(self, address: str) -> grpc.StatusCode | None:
        """A health check of the member at ``address`` (``PROBE_S``): None if it answered,
        else how the call ended."""
        method = self._channel(address).unary_unary(
            HEALTH_METHOD,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        try:
            method(health_pb2.HealthCheckRequest(), timeout=PROBE_S)
        except grpc.RpcError as exc:
            return cast(grpc.StatusCode, exc.code())
        return None

    def _ask(self, address: str) -> Any:
        """A ``Cluster`` call to ``address`` under way (a future of its answer)."""
        encode, decode = UNARY_METHODS["Cluster"]
        method = self._channel(address).unary_unary(
            SERVICE + "Cluster",
            request_serializer=encode.encode,
            response_deserializer=decode.decode,
        )
        return method.future(ClusterRequest(), metadata=self._metadata, timeout=ASK_S)

    def _locate(self, queue: str, first: str | None = None, only: bool = False) -> Located | None:
        """Ask the members (``first`` first; ``only``: that one alone) where ``queue`` is
        served; the first answer is learned and returned (None: no member answered)."""
        order = self._addresses.rotation()
        if first is not None:
            order = [first] if only else [first, *(a for a in order if a != first)]
        method_name = SERVICE + "Cluster"
        encode, decode = UNARY_METHODS["Cluster"]
        for address in order:
            method = self._channel(address).unary_unary(
                method_name, request_serializer=encode.encode, response_deserializer=decode.decode
            )
            try:
                info = method(
                    ClusterRequest(), metadata=self._metadata, timeout=self._locate_timeout
                )
            except grpc.RpcError as exc:
                log.debug("cluster call to %s failed: %s", address, error_from_rpc(exc))
                continue
            return self._view.locate(cast(ClusterInfo, info), address, queue)
        self._view.asked = True
        return None

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Stats of one queue, or of every queue (a cluster member: of the cluster, without
        those of members that did not answer: see ``cluster_stats``)."""
        return list(self._call("Stats", Stats(queue)).queues)

    def cluster_stats(self) -> ClusterStats:
        """Stats of every queue (of the cluster, each from its owner, with ``owner`` set) and
        ``missing``: the queues whose owner did not answer or refused, with the reason."""
        reply = self._call("Stats", Stats(None))
        return ClusterStats(list(reply.queues), list(reply.missing))

    def queues(self) -> list[QueueInfo]:
        """The configured queues."""
        return list(self._call("ListQueues", ListQueues()).queues)

    def _call(self, name: str, request: Any, idempotent: bool = True) -> Any:
        encode, decode = UNARY_METHODS[name]
        error: QLayerError | None = None
        for address in self._addresses.rotation():
            method = self._channel(address).unary_unary(
                SERVICE + name,
                request_serializer=encode.encode,
                response_deserializer=decode.decode,
            )
            try:
                return method(request, metadata=self._metadata, timeout=self._timeout)
            except grpc.RpcError as exc:
                error = with_tls_hint(error_from_rpc(exc), self._tls)
                raised = unary_failure(error, address, self._addresses, self._policy, idempotent)
                if raised is not None:
                    raise raised from exc
        assert error is not None
        raise error

    def close(self) -> None:
        with self._lock:
            subscriptions, self._subscriptions = self._subscriptions, []
        for subscription in subscriptions:
            subscription.close()
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# the merged faces of several streams (imported last: they build on Subscription)
from layer.client.partitioned import (  # noqa: E402
    MergedSubscription,
    PartitionedSubscription,
    RegexSubscription,
)
