"""The live path's admission (``QueueRuntime.admit``): its short way for plain messages without
headers stores and queues exactly what the long way does."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Message

from layer.coordinator.ingest import Fetched, PartitionStarted
from layer.documents import SIMDJSON_CAPACITY, DocumentReader
from layer.engine.model import Bookmark, TopicPartition
from layer.state.base import StoreBatch, StoredMessage
from layer.state.memory import MemoryStore
from tests.unit.ports import TOPIC, new_runtime, queue_config

TS = 1_699_999_999_000


def _messages(values: list[bytes | None], headers: bool, keyed: bool) -> list[Message]:
    return [
        Message(
            topic=TOPIC,
            partition=i % 2,
            offset=i // 2,
            key=f"k{i}".encode() if keyed and i % 3 else None,
            value=value,
            headers=[("h", b"v")] if headers else None,
            timestamp=(1, TS + i // 4),
        )
        for i, value in enumerate(values)
    ]


def _admit(values: list[bytes | None], headers: bool, keyed: bool, **options: object) -> tuple:
    rt = new_runtime(queue_config(**options))
    tps = [TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)]
    rt.take_fetched(
        Fetched(
            _messages(values, headers, keyed),
            {tp: len(values) for tp in tps},
            [PartitionStarted(tp, 0) for tp in tps],
        )
    )
    store = MemoryStore()
    batch = StoreBatch()
    admitted = rt.admit(100.0, batch)
    store.write(batch)
    bms = [Bookmark(TOPIC, i % 2, i // 2) for i in range(len(values))]
    stored = dict(zip(bms, store.get_messages("q", bms), strict=True))
    s = rt.engine.stats(100.0)
    return rt, admitted, stored, (s.available, s.inactive)


VALUES: list[bytes | None] = [
    b'{"n": 0}',
    b'{"n": 1,',  # not JSON
    b'{"x": NaN}',  # the standard parser's JSON, not orjson's
    b"[1, 2, 3]",
    None,
    b'"' + b"x" * 300 + b'"',
    b"\xff\xfe",
    b'{"n": 7}',
]


@pytest.mark.parametrize("keyed", [False, True])
@pytest.mark.parametrize("on_unparseable", ["dead-letter", "deliver"])
def test_the_short_way_stores_and_queues_what_the_long_way_does(
    keyed: bool, on_unparseable: str
) -> None:
    short = _admit(VALUES, headers=False, keyed=keyed, on_unparseable=on_unparseable)
    long = _admit(VALUES, headers=True, keyed=keyed, on_unparseable=on_unparseable)
    rt, admitted, stored, counts = short
    assert admitted == long[1] == len(VALUES)
    assert counts == long[3]
    for bm, message in stored.items():
        other = long[2][bm]
        assert message is not None and other is not None
        assert message == StoredMessage(
            other.key, other.value, (), other.timestamp_ms, None, other.error
        )
        assert message.encode() == StoredMessage.decode(message.encode()).encode()
    errors = {
        bm.partition * 1 + bm.offset * 2: m.error for bm, m in stored.items() if m and m.error
    }
    assert sorted(errors) == [1, 6]  # NaN parses, as the standard parser has it
    assert rt.counters.unparseable == long[0].counters.unparseable == 2
    # the payload cache holds what the store holds
    assert all(rt.payload_cache[bm] == stored[bm] for bm in rt.payload_cache)
    assert len(rt.payload_cache) == len(VALUES)


def test_a_message_restored_as_done_is_not_admitted_again() -> None:
    rt = new_runtime(queue_config())
    rt.restored_done.add(Bookmark(TOPIC, 0, 1))
    tp = TopicPartition(TOPIC, 0)
    messages = [
        Message(topic=TOPIC, partition=0, offset=i, value=b"{}", timestamp=(1, TS))
        for i in range(3)
    ]
    rt.take_fetched(Fetched(messages, {tp: 3}, [PartitionStarted(tp, 0)]))
    assert rt.admit(100.0, StoreBatch()) == 2
    assert not rt.restored_done
    assert rt.engine.stats(100.0).available == 2


def test_check_says_what_read_says() -> None:
    reader = DocumentReader("json")
    for value in [*VALUES, b"1" * 400, b"[" * 5000 + b"]" * 5000, b"{}  x"]:
        assert reader.check(value) == reader.read(value)[1], value
    with pytest.raises(ValueError):
        json.loads(b"{}  x")


def test_check_all_says_true_only_when_check_says_none_of_each() -> None:
    reader = DocumentReader("json")
    deep_ok = b"[" * 300 + b"]" * 300  # parses: brackets enough to ask the standard parser
    values = [*VALUES, b"1" * 400, b"[" * 5000 + b"]" * 5000, b"{}  x", deep_ok, b'{"a": 1}']
    for value in values:  # False may also mean "ask check": NaN, many brackets
        if reader.check_all([value]):
            assert reader.check(value) is None, value
    good = [b'{"n": 1}', b"[1, 2]", b'"' + b"x" * 300 + b'"', b"3"]
    assert reader.check_all(good)
    for bad in [b'{"n": 1,', None, b"[" * 5000 + b"]" * 5000, b'{"x": NaN}', deep_ok]:
        for at in range(len(good) + 1):
            assert not reader.check_all([*good[:at], bad, *good[at:]])
    assert not reader.check_all([])
    assert not DocumentReader("avro").check_all(good)


def test_check_all_reads_long_flat_objects_without_counting_and_counts_the_rest() -> None:
    """Values of 512 bytes and more: an object of scalars passes from its document (brackets
    in its strings do not count); any other document sends the batch to the bracket count."""
    reader = DocumentReader("json")
    flat = b'{"n": 1, "s": "' + b"[" * 600 + b'", "f": 1.5, "b": true, "z": null}'
    nested = b'{"a": {"b": [1, 2]}, "pad": "' + b"x" * 600 + b'"}'
    deep = b'{"a": ' + b"[" * 300 + b"]" * 300 + b"}"
    assert reader.check(flat) is None and reader.check(nested) is None
    assert reader.check_all([flat] * 5)
    plain = b'{"s": "' + b"x" * 600 + b'"}'
    assert reader.check_all([plain, nested, plain])  # counted: few brackets
    assert reader.check_all([b"[" + plain + b"]", plain])  # not an object: counted
    assert not reader.check_all([plain, nested, flat])  # counted: 600 brackets, ask ``check``
    assert not reader.check_all([flat, flat[:-1]])
    assert not reader.check_all([flat, nested, flat[:-1]])  # checked past the nested one
    assert not reader.check_all([flat, nested, None])
    assert not reader.check_all([None, flat])
    assert not reader.check_all([flat, deep, flat])  # 300 brackets: ask ``check``


def test_a_bad_message_past_the_rounds_room_is_still_found() -> None:
    """The batch check covers the messages a round takes; the next round checks its own."""
    rt = new_runtime(queue_config(on_unparseable="dead-letter"))
    tp = TopicPartition(TOPIC, 0)
    values = [b'{"n": %d}' % i for i in range(10)]
    values[7] = b"{not json"
    messages = [
        Message(topic=TOPIC, partition=0, offset=i, value=v, timestamp=(1, TS))
        for i, v in enumerate(values)
    ]
    rt.take_fetched(Fetched(messages, {tp: 10}, [PartitionStarted(tp, 0)]))
    store = MemoryStore()
    for limit in (5, 5):
        batch = StoreBatch()
        assert rt.admit(100.0, batch, limit=limit) == 5
        store.write(batch)
    assert rt.counters.unparseable == 1
    stored = store.get_messages("q", [Bookmark(TOPIC, 0, i) for i in range(10)])
    assert [m is not None and m.error is not None for m in stored] == [i == 7 for i in range(10)]


def test_check_all_leaves_a_payload_past_the_parsers_capacity_to_check() -> None:
    """A payload larger than the batch check parses (its parser would keep ~14 times its size
    for good) makes the batch be checked value by value, which accepts it as before."""
    reader = DocumentReader("json")
    big = b'{"pad": "' + b"x" * SIMDJSON_CAPACITY + b'"}'
    small = b'{"n": 1}'
    assert reader.check(big) is None
    assert not reader.check_all([small, big, small])
    assert reader.check_all([small, big[: SIMDJSON_CAPACITY - 100] + b'"}'])  # under: parsed
    assert not reader.check_all([small, big[:-1]])  # and a bad one past it is still bad
    assert reader.check(big[:-1]) is not None
