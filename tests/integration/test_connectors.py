"""The connectors on a real broker: launcher, profile, settings, topic admin, produce, consume."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import IO

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

import connectors
from connectors import (
    KAFKA,
    TANSU,
    EmbeddedBroker,
    TopicAdmin,
    TopicSpec,
    admin_settings,
    client_settings,
    consumer_settings,
    detect_profile,
    producer_settings,
    read_watermarks,
    start_broker,
)
from connectors.embedded import sweep_log_dirs
from layer.exceptions import BrokerError, ConfigError
from tests.harness import ROOT
from tests.helpers import process_ended, wait_until

pytestmark = pytest.mark.integration


# -- the embedded broker ---------------------------------------------------------------------


def test_embedded_broker_serves_and_stops_on_sigint() -> None:
    broker = EmbeddedBroker().start()
    try:
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        assert psutil.pid_exists(broker.pid)
        metadata = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(
            timeout=5
        )
        assert [b.port for b in metadata.brokers.values()] == [broker.port]
        assert "ready" in broker.log_tail()
    finally:
        returncode = broker.stop()
    assert returncode == 0
    assert not broker.running
    assert not broker.log_path.exists()  # the temporary log directory is removed
    assert broker.stop() == 0  # stopping again is harmless


def test_embedded_broker_context_manager_and_kept_log(tmp_path) -> None:
    log = tmp_path / "broker.log"
    with EmbeddedBroker(log_path=log) as broker:
        pid = broker.pid
        assert broker.running
    assert not psutil.pid_exists(pid)  # reaped, not a zombie
    assert broker.returncode == 0
    assert "listening on" in log.read_text()


def test_embedded_broker_retries_a_taken_port(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        real_free_port = connectors.embedded._free_port
        monkeypatch.setattr(
            connectors.embedded, "_free_port", lambda: next(ports, None) or real_free_port()
        )
        with EmbeddedBroker() as broker:
            assert broker.port != taken


def test_embedded_broker_on_a_taken_fixed_port_is_a_broker_error() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        broker = EmbeddedBroker(port=taken)
        with pytest.raises(BrokerError, match="AddrInUse"):  # the log's tail is in the error
            broker.start()
        assert not broker.running
        assert not broker.log_path.parent.exists()


def test_embedded_broker_restarts_on_its_port() -> None:
    with EmbeddedBroker() as broker:
        port, first_pid = broker.port, broker.pid
        assert broker.stop() == 0
        broker.start()  # a restart binds the same port again (and, memory only, starts empty)
        assert (broker.port, broker.running) == (port, True)
        assert broker.pid != first_pid
        AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=5)


def test_embedded_broker_binary_missing(tmp_path) -> None:
    with pytest.raises(BrokerError, match="not found"):
        EmbeddedBroker(binary=tmp_path / "tansu")


_OWNER = """
import time
from connectors.embedded import EmbeddedBroker
broker = EmbeddedBroker().start()
print(broker.pid, flush=True)
time.sleep(600)
"""


def test_a_broker_dies_with_an_owner_that_was_sigkilled() -> None:
    """No ``finally`` or finalizer runs in a SIGKILLed process: the kernel ends its broker
    (an in-memory broker left behind holds its memory and port for good)."""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER], cwd=ROOT, stdout=subprocess.PIPE)
    pid = None
    try:
        assert owner.stdout is not None
        pid = int(owner.stdout.readline())
        assert not process_ended(pid)
        owner.kill()
        owner.wait(10)
        wait_until(
            lambda: process_ended(pid), 15, message=f"broker {pid} outlived its SIGKILLed owner"
        )
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if pid is not None and not process_ended(pid):
            psutil.Process(pid).kill()
        if owner.stdout is not None:
            owner.stdout.close()


_LOG_OWNER = """
import sys
from connectors.embedded import EmbeddedBroker
with EmbeddedBroker() as broker:
    print(broker.log_path, flush=True)
    sys.stdin.read()  # until the test closes it: then the broker stops and removes its log dir
"""


def _line(stream: IO[bytes] | None) -> str:
    assert stream is not None
    return stream.readline().decode().strip()


def test_the_log_dir_of_a_sigkilled_owner_is_swept_by_the_next_broker() -> None:
    """A SIGKILLed owner removes nothing; the next embedded broker made anywhere removes its
    temporary log directory, and leaves those of owners still running."""
    owners = [
        subprocess.Popen(
            [sys.executable, "-c", _LOG_OWNER],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        dead, alive = owners
        dead_dir, alive_dir = (Path(_line(o.stdout)).parent for o in owners)
        assert dead_dir.is_dir() and alive_dir.is_dir()
        dead.kill()
        dead.wait(10)
        assert dead_dir.is_dir()  # nothing ran in the killed process
        broker = EmbeddedBroker()  # made, not started: the sweep comes with the log dir
        try:
            assert not dead_dir.exists()
            assert alive_dir.is_dir()
            assert broker.log_path.parent not in (dead_dir, alive_dir)
        finally:
            broker.stop()
        assert alive.stdin is not None
        alive.stdin.close()
        assert alive.wait(30) == 0
        assert not alive_dir.exists()  # a clean stop removes its own
    finally:
        for owner in owners:
            if owner.poll() is None:
                owner.kill()
                owner.wait()
            for stream in (owner.stdin, owner.stdout):
                if stream is not None and not stream.closed:
                    stream.close()


def test_a_log_dir_whose_owner_is_unknown_or_reborn_is_kept_or_swept(tmp_path: Path) -> None:
    """Only a known, ended owner makes a directory another's to remove: no owner file (a
    directory being made) keeps it, and so does a live one; a pid now held by a process
    started later than the recorded owner (reused) does not."""
    me = psutil.Process()
    unknown = tmp_path / "qlayer-tansu-unknown"
    unknown.mkdir()
    live = tmp_path / "qlayer-tansu-live"
    live.mkdir()
    (live / "owner").write_text(f"{me.pid} {me.create_time()!r}\n")
    reborn = tmp_path / "qlayer-tansu-reborn"
    reborn.mkdir()
    (reborn / "owner").write_text(f"{me.pid} {me.create_time() - 100.0!r}\n")
    garbled = tmp_path / "qlayer-tansu-garbled"
    garbled.mkdir()
    (garbled / "owner").write_text("not a pid\n")
    other = tmp_path / "something-else"
    other.mkdir()
    (other / "owner").write_text(f"{me.pid} 1.0\n")

    assert sweep_log_dirs(tmp_path) == [reborn]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "qlayer-tansu-garbled", "qlayer-tansu-live", "qlayer-tansu-unknown", "something-else"
    ]  # fmt: skip


def test_a_broker_started_from_another_thread_outlives_that_thread() -> None:
    """The kernel's parent-death signal follows the thread that started the child, not the
    process: a broker started from a worker thread is left unbound, or it would die with it."""
    started: list[EmbeddedBroker] = []
    worker = threading.Thread(target=lambda: started.append(EmbeddedBroker().start()))
    worker.start()
    worker.join(60)
    assert started, "the broker did not start"
    broker = started[0]
    try:
        # join returns before the kernel's thread has ended: wait for that too
        task = Path(f"/proc/self/task/{worker.native_id}")
        wait_until(lambda: not task.exists(), 10, message=f"thread {worker.native_id} lives")
        AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
        assert not process_ended(broker.pid)
    finally:
        broker.stop()


def test_start_broker_external(monkeypatch: pytest.MonkeyPatch, broker) -> None:
    monkeypatch.delenv(connectors.BOOTSTRAP_ENV_VAR, raising=False)
    with pytest.raises(BrokerError, match=connectors.BOOTSTRAP_ENV_VAR):
        start_broker("external")
    monkeypatch.setenv(connectors.BOOTSTRAP_ENV_VAR, broker.bootstrap_servers)
    external = start_broker("external")
    assert external.bootstrap_servers == broker.bootstrap_servers
    external.stop()  # a no-op: the broker still serves
    AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=5)
    with pytest.raises(ConfigError):
        start_broker("nonsense")


# -- profile and settings --------------------------------------------------------------------


def test_profile_detection(broker) -> None:
    detected = detect_profile(broker.bootstrap_servers, {})
    assert detected == broker.profile
    if broker.kind == "embedded":
        assert detected is TANSU
    assert detect_profile(broker.bootstrap_servers, {}, hint="kafka") is KAFKA
    assert detect_profile("127.0.0.1:1", {}, hint="tansu") is TANSU  # a hint asks nobody
    with pytest.raises(ConfigError, match="redpanda"):
        detect_profile(broker.bootstrap_servers, {}, hint="redpanda")


def test_detect_profile_of_unreachable_broker_is_a_broker_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: connections are refused
        with pytest.raises(BrokerError, match="cannot reach"):
            detect_profile(f"127.0.0.1:{port}", {}, timeout=1)


def test_client_settings_pass_security_keys_verbatim() -> None:
    settings = client_settings(
        "host:9092",
        {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.password": "s3cret"},
    )
    assert settings == {
        "bootstrap.servers": "host:9092",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.password": "s3cret",
    }
    with pytest.raises(ConfigError, match="'acks'") as info:
        client_settings("host:9092", {"acks": "0", "sasl.password": "s3cret"})
    assert "s3cret" not in str(info.value)
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        client_settings("host:9092", {"bootstrap.servers": "other:9092"})


def test_consumer_and_producer_settings_follow_the_profile() -> None:
    base = client_settings("host:9092", {})
    for profile in (TANSU, KAFKA):
        settings = consumer_settings(base, profile, group_id="g")
        assert settings["session.timeout.ms"] == profile.session_timeout_ms
        assert settings["heartbeat.interval.ms"] < profile.session_timeout_ms
        assert settings["enable.auto.commit"] is False
        assert settings["isolation.level"] == "read_committed"
    assert consumer_settings(base, TANSU, read_committed=False)["isolation.level"] == (
        "read_uncommitted"
    )
    producer = producer_settings(base, transactional_id="tx")
    assert producer["transactional.id"] == "tx"
    assert producer["enable.idempotence"] is True
    assert producer["acks"] == "all"
    assert "bootstrap.servers" in admin_settings(base)


# -- topic admin -----------------------------------------------------------------------------


def test_ensure_topics_is_idempotent(kafka_settings, topic_admin: TopicAdmin) -> None:
    name = f"test-{uuid.uuid4().hex}"
    other = f"test-{uuid.uuid4().hex}"
    try:
        assert topic_admin.ensure_topics([TopicSpec(name, partitions=3)]) == [name]
        assert topic_admin.ensure_topics([TopicSpec(name, partitions=3)]) == []
        # An existing topic is left as it is, a new one beside it is created.
        assert topic_admin.ensure_topics([TopicSpec(name, 5), TopicSpec(other, 2)]) == [other]
        assert topic_admin.partitions(name) == 3
        assert topic_admin.partitions(other) == 2
    finally:
        topic_admin.delete_topics([name, other])
    wait_until(
        lambda: name not in topic_admin.list_topics(),
        timeout=10,
        message=f"topic {name} still listed after delete",
    )


def test_list_topics_by_pattern(topic_factory, topic_admin: TopicAdmin) -> None:
    prefix = f"listing-{uuid.uuid4().hex[:8]}"
    first = topic_factory(2, prefix=prefix)
    second = topic_factory(prefix=prefix)
    topic_factory(prefix="unrelated")
    assert topic_admin.list_topics(re.compile(re.escape(prefix) + "-.*")) == {
        first: 2,
        second: 1,
    }
    everything = topic_admin.list_topics()
    assert {first, second} <= everything.keys()
    assert not [name for name in everything if name.startswith("__")]


def test_partitions_of_a_missing_topic_is_an_error_and_creates_nothing(
    topic_admin: TopicAdmin,
) -> None:
    name = f"missing-{uuid.uuid4().hex}"
    with pytest.raises(BrokerError, match=name):
        topic_admin.partitions(name)
    assert name not in topic_admin.list_topics()
    topic_admin.delete_topics([name])  # missing_ok


# -- produce and consume ---------------------------------------------------------------------


def test_produce_and_consume_through_the_settings(broker, kafka_settings, topic_factory) -> None:
    topic = topic_factory(partitions=2)
    producer = Producer(producer_settings(kafka_settings))
    for i in range(20):
        producer.produce(topic, b"v%d" % i, b"k", partition=i % 2, headers=[("h", b"1")])
    assert producer.flush(10) == 0
    producer.close()
    consumer = Consumer(
        consumer_settings(kafka_settings, broker.profile, group_id=f"group-{uuid.uuid4().hex}")
    )
    received = []
    try:
        consumer.subscribe([topic])

        def all_received() -> bool:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                received.append(message)
            return len(received) == 20

        # The profile's session timeout keeps the group join short on every broker.
        wait_until(all_received, timeout=20, interval=0, message="not all 20 messages consumed")
        consumer.commit(asynchronous=False)
        committed = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
    finally:
        consumer.close()
    assert sorted(m.value() or b"" for m in received) == sorted(b"v%d" % i for i in range(20))
    assert all(m.headers() == [("h", b"1")] for m in received)
    assert [tp.offset for tp in committed] == [10, 10]


def test_read_watermarks_counts_every_record_of_a_batch(
    kafka_settings, topic_factory, producer_factory
) -> None:
    topic = topic_factory(partitions=2)
    producer = producer_factory(linger_ms=1000)
    for i in range(100):
        producer.produce(topic, value=b"%d" % i, partition=0)
    assert producer.flush(10) == 0
    assert read_watermarks(kafka_settings, [(topic, 0), (topic, 1)]) == {
        (topic, 0): (0, 100),
        (topic, 1): (0, 0),
    }
    assert read_watermarks(kafka_settings, []) == {}
    with pytest.raises(ConfigError, match="isolation level"):
        read_watermarks(kafka_settings, [(topic, 0)], isolation_level="serializable")  # type: ignore[arg-type]


def test_read_watermarks_read_committed_stops_before_an_open_transaction(
    kafka_settings, topic_factory, producer_factory
) -> None:
    topic = topic_factory()
    producer = producer_factory()
    for i in range(5):
        producer.produce(topic, value=b"%d" % i)
    assert producer.flush(10) == 0
    transactional = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    transactional.init_transactions(10)
    transactional.begin_transaction()
    for i in range(3):
        transactional.produce(topic, value=b"open-%d" % i)
    assert transactional.flush(10) == 0
    tp = (topic, 0)
    assert read_watermarks(kafka_settings, [tp])[tp] == (0, 8)
    assert read_watermarks(kafka_settings, [tp], isolation_level="read_committed")[tp] == (0, 5)
    transactional.commit_transaction(10)
    # the commit marker takes an offset too
    assert read_watermarks(kafka_settings, [tp], isolation_level="read_committed")[tp] == (0, 9)


def test_transactions_commit_visible_open_hidden(
    kafka_settings, topic_factory, producer_factory, consume_all
) -> None:
    topic = topic_factory()
    producer = producer_factory(transactional_id=f"tx-{uuid.uuid4().hex}")
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(10)
    assert [m.value() for m in consume_all(topic)] == [b"committed"]

    producer.begin_transaction()
    producer.produce(topic, value=b"open")
    assert producer.flush(10) == 0
    # read_uncommitted sees the open transaction's record; read_committed stops before it.
    assert [m.value() for m in consume_all(topic, read_committed=False)] == [
        b"committed",
        b"open",
    ]
    with pytest.raises(AssertionError, match="not read to its end"):
        consume_all(topic, timeout=1.0)
    producer.commit_transaction(10)
    assert [m.value() for m in consume_all(topic)] == [b"committed", b"open"]
