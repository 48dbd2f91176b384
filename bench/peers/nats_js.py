"""NATS JetStream: a work-queue stream, acked async publishes, a push consumer with explicit acks.

Client: nats-py, the NATS project's asyncio client. The publisher keeps up to ``PUBLISH_WINDOW``
publish acks outstanding (``publish_async`` with a bounded window). The consumer is one durable push
consumer with a deliver group that all consumer processes join, ``AckExplicit`` and
``MaxAckPending`` (default 1000). Push rather than pull: nats-py's ``fetch(batch)`` holds the first
messages of a batch until the batch fills or its timeout ends, which would measure the fetch
timeout, not the broker.

The server is at ``BENCH_NATS_URL`` (default ``nats://127.0.0.1:4222``).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from bench.harness import (
    PUBLISH_WINDOW,
    Pacer,
    Published,
    Recorder,
    ServiceUnavailable,
    payload,
)

NATS_URL = os.environ.get("BENCH_NATS_URL", "nats://127.0.0.1:4222")
# the JetStream store directory (-sd) the server is started with
DATA_DIR = Path("/var/lib/nats-server")
START = (
    "start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- "
    f"-a 127.0.0.1 -p 4222 -js -sd {DATA_DIR} -l /var/log/nats-server.log"
)
DEFAULT_MAX_ACK_PENDING = 1000
_ERRORS = (OSError, asyncio.TimeoutError, nats.errors.Error)


async def _quiet(_exc: Exception) -> None:
    """nats-py reports connection errors through a callback too; the raised error says it all."""


async def _connect() -> Client:
    try:
        # max_reconnect_attempts=0 would mean "forever", even for the first connect
        return await asyncio.wait_for(
            nats.connect(
                NATS_URL,
                connect_timeout=2,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                reconnect_time_wait=0.2,
                error_cb=_quiet,
            ),
            timeout=10,
        )
    except _ERRORS as exc:
        raise ServiceUnavailable(
            f"NATS is not reachable at {NATS_URL} ({type(exc).__name__}: {exc}); "
            f"start it with: {START}"
        ) from exc


async def _check() -> None:
    nc = await _connect()
    try:
        await nc.jetstream().account_info()
    except _ERRORS as exc:
        raise ServiceUnavailable(
            f"NATS at {NATS_URL} answers but JetStream does not ({type(exc).__name__}: {exc}); "
            f"start it with -js: {START}"
        ) from exc
    finally:
        await nc.close()


def check_available() -> None:
    """Raise ``ServiceUnavailable`` unless the server accepts a connection and has JetStream."""
    asyncio.run(_check())


class NatsPeer:
    name = "nats"
    worker_module = "bench.peers.nats_js"
    # the server process, for bench.peer_memory: found by its port, stores in data_dir
    port = urlparse(NATS_URL).port or 4222
    data_dir: Path | None = DATA_DIR
    start_command = START

    def __init__(
        self, max_ack_pending: int = DEFAULT_MAX_ACK_PENDING, window: int = PUBLISH_WINDOW
    ) -> None:
        self.max_ack_pending = max_ack_pending
        self.window = window
        self._settings: dict[str, Any] | None = None

    def create(self) -> dict[str, Any]:
        return asyncio.run(self._create())

    async def _create(self) -> dict[str, Any]:
        uid = uuid.uuid4().hex[:10]
        target = {
            "stream": f"QBENCH_{uid}",
            "subject": f"qbench.{uid}",
            "group": f"qbench-{uid}",
        }
        nc = await _connect()
        try:
            js = nc.jetstream()
            await js.add_stream(
                StreamConfig(
                    name=target["stream"],
                    subjects=[target["subject"]],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    num_replicas=1,
                )
            )
            await js.add_consumer(
                target["stream"],
                ConsumerConfig(
                    durable_name=target["group"],
                    deliver_subject=f"_qbench_deliver.{uid}",
                    deliver_group=target["group"],
                    ack_policy=AckPolicy.EXPLICIT,
                    ack_wait=30,
                    max_ack_pending=self.max_ack_pending,
                    filter_subject=target["subject"],
                ),
            )
        finally:
            await nc.close()
        return target

    def delete(self, target: dict[str, Any]) -> None:
        async def go() -> None:
            nc = await _connect()
            try:
                await nc.jetstream().delete_stream(target["stream"])
            finally:
                await nc.close()

        asyncio.run(go())

    def outstanding(self, target: dict[str, Any]) -> int:
        # a work-queue stream drops a message once it is acked
        async def go() -> int:
            nc = await _connect()
            try:
                info = await nc.jetstream().stream_info(target["stream"])
                return int(info.state.messages)
            finally:
                await nc.close()

        return asyncio.run(go())

    def first_delivery(self, target: dict[str, Any]) -> bool:
        """Take one message as a consumer process does and leave it unacked; False if none
        came within a second.

        The message stays in the stream and is redelivered after ack_wait.
        """

        async def go() -> bool:
            nc = await _connect()
            try:
                sub = await nc.jetstream().subscribe(
                    target["subject"],
                    queue=target["group"],
                    stream=target["stream"],
                    manual_ack=True,
                )
                try:
                    await sub.next_msg(timeout=1)
                except nats.errors.TimeoutError:
                    return False
                return True
            finally:
                await nc.close()

        return asyncio.run(go())

    def publish(
        self, target: dict[str, Any], n: int, size: int, rate: float = 0.0, seconds: float = 0.0
    ) -> Published:
        # one limit for the whole run: a stalled broker fails it rather than hanging it
        limit = 120 + (n / rate if rate else n / 200)
        return asyncio.run(
            asyncio.wait_for(
                self._publish(target["subject"], n, size, rate, seconds), timeout=limit
            )
        )

    async def _publish(
        self, subject: str, n: int, size: int, rate: float, seconds: float
    ) -> Published:
        nc = await _connect()
        try:
            js = nc.jetstream(publish_async_max_pending=self.window)
            errors: list[BaseException] = []

            def on_ack(fut: asyncio.Future[Any]) -> None:
                if not fut.cancelled() and fut.exception() is not None:
                    errors.append(fut.exception())  # type: ignore[arg-type]

            pacer = Pacer(rate, seconds)
            first = time.time()
            sent = 0
            while sent < n and not pacer.over():
                wait = pacer.wait(sent)
                if wait > 0:
                    await asyncio.sleep(wait)
                # waits while `window` acks are outstanding; no wait_stall, as nats-py wraps
                # each publish in asyncio.wait_for then, which cut the rate to a fifth here
                fut = await js.publish_async(subject, payload(size, sent))
                fut.add_done_callback(on_ack)
                sent += 1
            last_sent = time.time()
            await js.publish_async_completed()
            confirmed = time.time()
        finally:
            await nc.close()
        if errors:
            raise RuntimeError(f"{len(errors)} JetStream publishes failed, first: {errors[0]!r}")
        return Published(sent, first, last_sent, confirmed)

    def settings(self) -> dict[str, Any]:
        if self._settings is None:

            async def server() -> str:
                nc = await _connect()
                try:
                    v = nc.connected_server_version
                    dev = f"-{v.dev}" if v.dev else ""
                    return f"v{v.major}.{v.minor}.{v.patch}{dev}"
                finally:
                    await nc.close()

            self._settings = {
                "client": f"nats-py {version('nats-py')}",
                "server": f"nats-server {asyncio.run(server())}",
                "queue": "JetStream stream, retention=workqueue, one durable push consumer "
                "with a deliver group shared by the consumer processes",
                "durability": "file storage, 1 replica (server default fsync interval)",
                "publish": f"publish_async, up to {self.window} pub acks outstanding",
                "max_ack_pending": self.max_ack_pending,
                "ack": "explicit, msg.ack() per message (fire-and-forget +ACK)",
            }
        return self._settings


async def _consume(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    nc = await _connect()

    async def on_message(msg: Msg) -> None:
        rec.delivered(msg.data, msg.metadata.num_delivered > 1)
        await msg.ack()
        rec.acked()

    # binds to the consumer the driver made: the queue name is its durable name
    await nc.jetstream().subscribe(
        target["subject"],
        queue=target["group"],
        stream=target["stream"],
        manual_ack=True,
        cb=on_message,
    )
    rec.ready()
    while not stop.is_set():
        await asyncio.sleep(0.02)
    await nc.flush()  # the last acks leave before the connection closes
    await nc.close()


def consume(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    """A consumer process: one member of the consumer's deliver group."""
    asyncio.run(_consume(target, rec, stop))
