"""The coordinator SIGKILLed while it reads a restored queue's backlog in bulk
(``layer.coordinator.backlog``): the restart on what the killed one left in its state directory
loses nothing, and every message comes out with the payload it was published with.

The state directory is wiped first, so the restore reads every queued message from its topic;
readiness (``/readyz``) says how far the bulk read got (``N messages of its backlog read``), and
the kill comes as soon as it says some but not all. Each write of the bulk read holds its
messages, their runs and the read positions together; the restart resumes from those positions.
"""

from __future__ import annotations

import http.client
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.admin import TopicAdmin, TopicSpec
from layer.client import QueueClient
from tests.harness import CoordinatorProcess, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

MESSAGES = 120_000
PARTITIONS = 4
READ = re.compile(r"(\d+) messages of its backlog read")


def _ready(address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/readyz")
        body: dict[str, Any] = json.loads(connection.getresponse().read())
        return body
    finally:
        connection.close()


def _publish(bootstrap: str, topic: str) -> None:
    # every other message without a key: both encodings of the bulk read
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for i in range(MESSAGES):
        key = None if i % 2 else str(i).encode()
        while True:
            try:
                producer.produce(topic, key=key, value=json.dumps({"i": i}).encode())
                break
            except BufferError:
                producer.poll(0.1)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(60) == 0


def test_sigkill_during_the_bulk_backlog_read_loses_nothing(tmp_path: Path, broker) -> None:
    bootstrap = broker.bootstrap_servers
    topic, queue = f"bulk-{uuid.uuid4().hex[:8]}", f"q-{uuid.uuid4().hex[:8]}"
    TopicAdmin({"bootstrap.servers": bootstrap}).ensure_topics(
        [TopicSpec(topic, partitions=PARTITIONS)]
    )
    cfg = write_config(
        tmp_path / "qlayer.toml",
        bootstrap,
        [{"name": queue, "underlying_topic": topic, "lease_period": "60s"}],
        coordinator={"id": f"c-{uuid.uuid4().hex[:8]}", "http": "127.0.0.1:0"},
    )
    coord = CoordinatorProcess(cfg, tmp_path / "state", tmp_path / "coordinator.log")
    try:
        address = coord.start(timeout=120)
        _publish(bootstrap, topic)
        with QueueClient(address) as client:
            wait_until(lambda: client.stats(queue)[0].available == MESSAGES, 300, message="ingest")

        # Killed mid-read: the kill comes at the first readiness answer that says part of the
        # backlog is read. A restart that read it all before an answer could say so is tried
        # again (each from a wiped state directory).
        caught = None
        for _attempt in range(5):
            coord.kill()
            coord.wipe_state()
            http_address = coord.start(until="http", timeout=120)

            def progress(http_address: str = http_address) -> int | None:
                if not coord.running:
                    return -1
                try:
                    reasons = _ready(http_address)["reasons"]
                except (OSError, ValueError):
                    return -1  # serving already, or gone: this attempt is over
                for reason in reasons:
                    found = READ.search(reason)
                    if found and 0 < int(found.group(1)) < MESSAGES:
                        return int(found.group(1))
                if not any(r.startswith("restoring") for r in reasons) and reasons != [
                    "API not serving yet"
                ]:
                    return -1  # restored before an answer caught the read
                return None

            seen = wait_until(progress, 180, interval=0.005, message="the restore did not end")
            if seen > 0:
                coord.kill()
                caught = seen
                break
        assert caught is not None, "no attempt was killed in the middle of the bulk read"

        # The restart, on what the killed one left: every message, each with its payload.
        address = coord.start(timeout=300)
        with QueueClient(address) as client:
            wait_until(
                lambda: client.stats(queue)[0].available == MESSAGES,
                120,
                message=lambda: f"available {client.stats(queue)[0].available} of {MESSAGES}",
            )
            got: dict[int, bytes | None] = {}
            with client.subscribe(queue, max_backlog=2000) as sub:
                while len(got) < MESSAGES:
                    m = sub.next(timeout=60)
                    assert m is not None, f"{len(got)} of {MESSAGES} delivered"
                    i = m.json()["i"]
                    assert i not in got, f"message {i} delivered twice"
                    assert m.data == json.dumps({"i": i}).encode()
                    got[i] = m.key
                    m.ack()
                sub.flush(timeout=60)
        assert sorted(got) == list(range(MESSAGES))
        assert all(got[i] == (None if i % 2 else str(i).encode()) for i in got)
        print(f"killed with {caught} of {MESSAGES} messages of the backlog read")
    finally:
        coord.kill()
