"""The gRPC server (grpc.aio) in front of a ``QueueService``.

Service ``qlayer.v1.QueueService`` of ``layer/api/proto/qlayer/v1/queue.proto`` (the wire
reference; ``layer.api.frames`` is its codec), beside ``grpc.health.v1.Health`` and server
reflection (``grpc.reflection.v1alpha``, so ``grpcurl`` can list and call it):

- ``Subscribe`` (bidirectional stream): the client sends Subscribe (with an optional content
  filter), then Ack batches and Replace requests, and finally Close; the server answers
  Subscribed, then Messages batches, one AckResult per Ack and one Replaced (or an Error with the
  same request id) per Replace. A refused Replace leaves the subscription as it was and the
  stream open. However the stream ends (Close, client cancel, dropped connection, server stop),
  the subscription is closed exactly once, which returns the consumer's leases at once.
  Acks arrive as runs of offsets per partition and go to ``Subscription.ack`` as they are: no
  object per acked message.
- ``Publish``, ``Stats``, ``ListQueues``, ``Browse``, ``AckWhere``, ``Redrive``,
  ``DeadLetters`` (unary).
- ``Replay`` (server streaming, browse right): the queue's underlying topics from a bookmark
  or a time, as plain publish/subscribe (``layer.coordinator.replay``); nothing is leased.
- ``Reload`` (unary, admin): read the config file (and the tokens file) again and apply it
  (``ReloadReply``); a file that does not load is INVALID_ARGUMENT.

Access (``layer.api.access``): every call is first authenticated (a bearer token, or with
mutual TLS the client certificate's subject; UNAUTHENTICATED otherwise), then checked in one
place, ``_check``, against ``RPC_RIGHTS`` on the queue the request names (PERMISSION_DENIED
``permission_denied`` naming the principal, the right and the queue). A Replace on a stream is
checked like a Subscribe and refused with an Error frame. When a new tokens file is applied,
every open stream is checked again, and one whose principal lost ``consume`` ends with
PERMISSION_DENIED (its leases return).

A subscription whose queue a reload removes ends with NOT_FOUND, its message naming the queue.

Errors map to gRPC status codes and qlayer codes by one table (``layer.api.errors``): e.g.
UnknownQueue -> NOT_FOUND ``unknown_queue``, InvalidRequest (a bad filter expression included)
-> INVALID_ARGUMENT, BrokerError -> UNAVAILABLE ``unavailable``; the code travels in the trailing
metadata ``qlayer-error-code``. A missing or wrong bearer token -> UNAUTHENTICATED; on the stream
a refused Replace gets an Error frame with the code of the exception that refused it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, TypeVar

import grpc

from layer.api.access import RPC_RIGHTS, Access, Principal, Right
from layer.api.deliveries import DeliveryBatch
from layer.api.errors import CODE_METADATA_KEY, ErrorCode, code_of, status_of
from layer.api.frames import (
    ACK_WHERE_CODEC,
    ACK_WHERE_REPLY_CODEC,
    ALTER_QUEUE_CODEC,
    BROWSE_CODEC,
    BROWSE_REPLY_CODEC,
    CLIENT_FRAME_CODEC,
    CLUSTER_CODEC,
    CLUSTER_REPLY_CODEC,
    CREATE_QUEUE_CODEC,
    CREATE_TEMPORARY_QUEUE_CODEC,
    DEAD_LETTERS_CODEC,
    DEAD_LETTERS_REPLY_CODEC,
    DEFINITION_LIST_CODEC,
    DEFINITION_REPLY_CODEC,
    DELETE_QUEUE_CODEC,
    DELETE_QUEUE_REPLY_CODEC,
    LIST_DEFINITIONS_CODEC,
    LIST_QUEUES_CODEC,
    PUBLISH_CODEC,
    PUBLISHED_CODEC,
    QUEUE_LIST_CODEC,
    REDRIVE_CODEC,
    REDRIVE_REPLY_CODEC,
    RELOAD_CODEC,
    RELOAD_REPLY_CODEC,
    REPLAY_CODEC,
    REPLAY_REPLY_CODEC,
    SERVER_FRAME_CODEC,
    SERVICE_NAME,
    STATS_CODEC,
    STATS_REPLY_CODEC,
    Ack,
    AckResult,
    AckWhere,
    AckWhereReply,
    AlterQueue,
    Batch,
    Browse,
    BrowseReply,
    Check,
    Checked,
    Close,
    ClusterRequest,
    CreateQueue,
    CreateTemporaryQueue,
    DeadLetters,
    DeadLettersReply,
    DefinitionList,
    DefinitionReply,
    DeleteQueue,
    DeleteQueueReply,
    Error,
    FrameCodec,
    ListDefinitions,
    ListQueues,
    Messages,
    Publish,
    Published,
    QueueList,
    Redrive,
    RedriveReply,
    Reload,
    ReloadReply,
    Replace,
    Replaced,
    Replay,
    ReplayReply,
    Stats,
    StatsReply,
    Subscribe,
    Subscribed,
)
from layer.api.service import (
    AckFailure,
    ClusterInfo,
    DeliveredMessage,
    QueueService,
    Subscription,
)
from layer.exceptions import (
    CommitUncertain,
    ConfigError,
    PermissionDenied,
    QLayerError,
    SerializationError,
    Unauthenticated,
)

if TYPE_CHECKING:
    from grpc_health.v1 import health_pb2_grpc

__all__ = ["SERVICE_NAME", "ApiServer"]

log = logging.getLogger(__name__)

# The calls that need their right on every queue (a grant on "*"): they change the cluster.
_CLUSTER_ADMIN = {
    "Reload": "reload",
    "CreateQueue": "queue create",
    "AlterQueue": "queue alter",
    "DeleteQueue": "queue delete",
}

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# A delivery gate that took this long held the push (it answers at once otherwise).
_HELD_S = 0.1
# A Messages frame is cut once its payload passes this, well under MAX_MESSAGE_BYTES.
_FRAME_PAYLOAD_BYTES = 4 * 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Malformed:
    """A request that did not decode. The deserializer returns it instead of raising, because a
    raising deserializer makes grpc end the call with INTERNAL; the handler decides instead."""

    reason: str


def _lenient(codec: FrameCodec[T]) -> Callable[[bytes], T | _Malformed]:
    def decode(data: bytes) -> T | _Malformed:
        try:
            return codec.decode(data)
        except SerializationError as exc:
            return _Malformed(str(exc))

    return decode


@dataclass(frozen=True, slots=True)
class _SinkClosed:
    reason: str
    error: QLayerError | None = None  # the stream fails with its status (else UNAVAILABLE)


class _End:
    """The stream should finish (the client sent Close or stopped sending)."""


_END = _End()
_Outgoing = (
    DeliveryBatch
    | list[DeliveredMessage]
    | AckResult
    | Error
    | Replaced
    | Checked
    | _SinkClosed
    | _End
)


#: (queue, stage, seconds, messages): a latency stage timed here (layer.coordinator.stages)
PushTimer = Callable[[str, str, float, int], None]

#: awaited before messages are written: True, write them; False, drop them (the service no
#: longer owns what it decided to push, e.g. a cluster member that lost its session)
DeliveryGate = Callable[[], Awaitable[bool]]

#: awaited for a client's Check of a Messages frame decided at ``made_at`` (``time.monotonic``
#: here): True, its messages are still the service's to deliver; False, the client drops them
DeliveryCheck = Callable[[float], Awaitable[bool]]

#: asked at each Subscribe: how old a frame must be, by the client's bound, for the client to
#: Check it (0: never)
StaleAfter = Callable[[], float]


class _StreamSink:
    """The DeliverySink of one stream: everything to write goes through one queue, so the
    stream's single writer sends it in order and batches what piled up meanwhile."""

    def __init__(self, pushed: PushTimer | None = None) -> None:
        self._out: asyncio.Queue[_Outgoing] = asyncio.Queue()
        self.unsent = 0  # messages delivered here and not yet written (see DeliverySink)
        self._pushed = pushed
        # (wall clock delivered, messages of that delivery not written yet), oldest first
        self._delivered_at: deque[list[float]] = deque()

    def deliver(self, messages: Sequence[DeliveredMessage]) -> None:
        if messages:
            self.unsent += len(messages)
            self._out.put_nowait(
                messages if isinstance(messages, DeliveryBatch) else list(messages)
            )
            if self._pushed is not None:
                self._delivered_at.append([time.time(), float(len(messages))])

    def sent(self, messages: Sequence[DeliveredMessage], writing: float) -> None:
        """These messages are written to the transport, a write begun at ``writing`` (wall
        clock; the stages end there: when the write's await returns, the client may have had
        them for a while on a busy loop)."""
        count = len(messages)
        self.unsent -= count
        if self._pushed is None or not count:
            return
        # timed per frame: the time since each delivery it carries, and the whole way from
        # the Kafka timestamp of its first and last message
        now = writing
        queue = messages[0].queue
        marks = self._delivered_at
        left = count
        while left > 0 and marks:
            mark = marks[0]
            n = min(left, int(mark[1]))
            self._pushed(queue, "push", now - mark[0], n)
            left -= n
            mark[1] -= n
            if mark[1] <= 0:
                marks.popleft()
        ends = (messages[0],) if count == 1 else (messages[0], messages[-1])
        for m in ends:
            if m.timestamp_ms > 0:
                self._pushed(queue, "server", now - m.timestamp_ms / 1000.0, count // len(ends))

    def dropped(self, messages: Sequence[DeliveredMessage]) -> None:
        """These messages are never written (the gate refused them)."""
        left = len(messages)
        self.unsent -= left
        marks = self._delivered_at
        while left > 0 and marks:
            n = min(left, int(marks[0][1]))
            left -= n
            marks[0][1] -= n
            if marks[0][1] <= 0:
                marks.popleft()

    def close(self, reason: str, error: QLayerError | None = None) -> None:
        self._out.put_nowait(_SinkClosed(reason, error))

    def send(self, frame: AckResult | Error | Replaced | Checked) -> None:
        self._out.put_nowait(frame)

    def finish(self) -> None:
        self._out.put_nowait(_END)

    async def take(self, linger: bool = False) -> list[_Outgoing]:
        """What is there to write, waiting for the first. ``linger``: one turn of the event
        loop after it, so what was scheduled with it joins it (a round hands out its
        deliveries, then answers its acks: their AckResults come a turn later)."""
        items = [await self._out.get()]
        if linger:
            await asyncio.sleep(0)
        while not self._out.empty():
            items.append(self._out.get_nowait())
        return items


def _payload_size(message: DeliveredMessage) -> int:
    size = 64 + len(message.key or b"") + len(message.value or b"")
    headers = message.headers
    return size + sum(len(k) + len(v or b"") for k, v in headers) if headers else size


_KEY_OF = attrgetter("key")
_VALUE_OF = attrgetter("value")
_HEADERS_OF = attrgetter("headers")


def _batch_size(messages: list[DeliveredMessage]) -> int:
    """The sum of ``_payload_size`` over ``messages``, summed a field at a time (C loops over
    the batch; Python per message only for those with headers)."""
    size = 64 * len(messages)
    size += sum(map(len, filter(None, map(_VALUE_OF, messages))))
    size += sum(map(len, filter(None, map(_KEY_OF, messages))))
    for headers in filter(None, map(_HEADERS_OF, messages)):
        size += sum(len(k) + len(v or b"") for k, v in headers)
    return size


def _joined(items: list[DeliveryBatch | list[DeliveredMessage]]) -> Sequence[DeliveredMessage]:
    """The messages of what piled up for a write, in order: one DeliveryBatch when they all
    are batches of one queue (the rounds of a subscription to one queue), else a list."""
    if len(items) == 1 and isinstance(items[0], DeliveryBatch):
        return items[0]
    batches = [item for item in items if isinstance(item, DeliveryBatch)]
    if len(batches) == len(items) and all(b.queue == batches[0].queue for b in batches):
        return DeliveryBatch.join(batches)
    return [m for item in items for m in item]


def _message_frames(
    messages: Sequence[DeliveredMessage], columns: bool = False, common: bool = False
) -> list[Messages]:
    """``messages`` as Messages frames, a frame cut once its payload passes
    ``_FRAME_PAYLOAD_BYTES``: one frame, measured per batch, when the whole batch is under it
    (what a round hands a subscription almost always is)."""
    if not messages:
        return []
    if isinstance(messages, DeliveryBatch):
        if messages.payload_size() < _FRAME_PAYLOAD_BYTES:
            return [Messages(messages, columns, common=common)]
        return [
            Messages(piece, columns, common=common) for piece in messages.cut(_FRAME_PAYLOAD_BYTES)
        ]
    messages = list(messages)
    if _batch_size(messages) < _FRAME_PAYLOAD_BYTES:
        return [Messages(messages, columns)]
    frames: list[Messages] = []
    batch: list[DeliveredMessage] = []
    size = 0
    for message in messages:
        batch.append(message)
        size += _payload_size(message)
        if size >= _FRAME_PAYLOAD_BYTES:
            frames.append(Messages(batch, columns))
            batch, size = [], 0
    if batch:
        frames.append(Messages(batch, columns))
    return frames


def _status_of(exc: BaseException) -> grpc.StatusCode:
    return status_of(exc)


def _error_code_of(exc: BaseException) -> ErrorCode:
    """The code of the Error frame that refuses a stream request (a Replace)."""
    return code_of(exc)


async def _refuse(context: grpc.aio.ServicerContext, exc: QLayerError) -> NoReturn:
    """End the call with ``exc``'s status, its code in the trailing metadata."""
    await context.abort(
        _status_of(exc), str(exc), trailing_metadata=((CODE_METADATA_KEY, code_of(exc).value),)
    )
    raise AssertionError("context.abort returned")  # it always raises


def _credentials(context: grpc.aio.ServicerContext) -> tuple[str | None, str | None]:
    """(the ``authorization`` metadata value, the verified client certificate's subject), each
    None when absent. Two authorization values are refused rather than one picked."""
    values = [v for k, v in context.invocation_metadata() or () if k == "authorization"]
    if len(values) > 1:
        raise Unauthenticated("more than one authorization metadata value")
    authorization = None
    if values:
        value = values[0]
        authorization = value.decode("latin-1") if isinstance(value, bytes) else str(value)
    subjects = (context.auth_context() or {}).get("x509_subject") or []
    subject = subjects[0].decode("utf-8", "replace") if subjects else None
    return authorization, subject


async def _abort(
    context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str
) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("context.abort returned")  # it always raises


@dataclass(slots=True)
class _Watched:
    """An open stream as access control sees it: who opened it, on what queue (or regex)."""

    principal: Principal
    queue: str
    sink: _StreamSink


class _Closer:
    """Closes a subscription exactly once, from whichever path notices the end first."""

    def __init__(self, subscription: Subscription, open_: set[_Closer]) -> None:
        self._subscription = subscription
        self._open = open_
        self._task: asyncio.Task[None] | None = None
        # Captured now: grpc may run the done callback outside a running-loop context.
        self._loop = asyncio.get_running_loop()
        open_.add(self)

    def close(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = self._loop.create_task(self._close())
        return self._task

    async def _close(self) -> None:
        try:
            await self._subscription.close()
        except Exception:
            log.exception("closing subscription failed subscription=%s", self._subscription.id)
        else:
            log.debug("subscription closed subscription=%s", self._subscription.id)
        finally:
            self._open.discard(self)


def bind_error(listen: str, error: Exception) -> str:
    """Why grpc could not listen on ``listen``, in the words of the errno where a plain bind
    gets one (grpc's own error says only "Failed to bind" and sends the reason to its log):
    "Address already in use", "Cannot assign requested address", ...; else grpc's words."""
    host, _, port = listen.rpartition(":")
    try:
        infos = socket.getaddrinfo(host.strip("[]") or None, int(port), type=socket.SOCK_STREAM)
        family, kind, proto, _, where = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as grpc binds
            probe.bind(where)
    except socket.gaierror as exc:  # the host does not resolve
        return str(exc.strerror)
    except OSError as exc:
        if exc.errno and exc.errno > 0:
            return os.strerror(exc.errno)
    except (ValueError, IndexError):
        pass
    return str(error).split(";")[0]


class ApiServer:
    """Serves a ``QueueService`` over gRPC.

    ``listen`` is ``host:port`` (port 0 picks a free one; ``start`` returns it). ``access``
    decides who may call what (``layer.api.access``); without it, one is made of ``auth_token``
    (every call needs metadata ``authorization: Bearer <token>``) and ``admin_token`` (admin
    calls such as Reload need that one). ``tls`` is ``(certificate_chain_pem,
    private_key_pem)``; with ``tls_client_ca`` (PEM) too, clients must present a certificate
    signed by it, whose subject identifies callers without a token. The keepalive settings
    make a vanished peer (crashed host, cut network) end its streams within
    ``keepalive_time_s + keepalive_timeout_s``; a killed process is noticed at once through
    its closed socket. ``delivery_gate`` is awaited before each write of messages (a cluster
    member holds its pushes while it may have lost its session, and drops them once lost).
    Each Messages frame is stamped with the time it was decided; a client that got one late
    (older than ``stale_after()``, told in Subscribed) asks with Check, and ``delivery_check``
    answers whether that frame is still the service's to deliver.
    """

    def __init__(
        self,
        service: QueueService,
        listen: str = "127.0.0.1:7070",
        auth_token: str | None = None,
        tls: tuple[bytes, bytes] | None = None,
        *,
        admin_token: str | None = None,
        access: Access | None = None,
        tls_client_ca: bytes | None = None,
        keepalive_time_s: float = 5.0,
        keepalive_timeout_s: float = 5.0,
        health: health_pb2_grpc.HealthServicer | None = None,
        delivery_gate: DeliveryGate | None = None,
        delivery_check: DeliveryCheck | None = None,
        stale_after: StaleAfter | None = None,
    ) -> None:
        self._service = service
        self._gate = delivery_gate
        self._delivery_check = delivery_check
        self._stale_after = stale_after
        self._health = health  # grpc.health.v1, registered beside ours (no token needed)
        self._listen = listen
        if tls_client_ca is not None and tls is None:
            raise ConfigError("a client CA (mutual TLS) needs tls_cert and tls_key too")
        self._access = access or Access(
            auth_token=auth_token, admin_token=admin_token, mutual_tls=tls_client_ca is not None
        )
        self._tls = tls
        self._client_ca = tls_client_ca
        self._options = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", int(keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(keepalive_timeout_s * 1000)),
            # grpc (1.85) times out an unanswered keepalive ping by this (default 60 s), not
            # by the keepalive timeout alone; without it a silent peer lingers for a minute.
            ("grpc.http2.ping_timeout_ms", int(keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # Our clients ping every 10 s; accept pings that often without a GOAWAY.
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
            # grpc sets SO_REUSEPORT by default: a second coordinator given a port that one
            # already listens on would start without a word, and the kernel would split new
            # connections between the two. Without it the second one is refused.
            ("grpc.so_reuseport", 0),
        ]
        self._server: grpc.aio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # acks in flight
        self._unclosed: set[_Closer] = set()  # one per subscription not closed yet
        # open streams, checked again whenever a new tokens file is applied
        self._streams: dict[_Closer, _Watched] = {}
        self._access.on_change(self._recheck_streams)
        self.port: int | None = None

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("ApiServer already started")
        # the health and reflection servicers (descriptor pools, generated stubs) load with the
        # first server started, not with every importer of this module
        from grpc_health.v1 import health_pb2_grpc
        from grpc_reflection.v1alpha import reflection

        server = grpc.aio.server(options=self._options)
        server.add_generic_rpc_handlers((self._handler(),))
        services = [SERVICE_NAME, reflection.SERVICE_NAME]
        if self._health is not None:
            health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
            services.append("grpc.health.v1.Health")
        # Reflection needs no token either: it tells what queue.proto tells, nothing more.
        reflection.enable_server_reflection(services, server)
        try:
            if self._tls is None:
                port = server.add_insecure_port(self._listen)
            else:
                cert, key = self._tls
                creds = grpc.ssl_server_credentials(
                    [(key, cert)],
                    root_certificates=self._client_ca,
                    require_client_auth=self._client_ca is not None,
                )
                port = server.add_secure_port(self._listen, creds)
        except RuntimeError as exc:
            reason = bind_error(self._listen, exc)
            raise ConfigError(f"cannot listen on {self._listen}: {reason}") from exc
        if not port:
            raise ConfigError(f"cannot listen on {self._listen}")
        await server.start()
        self._server, self.port = server, port
        log.info(
            "api server listening address=%s port=%d tls=%s mutual_tls=%s",
            self._listen,
            port,
            bool(self._tls),
            self._client_ca is not None,
        )
        return port

    async def stop(self, grace: float | None = 5.0) -> None:
        """Stop accepting calls, give running ones ``grace`` seconds, then cancel them (each
        subscription is closed on the way out)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        await server.stop(grace)
        # The handlers were cancelled but may not have run their cleanup yet: close every
        # subscription here, so that when stop returns every lease has been given back.
        closing = [closer.close() for closer in list(self._unclosed)]
        if closing:
            await asyncio.wait(closing)
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace)
        for task in list(self._tasks):
            task.cancel()
        log.info("api server stopped port=%s", self.port)

    # Every call of qlayer.v1.QueueService: its handler method and codecs (the request's is
    # lenient: see _Malformed). Each handler authenticates and calls _check with RPC_RIGHTS.
    _METHODS: ClassVar[dict[str, tuple[str, FrameCodec[Any], FrameCodec[Any]]]] = {
        "Subscribe": ("_subscribe", CLIENT_FRAME_CODEC, SERVER_FRAME_CODEC),
        "Publish": ("_publish", PUBLISH_CODEC, PUBLISHED_CODEC),
        "Stats": ("_stats", STATS_CODEC, STATS_REPLY_CODEC),
        "ListQueues": ("_list_queues", LIST_QUEUES_CODEC, QUEUE_LIST_CODEC),
        "Browse": ("_browse", BROWSE_CODEC, BROWSE_REPLY_CODEC),
        "AckWhere": ("_ack_where", ACK_WHERE_CODEC, ACK_WHERE_REPLY_CODEC),
        "DeadLetters": ("_dead_letters", DEAD_LETTERS_CODEC, DEAD_LETTERS_REPLY_CODEC),
        "Redrive": ("_redrive", REDRIVE_CODEC, REDRIVE_REPLY_CODEC),
        "Reload": ("_reload", RELOAD_CODEC, RELOAD_REPLY_CODEC),
        "CreateQueue": ("_create_queue", CREATE_QUEUE_CODEC, DEFINITION_REPLY_CODEC),
        "AlterQueue": ("_alter_queue", ALTER_QUEUE_CODEC, DEFINITION_REPLY_CODEC),
        "DeleteQueue": ("_delete_queue", DELETE_QUEUE_CODEC, DELETE_QUEUE_REPLY_CODEC),
        "ListDefinitions": ("_list_definitions", LIST_DEFINITIONS_CODEC, DEFINITION_LIST_CODEC),
        "Cluster": ("_cluster", CLUSTER_CODEC, CLUSTER_REPLY_CODEC),
        "CreateTemporaryQueue": (
            "_create_temporary_queue",
            CREATE_TEMPORARY_QUEUE_CODEC,
            DEFINITION_REPLY_CODEC,
        ),
        "Replay": ("_replay", REPLAY_CODEC, REPLAY_REPLY_CODEC),
    }

    def _handler(self) -> grpc.GenericRpcHandler:
        handlers = {}
        for rpc, (method, request, reply) in self._METHODS.items():
            make = (
                grpc.stream_stream_rpc_method_handler
                if rpc == "Subscribe"
                else grpc.unary_stream_rpc_method_handler
                if rpc == "Replay"
                else grpc.unary_unary_rpc_method_handler
            )
            handlers[rpc] = make(
                getattr(self, method),
                request_deserializer=_lenient(request),
                response_serializer=reply.encode,
            )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    # --- helpers ------------------------------------------------------------------------------

    @property
    def access(self) -> Access:
        return self._access

    async def _caller(self, context: grpc.aio.ServicerContext) -> Principal:
        """Who is calling (UNAUTHENTICATED, with a message that never repeats the token, for a
        missing, malformed or unknown credential)."""
        try:
            return self._access.authenticate(*_credentials(context))
        except Unauthenticated as exc:
            await _abort(context, grpc.StatusCode.UNAUTHENTICATED, str(exc))

    async def _check(
        self, context: grpc.aio.ServicerContext, principal: Principal, rpc: str, queue: str | None
    ) -> None:
        """The one check of every call: ``RPC_RIGHTS[rpc]`` on the queue the request names.
        ``queue`` None (Stats of all queues, ListQueues) is checked per queue by the call
        itself: it answers only the queues the principal may browse."""
        if self._access.open:
            return  # nothing configured: every caller has every right
        right = RPC_RIGHTS[rpc]
        try:
            if rpc in _CLUSTER_ADMIN:
                self._access.authorize_everywhere(principal, right, _CLUSTER_ADMIN[rpc])
            elif queue is not None:
                for name in self._queues_named(queue):
                    self._access.authorize(principal, right, name)
        except PermissionDenied as exc:
            await _refuse(context, exc)

    def _recheck_streams(self) -> None:
        """A new tokens file: end the streams whose principal lost ``consume`` on their queue
        (or is gone), with PERMISSION_DENIED; their leases return. The others go on."""
        for watched in list(self._streams.values()):
            current = self._access.current(watched.principal)
            try:
                if current is None:
                    raise PermissionDenied(
                        f"principal {watched.principal.name!r} is no longer in the tokens file"
                    )
                for name in self._queues_named(watched.queue):
                    self._access.authorize(current, RPC_RIGHTS["Subscribe"], name)
            except PermissionDenied as exc:
                watched.sink.close("permission revoked", exc)
            else:
                watched.principal = current

    def _queues_named(self, queue: str) -> list[str]:
        """The queues a request's ``queue`` names: itself, or for a regex (``^...``, as
        Subscribe and Replace take) every configured queue it matches."""
        if not queue.startswith("^"):
            return [queue]
        try:
            pattern = re.compile(queue)
        except re.error:
            return []  # the service refuses it with INVALID_ARGUMENT
        return [q.name for q in self._service.queues() if pattern.search(q.name)]

    @staticmethod
    async def _request(context: grpc.aio.ServicerContext, request: object, kind: type[T]) -> T:
        if isinstance(request, _Malformed):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, request.reason)
        if not isinstance(request, kind):
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"expected {kind.__name__} request"
            )
        return request

    async def _admitted(
        self, context: grpc.aio.ServicerContext, request: object, kind: type[T], rpc: str
    ) -> tuple[Principal, T]:
        """A unary call's caller and request, once authenticated, well-formed and allowed
        (``RPC_RIGHTS[rpc]`` on the queue the request names, if it names one)."""
        principal = await self._caller(context)
        req = await self._request(context, request, kind)
        await self._check(context, principal, rpc, getattr(req, "queue", None))
        return principal, req

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- unary calls --------------------------------------------------------------------------

    async def _publish(self, request: object, context: grpc.aio.ServicerContext) -> Published:
        _, req = await self._admitted(context, request, Publish, "Publish")
        try:
            bookmark = await self._service.publish(req.queue, req.value, req.key, req.headers)
        except QLayerError as exc:
            await _refuse(context, exc)
        return Published(bookmark)

    async def _stats(self, request: object, context: grpc.aio.ServicerContext) -> StatsReply:
        principal, req = await self._admitted(context, request, Stats, "Stats")
        if req.queue is None:
            # every queue (of the cluster, from their owners): only those the caller may browse
            report = await self._service.cluster_stats()
            allowed = [s for s in report.queues if principal.allows(Right.BROWSE, s.queue)]
            missing = []
            for m in report.missing:
                shown = [q for q in m.queues if principal.allows(Right.BROWSE, q)]
                if shown:
                    missing.append(replace(m, queues=shown))
            return StatsReply(allowed, missing)
        try:
            stats = await self._service.stats(req.queue)
        except QLayerError as exc:
            await _refuse(context, exc)
        return StatsReply(list(stats))

    async def _list_queues(self, request: object, context: grpc.aio.ServicerContext) -> QueueList:
        principal, _ = await self._admitted(context, request, ListQueues, "ListQueues")
        try:
            queues = self._service.queues()
        except QLayerError as exc:
            await _refuse(context, exc)
        return QueueList([q for q in queues if principal.allows(Right.BROWSE, q.name)])

    async def _browse(self, request: object, context: grpc.aio.ServicerContext) -> BrowseReply:
        _, req = await self._admitted(context, request, Browse, "Browse")
        try:
            messages = await self._service.browse(req.queue, req.filter, req.limit)
        except QLayerError as exc:
            await _refuse(context, exc)
        return BrowseReply(list(messages))

    async def _ack_where(self, request: object, context: grpc.aio.ServicerContext) -> AckWhereReply:
        _, req = await self._admitted(context, request, AckWhere, "AckWhere")
        try:
            result = await self._service.ack_where(req.queue, req.filter, req.expire)
        except QLayerError as exc:
            await _refuse(context, exc)
        return AckWhereReply(result.acked, result.skipped)

    async def _redrive(self, request: object, context: grpc.aio.ServicerContext) -> RedriveReply:
        _, req = await self._admitted(context, request, Redrive, "Redrive")
        if req.limit is not None and req.limit < 0:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, f"limit must be >= 0, got {req.limit}"
            )
        try:
            result = await self._service.redrive(req.queue, req.filter, req.limit)
        except QLayerError as exc:
            await _refuse(context, exc)
        return RedriveReply(result.moved, result.already, result.unmatched)

    async def _dead_letters(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> DeadLettersReply:
        _, req = await self._admitted(context, request, DeadLetters, "DeadLetters")
        try:
            letters = await self._service.dead_letters(req.queue, req.filter, req.limit)
        except QLayerError as exc:
            await _refuse(context, exc)
        return DeadLettersReply(letters)

    async def _replay(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ReplayReply]:
        """Server streaming: batches of replayed records, each cut to frames of a few MiB. A
        refusal (or a broker failure midway) ends the call with its status; the client going
        away closes the stream, whose reader then stops."""
        _, req = await self._admitted(context, request, Replay, "Replay")
        stream = self._service.replay(
            req.queue, req.since_bookmarks, req.since_ms, req.until_ms, req.follow, req.filter
        )
        try:
            async for batch in stream:
                for frame in _message_frames(batch):
                    yield ReplayReply(list(frame.messages))
        except QLayerError as exc:
            await _refuse(context, exc)
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def _reload(self, request: object, context: grpc.aio.ServicerContext) -> ReloadReply:
        await self._admitted(context, request, Reload, "Reload")
        try:
            # the tokens file first, applied only once the config reload went through: a
            # file that does not load refuses the reload and nothing changes
            policy = self._access.read()
            # shielded: a caller that hangs up does not stop a reload half way
            result = await asyncio.shield(self._service.reload())
            self._access.apply(policy)
        except QLayerError as exc:  # a file that does not load: ConfigError, INVALID_ARGUMENT
            await _refuse(context, exc)
        return ReloadReply(result)

    async def _create_queue(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> DefinitionReply:
        principal, req = await self._admitted(context, request, CreateQueue, "CreateQueue")
        try:
            info = await asyncio.shield(self._service.create_queue(req.options, principal.name))
        except QLayerError as exc:
            await _refuse(context, exc)
        return DefinitionReply(info)

    async def _create_temporary_queue(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> DefinitionReply:
        principal, req = await self._admitted(
            context, request, CreateTemporaryQueue, "CreateTemporaryQueue"
        )
        try:
            info = await asyncio.shield(
                self._service.create_temporary_queue(req.queue, req.options, principal.name)
            )
        except QLayerError as exc:
            await _refuse(context, exc)
        return DefinitionReply(info)

    async def _alter_queue(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> DefinitionReply:
        principal, req = await self._admitted(context, request, AlterQueue, "AlterQueue")
        try:
            info = await asyncio.shield(
                self._service.alter_queue(req.name, req.options, principal.name)
            )
        except QLayerError as exc:
            await _refuse(context, exc)
        return DefinitionReply(info)

    async def _delete_queue(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> DeleteQueueReply:
        principal, req = await self._admitted(context, request, DeleteQueue, "DeleteQueue")
        try:
            await asyncio.shield(self._service.delete_queue(req.name, req.force, principal.name))
        except QLayerError as exc:
            await _refuse(context, exc)
        return DeleteQueueReply()

    async def _list_definitions(
        self, request: object, context: grpc.aio.ServicerContext
    ) -> DefinitionList:
        principal, _ = await self._admitted(context, request, ListDefinitions, "ListDefinitions")
        found = self._service.definitions()
        return DefinitionList([d for d in found if principal.allows(Right.BROWSE, d.name)])

    async def _cluster(self, request: object, context: grpc.aio.ServicerContext) -> ClusterInfo:
        principal, _ = await self._admitted(context, request, ClusterRequest, "Cluster")
        info = await self._service.cluster_info()
        queues = [q for q in info.queues if principal.allows(Right.BROWSE, q.queue)]
        return replace(info, queues=queues)

    # --- the subscription stream --------------------------------------------------------------

    async def _subscribe(self, requests: object, context: grpc.aio.ServicerContext) -> None:
        # Read the first frame before refusing anything: failing the call while the client's
        # first write is in flight makes grpc report INTERNAL to it instead of our status.
        first = await context.read()
        principal = await self._caller(context)
        if first is grpc.aio.EOF:
            return
        if isinstance(first, _Malformed):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, first.reason)
        if not isinstance(first, Subscribe):
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"the first frame must be Subscribe, got {type(first).__name__}",
            )
        await self._check(context, principal, "Subscribe", first.queue)
        # a service that times its stages (the coordinator's ``record_stage``) gets the push
        sink = _StreamSink(getattr(self._service, "record_stage", None))
        subscription = await self._open(first, sink, context)
        closer = _Closer(subscription, self._unclosed)
        watched = self._streams[closer] = _Watched(principal, first.queue, sink)
        # Belt and braces: the finally below runs on cancellation too, but the done callback
        # also covers a handler that grpc tears down without resuming it.
        context.add_done_callback(lambda _: closer.close())
        reader: asyncio.Task[None] | None = None
        try:
            stale_after = self._stale_after() if self._stale_after is not None else 0.0
            await context.write(
                Subscribed(
                    subscription.id,
                    subscription.backlog,
                    subscription.lease_period_s,
                    time.monotonic(),
                    stale_after,
                )
            )
            log.debug(
                "subscribed queue=%s subscription=%s backlog=%d client=%s filter=%r",
                first.queue,
                subscription.id,
                subscription.backlog,
                first.client_name,
                first.filter,
            )
            reader = asyncio.get_running_loop().create_task(
                self._read_frames(context, subscription, sink, watched)
            )
            await self._write_frames(
                context,
                sink,
                first.batch_frames,
                first.message_columns,
                first.message_columns and first.common_columns,
            )
        finally:
            if reader is not None:
                reader.cancel()
            self._streams.pop(closer, None)
            await asyncio.shield(closer.close())

    async def _open(
        self, frame: Subscribe, sink: _StreamSink, context: grpc.aio.ServicerContext
    ) -> Subscription:
        # Shielded: if the call is cancelled while the service is subscribing, the subscription
        # it creates must still be closed, or its leases would stay with a client that is gone.
        pending = asyncio.ensure_future(
            self._service.subscribe(
                frame.queue, frame.max_backlog, sink, frame.client_name, filter=frame.filter
            )
        )
        try:
            return await asyncio.shield(pending)
        except asyncio.CancelledError:
            pending.add_done_callback(self._close_orphan)
            raise
        except QLayerError as exc:
            await _refuse(context, exc)

    def _close_orphan(self, pending: asyncio.Future[Subscription]) -> None:
        if not pending.cancelled() and pending.exception() is None:
            _Closer(pending.result(), self._unclosed).close()

    async def _read_frames(
        self,
        context: grpc.aio.ServicerContext,
        subscription: Subscription,
        sink: _StreamSink,
        watched: _Watched,
    ) -> None:
        try:
            while True:
                frame = await context.read()
                if frame is grpc.aio.EOF or isinstance(frame, Close):
                    return
                if isinstance(frame, Ack):
                    # One task per batch, created in arrival order so the service starts them
                    # in order; reading goes on meanwhile (an ack waits for durability).
                    self._spawn(self._ack(subscription, frame, sink))
                elif isinstance(frame, Replace):
                    # A task too, so it starts after the acks sent before it (awaiting it here
                    # would run it ahead of their not yet started tasks).
                    self._spawn(self._replace(subscription, frame, sink, watched))
                elif isinstance(frame, Check):  # may wait a probation: a task as well
                    self._spawn(self._check_frame(subscription, frame, sink))
                elif isinstance(frame, _Malformed):
                    log.warning(
                        "malformed frame skipped subscription=%s reason=%s",
                        subscription.id,
                        frame.reason,
                    )
                    sink.send(Error(ErrorCode.MALFORMED_FRAME, frame.reason))
                else:
                    sink.send(
                        Error(ErrorCode.UNEXPECTED_FRAME, f"{type(frame).__name__} after Subscribe")
                    )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the call broke; the writer is told to finish below
            log.debug(
                "subscription stream read ended subscription=%s error=%r", subscription.id, exc
            )
        finally:
            sink.finish()

    async def _ack(self, subscription: Subscription, frame: Ack, sink: _StreamSink) -> None:
        try:
            failures = await subscription.ack(frame.op, frame.offsets, frame.seconds)
        except CommitUncertain as exc:
            # applied or not, nobody knows: no answer (the coordinator is failing; the stream
            # ends, and the client counts the operation unconfirmed)
            log.warning("ack left unanswered subscription=%s: %s", subscription.id, exc)
            return
        except Exception as exc:
            if not isinstance(exc, QLayerError):
                log.exception("ack failed subscription=%s", subscription.id)
            message = f"ack not confirmed: {exc}"
            failures = [AckFailure(b, ErrorCode.ACK_FAILED, message) for b in frame.bookmarks]
        sink.send(AckResult(frame.request_id, list(failures)))

    async def _check_frame(
        self, subscription: Subscription, frame: Check, sink: _StreamSink
    ) -> None:
        current = True
        if self._delivery_check is not None:
            try:
                current = await self._delivery_check(frame.made_at)
            except Exception:
                log.exception("delivery check failed subscription=%s", subscription.id)
                current = False
        if not current:
            log.warning(
                "a client got a frame this coordinator no longer owns: it drops it"
                " subscription=%s made_at=%.3f",
                subscription.id,
                frame.made_at,
            )
        sink.send(Checked(frame.request_id, current, time.monotonic(), int(time.time() * 1000)))

    async def _replace(
        self, subscription: Subscription, frame: Replace, sink: _StreamSink, watched: _Watched
    ) -> None:
        try:
            # checked like a Subscribe: a stream must not move to a queue it may not consume
            for name in self._queues_named(frame.queue):
                self._access.authorize(watched.principal, RPC_RIGHTS["Subscribe"], name)
            backlog = await subscription.replace(frame.queue, frame.max_backlog, frame.filter)
        except Exception as exc:  # refused: the subscription stays as it was, the stream open
            if not isinstance(exc, QLayerError):
                log.exception("replace failed subscription=%s", subscription.id)
            sink.send(Error(_error_code_of(exc), str(exc), frame.request_id))
            return
        log.debug(
            "subscription replaced subscription=%s queue=%s backlog=%d filter=%r",
            subscription.id,
            frame.queue,
            backlog,
            frame.filter,
        )
        watched.queue = frame.queue
        sink.send(Replaced(frame.request_id, backlog))

    async def _write_frames(
        self,
        context: grpc.aio.ServicerContext,
        sink: _StreamSink,
        batch: bool,
        columns: bool,
        common: bool = False,
    ) -> None:
        """The stream's one writer. To a client that takes Batch frames (``batch``), what
        piled up goes as one gRPC message: each write costs the coordinator ~30 µs of CPU on
        a quiet machine (100-120 µs at load 11), as much as encoding fifty to two hundred
        messages. To one that takes message
        columns (``columns``), Messages go as MessageColumns, with a column alike for all its
        messages sent once to one that also reads those (``common``)."""
        while True:
            delivered: list[DeliveryBatch | list[DeliveredMessage]] = []
            control: list[_Control] = []
            end: _End | _SinkClosed | None = None
            for item in await sink.take(linger=batch):
                if isinstance(item, DeliveryBatch | list):
                    delivered.append(item)
                elif isinstance(item, _End | _SinkClosed):
                    end = end or item
                elif batch:
                    control.append(item)
                else:
                    await context.write(item)
            if end is not None:
                for frame in _batched(control, []):
                    await context.write(frame)
                if isinstance(end, _SinkClosed) and end.error is not None:
                    await _refuse(context, end.error)
                if isinstance(end, _SinkClosed):
                    await _abort(
                        context, grpc.StatusCode.UNAVAILABLE, f"subscription closed: {end.reason}"
                    )
                return
            frames = _message_frames(_joined(delivered), columns, common) if delivered else []
            if control:
                first = []
                if frames:
                    pushed = await self._may_push(
                        replace(frames[0], made_at=time.monotonic()), sink
                    )
                    first = [pushed] if pushed is not None else []
                for frame in _batched(control, first):
                    writing = time.time()
                    await context.write(frame)
                    _sent(sink, frame, writing)
                frames = frames[1:]
            for frame in frames:
                # stamped before it is let through: a stop after that shows in its age
                # asked before each frame: a write may wait long for the client's window
                pushed = await self._may_push(replace(frame, made_at=time.monotonic()), sink)
                if pushed is None:
                    continue
                # waits while the client's HTTP/2 window is full (it does not read)
                writing = time.time()
                await context.write(pushed)
                sink.sent(pushed.messages, writing)

    async def _may_push(self, frame: Messages, sink: _StreamSink) -> Messages | None:
        """``frame`` if its messages may be written (``delivery_gate``); None if not (they are
        dropped). After a hold (a member that may have lost its session waits to learn it),
        without the messages whose leases ran out meanwhile: they are not the consumer's any
        more (None if that is all of them)."""
        if self._gate is None:
            return frame
        began = time.monotonic()
        if not await self._gate():
            log.warning(
                "%d messages not pushed: the coordinator no longer owns them", len(frame.messages)
            )
            sink.dropped(frame.messages)
            return None
        if time.monotonic() - began < _HELD_S:
            return frame
        now_ms = time.time() * 1000  # the clock of lease deadlines
        kept: list[DeliveredMessage] = []
        expired: list[DeliveredMessage] = []
        for m in frame.messages:
            ended = m.lease_deadline_ms is not None and m.lease_deadline_ms <= now_ms
            (expired if ended else kept).append(m)
        if not expired:
            return frame
        log.warning("%d messages not pushed: their leases ran out while held", len(expired))
        sink.dropped(expired)
        return replace(frame, messages=kept) if kept else None


_Control = AckResult | Error | Replaced | Checked
_Write = Messages | Batch | _Control


def _batched(control: list[_Control], messages: list[Messages]) -> list[_Write]:
    """The frames to write for ``control`` then ``messages`` (at most one Messages frame):
    one Batch, except an AckResult with failures (up to MAX_ACK_OFFSETS of them: kept apart,
    so a Batch stays far under the message size limit) and a lone frame, written as is."""
    writes: list[_Write] = []
    group: list[Messages | _Control] = []
    for frame in control:
        if isinstance(frame, AckResult) and frame.failures:
            writes.extend(_one_or_batch(group))
            writes.append(frame)
            group = []
        else:
            group.append(frame)
    group.extend(messages)
    writes.extend(_one_or_batch(group))
    return writes


def _one_or_batch(frames: list[Messages | _Control]) -> list[_Write]:
    if len(frames) > 1:
        return [Batch(frames)]
    return list(frames)


def _sent(sink: _StreamSink, frame: _Write, writing: float) -> None:
    """``sink.sent`` for the messages a written frame carries, if any."""
    if isinstance(frame, Messages):
        sink.sent(frame.messages, writing)
    elif isinstance(frame, Batch):
        for inner in frame.frames:
            if isinstance(inner, Messages):
                sink.sent(inner.messages, writing)
