"""The definitions topic's I/O: create it, read it to its end, tail it, write to it.

The records and their reduce are ``layer.definitions`` (pure); this module only moves bytes. One
consumer reads the topic's single partition from the start (``catch_up``, at start) and then
follows it on a thread of its own (``tail``); a producer writes changes and says at which
offset each landed, so a writer can wait until its own change has been read back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaPartition

from connectors.admin import TopicAdmin, TopicSpec
from layer.definitions import Write
from layer.exceptions import BrokerError
from layer.state.recovery import take_batch

__all__ = ["DefinitionsLog", "ReadBack", "Record"]

log = logging.getLogger(__name__)

Record = tuple[bytes | None, bytes | None, int]  # key, value, offset

# Compacted, and tombstones kept for ever: a queue deleted with ``qlayer queue delete`` must
# stay deleted when a coordinator reads the topic again years later (compaction would otherwise
# drop the tombstone after delete.retention.ms and the last value before it would come back).
TOPIC_CONFIG = {"cleanup.policy": "compact", "delete.retention.ms": str(2**63 - 1)}


class DefinitionsLog:
    """The cluster's definitions topic (one partition)."""

    def __init__(
        self,
        topic: str,
        admin_settings: Mapping[str, Any],
        consumer_settings: Mapping[str, Any],
        producer_settings: Mapping[str, Any],
    ) -> None:
        self.topic = topic
        self._admin_settings = dict(admin_settings)
        self._consumer = Consumer({**consumer_settings, "enable.partition.eof": True})
        # offset 0, not OFFSET_BEGINNING: that asks ListOffsets first, which Tansu answers
        # in ~0.5 s (a restart's whole cost here); where 0 is gone (Kafka's retention or
        # compaction), auto.offset.reset = earliest starts at the first offset kept
        self._consumer.assign([KafkaPartition(topic, 0, 0)])
        self._producer = Producer(dict(producer_settings))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def ensure(self) -> None:
        TopicAdmin(self._admin_settings).ensure_topics([TopicSpec(self.topic, 1, TOPIC_CONFIG)])

    def catch_up(self, idle_timeout: float = 30.0) -> list[Record]:
        """Every record from where the consumer is to the partition's end."""
        out: list[Record] = []
        idle = 0.0
        while True:
            batch = take_batch(self._consumer, 10_000, 0.2)
            if not batch:
                idle += 0.2
                if idle > idle_timeout:
                    raise BrokerError(f"definitions topic {self.topic}: no end in sight")
                continue
            idle = 0.0
            for msg in batch:
                err = msg.error()
                if err is None:
                    out.append((msg.key(), msg.value(), msg.offset() or 0))
                elif err.code() == KafkaError._PARTITION_EOF:
                    return out
                else:
                    raise BrokerError(f"reading definitions topic {self.topic} failed: {err}")

    def tail(self, on_records: Callable[[list[Record]], None]) -> None:
        """Follow the topic on a thread until ``close``; ``on_records`` is called there."""

        def run() -> None:
            while not self._stop.is_set():
                try:
                    batch = take_batch(self._consumer, 10_000, 0.2)
                except KafkaException as exc:
                    log.warning("reading definitions topic %s: %s", self.topic, exc)
                    continue
                records = [
                    (m.key(), m.value(), m.offset() or 0) for m in batch if m.error() is None
                ]
                for m in batch:
                    err = m.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        log.warning("reading definitions topic %s: %s", self.topic, err)
                if records:
                    on_records(records)

        self._thread = threading.Thread(target=run, name="definitions", daemon=True)
        self._thread.start()

    def write(self, writes: Sequence[Write], timeout: float = 30.0) -> int:
        """Write records in order; returns the offset of the last one (``BrokerError`` if
        the broker did not take them all)."""
        offsets: list[int] = []
        errors: list[str] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))
            else:
                offsets.append(msg.offset())

        for w in writes:
            self._producer.produce(self.topic, key=w.key, value=w.value, on_delivery=delivered)
        left = self._producer.flush(timeout)
        if errors or left or len(offsets) != len(writes):
            why = "; ".join(errors) or f"{left} records not confirmed in {timeout:.0f}s"
            raise BrokerError(f"writing to definitions topic {self.topic} failed: {why}")
        return max(offsets)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the tail and flush what is written, within about ``timeout`` (Kafka away:
        the records not confirmed by then are left)."""
        deadline = time.monotonic() + timeout
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._consumer.close()
        self._producer.flush(max(deadline - time.monotonic(), 0.1))


class ReadBack:
    """Writers of a log waiting until its tail has read their records back (so what the tail
    builds holds everything written before): ``wait`` after a write, ``reached`` from the
    tail, both on the event loop."""

    def __init__(self) -> None:
        self._waiting: list[tuple[int, asyncio.Future[None]]] = []

    def reached(self, next_offset: int) -> None:
        """The tail has read everything before ``next_offset``: wake who waited for it."""
        waiting = []
        for offset, future in self._waiting:
            if offset >= next_offset:
                waiting.append((offset, future))
            elif not future.done():
                future.set_result(None)
        self._waiting = waiting

    async def wait(self, last: int, next_offset: int, timeout: float) -> bool:
        """Wait until the record at ``last`` is read back (the tail is at ``next_offset``
        now); False if ``timeout`` seconds pass first."""
        if last < next_offset:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((last, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return False
        return True
