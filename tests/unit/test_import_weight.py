"""What a light use of qlayer imports: the client, the CLI's ``--help``, a config load and the
coordinator must not pull in what they do not use (the expression parser, the Avro codec,
RocksDB, the API server's reflection, PySpark...). Each case runs in a fresh interpreter and
reads its ``sys.modules``, so an import added at the top of a shared module shows up here."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: never needed by the client, the CLI's help or a config without expressions and Avro
HEAVY = (
    "confluent_kafka",
    "fastavro",
    "grpc_reflection.v1alpha.reflection",
    "kafka",  # kafka-python
    "lark",
    "layer.codec",
    "layer.expr.parser",
    "prometheus_client",
    "psutil",
    "pyspark",
    "rocksdict",
)

CONFIG = """
[broker]
bootstrap_servers = "127.0.0.1:9092"

[[queue]]
name = "orders"
underlying_topic = "orders"
lease_period = "30s"
"""


def _loaded(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _found(loaded: set[str], names: tuple[str, ...]) -> list[str]:
    """The names of ``names`` loaded, a package counting as loaded with any of its modules."""
    return [n for n in names if n in loaded or any(m.startswith(n + ".") for m in loaded)]


def test_the_package_roots_import_nothing_heavy() -> None:
    loaded = _loaded("import layer, connectors, layer.api, layer.config, layer.state")
    assert _found(loaded, (*HEAVY, "grpc", "google.protobuf", "layer.client")) == []


def test_the_client_loads_neither_the_coordinator_nor_its_codecs() -> None:
    loaded = _loaded("from layer import AsyncQueueClient, QueueClient")
    assert "grpc" in loaded  # the test sees the client's imports
    unwanted = (*HEAVY, "layer.api.server", "layer.definitions", "layer.coordinator")
    assert _found(loaded, unwanted) == []


def test_the_cli_help_loads_no_client_and_no_grpc() -> None:
    loaded = _loaded(
        "import contextlib, io\n"
        "import layer.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    layer.cli.main(['--help'])\n"
    )
    unwanted = (*HEAVY, "asyncio", "grpc", "google.protobuf", "layer.client", "layer.api")
    assert _found(loaded, unwanted) == []


def test_a_config_without_expressions_loads_no_parser_and_no_avro() -> None:
    loaded = _loaded(f"from layer.config import loads\nloads({CONFIG!r})")
    assert "layer.config.loader" in loaded
    assert _found(loaded, (*HEAVY, "grpc", "layer.api")) == []


def test_the_coordinator_loads_what_it_uses_when_it_uses_it() -> None:
    loaded = _loaded("import layer.coordinator.app")
    assert "rocksdict" in loaded and "confluent_kafka" in loaded
    unwanted = (
        "connectors.embedded",  # only without bootstrap_servers
        "grpc_reflection.v1alpha.reflection",  # when the API server starts
        "kafka",  # kafka-python: a cluster's eviction of a dead member
        "lark",  # the first expression
        "layer.client.aio",  # the first peer of a cluster asked
        "prometheus_client",  # with an HTTP listener (GET /metrics)
        "psutil",
        "pyspark",
    )
    assert _found(loaded, unwanted) == []


LAZY_PACKAGES = (
    "connectors",
    "connectors.spark_kafka",
    "layer",
    "layer.api",
    "layer.client",
    "layer.config",
    "layer.engine",
    "layer.expr",
    "layer.state",
)


@pytest.mark.parametrize("name", LAZY_PACKAGES)
def test_a_lazy_package_exports_each_name_of_its_all(name: str) -> None:
    package = importlib.import_module(name)
    assert set(package.__all__) <= set(dir(package))
    for attr in package.__all__:
        getattr(package, attr)  # imported from its module on first use
    with pytest.raises(AttributeError, match="no attribute 'not_exported'"):
        package.not_exported  # noqa: B018
