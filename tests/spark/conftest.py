"""Spark fixtures: one local SparkSession for the session, with the qlayer_kafka source registered.

A missing Java or PySpark fails the tests that need them; it never skips them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from connectors.spark_kafka import FORMAT


def _java_problem() -> str | None:
    """Why Spark cannot start a JVM here, or None."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"$JAVA_HOME={java_home}" if java_home else "PATH"
        return f"no java executable found on {where}: install a JDK 17 (scripts/bootstrap.sh does)"
    probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        return f"{java} -version failed: {probe.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A ``local[2]`` SparkSession with small shuffles, no UI, and ``qlayer_kafka`` registered."""
    problem = _java_problem()
    if problem is not None:
        pytest.fail(f"Spark needs Java: {problem}", pytrace=False)
    # Spark's Python workers must run this interpreter (the venv's), or they cannot import
    # connectors.spark_kafka and fail to connect back.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Bind the driver to loopback, not whatever interface the host name resolves to.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from connectors.spark_kafka import register

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
    register(session)
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
