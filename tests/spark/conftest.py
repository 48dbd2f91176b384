"""Spark fixtures: one local SparkSession for the session, with the qlayer_kafka source registered.

A missing Java or PySpark fails the tests that need them; it never skips them.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from connectors import TopicAdmin, admin_settings, client_settings
from connectors.spark_kafka import FORMAT
from layer.exceptions import BrokerError
from spark.session import java_problem, prepare
from tests.helpers import topic_maker

logger = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def spark_topics(broker: Any) -> Iterator[list[str]]:
    """The topics the Spark tests made (``topic_factory``), deleted once the SparkSession has
    stopped (``spark`` takes this fixture, so its teardown comes first). Spark keeps its Python
    workers between tasks, and a worker keeps consumers on the partitions a stream read
    (``connectors.spark_kafka.follow``, for a minute after their last use): on Tansu, librdkafka
    crashes a process whose consumer reads a topic that is deleted (README "Limits")."""
    made: list[str] = []
    yield made
    if made:
        admin = TopicAdmin(admin_settings(client_settings(broker.bootstrap_servers, {})))
        try:
            admin.delete_topics(made)
        except BrokerError:
            logger.exception("cannot delete test topics topics=%s", made)


@pytest.fixture
def topic_factory(topic_admin: TopicAdmin, spark_topics: list[str]) -> Callable[..., str]:
    """The Spark tests' ``topic_factory`` (see tests/conftest.py): the same new uuid-named
    topics, deleted at the end of the session instead of the test's (``spark_topics``)."""
    return topic_maker(topic_admin, spark_topics)


@pytest.fixture(scope="session")
def spark(spark_topics: list[str]) -> Iterator[Any]:
    """A ``local[2]`` SparkSession with small shuffles, no UI, and ``qlayer_kafka`` registered."""
    problem = java_problem()
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    # The session's Python workers run this interpreter (the venv's) without PYSPARK_PYTHON:
    # prepare() below sees to it (tests/spark/test_spark_session.py checks it in a fresh process).
    # Bind the driver to loopback, not whatever interface the host name resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("qlayer-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        # A short-lived JVM on a small machine: quick compilation, one GC thread.
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    prepare(session)
    yield session
    session.stop()


@pytest.fixture
def kafka_options(broker: Any) -> dict[str, str]:
    """The options every qlayer_kafka read of the session's broker needs."""
    return {"kafka.bootstrap.servers": broker.bootstrap_servers}


@pytest.fixture
def read_kafka(spark: Any, kafka_options: Mapping[str, str]) -> Callable[..., Any]:
    """``read_kafka(**options) -> DataFrame``: a batch read with the broker's options added."""

    def read(**options: str) -> Any:
        return spark.read.format(FORMAT).options(**kafka_options, **options).load()

    return read


@pytest.fixture
def checkpoint_dir(tmp_path: Path) -> Path:
    return tmp_path / f"checkpoint-{uuid.uuid4().hex}"
