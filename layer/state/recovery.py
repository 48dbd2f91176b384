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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from layer.codec import (
    CHANGELOG_VALUE,
    CONFIRM_OFFSET,
    POSITION_OFFSET,
    decode,
    decode_key,
    default_codec,
)
from layer.engine.model import TopicPartition
from layer.exceptions import RecoveryError, RestoreStopped, SerializationError, StateError
from layer.state.base import ENTRIES, Store, StoreBatch, pack_offset, partition_prefix
from layer.state.snapshot import Subject, decode_confirm, decode_part

__all__ = ["RestoreResult", "Tail", "replay", "restore", "take_batch"]

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class RestoreResult:
    records_applied: int  # changelog records read and applied (beyond what the store had)
    seconds: float


def take_batch(consumer: Consumer, limit: int, timeout: float) -> list[Message]:
    """Up to ``limit`` messages (and events: end of partition, errors): waits up to ``timeout``
    for the first, then takes what the consumer already holds. ``consume(limit, timeout)``
    waits until ``limit`` have come or the time is up, so a read whose end is near waited out
    the whole timeout at every call: 0.2-0.5 s of each restart on an intact state directory."""
    first = consumer.poll(timeout)
    if first is None:
        return []
    return [first, *consumer.consume(limit - 1, 0)] if limit > 1 else [first]


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


_ALL = 1 << 63  # above every offset: delete_entries_below(..., _ALL) empties a partition


class _Restorer:
    def __init__(self, store: Store, changelog_topic: str, progress: Progress | None) -> None:
        self.store = store
        self.topic = changelog_topic
        self.progress = progress
        self.low_water: dict[tuple[str, TopicPartition], int] = {}
        self.loaded_queues: set[str] = set()
        self.readable_versions = frozenset(default_codec().schema(CHANGELOG_VALUE).readers)
        # the snapshot (id) each subject starts from, when the restore began at a snapshot;
        # every other snapshot record is passed over
        self.chosen: dict[Subject, str] = {}

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
            if ck.offset < 0:
                if ck.offset == POSITION_OFFSET:
                    self._apply_position(batch, ck.queue, tp, value)
                elif ck.offset == CONFIRM_OFFSET:
                    if value is not None:
                        decode_confirm(value)  # a malformed one is an error, not skipped
                elif value is not None and self.chosen.get((ck.queue, tp)) is not None:
                    self._apply_snapshot(batch, ck.queue, tp, value)
                return
            known = self._low_water(ck.queue, tp)
            first = ck.offset
            end = first + ck.length
            if known is not None:
                if end <= known:
                    return  # done and below the low-water mark: nothing to keep
                first = max(first, known)
            prefix = partition_prefix(ck.queue, ck.topic, ck.partition)
            if value is None:
                if end - first == 1:
                    batch.ops.append((ENTRIES, prefix + pack_offset(first), None))
                else:  # the tombstone of a run (format 2, since issue 11): every offset of it
                    batch.delete_entries(ck.queue, tp, first, end)
            elif value and value[0] in self.readable_versions:
                # Kept as the changelog's bytes: the store decodes entries when they are read.
                ops = batch.ops
                for offset in range(first, end):
                    ops.append((ENTRIES, prefix + pack_offset(offset), value))
            else:
                raise SerializationError("unknown value format")
        except (SerializationError, StateError) as exc:
            where = f"{self.topic}/{partition}/{offset}"
            raise RecoveryError(f"changelog record {where} cannot be applied: {exc}") from exc

    def _apply_snapshot(
        self, batch: StoreBatch, queue: str, tp: TopicPartition, value: bytes
    ) -> None:
        part = decode_part(value)
        if part.id != self.chosen.get((queue, tp)):
            return  # not the snapshot this restore starts from (an older or unconfirmed one)
        if part.part == 0:
            # the partition's state is the snapshot's: whatever was applied before goes
            batch.delete_entries_below(queue, tp, _ALL)
            self._low_water(queue, tp)
            if part.low_water is None:
                batch.delete_low_water(queue, tp)
                self.low_water.pop((queue, tp), None)
            else:
                batch.put_low_water(queue, tp, part.low_water)
                self.low_water[(queue, tp)] = part.low_water
        prefix = partition_prefix(queue, tp.topic, tp.partition)
        ops = batch.ops
        for first, count, run_value in part.runs:
            if not run_value or run_value[0] not in self.readable_versions:
                raise SerializationError("a snapshot run of an unknown value format")
            for offset in range(first, first + count):
                ops.append((ENTRIES, prefix + pack_offset(offset), run_value))

    def _apply_position(
        self, batch: StoreBatch, queue: str, tp: TopicPartition, value: bytes | None
    ) -> None:
        if value is None:
            known = self._low_water(queue, tp)
            if known is not None:
                # the mark hid the entries below it that the live path had not deleted yet
                batch.delete_entries_below(queue, tp, known)
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


class Tail:
    """Applies a changelog topic's records to a store as they come (a standby's warm copy,
    ``layer.coordinator.standby``), after a ``restore`` brought the store to some offset: each
    batch goes in one store write with the offsets it reaches, exactly as a restore's do, so a
    later ``restore`` resumes where the tail stopped. Only records the consumer delivers from
    each partition's stored offset on may be given (snapshots are passed over, as in a resumed
    restore). One ``Tail`` per topic while it is tailed; nothing else writes those queues."""

    def __init__(self, store: Store, changelog_topic: str) -> None:
        self._restorer = _Restorer(store, changelog_topic, None)

    def apply(self, messages: Sequence[Message]) -> int:
        """Apply records of this topic (errors and events are the caller's); returns how many."""
        restorer = self._restorer
        batch = StoreBatch()
        reached: dict[int, int] = {}
        for msg in messages:
            partition, offset = msg.partition(), msg.offset()
            if partition is None or offset is None:
                raise RecoveryError(f"changelog {restorer.topic}: a record without an offset")
            restorer.apply(batch, msg.key(), msg.value(), partition, offset)
            reached[partition] = offset + 1
        for partition, next_offset in reached.items():
            batch.set_changelog_offset(restorer.topic, partition, next_offset)
        if reached:
            restorer.store.write(batch)
        return len(messages)


def restore(
    store: Store,
    consumer_settings: Mapping[str, Any],
    changelog_topic: str,
    queue: str | None,
    progress: Progress | None = None,
    *,
    batch_size: int = 10_000,
    idle_timeout: float = 30.0,
    stop: Callable[[], bool] | None = None,
) -> RestoreResult:
    """Apply every committed changelog record the store has not applied yet.

    ``consumer_settings`` are librdkafka settings (bootstrap servers, security); isolation level,
    offset handling and partition-EOF events are set here. Records of every queue found in the
    changelog topic are applied (the store keeps one offset per changelog partition, so skipping
    another queue's records would lose them); ``queue`` names the queue being restored in logs.
    ``progress(done, total)`` is called after each applied batch; ``total`` grows as the high
    watermarks become known. Raises ``RecoveryError`` when the topic is missing, a record cannot
    be decoded, the stored offset is outside the log, or nothing arrives for ``idle_timeout``.
    ``stop()`` is asked between fetches (about every 0.2 s at most): once true, the restore
    raises ``RestoreStopped``, keeping what it applied (each batch is written with its offsets).
    """
    started = time.monotonic()
    restorer = _Restorer(store, changelog_topic, progress)
    reader = _Reader(_settings(consumer_settings))
    try:
        applied = _run(reader, restorer, queue, batch_size, idle_timeout, stop or _never)
    finally:
        reader.close()
    if restorer.chosen:
        logger.info(
            "changelog restore started at snapshots topic=%s subjects=%d",
            changelog_topic,
            len(restorer.chosen),
        )
    result = RestoreResult(applied, time.monotonic() - started)
    logger.info(
        "changelog restored topic=%s queue=%s records=%d seconds=%.3f",
        changelog_topic,
        queue,
        result.records_applied,
        result.seconds,
    )
    return result


def replay(
    store: Store,
    topic: str,
    records: Sequence[tuple[bytes | None, bytes | None]],
    *,
    from_snapshot: bool,
) -> int:
    """Apply one changelog partition's records (key, value; offset = index) to ``store``, as
    ``restore`` does from Kafka: from the last usable snapshot when ``from_snapshot`` and there
    is one, else from the first record. Returns the records applied. (No I/O but the store's.)"""
    restorer = _Restorer(store, topic, None)
    start = 0
    if from_snapshot:
        candidates = _Candidates()
        for offset, (key, value) in enumerate(records):
            if key is not None and _maybe_mark(key):
                try:
                    candidates.see(key, value, offset)
                except (SerializationError, StateError) as exc:
                    where = f"{topic}/0/{offset}"
                    raise RecoveryError(f"changelog record {where} cannot be read: {exc}") from exc
        found = candidates.usable()
        if found is not None:
            start, restorer.chosen = found[0], dict(found[1])
    batch = StoreBatch()
    for offset in range(start, len(records)):
        key, value = records[offset]
        restorer.apply(batch, key, value, 0, offset)
    batch.set_changelog_offset(topic, 0, len(records))
    store.write(batch)
    return len(records) - start


def _watermarks(consumer: Consumer, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    """A changelog partition's low and high watermarks, asked of the broker."""
    try:
        low, high = consumer.get_watermark_offsets(
            KafkaPartition(topic, partition), timeout=timeout, cached=False
        )
    except KafkaException as exc:
        raise RecoveryError(
            f"cannot read the offsets of changelog {topic}/{partition}: {exc}"
        ) from exc
    return low, high


def _at_end(ends: tuple[int, int], start: int | None) -> bool:
    """Whether a changelog partition holds nothing after ``start`` (the stored offset; None:
    nothing applied), by its ``ends`` (``_log_ends``): its log is empty, or ``start`` is its
    end. Decided from ListOffsets, so that a restart whose changelog did not move reads
    nothing: reading to the end costs a fetch wait or more (0.1-0.3 s on Tansu) even when
    nothing comes.

    The ends are the log's, every record counted (read_uncommitted): under read_committed
    Tansu answers 0 for the end while a transaction is open, which would make a changelog of
    committed records look empty (and a changelog's owner commits all the time). ListOffsets
    (latest) is short of the end on Tansu (the last batch's base offset + 1), but never past
    it, and the changelog is written in transactions only: its last batch is a commit or abort
    marker of one record, whose base offset + 1 is the end, or the records of a transaction
    still open, which begin at or after every offset a read_committed restore reached, so their
    base offset + 1 is past ``start``. So ``start`` equal to it is the end on every broker.
    Anything else (a ``start`` outside the log too) is left to the read, which reports it."""
    low, high = ends
    if low < 0 or high < low:
        return False
    return high == low if start is None else low <= start == high


def _log_ends(
    settings: Mapping[str, Any], topic: str, partitions: list[int], timeout: float
) -> dict[int, tuple[int, int]]:
    """The low watermark and the end of each partition's log, every record counted
    (ListOffsets under read_uncommitted, asked by a consumer of its own: the restore's reads
    read_committed)."""
    consumer = _consumer({**settings, "isolation.level": "read_uncommitted"})
    try:
        return {p: _watermarks(consumer, topic, p, timeout) for p in partitions}
    finally:
        consumer.close()


def _consumer(settings: dict[str, Any]) -> Consumer:
    try:
        return Consumer(settings)
    except KafkaException as exc:
        raise RecoveryError(f"cannot create a changelog consumer: {exc}") from exc


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


#: the fetch waits a restore's consumer steps through while its fetches bring nothing (see
#: ``_Reader``); each is given ``max(WAIT_PATIENCE_S, 3 waits)`` before the next
WAIT_STEPS_MS = (100, 500, 2_500)  # (the first is also the least)
WAIT_PATIENCE_S = 0.3


class _Reader:
    """The restore's consumer. Tansu holds a fetch for its whole ``fetch.wait.max.ms`` and, on
    a partition of many small transactions (a changelog: one per group commit, never
    compacted there), needs longer than the profile's 10 ms to find the offset asked: the
    fetch comes back empty, again and again (measured: 16,000 offsets read from the end
    never at 10 ms in 30 s, 1.0-3.1 s at 100, 0.9 s at 500, at load 18-25; 0.17 / 0.25 / 0.54 s
    at 100 / 200 / 500 at load 5). So a consumer whose fetches bring nothing for a while is
    made again with the next longer wait (``WAIT_STEPS_MS``), at the positions reached: a
    takeover from a warm standby costs one short fetch where it can, and a few hundred ms
    where it cannot, never the 3-12 s seen. On Kafka an empty fetch means the end: nothing
    changes there but one wait."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)
        # at least the first step: at 10 ms a fetch found nothing on a changelog of a few
        # thousand offsets as soon as the machine was busy, and each try cost 0.3 s
        self.wait_ms = max(int(self.settings.get("fetch.wait.max.ms", 500)), WAIT_STEPS_MS[0])
        self._empty_since: float | None = None
        self.consumer = self._make()

    def _make(self) -> Consumer:
        return _consumer({**self.settings, "fetch.wait.max.ms": self.wait_ms})

    def took(self, got_any: bool, now: float, resume: Callable[[], list[KafkaPartition]]) -> None:
        """After a poll: when nothing came for long enough, the consumer is made again with
        the next wait and assigned ``resume()``."""
        if got_any:
            self._empty_since = None
            return
        if self._empty_since is None:
            self._empty_since = now
            return
        longer = [w for w in WAIT_STEPS_MS if w > self.wait_ms]
        if not longer or now - self._empty_since < max(WAIT_PATIENCE_S, 3 * self.wait_ms / 1000):
            return
        positions = resume()
        self.consumer.close()
        self.wait_ms, self._empty_since = longer[0], None
        self.consumer = self._make()
        self.consumer.assign(positions)
        logger.info(
            "changelog restore: fetches brought nothing, fetch.wait.max.ms now %d", self.wait_ms
        )

    def close(self) -> None:
        self.consumer.close()


def _never() -> bool:
    return False


def _check(stop: Callable[[], bool], topic: str) -> None:
    if stop():
        raise RestoreStopped(f"changelog restore of {topic} stopped before it caught up")


def _run(
    reader: _Reader,
    restorer: _Restorer,
    queue: str | None,
    batch_size: int,
    idle_timeout: float,
    stop: Callable[[], bool],
) -> int:
    topic, store = restorer.topic, restorer.store
    consumer = reader.consumer
    partitions = _partitions(consumer, topic, idle_timeout)
    starts: dict[int, int | None] = {p: store.changelog_offset(topic, p) for p in partitions}
    ends = _log_ends(reader.settings, topic, partitions, idle_timeout)
    done = {p for p in partitions if _at_end(ends[p], starts[p])}
    if len(done) == len(partitions):
        _check(stop, topic)
        if restorer.progress is not None:
            restorer.progress(0, 0)
        logger.info(
            "changelog restore: nothing to read topic=%s queue=%s resume_offsets=%s",
            topic,
            queue,
            starts,
        )
        return 0
    for p, start in starts.items():
        if start is None and p not in done:
            # nothing applied yet: start at the last usable snapshot, when there is one
            found = _last_snapshot(consumer, topic, p, idle_timeout, stop)
            if found is not None:
                starts[p], chosen = found
                restorer.chosen.update(chosen)

    def assignment() -> list[KafkaPartition]:
        return [
            KafkaPartition(topic, p, OFFSET_BEGINNING if s is None else s)
            for p, s in starts.items()
        ]

    consumer.assign(assignment())
    logger.info(
        "changelog restore started topic=%s queue=%s partitions=%d resume_offsets=%s",
        topic,
        queue,
        len(partitions),
        starts,
    )
    pending = set(partitions) - done
    applied = 0
    last_activity = time.monotonic()
    while pending:
        _check(stop, topic)
        consumer = reader.consumer
        messages = take_batch(consumer, batch_size, 0.1)
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
            starts.update(reached)
        if messages:
            last_activity = time.monotonic()
        _caught_up(consumer, topic, pending)
        if pending:
            reader.took(bool(messages), time.monotonic(), assignment)
            consumer = reader.consumer  # made again with a longer wait, maybe
        if restorer.progress is not None:
            restorer.progress(applied, applied + _remaining(consumer, topic, partitions))
        if pending and time.monotonic() - last_activity > idle_timeout:
            raise RecoveryError(
                f"changelog {topic}: no records nor end of partition for {idle_timeout:.0f}s "
                f"(partitions {sorted(pending)} not caught up)"
            )
    return applied


#: records read per step of the backward search for a snapshot (doubled at each step)
SEARCH_CHUNK = 4_096


class _Candidates:
    """What the backward search has seen so far, from some offset to the partition's end."""

    def __init__(self) -> None:
        self.confirmed: set[tuple[Subject, str]] = set()
        # (subject, id) -> {part: offset of its last occurrence}
        self.parts: dict[tuple[Subject, str], dict[int, int]] = {}
        self.parts_count: dict[tuple[Subject, str], int] = {}
        # id -> (offset of its last part 0, siblings)
        self.ids: dict[str, tuple[int, tuple[Subject, ...]]] = {}

    def see(self, key: bytes, value: bytes | None, offset: int) -> None:
        ck = decode_key(key)
        if ck.offset == CONFIRM_OFFSET and value is not None:
            snapshot_id, _parts = decode_confirm(value)
            self.confirmed.add(((ck.queue, ck.topic_partition), snapshot_id))
            return
        if ck.offset >= CONFIRM_OFFSET or value is None:
            return
        part = decode_part(value)
        subject = (ck.queue, ck.topic_partition)
        found = self.parts.setdefault((subject, part.id), {})
        found.setdefault(part.part, offset)  # scanned backwards: the first seen is the last
        found[part.part] = max(found[part.part], offset)
        self.parts_count[(subject, part.id)] = part.parts
        if part.part == 0 and part.siblings:
            last = self.ids.get(part.id)
            if last is None or offset > last[0]:
                self.ids[part.id] = (offset, part.siblings)

    def usable(self) -> tuple[int, dict[Subject, str]] | None:
        """(offset to start from, subject -> id) of the latest usable snapshot, if any."""
        for snapshot_id, (_offset, siblings) in sorted(
            self.ids.items(), key=lambda item: item[1][0], reverse=True
        ):
            start: int | None = None
            for subject in siblings:
                key = (subject, snapshot_id)
                found = self.parts.get(key, {})
                parts = self.parts_count.get(key)
                if key not in self.confirmed or parts is None or len(found) != parts:
                    break
                first = found[0]
                if any(found[p] < first for p in range(parts)):
                    break  # a later part 0 without its other parts after it
                start = first if start is None else min(start, first)
            else:
                if start is not None:
                    return start, {subject: snapshot_id for subject in siblings}
        return None


def _last_snapshot(
    consumer: Consumer, topic: str, partition: int, idle_timeout: float, stop: Callable[[], bool]
) -> tuple[int, dict[Subject, str]] | None:
    """The latest usable snapshot of one changelog partition: searched backwards from its end,
    in growing steps, reading each step forwards. None when the partition has none."""
    low, high = _watermarks(consumer, topic, partition, idle_timeout)
    # ``high`` may be short of the end on some brokers (Tansu): the first step reads to the end
    candidates = _Candidates()
    chunk = SEARCH_CHUNK
    hi: int | None = None
    lo = max(low, high - chunk)
    while True:
        _read_range(consumer, topic, partition, lo, hi, candidates, idle_timeout, stop)
        found = candidates.usable()
        if found is not None or lo <= low:
            consumer.unassign()
            return found
        chunk *= 2
        hi, lo = lo, max(low, lo - chunk)


def _read_range(
    consumer: Consumer,
    topic: str,
    partition: int,
    lo: int,
    hi: int | None,
    candidates: _Candidates,
    idle_timeout: float,
    stop: Callable[[], bool],
) -> None:
    """Show ``candidates`` the records from ``lo`` to ``hi`` (None: the partition's end)."""
    consumer.assign([KafkaPartition(topic, partition, lo)])
    last_activity = time.monotonic()
    while True:
        _check(stop, topic)
        messages = take_batch(consumer, 10_000, 0.2)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if hi is None:
                        return
                    continue
                raise RecoveryError(f"reading changelog {topic}/{partition} failed: {err}")
            offset = msg.offset()
            if offset is None or (hi is not None and offset >= hi):
                continue
            key = msg.key()
            if key is not None and _maybe_mark(key):
                try:
                    candidates.see(key, msg.value(), offset)
                except (SerializationError, StateError) as exc:
                    where = f"{topic}/{partition}/{offset}"
                    raise RecoveryError(f"changelog record {where} cannot be read: {exc}") from exc
        if messages:
            last_activity = time.monotonic()
        position = consumer.position([KafkaPartition(topic, partition)])[0].offset
        if position >= 0:
            if hi is not None and position >= hi:
                return
            _low, high = consumer.get_watermark_offsets(
                KafkaPartition(topic, partition), cached=True
            )
            if hi is None and high is not None and 0 <= high <= position:
                return
        if time.monotonic() - last_activity > idle_timeout:
            raise RecoveryError(
                f"changelog {topic}/{partition}: nothing read for {idle_timeout:.0f}s"
                f" while searching for a snapshot"
            )


def _maybe_mark(key: bytes) -> bool:
    """Whether a key may be a snapshot's or a confirmation's (their offsets are negative: the
    key's last bytes are a varint of 1 after an odd zig-zag varint), without decoding it."""
    return len(key) >= 2 and key[-1] == 0x02 and key[-2] & 0x01 == 1 and key[-2] >= 0x03


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
