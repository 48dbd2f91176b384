"""Setting a session up for the views: workers, registration, Java, as a new user meets them.

Each test runs a fresh Python process (a SparkSession, once started, keeps its settings), with an
environment like a new user's: no ``PYSPARK_PYTHON``, and a ``python3`` on ``PATH`` that lacks
``confluent_kafka``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def _new_user_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_")}
    # the system python3 first: Spark's default worker command would find it, not the venv's
    env["PATH"] = "/usr/bin:/bin:" + os.path.dirname(sys.executable)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def _run(script: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_view_runs_its_workers_without_pyspark_python_and_registers_once(
    broker: Any, topic_factory: Callable[..., str], producer_factory: Callable[..., Any]
) -> None:
    topic = topic_factory()
    producer = producer_factory()
    for i in range(5):
        producer.produce(topic, value=str(i).encode())
    producer.flush(30)
    script = f"""
        import subprocess
        probe = ["python3", "-c", "import confluent_kafka"]
        assert subprocess.run(probe, stderr=subprocess.DEVNULL).returncode != 0
        from pyspark.sql import SparkSession
        from spark.session import prepare
        spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
        for _ in range(3):
            prepare(spark)
            rows = (spark.read.format("qlayer_kafka")
                    .option("kafka.bootstrap.servers", {broker.bootstrap_servers!r})
                    .option("subscribe", {topic!r}).load().collect())
            assert sorted(r.value for r in rows) == [str(i).encode() for i in range(5)], rows
        print("READ OK")
        spark.stop()
    """
    done = _run(script, _new_user_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert "READ OK" in done.stdout
    assert "replaced a previously registered data source" not in done.stderr, done.stderr[-3000:]
    assert "ModuleNotFoundError" not in done.stderr


def test_a_local_session_without_java_fails_in_one_line(tmp_path: Path) -> None:
    script = """
        from spark.session import local_session
        try:
            local_session()
        except Exception as exc:
            print(f"{type(exc).__name__}: {exc}")
    """
    env = _new_user_env(JAVA_HOME=str(tmp_path / "no-jdk"))
    done = _run(script, env, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    assert lines[0].startswith("ConfigError: Spark needs Java 17 or newer"), lines[0]
    assert "no-jdk" in lines[0]


def test_a_local_session_starts_its_jvm_with_the_streaming_settings() -> None:
    script = """
        from spark.session import local_session
        spark = local_session("local[1]", "jvm-options")
        bean = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
        print(" ".join(str(a) for a in bean.getInputArguments()))
        print(spark.conf.get("spark.sql.shuffle.partitions"))
        spark.stop()
    """
    done = _run(script, _new_user_env())
    assert done.returncode == 0, done.stderr[-3000:]
    arguments, partitions = done.stdout.strip().splitlines()[-2:]
    assert "-XX:TieredStopAtLevel=1" in arguments.split(), arguments
    assert "-XX:+UseSerialGC" in arguments.split(), arguments
    assert partitions == "1"
