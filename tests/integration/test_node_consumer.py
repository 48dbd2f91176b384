"""The Node.js consumer example (examples/node) against a real coordinator: it subscribes,
cancels and acks over gRPC using queue.proto alone, and the coordinator's stats agree."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.api.access import token_hash
from layer.api.tokens import new_token
from layer.client import QueueClient
from tests.harness import ROOT, CoordinatorProcess
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

EXAMPLE = ROOT / "examples" / "node"


def _node_modules() -> Path:
    """examples/node/node_modules if someone ran ``npm ci`` there; else one ``npm ci`` into a
    cache directory keyed by the lock file, shared by later runs."""
    local = EXAMPLE / "node_modules"
    if local.is_dir():
        return local
    npm = shutil.which("npm")
    assert npm is not None, "npm is missing (Node 20 with npm is needed for make test)"
    lock = (EXAMPLE / "package-lock.json").read_bytes()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = base / "qlayer" / f"node-example-{hashlib.sha256(lock).hexdigest()[:16]}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # two test runs at once install once
        if not (cache / "node_modules" / ".package-lock.json").is_file():
            for name in ("package.json", "package-lock.json"):
                shutil.copy(EXAMPLE / name, cache / name)
            done = subprocess.run(
                [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"],
                cwd=cache,
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert done.returncode == 0, f"npm ci failed:\n{done.stdout}\n{done.stderr}"
    return cache / "node_modules"


def run_consumer(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    node = shutil.which("node")
    assert node is not None, "node is missing (Node 20 is needed for make test)"
    env = dict(os.environ, NODE_PATH=str(_node_modules()))
    return subprocess.run(
        [node, str(EXAMPLE / "consumer.js"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_node_consumer_subscribes_cancels_and_acks(
    coordinator_factory: Callable[..., CoordinatorProcess],
    names: Callable[[str], str],
    tmp_path: Path,
) -> None:
    q, other = names("node"), names("node-other")
    publisher, consumer = new_token(), new_token()
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        f'[[principal]]\nname = "publisher"\ntoken_sha256 = "{token_hash(publisher)}"\n'
        '[[principal.grant]]\nqueues = "*"\nrights = ["publish", "browse"]\n'
        f'[[principal]]\nname = "node"\ntoken_sha256 = "{token_hash(consumer)}"\n'
        f'[[principal.grant]]\nqueues = "{q}"\nrights = ["consume"]\n'
    )
    queues: list[dict[str, Any]] = [
        {"name": q, "underlying_topic": q},
        {"name": other, "underlying_topic": other},
    ]
    proc = coordinator_factory(queues, tokens_file=str(tokens))
    target = str(proc.address)
    count, cancel = 20, 3
    with QueueClient(target, token=publisher) as client:
        for n in range(count):
            client.publish(q, json.dumps({"n": n}).encode())
        wait_until(lambda: client.stats(q)[0].available == count, timeout=30)

    done = run_consumer(
        "--server", target, "--queue", q, "--token", consumer,
        "--count", str(count), "--cancel", str(cancel), "--backlog", "5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert events[0]["event"] == "subscribed" and events[0]["backlog"] == 5
    summary = events[-1]
    assert summary == {"event": "done", "acked": count, "cancelled": cancel, "failed": []}
    acked = {e["bookmark"] for e in events if e["event"] == "acked"}
    cancelled = {e["bookmark"] for e in events if e["event"] == "cancelled"}
    assert len(acked) == count and cancelled <= acked  # the cancelled ones came back

    with QueueClient(target, token=publisher) as client:
        stats = client.stats(q)[0]
        assert (stats.available, stats.leased, stats.subscriptions) == (0, 0, 0)
        assert stats.acked_total == count
        assert stats.delivered_total == count + cancel  # each cancel made one redelivery

    # refused: no consume right on the other queue; the error says so, exit code 1
    refused = run_consumer("--server", target, "--queue", other, "--token", consumer)
    assert refused.returncode == 1
    assert (
        f"PERMISSION_DENIED permission_denied: principal 'node' lacks 'consume' on queue '{other}'"
        in refused.stderr
    )


def test_node_consumer_sees_parse_error_on_a_deliver_queue(
    broker: Any,
    coordinator_factory: Callable[..., CoordinatorProcess],
    names: Callable[[str], str],
) -> None:
    """on_unparseable = "deliver": Message.parse_error reaches a client built from the .proto."""
    q = names("node-up")
    proc = coordinator_factory([{"name": q, "underlying_topic": q, "on_unparseable": "deliver"}])
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(q, b'{"n": 1}')
    producer.produce(q, b'{"n": 2,')
    assert producer.flush(10) == 0
    done = run_consumer("--server", str(proc.address), "--queue", q, "--count", "2")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    (unparseable,) = [e for e in events if e["event"] == "unparseable"]
    assert unparseable["bookmark"] == f"{q}/0/1"
    assert unparseable["parseError"].startswith("unparseable json: ")
    assert events[-1] == {"event": "done", "acked": 2, "cancelled": 0, "failed": []}
