"""The gRPC transport end to end: ApiServer + both clients against an in-memory QueueService.

No broker: the service here is a test double of the coordinator's seam (a FIFO with leases), so
these tests pin the transport (frames, batching, stream lifecycle, auth), not queue semantics.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from layer.api.frames import (
    CLIENT_FRAME_CODEC,
    SERVER_FRAME_CODEC,
    Ack,
    AckResult,
    Error,
    Subscribe,
    Subscribed,
)
from layer.api.health import GrpcHealth
from layer.api.server import ApiServer
from layer.api.service import (
    AckFailure,
    ClusterStats,
    DeliveredMessage,
    DeliverySink,
    OffsetRuns,
    QueueInfo,
    QueueStats,
)
from layer.client import AsyncQueueClient, Message, QueueClient
from layer.coordinator.health import Health
from layer.engine.model import AckError, AckOp, Bookmark
from layer.exceptions import (
    ClientError,
    ConfigError,
    InvalidRequest,
    LeaseError,
    NotLeaseHolder,
    UnknownBookmark,
    UnknownQueue,
)
from tests.helpers import self_signed_cert

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# --- a tiny QueueService double ---------------------------------------------------------------


class MemorySubscription:
    def __init__(
        self, service: MemoryService, queue: str, backlog: int, sink: DeliverySink, name: str
    ) -> None:
        self.id = f"sub-{next(service.ids)}"
        self.queue = queue
        self.backlog = backlog
        self.lease_period_s = 30.0
        self.sink = sink
        self.client_name = name
        self.leased: dict[Bookmark, DeliveredMessage] = {}
        self.closes = 0
        self._service = service

    async def ack(
        self, op: AckOp, offsets: Sequence[OffsetRuns], seconds: float = 0.0
    ) -> list[AckFailure]:
        await asyncio.sleep(0)  # where the coordinator would wait for the changelog
        return self._service.apply(self, op, [t for runs in offsets for t in runs.bookmarks()])

    async def close(self) -> None:
        self._service.disconnect(self)


class MemoryService:
    """Each queue is a FIFO on topic ``<queue>-in``, partition 0; leases never time out."""

    def __init__(self, queues: Sequence[str] = ("orders",)) -> None:
        self.available: dict[str, deque[DeliveredMessage]] = {q: deque() for q in queues}
        self.offsets = {q: 0 for q in queues}
        self.subscriptions: list[MemorySubscription] = []
        self.ack_calls: list[tuple[AckOp, int]] = []  # (op, bookmarks): one per Ack frame
        self.closed: list[str] = []  # subscription ids, once per close() call
        self.ids = itertools.count(1)

    def _check(self, queue: str) -> None:
        if queue not in self.available:
            raise UnknownQueue(f"queue {queue!r} is not configured")

    async def subscribe(
        self,
        queue: str,
        max_backlog: int,
        sink: DeliverySink,
        client: str = "",
        filter: str | None = None,
    ) -> MemorySubscription:
        self._check(queue)
        if max_backlog < 0:
            raise InvalidRequest(f"max_backlog must be >= 0, got {max_backlog}")
        subscription = MemorySubscription(self, queue, min(max_backlog, 1000), sink, client)
        self.subscriptions.append(subscription)
        self.dispatch(queue)
        return subscription

    async def publish(
        self,
        queue: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> Bookmark:
        self._check(queue)
        bookmark = Bookmark(f"{queue}-in", 0, self.offsets[queue])
        self.offsets[queue] += 1
        message = DeliveredMessage(bookmark, key, value, list(headers), 1000, 0, 0, None)
        self.available[queue].append(message)
        self.dispatch(queue)
        return bookmark

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        if queue is not None:
            self._check(queue)
        return [
            QueueStats(
                queue=q,
                available=len(self.available[q]),
                leased=sum(len(s.leased) for s in self.subscriptions if s.queue == q),
                inactive=0,
                subscriptions=sum(1 for s in self.subscriptions if s.queue == q),
                oldest_available_age_s=None,
                delivered_total=0,
                acked_total=0,
                dead_lettered_total=0,
            )
            for q in self.available
            if queue in (None, q)
        ]

    async def cluster_stats(self) -> ClusterStats:
        return ClusterStats(await self.stats())

    def queues(self) -> list[QueueInfo]:
        return [
            QueueInfo(q, f"{q}-in", "at-least-once", "json", 30.0, 1000, None, None)
            for q in self.available
        ]

    def dispatch(self, queue: str) -> None:
        for subscription in self.subscriptions:
            if subscription.queue != queue:
                continue
            batch = []
            while self.available[queue] and len(subscription.leased) < subscription.backlog:
                m = self.available[queue].popleft()
                deadline = int(time.time() * 1000) + 30_000
                m = DeliveredMessage(
                    m.bookmark, m.key, m.value, m.headers, m.timestamp_ms,
                    m.deliveries + 1, m.cancels, deadline,
                )  # fmt: skip
                subscription.leased[m.bookmark] = m
                batch.append(m)
            if batch:
                subscription.sink.deliver(batch)

    def apply(
        self, subscription: MemorySubscription, op: AckOp, bookmarks: Sequence[str]
    ) -> list[AckFailure]:
        self.ack_calls.append((op, len(bookmarks)))
        failures = []
        for text in bookmarks:
            try:
                bookmark = Bookmark.parse(text)
            except ValueError as exc:
                failures.append(AckFailure(text, "malformed_bookmark", str(exc)))
                continue
            message = subscription.leased.get(bookmark)
            if message is None:
                holder = any(bookmark in s.leased for s in self.subscriptions)
                error = AckError.NOT_LEASE_HOLDER if holder else AckError.UNKNOWN_BOOKMARK
                failures.append(AckFailure(text, error, f"{error} in this double"))
            elif op in (AckOp.ACK, AckOp.EXPIRE):
                del subscription.leased[bookmark]
            elif op == AckOp.CANCEL:
                del subscription.leased[bookmark]
                self.available[subscription.queue].appendleft(message)
        self.dispatch(subscription.queue)
        return failures

    def disconnect(self, subscription: MemorySubscription) -> None:
        subscription.closes += 1
        self.closed.append(subscription.id)
        if subscription in self.subscriptions:
            self.subscriptions.remove(subscription)
            returned = sorted(subscription.leased.values(), key=lambda m: m.bookmark.offset)
            self.available[subscription.queue].extendleft(reversed(returned))
            subscription.leased.clear()
            self.dispatch(subscription.queue)


# --- running the server on its own loop -------------------------------------------------------


class ServerThread:
    def __init__(self, service: MemoryService, **kwargs: Any) -> None:
        self.service = service
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = ApiServer(service, "127.0.0.1:0", **kwargs)
        self.port = self.run(self.server.start())
        self.target = f"127.0.0.1:{self.port}"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the server's loop (the service is not thread-safe)."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper())

    def stop(self) -> None:
        self.run(self.server.stop(1.0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    servers: list[ServerThread] = []

    def factory(service: MemoryService | None = None, **kwargs: Any) -> ServerThread:
        server = ServerThread(service or MemoryService(), **kwargs)
        servers.append(server)
        return server

    yield factory
    for server in servers:
        if server.server.port is not None and server.loop.is_running():
            server.stop()


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


def leased(server: ServerThread) -> int:
    return server.call(lambda: sum(len(s.leased) for s in server.service.subscriptions))


# --- round trips ------------------------------------------------------------------------------


def test_sync_client_round_trip(serve: Callable[..., ServerThread]) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        first = client.publish("orders", {"id": 1}, key="k1", headers={"trace": "t1", "x": None})
        client.publish("orders", "text")
        client.publish("orders", b"\x00raw")
        assert first == "orders-in/0/0"
        with client.subscribe("orders", max_backlog=10) as sub:
            assert sub.backlog == 10 and sub.id.startswith("sub-")
            messages = [sub.next(timeout=5) for _ in range(3)]
            assert all(isinstance(m, Message) for m in messages)
            m1, m2, m3 = (m for m in messages if m is not None)
            assert (m1.bookmark, m1.topic, m1.partition, m1.offset) == (first, "orders-in", 0, 0)
            assert m1.json() == {"id": 1} and m1.key == b"k1"
            assert m1.headers == [("trace", b"t1"), ("x", None)]
            assert m1.deliveries == 1 and m1.cancels == 0
            assert m1.lease_deadline is not None and m1.lease_deadline > time.time()
            assert (m2.data, m3.data) == (b"text", b"\x00raw")
            assert sub.next(timeout=0.05) is None
            for m in (m1, m2, m3):
                m.ack()
            sub.flush(timeout=5)
            assert sub.acked_count == 3 and sub.ack_failures == []
            assert leased(server) == 0
            (stats,) = client.stats("orders")
            assert (stats.queue, stats.subscriptions, stats.leased) == ("orders", 1, 0)
        assert [q.name for q in client.queues()] == ["orders"]
    wait_until(lambda: len(server.service.closed) == 1)


def test_async_client_round_trip(serve: Callable[..., ServerThread]) -> None:
    server = serve()

    async def main() -> None:
        async with AsyncQueueClient(server.target) as client:
            for i in range(5):
                await client.publish("orders", {"i": i})
            async with client.subscribe("orders", max_backlog=2) as sub:
                assert sub.backlog == 2
                seen = []
                async for msg in sub:
                    seen.append(msg.json()["i"])
                    await msg.ack()
                    if len(seen) == 5:
                        break
                await sub.flush(timeout=5)
                assert seen == [0, 1, 2, 3, 4]
                assert sub.acked_count == 5
                assert await sub.next(timeout=0.05) is None
                assert [s.queue for s in await client.stats()] == ["orders"]
                assert [q.name for q in await client.queues()] == ["orders"]
            sub2 = await client.subscribe("orders")
            assert not sub2.closed
        assert sub2.closed  # client.close() closed it

    asyncio.run(main())
    wait_until(lambda: len(server.service.closed) == 2)
    assert leased(server) == 0


def test_backlog_of_one_flows_without_waiting_for_the_flush_timer(
    serve: Callable[..., ServerThread],
) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        for i in range(100):
            client.publish("orders", str(i))
        started = time.monotonic()
        with client.subscribe("orders", max_backlog=1) as sub:
            for i in range(100):
                msg = sub.next(timeout=5)
                assert msg is not None and msg.data == str(i).encode()
                msg.ack()
            sub.flush(timeout=5)
        assert time.monotonic() - started < 5
    assert server.service.ack_calls == [(AckOp.ACK, 1)] * 100


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_acks_are_batched(serve: Callable[..., ServerThread], flavour: str) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        for i in range(500):
            client.publish("orders", str(i))
        if flavour == "sync":
            with client.subscribe("orders", max_backlog=1000) as sub:
                for _ in range(500):
                    msg = sub.next(timeout=5)
                    assert msg is not None
                    msg.ack()
                sub.flush(timeout=5)
                assert sub.acked_count == 500
        else:

            async def consume() -> None:
                async with (
                    AsyncQueueClient(server.target) as aclient,
                    aclient.subscribe("orders", max_backlog=1000) as asub,
                ):
                    for _ in range(500):
                        amsg = await asub.next(timeout=5)
                        assert amsg is not None
                        await amsg.ack()
                    await asub.flush(timeout=5)
                    assert asub.acked_count == 500

            asyncio.run(consume())
    calls = server.service.ack_calls
    assert sum(n for _, n in calls) == 500
    assert len(calls) <= 20, f"{len(calls)} Ack frames for 500 acks"
    assert max(n for _, n in calls) <= 256


def test_ack_ops_keep_their_order_and_extend_carries_seconds(
    serve: Callable[..., ServerThread],
) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        for i in range(3):
            client.publish("orders", str(i))
        with client.subscribe("orders", max_backlog=3) as sub:
            a, b, c = (sub.next(timeout=5) for _ in range(3))
            assert a and b and c
            a.extend(10)
            a.ack()
            b.cancel()
            c.expire(wait=True)
            assert server.service.ack_calls == [
                (AckOp.EXTEND, 1),
                (AckOp.ACK, 1),
                (AckOp.CANCEL, 1),
                (AckOp.EXPIRE, 1),
            ]
            again = sub.next(timeout=5)  # the cancelled one comes back
            assert again is not None and again.bookmark == b.bookmark and again.deliveries == 2
            assert sub.acked_count == 1


# --- errors -----------------------------------------------------------------------------------


def test_unknown_queue(serve: Callable[..., ServerThread]) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        with pytest.raises(UnknownQueue, match="'nope'"):
            client.subscribe("nope")
        with pytest.raises(UnknownQueue, match="'nope'"):
            client.publish("nope", b"x")
        with pytest.raises(UnknownQueue, match="'nope'"):
            client.stats("nope")
        with pytest.raises(InvalidRequest, match="max_backlog"):
            client.subscribe("orders", max_backlog=-1)

    async def main() -> None:
        async with AsyncQueueClient(server.target) as client:
            with pytest.raises(UnknownQueue, match="'nope'"):
                await client.subscribe("nope")
            with pytest.raises(UnknownQueue, match="'nope'"):
                await client.publish("nope", b"x")

    asyncio.run(main())
    assert server.service.subscriptions == []


def test_refused_ack_is_recorded_and_the_stream_keeps_working(
    serve: Callable[..., ServerThread], caplog: pytest.LogCaptureFixture
) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        client.publish("orders", b"one")
        with client.subscribe("orders", max_backlog=5) as sub:
            msg = sub.next(timeout=5)
            assert msg is not None
            msg.ack(wait=True)
            msg.ack()  # already done: unknown now
            sub.flush(timeout=5)
            assert [(f.bookmark, f.error) for f in sub.ack_failures] == [
                (msg.bookmark, AckError.UNKNOWN_BOOKMARK)
            ]
            assert "ack refused" in caplog.text
            client.publish("orders", b"two")
            nxt = sub.next(timeout=5)
            assert nxt is not None and nxt.data == b"two"
            nxt.ack(wait=True)
            assert sub.acked_count == 2


def test_ack_wait_raises_the_refusal(serve: Callable[..., ServerThread]) -> None:
    server = serve()
    with QueueClient(server.target) as client:
        client.publish("orders", b"one")
        with client.subscribe("orders", 5) as holder, client.subscribe("orders", 5) as other:
            msg = holder.next(timeout=5)
            assert msg is not None
            stolen = Message(
                other, DeliveredMessage(Bookmark.parse(msg.bookmark), None, b"", [], 0, 1, 0, None)
            )
            with pytest.raises(NotLeaseHolder, match=msg.bookmark):
                stolen.ack(wait=True)
            msg.ack(wait=True)
            with pytest.raises(UnknownBookmark, match=msg.bookmark):
                msg.ack(wait=True)
            with pytest.raises(LeaseError):
                msg.extend(5, wait=True)
            assert other.ack_failures == []  # waited-for refusals are raised, not recorded

    async def main() -> None:
        async with AsyncQueueClient(server.target) as client:
            await client.publish("orders", b"two")
            async with client.subscribe("orders") as sub:
                amsg = await sub.next(timeout=5)
                assert amsg is not None
                await amsg.ack(wait=True)
                with pytest.raises(UnknownBookmark):
                    await amsg.ack(wait=True)

    asyncio.run(main())


# --- stream lifecycle -------------------------------------------------------------------------


def test_cancelled_stream_closes_the_subscription_once(serve: Callable[..., ServerThread]) -> None:
    server = serve()
    with QueueClient(server.target, reconnect=False) as client:  # the old behaviour
        client.publish("orders", b"x")
        sub = client.subscribe("orders", max_backlog=5)
        assert sub.next(timeout=5) is not None
        assert leased(server) == 1
        sub._call.cancel()  # what a dropped connection looks like to the server
        wait_until(lambda: server.service.closed == [sub.id])
        assert leased(server) == 0
        with pytest.raises(ClientError):
            sub.next(timeout=1)
        again = client.subscribe("orders", max_backlog=5).next(timeout=5)
        assert again is not None and again.deliveries == 2
    wait_until(lambda: len(server.service.closed) == 2)
    time.sleep(0.1)
    assert len(set(server.service.closed)) == len(server.service.closed)


def test_server_stop_ends_streams_and_closes_subscriptions(
    serve: Callable[..., ServerThread],
) -> None:
    server = serve()
    with QueueClient(server.target, reconnect=False) as client:  # the old behaviour
        sub = client.subscribe("orders")
        server.run(server.server.stop(0.5))
        assert server.service.closed == [sub.id]
        with pytest.raises(ClientError):
            sub.next(timeout=5)


def test_an_address_in_use_is_refused_with_its_reason(serve: Callable[..., ServerThread]) -> None:
    # grpc's default SO_REUSEPORT would let a second server share the port, the kernel
    # splitting new connections between them: the second must be refused instead, by name
    first = serve()
    foreign = grpc.server(ThreadPoolExecutor(1))  # another program, grpc's defaults
    foreign_port = foreign.add_insecure_port("127.0.0.1:0")
    foreign.start()
    try:
        for taken in (first.target, f"127.0.0.1:{foreign_port}"):

            async def start_second(where: str = taken) -> None:
                second = ApiServer(MemoryService(), where)
                await second.start()
                await second.stop(0)  # it should not have started: no server left behind

            with pytest.raises(ConfigError) as info:
                asyncio.run(start_second())
            assert str(info.value) == f"cannot listen on {taken}: Address already in use"
    finally:
        foreign.stop(None)

    async def start_elsewhere() -> None:
        await ApiServer(MemoryService(), "192.0.2.1:7070").start()  # TEST-NET-1: not ours

    with pytest.raises(ConfigError) as info:
        asyncio.run(start_elsewhere())
    assert str(info.value) == "cannot listen on 192.0.2.1:7070: Cannot assign requested address"
    with QueueClient(first.target) as client:  # the first one serves on, alone
        assert client.publish("orders", b"x") == "orders-in/0/0"
    assert first.service.offsets["orders"] == 1


FORKS_UNDER_CALLS = textwrap.dedent(
    """
    import subprocess, sys, threading
    from layer.client import QueueClient  # first, as a program using qlayer does
    from tests.integration.test_api_transport import MemoryService, ServerThread

    server = ServerThread(MemoryService())
    calling = threading.Event()
    done = threading.Event()

    def publish_until_done():
        with QueueClient(server.target) as client:
            while not done.is_set():
                client.publish("orders", b"x")
                calling.set()

    threads = [threading.Thread(target=publish_until_done) for _ in range(4)]
    for thread in threads:
        thread.start()
    assert calling.wait(30)
    codes = []
    for _ in range(int(sys.argv[1])):
        # as pyspark launches its JVM: preexec_fn makes it a fork, never a vfork
        child = subprocess.Popen(["true"], stdin=subprocess.PIPE, preexec_fn=lambda: None)
        child.stdin.close()
        codes.append(child.wait())
    done.set()
    for thread in threads:
        thread.join(30)
    print(sorted(set(codes)), codes.count(0))
    """
)


def test_a_program_using_the_client_can_fork_while_its_calls_run() -> None:
    # grpc core's fork handlers, on by default, aborted a child forked while a call ran in
    # another thread (8-11 of 300 children): pyspark's JVM launch failed that way in a full run
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env["PYTHONPATH"] = str(REPO)
    forks = 300
    run = subprocess.run(
        [sys.executable, "-c", FORKS_UNDER_CALLS, str(forks)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split("\n")[-2] == f"[0] {forks}", run.stderr[-2000:]


CONSUMER = textwrap.dedent(
    """
    import sys, time
    from layer.client import QueueClient
    client = QueueClient(sys.argv[1])
    sub = client.subscribe("orders", max_backlog=5)
    msg = sub.next(timeout=10)
    print(msg.bookmark, flush=True)
    time.sleep(60)
    """
)


@pytest.mark.parametrize("kill", ["SIGKILL", "SIGSTOP"])
def test_vanished_client_process_returns_its_leases(
    serve: Callable[..., ServerThread], kill: str
) -> None:
    # SIGKILL: the kernel closes the socket. SIGSTOP: the peer is silent (like a cut network),
    # only keepalive can notice; the server pings every 1 s and gives up after 1 s.
    server = serve(keepalive_time_s=1.0, keepalive_timeout_s=1.0)
    with QueueClient(server.target) as client:
        bookmark = client.publish("orders", b"x")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with subprocess.Popen(
            [sys.executable, "-c", CONSUMER, server.target],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        ) as proc:
            try:
                assert proc.stdout is not None
                assert proc.stdout.readline().strip() == bookmark
                assert leased(server) == 1
                proc.send_signal(getattr(signal, kill))
                started = time.monotonic()
                # without keepalive a stopped peer is never noticed (the kernel still answers
                # TCP), so noticing at all is the behaviour; nominally ~2 s, but gRPC's timers
                # slip on a busy machine (once > 6 s in a loaded run): the bound is generous
                wait_until(lambda: len(server.service.closed) == 1, timeout=30)
                noticed = time.monotonic() - started
                assert noticed < (10 if kill == "SIGKILL" else 20)
            finally:
                proc.kill()
                proc.wait()
        again = client.subscribe("orders").next(timeout=5)
        assert again is not None and again.bookmark == bookmark and again.deliveries == 2


def test_malformed_frames_do_not_break_the_server(serve: Callable[..., ServerThread]) -> None:
    server = serve()
    with grpc.insecure_channel(server.target) as channel:
        raw = channel.stream_stream("/qlayer.v1.QueueService/Subscribe")  # bytes in, bytes out

        # A garbage first frame ends the stream.
        with pytest.raises(grpc.RpcError) as info:
            list(raw(iter([b"\x01\xff\xff"])))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed ClientFrame frame" in (info.value.details() or "")

        # A first frame that is not Subscribe ends it too.
        ack = CLIENT_FRAME_CODEC.encode(Ack(1, AckOp.ACK, []))  # well formed, but not first
        with pytest.raises(grpc.RpcError) as info:
            list(raw(iter([ack])))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        # Garbage mid-stream is reported and skipped.
        requests: list[bytes] = [
            CLIENT_FRAME_CODEC.encode(Subscribe("orders", 1)),
            b"garbage",
            b"",
            CLIENT_FRAME_CODEC.encode(Ack.of(9, AckOp.ACK, [Bookmark("orders-in", 0, 77)])),
        ]
        call = raw(iter(requests))
        frames = [SERVER_FRAME_CODEC.decode(next(call)) for _ in range(4)]
        call.cancel()
    assert isinstance(frames[0], Subscribed)
    assert [f.code for f in frames[1:3] if isinstance(f, Error)] == ["malformed_frame"] * 2
    assert isinstance(frames[3], AckResult) and frames[3].request_id == 9
    assert frames[3].failures[0].error == AckError.UNKNOWN_BOOKMARK
    wait_until(lambda: len(server.service.closed) == 1)

    with QueueClient(server.target) as client:
        client.publish("orders", b"still serving")
        msg = client.subscribe("orders").next(timeout=5)
        assert msg is not None and msg.data == b"still serving"


# --- auth -------------------------------------------------------------------------------------


def test_bearer_token_is_required_when_configured(serve: Callable[..., ServerThread]) -> None:
    server = serve(auth_token="s3cret")
    for token in (None, "wrong"):
        with QueueClient(server.target, token=token) as client:
            with pytest.raises(ClientError, match="UNAUTHENTICATED"):
                client.publish("orders", b"x")
            with pytest.raises(ClientError, match="UNAUTHENTICATED"):
                client.subscribe("orders")
            with pytest.raises(ClientError, match="UNAUTHENTICATED"):
                client.queues()
    with QueueClient(server.target, token="s3cret") as client:
        client.publish("orders", b"x")
        assert client.subscribe("orders").next(timeout=5) is not None

    async def main() -> None:
        async with AsyncQueueClient(server.target, token="wrong") as client:
            with pytest.raises(ClientError, match="UNAUTHENTICATED"):
                await client.subscribe("orders")
        async with AsyncQueueClient(server.target, token="s3cret") as client:
            assert [q.name for q in await client.queues()] == ["orders"]

    asyncio.run(main())
    assert server.service.ack_calls == []


def test_grpc_health_follows_readiness_and_needs_no_token(
    serve: Callable[..., ServerThread],
) -> None:
    health = Health()
    grpc_health = GrpcHealth(health, interval=0.05)
    server = serve(auth_token="s3cret", health=grpc_health.servicer)
    server.run(grpc_health.start())
    serving, not_serving = (
        health_pb2.HealthCheckResponse.SERVING,
        health_pb2.HealthCheckResponse.NOT_SERVING,
    )
    with grpc.insecure_channel(server.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def check(service: str) -> int:
            request = health_pb2.HealthCheckRequest(service=service)
            return int(stub.Check(request, timeout=10).status)

        assert check("qlayer.Queue") == check("") == not_serving  # not restored yet
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="qlayer.Queue"), timeout=60)
        assert next(watch).status == not_serving
        server.call(lambda: (health.restored(), health.serving()))
        assert next(watch).status == serving
        assert check("qlayer.Queue") == check("") == serving
        assert check("qlayer.v1.QueueService") == serving
        health.kafka_down("broker stopped")  # off the loop, as librdkafka's threads do
        assert next(watch).status == not_serving
        health.kafka_up()
        assert next(watch).status == serving
        server.run(grpc_health.stop())  # shutting down: NOT_SERVING for good
        assert next(watch).status == not_serving
        assert check("") == not_serving
        watch.cancel()


def test_tls(serve: Callable[..., ServerThread], tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    server = serve(tls=(cert.read_bytes(), key.read_bytes()), auth_token="t")
    with QueueClient(server.target, token="t", tls_root_cert=cert.read_bytes()) as client:
        client.publish("orders", b"secret")
        msg = client.subscribe("orders").next(timeout=5)
        assert msg is not None and msg.data == b"secret"
    with QueueClient(server.target, token="t") as plain, pytest.raises(ClientError):
        plain.queues()


def test_server_reflection_lists_and_describes_the_service(
    serve: Callable[..., ServerThread],
) -> None:
    """What grpcurl does: list the services, then fetch queue.proto's descriptor by symbol and
    read the methods and the Ack's fields from it (no token needed, like health)."""
    health = GrpcHealth(Health(), interval=0.05)
    server = serve(auth_token="s3cret", health=health.servicer)
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (answer,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
        names = {s.name for s in answer.list_services_response.service}
        assert names == {
            "qlayer.v1.QueueService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection",
        }
        pool = DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        service = pool.FindServiceByName("qlayer.v1.QueueService")
        assert service.file.name == "qlayer/v1/queue.proto"
        assert {m.name for m in service.methods} == {
            "Subscribe", "Publish", "Stats", "ListQueues", "Browse", "AckWhere", "Redrive",
            "DeadLetters", "Reload", "Replay", "CreateQueue", "AlterQueue", "DeleteQueue",
            "ListDefinitions", "CreateTemporaryQueue", "Cluster",
        }  # fmt: skip
        subscribe = service.methods_by_name["Subscribe"]
        assert subscribe.client_streaming and subscribe.server_streaming
        replay = service.methods_by_name["Replay"]
        assert replay.server_streaming and not replay.client_streaming
        runs = pool.FindMessageTypeByName("qlayer.v1.OffsetRuns").fields_by_name["runs"]
        assert runs.is_repeated and runs.type == runs.TYPE_INT64
