"""The ingest reader's per-fetch step (``IngestReader.take``): what it hands over, per batch."""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, Message

from layer.coordinator.ingest import Fetched, IngestReader, last_offsets
from layer.engine.model import TopicPartition


def _msg(topic: str, partition: int, offset: int, error: KafkaError | None = None) -> Message:
    return Message(topic=topic, partition=partition, offset=offset, value=b"{}", error=error)


def test_last_offsets_is_the_last_of_each_partition() -> None:
    msgs = [_msg("a", 0, 5), _msg("a", 1, 2), _msg("a", 0, 6), _msg("b", 0, 9), _msg("a", 1, 3)]
    assert last_offsets(msgs) == {
        TopicPartition("a", 0): 6,
        TopicPartition("a", 1): 3,
        TopicPartition("b", 0): 9,
    }
    assert all(type(tp) is TopicPartition for tp in last_offsets(msgs))
    assert last_offsets([]) == {}


def _reader(handed: list[Fetched], trouble: list[str]) -> IngestReader:
    return IngestReader(
        "q",
        {},
        "a",
        False,
        {TopicPartition("a", 0): 0},
        "earliest",
        handed.append,
        lambda: 0,
        on_trouble=trouble.append,
    )


def test_take_hands_over_the_error_free_messages_and_reports_the_others() -> None:
    handed: list[Fetched] = []
    trouble: list[str] = []
    reader = _reader(handed, trouble)
    # no broker: librdkafka's cached watermarks are unknown, so none is handed over
    consumer = Consumer({"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "log_level": 0})
    try:
        whole = [_msg("a", 0, 0), _msg("a", 0, 1)]
        assert reader.take(consumer, whole) is whole
        eof = KafkaError(KafkaError._PARTITION_EOF)
        transport = KafkaError(KafkaError._TRANSPORT)
        mixed = [_msg("a", 0, 2), _msg("a", 0, 3, eof), _msg("a", 0, 4), _msg("a", 0, 5, transport)]
        good = reader.take(consumer, mixed)
        assert [m.offset() for m in good] == [2, 4]
        assert len(trouble) == 1 and "fetch" in trouble[0]
        assert reader.take(consumer, [_msg("a", 0, 6, eof)]) == []  # nothing to hand over
    finally:
        consumer.close()
    assert [[m.offset() for m in f.messages] for f in handed] == [[0, 1], [2, 4]]
    assert reader._next == {TopicPartition("a", 0): 5}
