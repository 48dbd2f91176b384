"""Publishing to a queue's name: AMPS routes such a publish to the queue's DefaultPublishTarget.

Here a publisher may write, with any Kafka producer, to the topic named after a queue that has a
``default_publish_target`` (and does not read that topic itself). The coordinator copies each
such message to the target topic exactly once: the copies and the read position of the source
partitions go into the same changelog transaction, and after a restart the copying resumes from
the committed position. The position is kept in the queue's changelog as the POSITION records of
a companion name (``<queue>~route``), which no queue can have (``~`` is not allowed in names).

A copy keeps the key, value and headers and adds ``qlayer.routed-from``: the source bookmark.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import Message

from layer.codec import encode_change
from layer.config import QueueConfig
from layer.coordinator.ingest import Fetched, IngestReader, bookmark_of
from layer.engine.model import LowWater, TopicPartition
from layer.state.base import Store, StoreBatch
from layer.state.changelog import ChangelogRecord, ExtraRecord

log = logging.getLogger(__name__)

ROUTE_SUFFIX = "~route"
ROUTED_FROM = "qlayer.routed-from"


def routes_publishes(queue: QueueConfig) -> bool:
    """Whether publishes to the topic named after ``queue`` are copied to its target."""
    return queue.default_publish_target is not None and not queue.matches(queue.name)


@dataclass(slots=True)
class PublishRoute:
    """The copier of one queue: what was fetched from the source topic and not copied yet."""

    queue: str
    source: str
    target: str
    changelog_topic: str
    inbox: deque[Message] = field(default_factory=deque)
    copied_total: int = 0
    reader: IngestReader | None = None

    @property
    def state_name(self) -> str:
        return self.queue + ROUTE_SUFFIX

    def positions(self, store: Store) -> dict[TopicPartition, int]:
        """Next offset to copy per source partition, as committed."""
        return {
            tp: pos.low_water
            for tp, pos in store.positions(self.state_name).items()
            if pos.low_water is not None
        }

    def start(
        self,
        store: Store,
        consumer_settings: dict[str, object],
        on_batch: Callable[[Fetched], None],
        on_trouble: Callable[[str], None] | None = None,
    ) -> None:
        """Start copying; ``on_trouble``: told of Kafka transport errors (the reader goes on)."""
        self.reader = IngestReader(
            self.state_name,
            consumer_settings,
            self.source,
            False,
            self.positions(store),
            "earliest",  # everything ever published to the queue's name is routed
            on_batch,
            lambda: len(self.inbox),
            on_trouble=on_trouble,
        )
        self.reader.start()

    def take(
        self, batch: StoreBatch, now_ms: int, limit: int = 4096
    ) -> tuple[list[ChangelogRecord], list[ExtraRecord]]:
        """Up to ``limit`` copies and the position records that go in the same transaction;
        the positions also go into ``batch`` (written once the transaction commits)."""
        copies: list[ExtraRecord] = []
        reached: dict[TopicPartition, int] = {}
        inbox = self.inbox
        while inbox and len(copies) < limit:
            msg = inbox.popleft()
            bm = bookmark_of(msg)
            headers: list[tuple[str, bytes | None]] = list(msg.headers() or ())  # type: ignore[arg-type]
            headers.append((ROUTED_FROM, str(bm).encode()))
            copies.append((self.target, msg.key(), msg.value(), headers))
            reached[TopicPartition(bm.topic, bm.partition)] = bm.offset + 1
        records: list[ChangelogRecord] = []
        for tp, offset in reached.items():
            key, value = encode_change(self.state_name, LowWater(tp, offset), now_ms)
            records.append((self.changelog_topic, key, value))
            batch.put_low_water(self.state_name, tp, offset)
        self.copied_total += len(copies)
        return records, copies
