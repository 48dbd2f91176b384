"""A restored queue's backlog, read in bulk before it serves (restore step 2b).

After the store is restored and the engine built from it (``layer.coordinator.restore``), the
messages between each partition's read position (or low-water mark) and its high watermark are
still to be read: every queued message when the state directory was lost, the publishes of the
downtime otherwise. The live path (``IngestReader`` -> ``QueueRuntime.admit``, one round of at
most 4,096 at a time) takes them at its own pace, ~30,000 a second on a 2-core machine; a
queue restored from its changelog with 1,000,000 queued was all available only after 30 s, of
which 20% went to parsing JSON only to learn that it parses, 12% to a ``Bookmark`` per message
and the rest to the reader thread and the round around each batch (py-spy; issue 11).

``Backlog`` admits a fetch of the backlog with as little per message as the queue allows: for a
plain queue without expressions (no group, conflation, barrier, priority or filter) a message
without headers goes into its partition's blob (``layer.state.blobs``, as on the live path's
short way; one that does not parse is stored alone, with its error), its offset extends the
partition's current run, and a JSON payload is only checked (``DocumentReader.check``, as on
the live path). Anything else (a message with headers, a restored delay, a queue with
expressions) goes through ``QueueRuntime.admit`` as on the live path, so the
semantics are one. The engine's room (``target_queue_depth``) is respected: the backlog stops
where the room ends and the live reader goes on from the read positions written.

Pure over the store and the engine: the fetches come from a ``ChangelogSource`` (Kafka, or a
list in unit tests).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence, Set
from itertools import groupby

from confluent_kafka import Message

from layer import avro_fast
from layer.config import OnUnparseable
from layer.coordinator.runtime import (
    _HEADERS,
    _KEY,
    _OFFSET_OF,
    _PARTITION_OF,
    _TIMESTAMP,
    _TOPIC,
    _VALUE,
    BLOB_MESSAGES,
    QueueRuntime,
    cache_payloads,
    stretches,
)
from layer.engine.model import Bookmark, TopicPartition
from layer.state.base import StoreBatch, StoredMessage, pack_offset, partition_prefix

__all__ = ["Backlog"]

_NONE: frozenset[int] = frozenset()


def _tp_of(msg: Message) -> tuple[str, int]:
    return msg.topic(), msg.partition()  # type: ignore[return-value]


class Backlog:
    """Admits fetched messages of one restored queue's backlog into its engine and a store
    batch; ``positions`` are where the next fetch starts (offset per partition)."""

    def __init__(self, rt: QueueRuntime, positions: dict[TopicPartition, int]) -> None:
        self.rt = rt
        self.positions = dict(positions)
        self.admitted = 0
        self.full = False  # the engine's room ran out: the live reader goes on from here
        exprs = rt.exprs
        self._fast = not exprs.needed and exprs.plain
        self._check_json = exprs.reader is not None and rt.config.message_type == "json"
        self._prefixes: dict[TopicPartition, bytes] = {}
        # offsets restored from the changelog as done, per partition; and those that are not
        # plain (done, or with a restored delay)
        self._done: dict[TopicPartition, set[int]] = {}
        self._apart: dict[TopicPartition, set[int]] = {}
        for bm in rt.restored_done:
            tp = TopicPartition(bm.topic, bm.partition)
            self._done.setdefault(tp, set()).add(bm.offset)
            self._apart.setdefault(tp, set()).add(bm.offset)
        for bm in rt.restored_delays:
            self._apart.setdefault(TopicPartition(bm.topic, bm.partition), set()).add(bm.offset)
        self._slow = 0  # admitted through rt.admit in this take

    def take(self, messages: Sequence[Message], batch: StoreBatch, now: float) -> int:
        """Admit ``messages`` (error-free, in offset order per partition) as far as the room
        allows; returns how many entered the queue. Read positions go into ``batch``."""
        rt = self.rt
        engine = rt.engine
        room = engine.room()
        if self._fast and messages and room > 0:
            head = messages if len(messages) <= room else messages[:room]
            columns = self._plain(head)
            if columns is not None:
                admitted = self._take_columns(head, columns, batch, now)
                if len(head) < len(messages):
                    self.full = True
                return admitted
        name = rt.name
        record = rt.record_runs
        keys, values = batch.put_messages_encoded()
        put_key, put_value = keys.append, values.append
        pack = pack_offset
        # the live path's JSON check (``DocumentReader.check``: orjson, and the standard parser
        # where the two may disagree), so a payload is unparseable on both paths or neither
        reader = rt.exprs.reader
        check = reader.check if self._check_json and reader is not None else None
        fast = self._fast
        dead_letter = rt.config.on_unparseable == OnUnparseable.DEAD_LETTER
        admitted = 0
        # the partition of the messages at hand, and the run of them being built: its first
        # offset, the offset after it, the timestamps
        topic: str | None = None
        partition = -1
        tp = TopicPartition("", -1)
        prefix = b""
        apart: Set[int] = _NONE  # offsets of this partition that are not plain: done, delayed
        run_start = run_end = 0
        times: list[float] = []
        read_to: dict[TopicPartition, int] = {}
        # the first messages of the backlog (the first handed out) go to the payload cache, as
        # the live path keeps the recently admitted ones
        cache = rt.payload_cache
        cache_room = rt.payload_cache_size - len(cache)

        # per partition, the blob being built: offsets, keys, values, timestamps (ms)
        Pending = tuple[list[int], list[bytes | None], list[bytes | None], list[int]]
        pending: dict[TopicPartition, Pending] = {}
        blob: Pending = ([], [], [], [])

        def flush() -> None:
            engine.add_run(tp, run_start, times, now)
            if record:
                batch.put_run(name, tp, run_start, array("d", times), None)
            read_to[tp] = run_end

        for msg in messages:
            if room <= 0:
                self.full = True
                break
            # an error-free fetched message has all three (librdkafka)
            p: int = msg.partition()  # type: ignore[assignment]
            t: str = msg.topic()  # type: ignore[assignment]
            offset: int = msg.offset()  # type: ignore[assignment]
            if p != partition or t != topic:
                if times:
                    flush()
                    times = []
                topic, partition, tp = t, p, TopicPartition(t, p)
                prefix = self._prefix(tp)
                blob = pending.setdefault(tp, ([], [], [], []))
                apart = self._apart.get(tp, _NONE)
            # the live path's admission for what is not a plain message: not fast, set apart,
            # with headers, or unparseable on a queue that dead-letters those on arrival
            slow = not fast or offset in apart or bool(msg.headers())
            error = None
            if not slow:
                value = msg.value()
                key = msg.key()
                ts: int = msg.timestamp()[1]
                if ts < 0:
                    ts = 0
                if check is not None and value is not None:
                    error = check(value)  # the live path's check, the one rule for JSON
                    slow = error is not None and dead_letter
            if slow:
                if times:
                    flush()
                    times = []
                n = self._one(msg, tp, offset, batch, now, read_to)
                admitted += n
                room -= n
                continue
            if error is not None:
                rt.unparseable_seen(Bookmark(t, p, offset), error)
            if error is None:
                if len(blob[0]) >= BLOB_MESSAGES:
                    batch.put_blob(name, tp, *blob)
                    rt.blob_written(tp, blob[0][-1])
                    blob = pending[tp] = ([], [], [], [])
                blob[0].append(offset)
                blob[1].append(key)
                blob[2].append(value)
                blob[3].append(ts)
            else:
                put_key(prefix + pack(offset))
                put_value(avro_fast.stored_message(key, value, (), ts, None, error))
            if cache_room > 0:
                cache[Bookmark(t, p, offset)] = StoredMessage(key, value, (), ts, None, error)
                cache_room -= 1
            admitted += 1
            room -= 1
            if times and offset == run_end:
                times.append(ts / 1000.0 if ts else now)
                run_end += 1
                continue
            if times:
                flush()
            run_start, run_end, times = offset, offset + 1, [ts / 1000.0 if ts else now]
        if times:
            flush()
        for at, one in pending.items():
            if one[0]:
                batch.put_blob(name, at, *one)
                rt.blob_written(at, one[0][-1])
        self._mark_read(read_to, batch)
        fast_count = admitted - self._slow
        rt.counters.ingested += fast_count  # rt.admit counts its own
        self._slow = 0
        self.admitted += admitted
        return admitted

    def _plain(self, head: Sequence[Message]) -> list[bytes | None] | None:
        """The values of ``head`` when every message in it is plain (no headers, none set
        apart, every JSON payload parses: ``DocumentReader.check_all``, per batch); None when
        one may not be (then ``take`` goes message by message)."""
        if any(map(_HEADERS, head)):
            return None
        values: list[bytes | None] = list(map(_VALUE, head))
        if self._check_json:
            reader = self.rt.exprs.reader
            if reader is None or not reader.check_all(values):
                return None
        if self._apart and any(
            not self._apart.get(TopicPartition(t, p), _NONE).isdisjoint(map(_OFFSET_OF, group))
            for (t, p), group in groupby(head, key=_tp_of)
        ):
            return None
        return values

    def _take_columns(
        self, head: Sequence[Message], values: list[bytes | None], batch: StoreBatch, now: float
    ) -> int:
        """``take`` for a fetch of plain messages (``_plain``), by columns: each field read
        for all of them at once (``map``, in C), their blobs cut at ``BLOB_MESSAGES`` as the
        message-by-message way cuts them, a run per stretch of consecutive offsets."""
        rt = self.rt
        engine = rt.engine
        name = rt.name
        record = rt.record_runs
        topics = list(map(_TOPIC, head))
        partitions = list(map(_PARTITION_OF, head))
        offsets: list[int] = list(map(_OFFSET_OF, head))  # type: ignore[arg-type]
        keys = list(map(_KEY, head))
        stamps: list[int] = [ts for _kind, ts in map(_TIMESTAMP, head)]
        if min(stamps) < 0:
            stamps = [ts if ts > 0 else 0 for ts in stamps]
        cache = rt.payload_cache
        read_to: dict[TopicPartition, int] = {}
        # per partition, the blob being built: offsets, keys, values, timestamps (ms)
        pending: dict[
            TopicPartition, tuple[list[int], list[bytes | None], list[bytes | None], list[int]]
        ] = {}
        i = 0
        for (topic, partition), group in groupby(zip(topics, partitions, strict=True)):
            j = i + sum(1 for _ in group)
            tp = TopicPartition(topic, partition)  # type: ignore[arg-type]
            segment = offsets[i:j]
            blob = pending.get(tp)
            if blob is None:
                blob = pending[tp] = ([], [], [], [])
            at = i
            while at < j:
                if len(blob[0]) >= BLOB_MESSAGES:
                    batch.put_blob(name, tp, *blob)
                    rt.blob_written(tp, blob[0][-1])
                    blob = pending[tp] = ([], [], [], [])
                end = min(j, at + BLOB_MESSAGES - len(blob[0]))
                blob[0].extend(offsets[at:end])
                blob[1].extend(keys[at:end])
                blob[2].extend(values[at:end])
                blob[3].extend(stamps[at:end])
                at = end
            cache_payloads(
                cache,
                rt.payload_cache_size,
                tp.topic,
                tp.partition,
                segment,
                keys[i:j],
                values[i:j],
                stamps[i:j],
            )
            times = [ts / 1000.0 if ts else now for ts in stamps[i:j]]
            for first, end in stretches(segment):
                engine.add_run(tp, segment[first], times[first:end], now)
                if record:
                    batch.put_run(name, tp, segment[first], array("d", times[first:end]), None)
            read_to[tp] = segment[-1] + 1
            i = j
        for tp, blob in pending.items():
            if blob[0]:
                batch.put_blob(name, tp, *blob)
                rt.blob_written(tp, blob[0][-1])
        self._mark_read(read_to, batch)
        rt.counters.ingested += len(head)
        self.admitted += len(head)
        return len(head)

    def _prefix(self, tp: TopicPartition) -> bytes:
        prefix = self._prefixes.get(tp)
        if prefix is None:
            prefix = self._prefixes[tp] = partition_prefix(self.rt.name, tp.topic, tp.partition)
        return prefix

    def _one(
        self,
        msg: Message,
        tp: TopicPartition,
        offset: int,
        batch: StoreBatch,
        now: float,
        read_to: dict[TopicPartition, int],
    ) -> int:
        """A message that is not plain: done (skipped), or through the live path's admission."""
        rt = self.rt
        done = self._done.get(tp)
        if done is not None and offset in done:
            done.discard(offset)
            self._apart[tp].discard(offset)
            rt.restored_done.discard(Bookmark(tp.topic, tp.partition, offset))
            read_to[tp] = offset + 1
            return 0
        if read_to:
            self._mark_read(read_to, batch)
            read_to.clear()
        rt.inbox.append(msg)
        n = rt.admit(now, batch, limit=1)
        rt.inbox.clear()
        self.positions[tp] = offset + 1
        self._slow += n
        return n

    def _mark_read(self, read_to: dict[TopicPartition, int], batch: StoreBatch) -> None:
        rt = self.rt
        for tp, position in read_to.items():
            rt.engine.mark_read(tp, position)
            batch.put_read_position(rt.name, tp, position)
            self.positions[tp] = position
