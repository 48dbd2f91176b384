"""RabbitMQ: a quorum queue, publisher confirms, persistent messages, manual acks, prefetch.

Client: pika, RabbitMQ's reference Python client. Consumers use its ``BlockingConnection``. The
publisher uses its ``SelectConnection`` because publisher confirms through ``BlockingConnection``
wait for each message's confirm in turn, one round trip per message; the callback connection keeps
up to ``PUBLISH_WINDOW`` confirms outstanding instead, which is how a fast AMQP publisher works.
(aio-pika could do the same with futures, but adds five packages for no measured gain.)

The broker is at ``BENCH_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/%2F``).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from bench.harness import (
    PUBLISH_WINDOW,
    Pacer,
    Published,
    Recorder,
    ServiceUnavailable,
    payload,
)

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")
START = "rabbitmq-server -detached"
# the node's home (Debian package layout): its quorum queues' Raft logs are under mnesia/
DATA_DIR = Path("/var/lib/rabbitmq")
DEFAULT_PREFETCH = 100

_PERSISTENT = pika.BasicProperties(
    content_type="application/json", delivery_mode=pika.DeliveryMode.Persistent
)


def _params() -> pika.URLParameters:
    params = pika.URLParameters(AMQP_URL)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.blocked_connection_timeout = 60
    return params


def _where() -> str:
    # host and port only: the URL carries the password
    params = _params()
    return f"{params.host}:{params.port}"


def _unavailable(exc: BaseException) -> ServiceUnavailable:
    # pika's connection errors often print empty; the wrapped cause says what failed
    cause = exc
    while not str(cause):
        inner = cause.args[0] if cause.args else getattr(cause, "exception", None)
        if not isinstance(inner, BaseException):
            break
        cause = inner
    return ServiceUnavailable(
        f"RabbitMQ is not reachable at {_where()} ({type(cause).__name__}: {cause}); "
        f"start it with: {START}"
    )


def check_available() -> None:
    """Raise ``ServiceUnavailable`` unless the broker accepts a connection."""
    try:
        conn = pika.BlockingConnection(_params())
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise _unavailable(exc) from exc
    conn.close()


@contextmanager
def _channel() -> Iterator[tuple[pika.BlockingConnection, BlockingChannel]]:
    try:
        conn = pika.BlockingConnection(_params())
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise _unavailable(exc) from exc
    try:
        yield conn, conn.channel()
    finally:
        conn.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RabbitPeer:
    name = "rabbitmq"
    worker_module = "bench.peers.rabbitmq"
    # the server process, for bench.peer_memory: found by its port, stores in data_dir
    port = urlparse(AMQP_URL).port or 5672
    data_dir: Path | None = DATA_DIR
    start_command = START

    def __init__(self, prefetch: int = DEFAULT_PREFETCH, window: int = PUBLISH_WINDOW) -> None:
        self.prefetch = prefetch
        self.window = window
        self._settings: dict[str, Any] | None = None

    def create(self) -> dict[str, Any]:
        name = f"qbench-{uuid.uuid4().hex[:10]}"
        with _channel() as (_, ch):
            ch.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        return {"queue": name, "prefetch": self.prefetch}

    def delete(self, target: dict[str, Any]) -> None:
        with _channel() as (_, ch):
            ch.queue_delete(target["queue"])

    def outstanding(self, target: dict[str, Any]) -> int:
        # the consumers have closed their channels, so anything unacked is back to ready
        with _channel() as (_, ch):
            return int(ch.queue_declare(target["queue"], passive=True).method.message_count)

    def first_delivery(self, target: dict[str, Any]) -> bool:
        """Take one message (basic.get, manual ack) and leave it unacked; False if there was none.

        The message goes back to the queue when the connection closes.
        """
        with _channel() as (_, ch):
            method, _props, _body = ch.basic_get(target["queue"], auto_ack=False)
            return method is not None

    def publish(
        self, target: dict[str, Any], n: int, size: int, rate: float = 0.0, seconds: float = 0.0
    ) -> Published:
        return _ConfirmedPublisher(target["queue"], n, size, rate, seconds, self.window).run()

    def settings(self) -> dict[str, Any]:
        if self._settings is None:
            with _channel() as (conn, _):
                # BlockingConnection has no public accessor for what the broker said at connect
                props = conn._impl.server_properties or {}
            self._settings = {
                "client": f"pika {version('pika')}",
                "server": f"{_text(props.get('product', 'RabbitMQ'))} {_text(props.get('version', '?'))}",
                "queue": "quorum queue (x-queue-type=quorum), durable, single node",
                "durability": "persistent messages (delivery_mode=2) in the quorum queue's Raft log",
                "publisher_confirms": True,
                "confirm_window": self.window,
                "prefetch": self.prefetch,
                "ack": "manual basic.ack per message",
            }
        return self._settings


class _ConfirmedPublisher:
    """Publish on a confirming channel with at most ``window`` confirms outstanding."""

    def __init__(
        self, queue: str, n: int, size: int, rate: float, seconds: float, window: int
    ) -> None:
        self.queue, self.n, self.size, self.window = queue, n, size, window
        self.rate, self.seconds = rate, seconds
        self.sent = 0
        self.unconfirmed: set[int] = set()
        # every tag below this is confirmed: lets a multiple confirm clear a range once
        self.floor = 1
        self.first = self.last_sent = self.confirmed = 0.0
        self.finished = False
        self.timer_pending = False
        self.error: BaseException | None = None
        self.pacer = Pacer(rate, seconds)
        self.conn: pika.SelectConnection | None = None
        self.ch: Any = None

    def run(self) -> Published:
        self.conn = pika.SelectConnection(
            _params(),
            on_open_callback=self._on_open,
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_closed,
        )
        limit = 120 + (self.n / self.rate if self.rate else self.n / 200)
        self.conn.ioloop.call_later(limit, self._on_timeout)
        self.conn.ioloop.start()
        if self.error is not None:
            raise self.error
        return Published(self.n, self.first, self.last_sent, self.confirmed)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        assert self.conn is not None
        if self.conn.is_open:
            self.conn.close()
        else:
            self.conn.ioloop.stop()

    def _on_open(self, conn: Any) -> None:
        conn.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, conn: Any, exc: BaseException) -> None:
        self.error = _unavailable(exc)
        conn.ioloop.stop()

    def _on_closed(self, conn: Any, reason: BaseException) -> None:
        if not self.finished and self.error is None:
            self.error = RuntimeError(f"RabbitMQ connection closed while publishing: {reason}")
        conn.ioloop.stop()

    def _on_timeout(self) -> None:
        if not self.finished:
            self._fail(
                RuntimeError(
                    f"publish timed out: {self.sent - len(self.unconfirmed)} of {self.n} confirmed"
                )
            )

    def _on_channel(self, ch: Any) -> None:
        self.ch = ch
        ch.add_on_close_callback(self._on_channel_closed)
        ch.confirm_delivery(self._on_confirm, callback=self._on_confirm_mode)

    def _on_channel_closed(self, ch: Any, reason: BaseException) -> None:
        if not self.finished:
            self._fail(RuntimeError(f"RabbitMQ channel closed while publishing: {reason}"))

    def _on_confirm_mode(self, _frame: Any) -> None:
        self.pacer = Pacer(self.rate, self.seconds)
        self.first = time.time()
        self._pump()

    def _on_timer(self) -> None:
        self.timer_pending = False
        self._pump()

    def _pump(self) -> None:
        assert self.conn is not None
        while self.sent < self.n and len(self.unconfirmed) < self.window:
            if self.pacer.over():
                # fell behind the offered rate: what was sent is the run
                self.n = self.sent
                self._finish_if_done()
                return
            wait = self.pacer.wait(self.sent)
            if wait > 0:
                if not self.timer_pending:
                    self.timer_pending = True
                    self.conn.ioloop.call_later(wait, self._on_timer)
                return
            self.ch.basic_publish("", self.queue, payload(self.size, self.sent), _PERSISTENT)
            self.last_sent = time.time()
            self.sent += 1
            # a confirming channel numbers deliveries 1, 2, ... in publish order
            self.unconfirmed.add(self.sent)

    def _on_confirm(self, frame: Any) -> None:
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            self._fail(RuntimeError(f"RabbitMQ nacked publish delivery_tag={method.delivery_tag}"))
            return
        tag = method.delivery_tag
        if method.multiple:
            for t in range(self.floor, tag + 1):
                self.unconfirmed.discard(t)
            self.floor = max(self.floor, tag + 1)
        else:
            self.unconfirmed.discard(tag)
        if not self._finish_if_done():
            self._pump()

    def _finish_if_done(self) -> bool:
        if self.sent < self.n or self.unconfirmed or self.finished:
            return self.finished
        self.confirmed = time.time()
        self.finished = True
        assert self.conn is not None
        self.conn.close()
        return True


def consume(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    """A consumer process: prefetch-bounded deliveries, each acked on its own."""
    conn = pika.BlockingConnection(_params())
    ch = conn.channel()
    ch.basic_qos(prefetch_count=target["prefetch"])

    def on_message(channel: BlockingChannel, method: Any, _props: Any, body: bytes) -> None:
        rec.delivered(body, bool(method.redelivered))
        channel.basic_ack(method.delivery_tag)
        rec.acked()

    ch.basic_consume(target["queue"], on_message, auto_ack=False)
    rec.ready()
    while not stop.is_set():
        conn.process_data_events(time_limit=0.05)
    conn.close()
