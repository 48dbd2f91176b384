"""A state directory that does not belong to the cluster, with real brokers and coordinators.

- A coordinator ran and acked on one Tansu broker; the broker stopped and a new, empty one started
  on the same port (what an in-memory broker's restart looks like): a coordinator started on the
  old state directory exits in under 5 s with one line that names the directory, the mismatch
  and both remedies; ``--reset-state`` then serves.
- A state directory that is merely behind the changelog restores the rest and starts.
- An up-to-date one starts without complaint, twice in a row (the changelog is written in
  transactions, so its end lies past a commit marker, beyond the stored offset).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from connectors import EmbeddedBroker, TopicAdmin, TopicSpec, client_settings, read_watermarks
from layer.client import QueueClient
from layer.config import load
from layer.state import RocksDBStore, StoreBatch
from tests.harness import ROOT, CoordinatorProcess, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

STALE_EXIT_DEADLINE = 5.0
EXIT_USAGE = 2
MISMATCH = "does not belong to the Kafka cluster"


def _config(home: Path, bootstrap: str, queue: str, topic: str) -> Path:
    return write_config(
        home / "qlayer.toml",
        bootstrap,
        [{"name": queue, "underlying_topic": topic, "lease_period": "30s"}],
        coordinator={"id": f"stale-{uuid.uuid4().hex[:8]}"},
    )


def _publish(address: str, queue: str, numbers: range) -> None:
    with QueueClient(address) as client:
        for i in numbers:
            client.publish(queue, {"i": i})


def _ack(address: str, queue: str, count: int, wanted: set[int]) -> list[int]:
    """Take ``count`` messages, ack (durably) those in ``wanted``; the rest go back on close."""
    got: list[int] = []
    with QueueClient(address) as client, client.subscribe(queue, max_backlog=count) as sub:
        deadline = time.monotonic() + 30
        while len(got) < count:
            assert time.monotonic() < deadline, f"only {got} of {count} messages arrived"
            msg = sub.next(timeout=1.0)
            if msg is None:
                continue
            i = msg.json()["i"]
            got.append(i)
            if i in wanted:
                msg.ack(wait=True)
    return got


def _available(address: str, queue: str) -> list[int]:
    with QueueClient(address) as client:
        return [m.json()["i"] for m in client.browse(queue)]


def _wait_available(address: str, queue: str, expected: list[int]) -> None:
    wait_until(
        lambda: _available(address, queue) == expected,
        30,
        message=f"the queue's available messages to be {expected}",
    )


def _log_of_last_start(coord: CoordinatorProcess) -> str:
    text = coord.log_path.read_text(errors="replace")
    return text[text.rfind("--- start ") :]


@pytest.fixture
def own_broker() -> Iterator[list[EmbeddedBroker]]:
    """Tansu brokers this test starts (and stops) itself: the session broker cannot restart."""
    brokers: list[EmbeddedBroker] = []
    yield brokers
    for b in brokers:
        b.stop()


def test_a_state_dir_from_a_broker_that_restarted_empty_fails_fast_then_reset_serves(
    tmp_path: Path, own_broker: list[EmbeddedBroker]
) -> None:
    first = EmbeddedBroker().start()
    own_broker.append(first)
    port = first.port
    queue, topic = f"orders-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
    cfg = _config(tmp_path, first.bootstrap_servers, queue, topic)
    changelog = load(cfg).coordinator.changelog_topic(queue)
    state = tmp_path / "state"
    coord = CoordinatorProcess(cfg, state, tmp_path / "coordinator.log")
    address = coord.start()
    _publish(address, queue, range(5))
    assert sorted(_ack(address, queue, 5, {0, 1, 2})) == [0, 1, 2, 3, 4]
    _wait_available(address, queue, [3, 4])
    assert coord.stop() == 0

    with RocksDBStore(state) as store:  # what the state dir remembers
        assert store.cluster_id() == "tansu_cluster"
        stored = store.changelog_offsets()[(changelog, 0)]
    assert stored > 0

    first.stop()
    second = EmbeddedBroker(port=port).start()
    own_broker.append(second)
    assert second.bootstrap_servers == first.bootstrap_servers

    command = [
        sys.executable,
        "-m",
        "layer.cli",
        "coordinator",
        "--config",
        str(cfg),
        "--state-dir",
        str(state),
        "--listen",
        "127.0.0.1:0",
    ]
    started = time.monotonic()
    stale = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - started
    print(f"\nstale state dir: the coordinator exited {stale.returncode} after {seconds:.2f} s")
    assert stale.returncode == EXIT_USAGE, stale.stderr
    assert "serving on" not in stale.stdout
    assert "Traceback" not in stale.stderr
    lines = [line for line in stale.stderr.splitlines() if MISMATCH in line]
    assert len(lines) == 1, stale.stderr
    line = lines[0]
    print(line)
    assert line.startswith(f"qlayer coordinator: state dir {state} {MISMATCH} at 127.0.0.1:{port}")
    assert f"{changelog}/0: state at offset {stored}, the topic does not exist" in line
    assert f"run `qlayer coordinator --config {cfg} --reset-state`" in line
    assert "point the coordinator at the cluster the state belongs to" in line
    assert seconds < STALE_EXIT_DEADLINE, f"took {seconds:.2f} s"

    # the refusal changed nothing: the state is still there, and the check did not create the
    # changelog topic (a metadata request naming a missing topic creates it on Tansu)
    with RocksDBStore(state) as store:
        assert store.changelog_offsets()[(changelog, 0)] == stored
    admin = TopicAdmin(client_settings(second.bootstrap_servers, {}))
    assert changelog not in admin.list_topics()

    # the changelog exists but is shorter than the state (here: empty): refused too
    admin.ensure_topics([TopicSpec(changelog, partitions=1)])
    started = time.monotonic()
    shorter = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - started
    print(f"changelog shorter than the state: exited {shorter.returncode} after {seconds:.2f} s")
    assert shorter.returncode == EXIT_USAGE, shorter.stderr
    assert "Traceback" not in shorter.stderr
    assert f"{changelog}/0: state at offset {stored}, the broker's changelog ends at 0" in (
        shorter.stderr
    )
    assert seconds < STALE_EXIT_DEADLINE, f"took {seconds:.2f} s"

    address = coord.start(extra_args=["--reset-state"])
    assert "discarded the local state" in _log_of_last_start(coord)
    _wait_available(address, queue, [])  # the new broker knows none of the old messages
    _publish(address, queue, range(100, 102))
    assert sorted(_ack(address, queue, 2, {100, 101})) == [100, 101]
    _wait_available(address, queue, [])
    assert coord.stop() == 0
    with RocksDBStore(state) as store:  # rebuilt on the new broker: at most its changelog's end
        now = store.changelog_offsets()[(changelog, 0)]
    settings = client_settings(second.bootstrap_servers, {})
    end = read_watermarks(settings, [(changelog, 0)])[(changelog, 0)].high
    assert 0 < now <= end


def test_a_state_dir_behind_the_changelog_restores_the_rest(broker: Any, tmp_path: Path) -> None:
    queue, topic = f"behind-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
    cfg = _config(tmp_path, broker.bootstrap_servers, queue, topic)
    coord = CoordinatorProcess(cfg, tmp_path / "state", tmp_path / "coordinator.log")
    address = coord.start()
    _publish(address, queue, range(10))
    _ack(address, queue, 10, {0, 1, 2})
    _wait_available(address, queue, list(range(3, 10)))
    assert coord.stop() == 0
    shutil.copytree(tmp_path / "state", tmp_path / "old-state")

    address = coord.start()
    _ack(address, queue, 7, {3, 4, 5})  # written to the changelog after the copy
    _wait_available(address, queue, [6, 7, 8, 9])
    assert coord.stop() == 0

    old = CoordinatorProcess(cfg, tmp_path / "old-state", tmp_path / "old.log")
    try:
        address = old.start()
        assert MISMATCH not in _log_of_last_start(old)
        _wait_available(address, queue, [6, 7, 8, 9])  # 3..5 were acked after the copy
    finally:
        assert old.stop() == 0


def test_an_up_to_date_state_dir_starts_without_complaint_twice(
    broker: Any, tmp_path: Path
) -> None:
    queue, topic = f"fresh-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
    cfg = _config(tmp_path, broker.bootstrap_servers, queue, topic)
    changelog = load(cfg).coordinator.changelog_topic(queue)
    state = tmp_path / "state"
    coord = CoordinatorProcess(cfg, state, tmp_path / "coordinator.log")
    address = coord.start()
    _publish(address, queue, range(6))
    _ack(address, queue, 6, {0, 1})
    _wait_available(address, queue, [2, 3, 4, 5])
    assert coord.stop() == 0

    with RocksDBStore(state) as store:
        stored = store.changelog_offsets()[(changelog, 0)]
    end = read_watermarks(client_settings(broker.bootstrap_servers, {}), [(changelog, 0)])
    # the stored offset is the next one to read; the last transaction's commit marker lies
    # there, so the changelog's end is beyond it: equal would be fine, beyond is the edge
    assert stored < end[(changelog, 0)].high

    for _restart in range(2):
        address = coord.start()
        assert MISMATCH not in _log_of_last_start(coord)
        _wait_available(address, queue, [2, 3, 4, 5])
        assert coord.stop() == 0


def test_a_state_dir_of_another_cluster_is_refused_then_reset_records_this_one(
    broker: Any, tmp_path: Path
) -> None:
    queue, topic = f"other-{uuid.uuid4().hex[:6]}", f"t-{uuid.uuid4().hex[:6]}"
    cfg = _config(tmp_path, broker.bootstrap_servers, queue, topic)
    state = tmp_path / "state"
    with RocksDBStore(state) as store:
        batch = StoreBatch()
        batch.set_cluster_id("MkU3OEVBNTcwNTJENDM2Qk")  # what a Kafka cluster's id looks like
        store.write(batch)
    with RocksDBStore(state) as store:
        assert store.cluster_id() == "MkU3OEVBNTcwNTJENDM2Qk"
    command = [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(cfg)]
    command += ["--state-dir", str(state), "--listen", "127.0.0.1:0"]
    started = time.monotonic()
    other = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    seconds = time.monotonic() - started
    print(f"\nanother cluster's state dir: exited {other.returncode} after {seconds:.2f} s")
    assert other.returncode == EXIT_USAGE, other.stderr
    assert "Traceback" not in other.stderr
    cluster_id = _cluster_id(broker.bootstrap_servers)
    assert (
        f"it was built from Kafka cluster 'MkU3OEVBNTcwNTJENDM2Qk', the broker is cluster"
        f" {cluster_id!r}" in other.stderr
    )
    assert seconds < STALE_EXIT_DEADLINE, f"took {seconds:.2f} s"

    coord = CoordinatorProcess(cfg, state, tmp_path / "coordinator.log")
    address = coord.start(extra_args=["--reset-state"])
    try:
        _publish(address, queue, range(2))
        assert sorted(_ack(address, queue, 2, {0, 1})) == [0, 1]
    finally:
        assert coord.stop() == 0
    with RocksDBStore(state) as store:
        assert store.cluster_id() == cluster_id


def _cluster_id(bootstrap: str) -> str:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    assert metadata.cluster_id
    return str(metadata.cluster_id)
