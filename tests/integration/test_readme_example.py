"""The README's Python example, run as written (only the broker's and the coordinator's
addresses and the queue's name are swapped for the test's): both the message produced with a
plain Kafka producer ({"id": 2}, which needs its flush) and the one published through the
coordinator ({"id": 3}) reach the consumer loop and are acked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from connectors.embedded import bound_to_parent
from layer.client import QueueClient
from tests.harness import ROOT
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def readme_python_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    after = text.index("From Python:")
    match = re.search(r"```python\n(.*?)```", text[after:], re.S)
    assert match is not None, "the README's Python example is gone"
    return match.group(1)


def test_every_kafka_producer_in_the_docs_is_flushed() -> None:
    """A producer's produce() only queues the message: an example that exits without flush()
    loses it. Every docs example that produces flushes (or polls its producer) after."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
        for block in blocks:
            if ".produce(" in block:
                assert ".flush(" in block, f"{path.name}: produce without flush:\n{block}"


def test_the_readme_python_example_delivers_both_messages(
    broker, coordinator_factory, names, tmp_path: Path
) -> None:
    q = names("orders")
    c = coordinator_factory([{"name": q, "underlying_topic": q, "lease_period": "30s"}])
    code = readme_python_example()
    assert 'producer.produce("orders", b\'{"id": 2}\')' in code and "producer.flush()" in code
    code = (
        code.replace("127.0.0.1:9092", broker.bootstrap_servers)
        .replace("127.0.0.1:7070", str(c.address))
        .replace('"orders"', repr(q))
    )
    script = tmp_path / "readme_example.py"
    script.write_text(code, encoding="utf-8")
    log = (tmp_path / "readme_example.log").open("w")
    proc = subprocess.Popen(
        bound_to_parent([sys.executable, str(script)]),
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        with QueueClient(c.address) as client:
            # the loop runs forever (as in the README): both acked, nothing left
            wait_until(
                lambda: client.stats(q)[0].acked_total == 2,
                60,
                message=lambda: (
                    f"both messages acked: {client.stats(q)[0]}\n"
                    f"{(tmp_path / 'readme_example.log').read_text()}"
                ),
            )
            assert proc.poll() is None, (tmp_path / "readme_example.log").read_text()
            (s,) = client.stats(q)
            assert (s.available, s.leased, s.extra["ingested_total"]) == (0, 0, 2)
            got = sorted(m.json()["id"] for m in client.replay(q))
            assert got == [2, 3]
    finally:
        proc.kill()
        proc.wait(10)
        log.close()
