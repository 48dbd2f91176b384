"""Admission's short way by columns (``QueueRuntime._admit_columns``: a whole fetch of plain
messages at once) admits exactly what the message-by-message loop does: the same store batch
(blobs, run records, read positions), engine state, payload cache and blob bookkeeping."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from layer.coordinator.ingest import Fetched, PartitionStarted
from layer.coordinator.runtime import QueueRuntime
from layer.engine.model import Bookmark, TopicPartition
from layer.engine.queue import QueueEngine
from layer.state.base import StoreBatch
from layer.state.memory import MemoryStore
from tests.unit.ports import TOPIC, queue_config

NOW = 1_700_000_000.0


@st.composite
def fetches(draw: st.DrawFn) -> list[list[Message]]:
    """Fetches of two partitions, their messages' chunks interleaved, offsets with gaps
    (transaction markers), keys or none, timestamps missing (-1), zero or set."""
    next_offset = {0: 0, 1: draw(st.integers(0, 5))}
    out = []
    for _ in range(draw(st.integers(1, 3))):
        messages = []
        for _ in range(draw(st.integers(1, 4))):
            p = draw(st.integers(0, 1))
            for _ in range(draw(st.integers(1, 700))):
                offset = next_offset[p] + draw(st.sampled_from([0] * 20 + [1, 2]))
                next_offset[p] = offset + 1
                key = draw(st.sampled_from([None, b"k"]))
                ts = draw(st.sampled_from([1_699_999_999_000, 0, -1]))
                value = b'{"o": %d}' % offset
                messages.append(Message(TOPIC, p, offset, key, value, timestamp=(1, ts)))
        out.append(messages)
    return out


def _admit(fetched: list[list[Message]], by_message: bool, limit: int, cache: int) -> Any:
    q = queue_config()
    rt = QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), "q-changelog")
    rt.record_runs = True
    rt.payload_cache_size = cache
    if by_message:
        # a bookmark restored as done (of no message here) keeps admission message by message
        rt.restored_done = {Bookmark("elsewhere", 0, 0)}
    store = MemoryStore()
    admitted = []
    for messages in fetched:
        tps = {TopicPartition(TOPIC, m.partition()) for m in messages}  # type: ignore[arg-type]
        first = {
            tp: min(m.offset() for m in messages if m.partition() == tp.partition)  # type: ignore[type-var]
            for tp in tps
        }
        started = [PartitionStarted(tp, first[tp]) for tp in tps if tp not in rt.known_partitions]
        rt.take_fetched(Fetched(messages, {tp: 1 << 40 for tp in tps}, started))
        while rt.inbox:
            batch = StoreBatch()
            admitted.append(rt.admit(NOW, batch, limit=limit))
            store.write(batch)
    s = rt.engine.stats(NOW)
    return (
        admitted,
        {cf: dict(data) for cf, data in store._data.items()},
        store.positions("q"),
        (s.available, s.unread, s.oldest_available_at),
        [(e.bookmark, e.timestamp) for e in rt.engine._core.order.browse(None)],
        dict(rt.payload_cache),
        rt.blob_spans,
        {tp: list(ends) for tp, ends in rt.blob_ends.items()},
        rt.counters.ingested,
    )


@settings(max_examples=60, deadline=None)
@given(fetches(), st.sampled_from([7, 1000, 4096]), st.sampled_from([0, 500, 20_000]))
def test_admission_by_columns_admits_what_admission_by_message_does(
    fetched: list[list[Message]], limit: int, cache: int
) -> None:
    assert _admit(fetched, False, limit, cache) == _admit(fetched, True, limit, cache)
