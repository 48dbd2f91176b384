"""In-memory ports for the coordinator's parts (``layer.coordinator.round``, ``restore``): the
changelog as a list of transactions, and a subscription's sink as a list of messages."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from layer.api.service import DeliveredMessage
from layer.codec import ChangelogKey, decode_change, decode_key
from layer.config import QueueConfig
from layer.coordinator.commits import Offsets
from layer.coordinator.ingest import Fetched, PartitionStarted
from layer.coordinator.round import RoundSignal
from layer.coordinator.runtime import QueueRuntime
from layer.coordinator.subscriptions import Subscriptions
from layer.engine.model import TopicPartition
from layer.engine.queue import QueueEngine
from layer.exceptions import QLayerError
from layer.state.base import Store
from layer.state.changelog import ChangelogRecord, ExtraRecord

TOPIC = "orders"
TP = TopicPartition(TOPIC, 0)


@dataclass
class Transaction:
    records: list[ChangelogRecord]
    extra: list[ExtraRecord]
    views: list[ExtraRecord]

    def changes(self) -> list[tuple[ChangelogKey, dict[str, Any] | None]]:
        """The changes, one per message (a run record gives one per message of its run);
        snapshots and their confirmations are left out (``snapshot_records``)."""
        out = []
        for _topic, key, value in self.records:
            ck, decoded = decode_change(key, value) if decode_key(key).offset >= -1 else (None, 0)
            if ck is None:
                continue
            for i in range(ck.length):
                out.append((ck._replace(offset=ck.offset + i, length=1) if i else ck, decoded))
        return out

    def snapshot_records(self) -> list[tuple[ChangelogKey, bytes | None]]:
        """The snapshot parts and confirmations (keys at offsets below -1)."""
        return [
            (decode_key(key), value)
            for _topic, key, value in self.records
            if decode_key(key).offset < -1
        ]


class MemoryChangelog:
    """The ``Changelog`` port: each commit is a transaction appended to ``transactions``, its
    records numbered per topic as Kafka would. ``fail`` makes the next commits raise it;
    ``during`` runs while a commit is under way (a clock moving on, say)."""

    def __init__(self) -> None:
        self.transactions: list[Transaction] = []
        self.fail: BaseException | None = None
        self.during: Callable[[], None] | None = None
        self._next: dict[str, int] = defaultdict(int)

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        views: Sequence[ExtraRecord] = (),
    ) -> asyncio.Future[Offsets]:
        fut: asyncio.Future[Offsets] = asyncio.get_running_loop().create_future()
        if self.during is not None:
            self.during()
        if self.fail is not None:
            fut.set_exception(self.fail)
            return fut
        self.transactions.append(Transaction(list(records), list(extra), list(views)))
        offsets: Offsets = {}
        for topic, _key, _value in records:
            offsets[(topic, 0)] = self._next[topic]
            self._next[topic] += 1
        fut.set_result(offsets)
        return fut


@dataclass
class ListSink:
    """A ``DeliverySink`` that keeps what it is given (all of it written at once)."""

    messages: list[DeliveredMessage] = field(default_factory=list)
    closed: str | None = None

    def deliver(self, messages: Sequence[DeliveredMessage]) -> None:
        self.messages.extend(messages)

    @property
    def unsent(self) -> int:
        return 0

    def close(self, reason: str, error: QLayerError | None = None) -> None:
        self.closed = reason


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def queue_config(**options: Any) -> QueueConfig:
    return QueueConfig(name="q", underlying_topic=TOPIC, **options)


def new_runtime(q: QueueConfig) -> QueueRuntime:
    return QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), f"{q.name}-changelog")


def fetch(rt: QueueRuntime, values: Sequence[bytes], first: int = 0) -> None:
    """As a reader hands a fetch over: messages of partition 0 from offset ``first``."""
    messages = [
        Message(
            topic=TOPIC,
            partition=0,
            offset=first + i,
            key=f"k{first + i}".encode(),
            value=value,
            headers=[("h", b"v")],
            timestamp=(1, 1_699_999_999_000),
        )
        for i, value in enumerate(values)
    ]
    started = [PartitionStarted(TP, first)] if TP not in rt.known_partitions else []
    rt.take_fetched(Fetched(messages, {TP: first + len(values)}, started))


def subscriptions(
    runtimes: dict[str, QueueRuntime], store: Store, clock: Clock, signal: RoundSignal
) -> Subscriptions:
    def alive() -> None:
        pass

    return Subscriptions(
        runtimes,
        store,
        clock=clock,
        wake=signal.wake,
        next_commit=signal.next_commit,
        check_alive=alive,
        instance="test",
    )
