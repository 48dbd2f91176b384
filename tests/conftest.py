"""Root fixtures: the session's broker, Kafka settings, and factories for topics and producers.

The broker comes from ``--broker`` (or ``$QLAYER_TEST_BROKER``): ``embedded`` (default, a Tansu
process started once per session), ``external`` (``$QLAYER_BOOTSTRAP_SERVERS``) or
``testcontainers`` (Kafka in Docker). A broker that cannot be reached fails the tests that need
it; it never skips them.
"""

from __future__ import annotations

import compileall
import gc
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from connectors import (
    BrokerProfile,
    RunningBroker,
    TopicAdmin,
    admin_settings,
    cached_high_watermark,
    client_settings,
    consumer_settings,
    detect_profile,
    producer_settings,
    start_broker,
)
from layer.exceptions import BrokerError
from tests.helpers import topic_maker

pytest_plugins = ["tests.coordinator_fixtures"]

# Hypothesis' per-example deadline (200 ms) fails healthy tests on a loaded 2-core machine: what
# the property tests check is behaviour, and benchmarks measure time.
hypothesis.settings.register_profile("qlayer", deadline=None)
hypothesis.settings.load_profile("qlayer")

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent

BROKER_KINDS = ("embedded", "external", "testcontainers")
BROKER_ENV_VAR = "QLAYER_TEST_BROKER"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--broker",
        choices=BROKER_KINDS,
        default=None,
        help=(
            "broker for integration tests: embedded (a Tansu process, the default), external"
            " ($QLAYER_BOOTSTRAP_SERVERS) or testcontainers (Kafka in Docker);"
            f" also ${BROKER_ENV_VAR}"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    _broker_kind(config)  # a bad $QLAYER_TEST_BROKER stops the run before any test
    _compile_sources()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make test`` spreads the tests over pytest-xdist workers (``--dist loadgroup``): the
    Spark tests go to one of them together, so that one JVM (the session's ``spark``
    fixture) serves them all instead of one starting in each worker."""
    spark = ROOT / "tests" / "spark"
    for item in items:
        if item.path.is_relative_to(spark):
            item.add_marker(pytest.mark.xdist_group("spark"))


def _compile_sources() -> None:
    """Byte-compile ``layer`` and ``connectors`` to their ``__pycache__`` when the environment
    says not to write bytecode (``PYTHONDONTWRITEBYTECODE``): every coordinator and CLI
    subprocess the tests start would otherwise compile the whole package from source (0.1-0.2 s
    of CPU each), hundreds of times a run. The children still read bytecode; a file whose
    source changed is compiled again (timestamps are checked), so one up to date costs a stat."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return  # the children write their own
    for package in ("layer", "connectors"):
        compileall.compile_dir(ROOT / package, quiet=1)


# -- the broker ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BrokerHandle:
    """The session's broker: where it is, what kind it is, and the launcher that owns it."""

    kind: str
    bootstrap_servers: str
    profile: BrokerProfile
    launcher: RunningBroker


def _broker_kind(config: pytest.Config) -> str:
    kind = config.getoption("--broker") or os.environ.get(BROKER_ENV_VAR, "").strip() or "embedded"
    if kind not in BROKER_KINDS:
        raise pytest.UsageError(f"${BROKER_ENV_VAR}={kind!r}: expected one of {BROKER_KINDS}")
    return kind


@pytest.fixture(scope="session")
def broker(pytestconfig: pytest.Config) -> Iterator[BrokerHandle]:
    """The broker shared by the whole session (started once; fails, never skips, if it can't)."""
    kind = _broker_kind(pytestconfig)
    failure = None
    try:
        launcher = start_broker(kind)
        try:
            profile = detect_profile(launcher.bootstrap_servers, {})
        except BrokerError:
            launcher.stop()
            raise
    except BrokerError as exc:
        failure = f"--broker={kind}: {exc}"
    if failure is not None:  # outside the except block, so the report is one clean line
        pytest.fail(failure, pytrace=False)
    logger.info(
        "test broker kind=%s bootstrap=%s profile=%s", kind, launcher.bootstrap_servers, profile
    )
    yield BrokerHandle(kind, launcher.bootstrap_servers, profile, launcher)
    # Kafka clients a test dropped without closing are destroyed when collected; do it while the
    # broker still answers, or each logs connection errors over the run's closing lines
    gc.collect()
    launcher.stop()


@pytest.fixture
def kafka_settings(broker: BrokerHandle) -> dict[str, Any]:
    """Base librdkafka settings for the session's broker (a fresh dict per test)."""
    return client_settings(broker.bootstrap_servers, {})


# -- factories -------------------------------------------------------------------------------


@pytest.fixture
def topic_admin(kafka_settings: Mapping[str, Any]) -> TopicAdmin:
    return TopicAdmin(admin_settings(kafka_settings))


@pytest.fixture
def topic_factory(topic_admin: TopicAdmin) -> Iterator[Callable[..., str]]:
    """``make(partitions=1, config=None, *, prefix="test") -> name``: a new uuid-named topic.

    The topics are deleted when the test ends.
    """
    created: list[str] = []
    yield topic_maker(topic_admin, created)
    try:
        topic_admin.delete_topics(created)
    except BrokerError:
        logger.exception("cannot delete test topics topics=%s", created)


@pytest.fixture
def producer_factory(kafka_settings: Mapping[str, Any]) -> Iterator[Callable[..., Producer]]:
    """``make(**overrides) -> Producer``: an idempotent acks=all producer.

    Overrides are librdkafka keys with dots written as underscores (``linger_ms=50``,
    ``transactional_id="x"``) or, unpacked from a dict, as they are. The producers are flushed
    and closed when the test ends.
    """
    producers: list[Producer] = []

    def make(**overrides: Any) -> Producer:
        extra = {
            key if "." in key else key.replace("_", "."): value for key, value in overrides.items()
        }
        producer = Producer(producer_settings(kafka_settings, extra=extra))
        producers.append(producer)
        return producer

    yield make
    for producer in producers:
        producer.flush(10)
        producer.close()


ConsumeAll = Callable[..., list[Message]]


@pytest.fixture
def consume_all(broker: BrokerHandle, kafka_settings: Mapping[str, Any]) -> ConsumeAll:
    """``consume_all(topic, *, read_committed=True, timeout=10.0) -> list[Message]``.

    Reads every partition of ``topic`` from the start until the position reaches the high
    watermark that the fetch responses carried (ListOffsets is wrong on Tansu), within
    ``timeout`` seconds. Messages come back ordered by (partition, offset).
    """
    admin = TopicAdmin(admin_settings(kafka_settings))

    def read(topic: str, *, read_committed: bool = True, timeout: float = 10.0) -> list[Message]:
        partitions = [
            TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(admin.partitions(topic))
        ]
        consumer = Consumer(
            consumer_settings(kafka_settings, broker.profile, read_committed=read_committed)
        )
        messages: list[Message] = []
        try:
            consumer.assign(partitions)
            deadline = time.monotonic() + timeout
            while True:
                for message in consumer.consume(num_messages=1000, timeout=0.05):
                    error = message.error()
                    if error is None:
                        messages.append(message)
                    elif error.code() != KafkaError._PARTITION_EOF:
                        raise BrokerError(f"consuming {topic!r}: {error}")
                lagging = _lagging(consumer, partitions)
                if not lagging:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"{topic!r} not read to its end within {timeout}s:"
                        f" (partition, position, high watermark) {lagging}"
                    )
        finally:
            consumer.close()
        messages.sort(key=lambda m: (m.partition(), m.offset()))
        return messages

    return read


def _lagging(
    consumer: Consumer, partitions: list[TopicPartition]
) -> list[tuple[int, int, int | None]]:
    """Partitions whose position is below the fetched high watermark (or not fetched yet)."""
    lagging = []
    positions = consumer.position([TopicPartition(tp.topic, tp.partition) for tp in partitions])
    for tp in positions:
        high = cached_high_watermark(consumer, tp.topic, tp.partition)
        low, _high = consumer.get_watermark_offsets(tp, cached=True)
        # Before the first message the position is unset; the log start is where it would be.
        position = tp.offset if tp.offset >= 0 else low
        if high is None or position < high:
            lagging.append((tp.partition, position, high))
    return lagging
