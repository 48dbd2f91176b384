"""Getting a SparkSession ready for the views: Python workers, data sources, Java.

Three things a new user otherwise trips over:

- Spark starts its Python workers with ``$PYSPARK_PYTHON`` (default ``python3``), which is not the
  interpreter that has ``confluent_kafka`` and this package installed unless a virtualenv happens
  to be first on ``PATH``: the workers then fail with ``ModuleNotFoundError``. Unless the user set
  ``PYSPARK_PYTHON`` (or ``spark.pyspark.python``), the views run the workers with the running
  interpreter.
- Registering a Python data source a second time in a session makes Spark log a WARN (``data
  source ... replaced a previously registered data source``): each format is registered once.
- Without Java, PySpark fails with a long gateway error: :func:`local_session` says so in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from connectors.spark_kafka.source import register
from connectors.spark_kafka.view import register_view
from layer.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["STREAMING_CONF", "java_problem", "local_session", "prepare", "worker_python"]

PYTHON_ENV = "PYSPARK_PYTHON"

#: Settings :func:`local_session` starts with, for streaming views (a ``conf`` given wins).
STREAMING_CONF = {
    # A streaming aggregate keeps its state in this many partitions for the query's life (a
    # restart takes the number from the checkpoint), and each micro-batch runs a task per
    # partition: Spark's default of 200 is 200 state-store tasks a micro-batch. A queue's
    # view has one partition; with one here, live_aggregate runs each micro-batch as one
    # stage, without a shuffle (spark.aggregates). Batch queries on the session get one
    # shuffle partition too (what a local session of a few cores mostly wants; set it higher
    # through local_session's conf for large batch shuffles).
    "spark.sql.shuffle.partitions": "1",
    # Every micro-batch writes an offset-log, a commit-log and a state-store file. The default
    # FileContext-based writer renames each through Hadoop's local filesystem, which without
    # Hadoop's native library (PyPI's PySpark ships none) forks a `readlink` process for every
    # link-status check: ~20 forks a micro-batch, which made walCommit and commitOffsets 45-65
    # ms each on the 2-core machine under load 6-10 (and the state store's commit, in
    # addBatch, slower too). The FileSystem-based writer (what Spark uses where FileContext is
    # not supported) forks none of them: 12-17 ms each, 290 ms a micro-batch instead of 490 for
    # a streaming count of Spark's rate source (measured alternately).
    "spark.sql.streaming.checkpointFileManagerClass": (
        "org.apache.spark.sql.execution.streaming.checkpointing."
        "FileSystemBasedCheckpointFileManager"
    ),
    # The driver JVM (on local[N] also the executor) compiles with C1 only and collects with
    # the serial collector. Each micro-batch plans and generates code anew, and in a stream's
    # first minutes most of the JVM's CPU was outside the Java code running micro-batches (a
    # JFR recording of 30 s: 58 JIT compilations lasting 20 s in all, 24 G1 collections,
    # ~4 s of Java code executing of ~17 s of CPU); on 2 cores shared with a broker and a
    # coordinator that CPU is what a micro-batch waits for. Alternated three times at 1,000
    # msg/s (bench.spark_bench): the JVM's CPU a micro-batch 482-603 ms -> 239-320 ms. A
    # session that runs long batch jobs over millions of rows can pass
    # spark.driver.extraJavaOptions="" for the JVM's defaults. Only a session whose JVM this
    # starts takes it (getOrCreate keeps a running one).
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
}


def java_problem() -> str | None:
    """Why Spark cannot start a JVM here (one line), or None."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"$JAVA_HOME={java_home}" if java_home else "PATH"
        return (
            f"Spark needs Java 17 or newer, and no java executable was found on {where}:"
            " install a JDK 17 (scripts/bootstrap.sh does) or set JAVA_HOME"
        )
    try:
        probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"Spark needs Java 17 or newer: {java} -version failed: {exc}"
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["no output"])[-1]
        return f"Spark needs Java 17 or newer: {java} -version failed: {last}"
    return None


def worker_python() -> str:
    """The interpreter Spark's Python workers should run: ``$PYSPARK_PYTHON`` if set, else this
    one (which has ``confluent_kafka`` and qlayer installed)."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def prepare(spark: SparkSession) -> SparkSession:
    """Point ``spark``'s Python workers at this interpreter unless the user chose one, and
    register the qlayer data sources (once). Returns ``spark``."""
    context = spark.sparkContext
    chosen = os.environ.get(PYTHON_ENV) or context.getConf().get("spark.pyspark.python")
    if not chosen:
        # SparkContext read $PYSPARK_PYTHON (unset: "python3") when it started; the workers of
        # the data sources and UDFs registered from now on take this attribute.
        context.pythonExec = sys.executable
    register(spark)
    register_view(spark)
    return spark


def local_session(master: str = "local[2]", app: str = "qlayer", **conf: str) -> SparkSession:
    """A SparkSession on this machine, ready for the views (:func:`prepare`): the driver on
    loopback, no UI, UTC, ``STREAMING_CONF``. ``conf``: more Spark settings
    (``spark.sql.shuffle.partitions="4"``; pass them as a dict with ``**``). ``ConfigError``
    in one line when Java is missing."""
    problem = java_problem()
    if problem is not None:
        raise ConfigError(problem)
    os.environ.setdefault(PYTHON_ENV, sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    for key, value in {**STREAMING_CONF, **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return prepare(spark)
