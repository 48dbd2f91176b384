"""Recovery: rebuild a store from the changelog topic, resuming from the offsets it already holds.

The changelog is read with ``isolation.level=read_committed`` (aborted and open transactions are
never applied), from each partition's stored offset (or the beginning), until it is caught up,
and reduced last-value-wins into the store: a later record for a key overwrites an earlier one,
a tombstone deletes, a POSITION record sets the partition's low-water mark and drops every entry
below it. Each consumed batch is written in one store batch *together with* the changelog offsets
it reaches, so a restore interrupted at any point resumes where it stopped and never applies a
record twice. Correctness does not depend on compaction: an uncompacted changelog holds every
version of every key, and they are simply applied in order.

"Caught up" is decided per partition by the consumer's end-of-partition event or by its position
reaching the high watermark of the last fetch response. The high watermark from ListOffsets is
not used: some brokers (Tansu) answer it wrongly. With transactions the last offsets of a
partition are commit markers that are never delivered, so counting delivered records would wait
forever; the consumer position moves past them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from layer.codec import CHANGELOG_VALUE, POSITION_OFFSET, decode, decode_key, default_codec
from layer.engine.model import TopicPartition
from layer.exceptions import RecoveryError, SerializationError, StateError
from layer.state.base import ENTRIES, Store, StoreBatch, pack_offset, partition_prefix

__all__ = ["RestoreResult", "restore"]

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    records_applied: int  # changelog records read and applied (beyond what the store had)
    seconds: float


def _settings(consumer_settings: Mapping[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {"group.id": f"qlayer-restore-{uuid.uuid4().hex}"}
    settings.update(consumer_settings)
    settings.update(
        {
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            # A stored offset outside the log means the changelog lost records (a broker without
            # persistence restarted, or retention deleted them): fail loudly, never skip.
            "auto.offset.reset": "error",
        }
    )
    return settings


class _Restorer:
    def __init__(self, store: Store, changelog_topic: str, progress: Progress | None) -> None:
        self.store = store
        self.topic = changelog_topic
        self.progress = progress
        self.low_water: dict[tuple[str, TopicPartition], int] = {}
        self.loaded_queues: set[str] = set()
        self.readable_versions = frozenset(default_codec().schema(CHANGELOG_VALUE).readers)

    def _low_water(self, queue: str, tp: TopicPartition) -> int | None:
        if queue not in self.loaded_queues:
            self.loaded_queues.add(queue)
            for partition, position in self.store.positions(queue).items():
                if position.low_water is not None:
                    self.low_water.setdefault((queue, partition), position.low_water)
        return self.low_water.get((queue, tp))

    def apply(
        self, batch: StoreBatch, key: bytes | None, value: bytes | None, partition: int, offset: int
    ) -> None:
        try:
            if key is None:
                raise SerializationError("no key")
            ck = decode_key(key)
            tp = TopicPartition(ck.topic, ck.partition)
            if ck.offset == POSITION_OFFSET:
                self._apply_position(batch, ck.queue, tp, value)
                return
            known = self._low_water(ck.queue, tp)
            if known is not None and ck.offset < known:
                return  # done and below the low-water mark: nothing to keep
            store_key = partition_prefix(ck.queue, ck.topic, ck.partition) + pack_offset(ck.offset)
            if value is None:
                batch.ops.append((ENTRIES, store_key, None))
            elif value and value[0] in self.readable_versions:
                # Kept as the changelog's bytes: the store decodes entries when they are read.
                batch.ops.append((ENTRIES, store_key, value))
            else:
                raise SerializationError("unknown value format")
        except (SerializationError, StateError) as exc:
            where = f"{self.topic}/{partition}/{offset}"
            raise RecoveryError(f"changelog record {where} cannot be applied: {exc}") from exc

    def _apply_position(
        self, batch: StoreBatch, queue: str, tp: TopicPartition, value: bytes | None
    ) -> None:
        if value is None:
            batch.delete_low_water(queue, tp)
            self.low_water.pop((queue, tp), None)
            return
        low_water = decode(CHANGELOG_VALUE, value)["low_water"]
        if low_water is None:
            raise SerializationError("a POSITION record without low_water")
        batch.put_low_water(queue, tp, low_water)
        batch.delete_entries_below(queue, tp, low_water)
        self._low_water(queue, tp)
        self.low_water[(queue, tp)] = low_water


def restore(
    store: Store,
    consumer_settings: Mapping[str, Any],
    changelog_topic: str,
    queue: str | None,
    progress: Progress | None = None,
    *,
    batch_size: int = 10_000,
    idle_timeout: float = 30.0,
) -> RestoreResult:
    """Apply every committed changelog record the store has not applied yet.

    ``consumer_settings`` are librdkafka settings (bootstrap servers, security); isolation level,
    offset handling and partition-EOF events are set here. Records of every queue found in the
    changelog topic are applied (the store keeps one offset per changelog partition, so skipping
    another queue's records would lose them); ``queue`` names the queue being restored in logs.
    ``progress(done, total)`` is called after each applied batch; ``total`` grows as the high
    watermarks become known. Raises ``RecoveryError`` when the topic is missing, a record cannot
    be decoded, the stored offset is outside the log, or nothing arrives for ``idle_timeout``.
    """
    started = time.monotonic()
    restorer = _Restorer(store, changelog_topic, progress)
    try:
        consumer = Consumer(_settings(consumer_settings))
    except KafkaException as exc:
        raise RecoveryError(f"cannot create a changelog consumer: {exc}") from exc
    try:
        applied = _run(consumer, restorer, queue, batch_size, idle_timeout)
    finally:
        consumer.close()
    result = RestoreResult(applied, time.monotonic() - started)
    logger.info(
        "changelog restored topic=%s queue=%s records=%d seconds=%.3f",
        changelog_topic,
        queue,
        result.records_applied,
        result.seconds,
    )
    return result


def _partitions(consumer: Consumer, topic: str, timeout: float) -> list[int]:
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
    except KafkaException as exc:
        raise RecoveryError(f"cannot read the metadata of changelog topic {topic}: {exc}") from exc
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        error = found.error if found is not None else "not found"
        raise RecoveryError(f"changelog topic {topic} is not available: {error}")
    return sorted(found.partitions)


def _run(
    consumer: Consumer, restorer: _Restorer, queue: str | None, batch_size: int, idle_timeout: float
) -> int:
    topic, store = restorer.topic, restorer.store
    partitions = _partitions(consumer, topic, idle_timeout)
    starts: dict[int, int | None] = {p: store.changelog_offset(topic, p) for p in partitions}
    consumer.assign(
        [KafkaPartition(topic, p, OFFSET_BEGINNING if s is None else s) for p, s in starts.items()]
    )
    logger.info(
        "changelog restore started topic=%s queue=%s partitions=%d resume_offsets=%s",
        topic,
        queue,
        len(partitions),
        starts,
    )
    pending = set(partitions)
    applied = 0
    last_activity = time.monotonic()
    while pending:
        messages = consumer.consume(num_messages=batch_size, timeout=0.2)
        batch = StoreBatch()
        reached: dict[int, int] = {}
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                    continue
                raise RecoveryError(
                    f"reading changelog {topic}/{msg.partition()} failed: {err}"
                    + (" (the stored offset is outside the log)" if _is_reset(err) else "")
                )
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None:
                raise RecoveryError(f"changelog {topic}: a record without partition or offset")
            restorer.apply(batch, msg.key(), msg.value(), partition, offset)
            reached[partition] = offset + 1
        if reached:
            for partition, next_offset in reached.items():
                batch.set_changelog_offset(topic, partition, next_offset)
            store.write(batch)
            applied += sum(1 for m in messages if m.error() is None)
        if messages:
            last_activity = time.monotonic()
        _caught_up(consumer, topic, pending)
        if restorer.progress is not None:
            restorer.progress(applied, applied + _remaining(consumer, topic, partitions))
        if pending and time.monotonic() - last_activity > idle_timeout:
            raise RecoveryError(
                f"changelog {topic}: no records nor end of partition for {idle_timeout:.0f}s "
                f"(partitions {sorted(pending)} not caught up)"
            )
    return applied


def _is_reset(err: KafkaError) -> bool:
    return err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE)


def _caught_up(consumer: Consumer, topic: str, pending: set[int]) -> None:
    if not pending:
        return
    positions = consumer.position([KafkaPartition(topic, p) for p in pending])
    for tp in positions:
        if tp.offset < 0:
            continue  # nothing consumed from it yet
        _low, high = consumer.get_watermark_offsets(tp, cached=True)
        if high is not None and high >= 0 and tp.offset >= high:
            pending.discard(tp.partition)


def _remaining(consumer: Consumer, topic: str, partitions: list[int]) -> int:
    remaining = 0
    for tp in consumer.position([KafkaPartition(topic, p) for p in partitions]):
        _low, high = consumer.get_watermark_offsets(tp, cached=True)
        if high is not None and high >= 0:
            start = tp.offset if tp.offset >= 0 else max(_low or 0, 0)
            remaining += max(high - start, 0)
    return remaining
