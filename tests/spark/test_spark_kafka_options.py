"""Options of the qlayer_kafka data source: parsing, errors that name the option, offset maths."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from connectors.spark_kafka import (
    KafkaSourceOptions,
    OffsetSpec,
    Subscription,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)
from layer.exceptions import ConfigError

pytestmark = [
    pytest.mark.spark,
    # PySpark's collect() leaves its result socket to the garbage collector.
    pytest.mark.filterwarnings("ignore:unclosed <socket.socket:ResourceWarning"),
]

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_options_parse_like_spark_kafka_source() -> None:
    parsed = KafkaSourceOptions.parse(
        {
            **BOOTSTRAP,
            "SUBSCRIBE": " a, b ,a",  # names are case-insensitive; topics trimmed, deduplicated
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "user",
            "kafka.isolation.level": "read_committed",
            "startingOffsets": '{"a":{"0":5,"1":-2},"b":{"0":-1}}',
            "maxOffsetsPerTrigger": "100",
            "includeHeaders": "TRUE",
            "minPartitions": "8",  # a Spark tuning option: accepted, changes nothing
        }
    )
    assert parsed.bootstrap_servers == "127.0.0.1:9092"
    assert parsed.subscription == Subscription("subscribe", topics=("a", "b"))
    assert parsed.kafka_settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "user",
        "isolation.level": "read_committed",
    }
    assert parsed.starting_offsets == OffsetSpec(
        "specific", {("a", 0): 5, ("a", 1): -2, ("b", 0): -1}
    )
    assert parsed.ending_offsets is None
    assert parsed.max_offsets_per_trigger == 100
    assert parsed.include_headers and parsed.fail_on_data_loss and parsed.read_committed

    config = parsed.consumer_config()
    assert config["sasl.username"] == "user"
    assert config["isolation.level"] == "read_committed"
    assert config["enable.auto.commit"] is False and config["enable.partition.eof"] is True
    assert config["auto.offset.reset"] == "error"  # failOnDataLoss
    # Spark's default isolation is read_uncommitted.
    default = KafkaSourceOptions.parse({**BOOTSTRAP, "assign": '{"t":[1,0]}'})
    assert default.consumer_config()["isolation.level"] == "read_uncommitted"
    assert default.subscription.partitions == (("t", 0), ("t", 1))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, r"'kafka\.bootstrap\.servers' is required"),
        ({}, r"exactly one of .*'subscribe', 'subscribePattern' or 'assign'.*got 0"),
        ({"subscribe": "t", "assign": '{"t":[0]}'}, r"got 2 \(subscribe, assign\)"),
        ({"subscribe": " , "}, r"'subscribe' names no topic: ' , '"),
        ({"subscribePattern": "orders-("}, r"'subscribePattern' is not a valid regex 'orders-\('"),
        ({"assign": "[0, 1]"}, r"'assign' must be JSON like .*, got '\[0, 1\]'"),
        ({"assign": '{"t": [0, "x"]}'}, r"'assign' must be JSON like"),
        ({"subscribe": "t", "startingOffsets": "newest"}, r"'startingOffsets' must be .*'newest'"),
        (
            {"subscribe": "t", "startingOffsets": '{"t": {"zero": 1}}'},
            r"'startingOffsets': bad offset 1 for partition 'zero' of topic 't'",
        ),
        (
            {"subscribe": "t", "endingOffsets": '{"t": {"0": -3}}'},
            r"'endingOffsets': bad offset -3",
        ),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "0"}, r"'maxOffsetsPerTrigger' .* got '0'"),
        ({"subscribe": "t", "maxOffsetsPerTrigger": "ten"}, r"'maxOffsetsPerTrigger' .* 'ten'"),
        ({"subscribe": "t", "includeHeaders": "yes"}, r"'includeHeaders' must be true or false"),
        ({"subscribe": "t", "failOnDataLoss": "maybe"}, r"'failOnDataLoss' .* got 'maybe'"),
        (
            {"subscribe": "t", "kafkaConsumer.pollTimeoutMs": "-5"},
            r"'kafkaConsumer\.pollTimeoutMs' must be a positive integer, got '-5'",
        ),
        (
            {"subscribe": "t", "kafka.auto.offset.reset": "earliest"},
            r"'kafka\.auto\.offset\.reset' is not supported: use startingOffsets",
        ),
        (
            {"subscribe": "t", "kafka.isolation.level": "serializable"},
            r"'kafka\.isolation\.level' must be .*, got 'serializable'",
        ),
        ({"subscribe": "t", "subscibe": "t"}, r"unknown option 'subscibe'"),
        ({"subscribe": "t", "startingTimestamp": "1"}, r"'startingtimestamp' is not supported"),
    ],
)
def test_bad_options_are_named_with_their_value(options: dict[str, str], message: str) -> None:
    given = options if "bootstrap" in message else {**BOOTSTRAP, **options}
    with pytest.raises(ConfigError, match=message):
        KafkaSourceOptions.parse(given)


def test_offsets_json_is_sparks_and_ordered() -> None:
    offsets = {("b", 0): 1, ("a", 10): 7, ("a", 2): 3}
    as_json = offsets_to_json(offsets)
    # Spark compares offsets as text: the order must not depend on how the dict was built.
    assert json.dumps(as_json) == '{"a": {"2": 3, "10": 7}, "b": {"0": 1}}'
    assert offsets_from_json(json.loads(json.dumps(as_json))) == offsets


def test_rate_limit_shares_the_limit_by_lag_as_spark() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 5}
    until = {("t", 0): 150, ("t", 1): 150, ("t", 2): 5}
    # lag 150 and 50 (partition 2 has none): 40 * 3/4 and 40 * 1/4
    assert rate_limit(40, start, until) == {("t", 0): 30, ("t", 1): 110, ("t", 2): 5}
    # Below one offset a partition still gets one, so it is never starved.
    small = rate_limit(2, {("t", p): 0 for p in range(3)}, {("t", p): 10 for p in range(3)})
    assert small == {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}
    # Nothing to read: the ends stay.
    assert rate_limit(10, until, until) == until


# -- the errors as a Spark user sees them ----------------------------------------------------


def _failure(action: Any) -> str:
    with pytest.raises(Exception) as caught:  # noqa: B017 - Spark wraps the error in its own
        action()
    return str(caught.value)


def test_spark_reports_option_errors(spark, kafka_options, read_kafka, topic_factory) -> None:
    topic = topic_factory(partitions=2)

    text = _failure(lambda: spark.read.format("qlayer_kafka").option("subscribe", topic).load())
    assert "'kafka.bootstrap.servers' is required" in text

    text = _failure(lambda: read_kafka(subscribe=topic, startingOffsets="latest").collect())
    assert "'startingOffsets' cannot be latest (-1) for batch queries" in text

    partial = json.dumps({topic: {"0": 0}})
    text = _failure(lambda: read_kafka(subscribe=topic, startingOffsets=partial).collect())
    assert "startingOffsets must give an offset for every partition" in text
    assert f"missing {topic}/1" in text

    beyond = json.dumps({topic: {"0": 5, "1": -1}})
    text = _failure(lambda: read_kafka(subscribe=topic, endingOffsets=beyond).collect())
    assert f"endingOffsets asks for {topic}/0 up to offset 5, but it ends at 0" in text

    text = _failure(lambda: read_kafka(subscribe=topic, **{"kafka.no.such.key": "1"}).collect())
    assert "refused by librdkafka" in text and "no.such.key" in text

    text = _failure(lambda: read_kafka(assign=json.dumps({topic: [7]})).collect())
    assert f"assign names partitions that do not exist: {topic}/7" in text

    stream = (
        spark.readStream.format("qlayer_kafka")
        .options(**kafka_options, subscribe=topic, endingOffsets="latest")
        .load()
    )
    # The stream's reader is made when the query runs: the query fails, start() does not.
    query = stream.writeStream.format("memory").queryName(f"never_{uuid.uuid4().hex}").start()
    text = _failure(lambda: query.awaitTermination(60))
    assert "'endingOffsets' is not valid in streaming queries" in text
