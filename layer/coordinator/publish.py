"""Publishing through the coordinator: one producer, a publish answered once Kafka has it.

While Kafka is away a publish is refused at once, and those waiting for Kafka's answer fail
as soon as the coordinator's watch says it went away (``fail_waiting``): a client is never
left waiting on a broker that does not answer. Such a publish may still be written when Kafka
comes back; the error says so.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaException, Producer

from connectors.kafka import producer_settings
from layer.coordinator.outage import KafkaWatch
from layer.engine.model import Bookmark
from layer.exceptions import BrokerError

__all__ = ["Publisher"]


class Publisher:
    """Runs on the coordinator's event loop; the producer's callbacks come back to it."""

    def __init__(self, settings: Mapping[str, Any], watch: KafkaWatch) -> None:
        self._settings = settings
        self._watch = watch
        self._waiting: set[asyncio.Future[Bookmark]] = set()
        self._producer: Producer | None = None
        self._stop = threading.Event()
        self._poll_task: asyncio.Future[None] | None = None

    def start(self) -> None:
        self._producer = Producer(producer_settings(self._settings, linger_ms=2))
        self._poll_task = asyncio.ensure_future(asyncio.to_thread(self._poll))

    async def publish(
        self,
        target: str,
        value: bytes,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] = (),
    ) -> Bookmark:
        if not self._watch.reachable:
            raise self._watch.unreachable_error(f"publish to {target!r} refused")
        assert self._producer is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Bookmark] = loop.create_future()

        def delivered(err: object, msg: object) -> None:
            if err is not None:
                loop.call_soon_threadsafe(
                    _set_exception, fut, BrokerError(f"publish to {target!r} failed: {err}")
                )
            else:
                bm = Bookmark(msg.topic(), msg.partition(), msg.offset())  # type: ignore[attr-defined]
                loop.call_soon_threadsafe(_set_result, fut, bm)

        try:
            self._producer.produce(
                target, value=value, key=key, headers=list(headers) or None, on_delivery=delivered
            )
        except (KafkaException, BufferError) as exc:
            raise BrokerError(f"publish to {target!r} failed: {exc}") from exc
        self._waiting.add(fut)
        try:
            return await fut
        finally:
            self._waiting.discard(fut)

    def fail_waiting(self) -> None:
        """Kafka went away: the publishes waiting for its answer fail now."""
        if not self._waiting:
            return
        error = self._watch.unreachable_error(
            "publish not confirmed (it may still be written when Kafka is back)"
        )
        for fut in list(self._waiting):
            _set_exception(fut, error)

    async def stop(self) -> None:
        self._stop.set()
        if self._poll_task is not None:
            await self._poll_task
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 5)

    def _poll(self) -> None:
        assert self._producer is not None
        while not self._stop.is_set():
            self._producer.poll(0.05)


def _set_result(fut: asyncio.Future[Bookmark], value: Bookmark) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[Bookmark], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
