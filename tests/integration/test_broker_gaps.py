"""The measured gaps of the embedded (Tansu) broker, pinned.

Each test observes one behaviour on the session's broker and checks that the broker's profile
(``connectors.kafka.BrokerProfile``) says the same, so a broker upgrade that closes (or opens) a
gap fails here first. On Apache Kafka the same tests check the profile's "everything works".
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from connectors import (
    EmbeddedBroker,
    TopicAdmin,
    TopicSpec,
    admin_settings,
    client_settings,
    consumer_settings,
    detect_profile,
    read_watermarks,
)
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def test_list_offsets_latest_vs_fetch_high_watermark(
    broker, kafka_settings, topic_factory, producer_factory
) -> None:
    topic = topic_factory()
    producer = producer_factory(linger_ms=1000)  # all 100 records go out as one batch
    for i in range(100):
        producer.produce(topic, value=b"%d" % i)
    assert producer.flush(10) == 0

    fetched = read_watermarks(kafka_settings, [(topic, 0)])[(topic, 0)].high
    consumer = Consumer(consumer_settings(kafka_settings, broker.profile))
    try:
        _low, listed = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()

    assert fetched == 100
    assert (listed == fetched) is broker.profile.list_offsets_reliable
    if not broker.profile.list_offsets_reliable:
        assert listed == 1  # the batch's base offset (0) + 1


def test_compaction_is_accepted_but_applied_only_where_supported(
    broker, topic_factory, producer_factory, topic_admin, consume_all
) -> None:
    topic = topic_factory(
        config={
            "cleanup.policy": "compact",
            "segment.ms": "100",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "100",
        }
    )
    producer = producer_factory()
    producer.produce(topic, key=b"k", value=b"v1")
    producer.produce(topic, key=b"k", value=b"v2")
    assert producer.flush(10) == 0

    def versions_of_k() -> list[bytes | None]:
        return [m.value() for m in consume_all(topic) if m.key() == b"k"]

    if broker.profile.compaction:

        def compacted() -> bool:
            # Records with other keys roll segments so the cleaner has something to clean.
            producer.produce(topic, key=uuid.uuid4().bytes, value=b"filler")
            producer.flush(10)
            return versions_of_k() == [b"v2"]

        wait_until(compacted, timeout=120, interval=1, message=f"{topic} never compacted")
    else:
        assert topic in topic_admin.list_topics()  # the compact policy was accepted...
        assert versions_of_k() == [b"v1", b"v2"]  # ...and both versions stay readable


def test_offsets_for_times(broker, kafka_settings, topic_factory, producer_factory) -> None:
    topic = topic_factory()
    producer = producer_factory()
    start = int(time.time() * 1000) - 60_000
    for i in range(3):
        producer.produce(topic, value=b"%d" % i, timestamp=start + i * 1000)
    assert producer.flush(10) == 0

    consumer = Consumer(consumer_settings(kafka_settings, broker.profile))
    try:
        [found] = consumer.offsets_for_times([TopicPartition(topic, 0, start + 1500)], timeout=10)
    finally:
        consumer.close()
    assert (found.offset == 2) is broker.profile.offsets_for_times
    if not broker.profile.offsets_for_times:
        assert found.offset == 0


def test_create_partitions(broker, kafka_settings, topic_factory, topic_admin) -> None:
    topic = topic_factory()
    admin = AdminClient(admin_settings(kafka_settings))
    future = admin.create_partitions([NewPartitions(topic, 2)], request_timeout=10)[topic]
    if broker.profile.create_partitions:
        future.result(timeout=15)
        wait_until(lambda: topic_admin.partitions(topic) == 2, timeout=10, message="not grown")
    else:
        with pytest.raises(KafkaException) as info:
            future.result(timeout=15)
        assert info.value.args[0].code() == KafkaError._UNSUPPORTED_FEATURE
        assert topic_admin.partitions(topic) == 1


def test_delete_records(broker, kafka_settings, topic_factory) -> None:
    if broker.profile.delete_records:
        assert _delete_records_works(kafka_settings, topic_factory())
        return
    # On Tansu the request panics a broker task: keep it away from the session's broker.
    with EmbeddedBroker() as own:
        own_settings = client_settings(own.bootstrap_servers, {})
        assert not detect_profile(own.bootstrap_servers, {}).delete_records
        TopicAdmin(admin_settings(own_settings)).ensure_topics([TopicSpec("delete-records")])
        assert not _delete_records_works(own_settings, "delete-records")


def _delete_records_works(settings, topic: str) -> bool:
    """Write 10 records, delete those below offset 5; whether the broker did it."""
    producer = Producer(settings)
    for i in range(10):
        producer.produce(topic, value=b"%d" % i)
    assert producer.flush(10) == 0
    producer.close()
    admin = AdminClient(admin_settings(settings))
    request = TopicPartition(topic, 0, 5)
    future = admin.delete_records([request], request_timeout=10)[TopicPartition(topic, 0)]
    try:
        return future.result(timeout=15).offset == 5
    except KafkaException:
        return False


def test_read_committed_and_aborted_transactions(
    broker, topic_factory, producer_factory, consume_all
) -> None:
    topic = topic_factory()
    producer = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    # Flush first: abort_transaction drops records still queued in the client, and then the
    # broker never sees them.
    assert producer.flush(10) == 0
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(10)

    seen = [m.value() for m in consume_all(topic, read_committed=True)]
    if broker.profile.read_committed_hides_aborted:
        assert seen == [b"committed"]
    else:
        assert seen == [b"aborted", b"committed"]


def test_fetch_answers_early_within_the_profile_wait(
    broker, kafka_settings, topic_factory, producer_factory
) -> None:
    """With the profile's fetch.wait.max.ms a consumer sees a new record at once (the latency
    floor of every delivery); with 500 ms Tansu makes it wait ~250 ms."""
    topic = topic_factory()
    producer = producer_factory(linger_ms=0)
    consumer = Consumer(consumer_settings(kafka_settings, broker.profile))
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        producer.produce(topic, b"warm-up", partition=0)
        producer.flush(10)
        assert consumer.consume(1, 10), "the first record did not arrive"
        waits = []
        for _ in range(10):
            started = time.monotonic()
            producer.produce(topic, b"x", partition=0)
            producer.flush(10)
            assert consumer.consume(1, 5), "a record did not arrive"
            waits.append(time.monotonic() - started)
        waits.sort()
        assert waits[5] < 0.1, f"median publish-to-fetch {waits[5] * 1000:.0f} ms"
    finally:
        consumer.close()
