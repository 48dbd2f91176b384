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
without headers is stored (its record encoded directly), its offset extends the partition's
current run, and a JSON payload is only checked (``orjson``, and the standard parser again for
the error text of one that fails). Anything else (a message with headers, a restored delay, a
queue with expressions) goes through ``QueueRuntime.admit`` as on the live path, so the
semantics are one. The engine's room (``target_queue_depth``) is respected: the backlog stops
where the room ends and the live reader goes on from the read positions written.

Pure over the store and the engine: the fetches come from a ``ChangelogSource`` (Kafka, or a
list in unit tests).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import orjson
from confluent_kafka import Message

from layer import avro_fast
from layer.coordinator.runtime import QueueRuntime
from layer.engine.model import Bookmark, TopicPartition
from layer.state.base import MESSAGES, StoreBatch, StoredMessage, pack_offset, partition_prefix

__all__ = ["Backlog"]


class Backlog:
    """Admits fetched messages of one restored queue's backlog into its engine and a store
    batch; ``positions`` are where the next fetch starts (offset per partition)."""

    def __init__(self, rt: QueueRuntime, positions: dict[TopicPartition, int]) -> None:
        self.rt = rt
        self.positions = dict(positions)
        self.admitted = 0
        self.full = False  # the engine's room ran out: the live reader goes on from here
        exprs = rt.exprs
        self._fast = (
            not exprs.needed
            and exprs.group is None
            and exprs.conflate is None
            and exprs.barrier is None
        )
        self._check_json = exprs.reader is not None and rt.config.message_type == "json"
        self._prefixes: dict[tuple[str, int], bytes] = {}
        # done or delayed offsets per partition (restored from the changelog)
        self._done: dict[tuple[str, int], set[int]] = {}
        for bm in rt.restored_done:
            self._done.setdefault((bm.topic, bm.partition), set()).add(bm.offset)
        self._delayed: dict[tuple[str, int], set[int]] = {}
        for bm in rt.restored_delays:
            self._delayed.setdefault((bm.topic, bm.partition), set()).add(bm.offset)

    def take(self, messages: Sequence[Message], batch: StoreBatch, now: float) -> int:
        """Admit ``messages`` (error-free, in offset order per partition) as far as the room
        allows; returns how many entered the queue. Read positions go into ``batch``."""
        rt = self.rt
        engine = rt.engine
        name = rt.name
        record = rt.record_runs
        cache, cache_size = rt.payload_cache, rt.payload_cache_size
        room = engine.room()
        ops = batch.ops
        read_to: dict[tuple[str, int], int] = {}
        admitted = fast = unparseable = 0
        # the run being built: partition, its first offset, its timestamps
        run_key: tuple[str, int] | None = None
        run_start = 0
        run_times: list[float] = []

        def flush() -> None:
            assert run_key is not None
            tp = TopicPartition(*run_key)
            engine.add_run(tp, run_start, run_times, now)
            if record:
                batch.put_run(name, tp, run_start, array("d", run_times), None)

        for msg in messages:
            if room <= 0:
                self.full = True
                break
            # an error-free fetched message has all three (librdkafka)
            topic: str = msg.topic()  # type: ignore[assignment]
            partition: int = msg.partition()  # type: ignore[assignment]
            offset: int = msg.offset()  # type: ignore[assignment]
            key = (topic, partition)
            done = self._done.get(key)
            if done and offset in done:
                done.discard(offset)
                rt.restored_done.discard(Bookmark(topic, partition, offset))
                read_to[key] = offset + 1
                continue
            headers = msg.headers()
            delayed = self._delayed.get(key)
            if not self._fast or headers or (delayed and offset in delayed):
                # the live path's admission, one message
                if run_times:
                    flush()
                    run_times = []
                if read_to:
                    self._mark_read(read_to, batch)
                    read_to = {}
                rt.inbox.append(msg)
                n = rt.admit(now, batch, limit=1)
                rt.inbox.clear()
                admitted += n
                room -= n
                self.positions[TopicPartition(*key)] = offset + 1
                continue
            value = msg.value()
            error = None
            if self._check_json and value is not None:
                try:
                    orjson.loads(value)
                except orjson.JSONDecodeError:
                    # orjson is stricter (NaN, integers past 64 bits): the queue's own parser
                    # decides, and words the error
                    assert rt.exprs.reader is not None
                    error = rt.exprs.reader.read(value)[1]
                    if error is not None:
                        unparseable += 1
            _type, ts = msg.timestamp()
            ts = ts if ts > 0 else 0
            msg_key = msg.key()
            prefix = self._prefixes.get(key)
            if prefix is None:
                prefix = self._prefixes[key] = partition_prefix(name, topic, partition)
            ops.append(
                (
                    MESSAGES,
                    prefix + pack_offset(offset),
                    avro_fast.stored_message(msg_key, value, (), ts, None, error),
                )
            )
            if len(cache) < cache_size:
                cache[Bookmark(topic, partition, offset)] = StoredMessage(
                    msg_key, value, (), ts, None, error
                )
            read_to[key] = offset + 1
            fast += 1
            room -= 1
            when = ts / 1000.0 if ts else now
            if run_times and key == run_key and offset == run_start + len(run_times):
                run_times.append(when)
                continue
            if run_times:
                flush()
            run_key, run_start, run_times = key, offset, [when]
        if run_times:
            flush()
        self._mark_read(read_to, batch)
        rt.counters.ingested += fast  # rt.admit counts its own
        rt.counters.unparseable += unparseable
        self.admitted += admitted + fast
        return admitted + fast

    def _mark_read(self, read_to: dict[tuple[str, int], int], batch: StoreBatch) -> None:
        rt = self.rt
        for key, position in read_to.items():
            tp = TopicPartition(*key)
            rt.engine.mark_read(tp, position)
            batch.put_read_position(rt.name, tp, position)
            self.positions[tp] = position
