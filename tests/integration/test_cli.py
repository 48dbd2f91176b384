"""The ``qlayer`` command line against real processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import psutil
import pytest

from tests.harness import ROOT, qlayer
from tests.helpers import process_ended, wait_until

pytestmark = pytest.mark.integration


def test_help_teaches() -> None:
    r = qlayer("--help")
    assert r.returncode == 0
    for command in ("broker", "coordinator", "publish", "consume", "stats", "demo"):
        assert command in r.stdout
    assert "qlayer demo" in r.stdout  # where to start


def test_queue_alter_help_lists_each_live_option() -> None:
    from layer.coordinator.reload import FIXED_OPTIONS, LIVE_OPTIONS

    r = qlayer("queue", "alter", "--help")
    assert r.returncode == 0, r.stderr
    listed = {line.split(":")[0].strip() for line in r.stdout.splitlines() if line.startswith("  ")}
    assert set(LIVE_OPTIONS) <= listed
    assert not set(FIXED_OPTIONS) & listed  # only named as refused, never as live


def test_no_command_is_a_usage_error() -> None:
    assert qlayer().returncode == 2


def test_broker_serves_until_sigint() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "layer.cli", "broker"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("embedded broker serving on 127.0.0.1:")
        bootstrap = line.split()[4]
        from confluent_kafka.admin import AdminClient

        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)  # it really serves
        proc.send_signal(signal.SIGINT)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_sigkilled_coordinator_takes_its_embedded_broker_with_it(tmp_path) -> None:
    """Without ``bootstrap_servers`` the coordinator starts an in-memory broker of its own;
    killed with -9, it runs no cleanup, and the kernel ends that broker with it."""
    config = tmp_path / "qlayer.toml"
    config.write_text(
        f'[coordinator]\nlisten = "127.0.0.1:0"\nstate_dir = "{tmp_path / "state"}"\n'
        '[[queue]]\nname = "orders"\nunderlying_topic = "orders"\n'
    )
    with open(tmp_path / "coordinator.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    brokers: list[psutil.Process] = []
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("qlayer coordinator serving on"), (
            tmp_path / "coordinator.log"
        ).read_text()[-3000:]
        brokers = [p for p in psutil.Process(proc.pid).children() if p.name() == "tansu"]
        assert len(brokers) == 1
        proc.kill()
        proc.wait(10)
        wait_until(
            lambda: process_ended(brokers[0].pid),
            15,
            message=f"broker {brokers[0].pid} outlived its coordinator",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for b in brokers:
            if b.is_running():
                b.kill()
        if proc.stdout is not None:
            proc.stdout.close()


def test_publish_consume_stats(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": topic}])
    server = ["--server", str(c.address)]
    r = qlayer(
        "publish", q, "-", *server, "--key", "k", "--header", "h=v", stdin='{"a": 1}\n{"a": 2}\n'
    )
    assert r.returncode == 0, r.stderr
    assert [line.rsplit("/", 2)[0] for line in r.stdout.split()] == [topic, topic]

    r = qlayer("consume", q, *server, "--count", "1", "--cancel")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"] == {"a": 1}

    r = qlayer("consume", q, *server, "--count", "2", "--timeout", "5")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["data"]["a"] for x in lines] == [1, 2]
    assert lines[0]["deliveries"] >= 2  # the cancelled one came back

    r = qlayer("stats", q, *server)
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert stats["acked_total"] == 2 and stats["available"] == 0


def test_browse_and_ack_where(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": topic}])
    server = ["--server", str(c.address)]
    docs = "".join(json.dumps({"a": i}) + "\n" for i in range(3))
    assert qlayer("publish", q, "-", *server, stdin=docs).returncode == 0

    def browse(*more: str) -> list[dict[str, object]]:
        r = qlayer("browse", q, *server, "--json", *more)
        assert r.returncode == 0, r.stderr
        return [json.loads(line) for line in r.stdout.splitlines()]

    wait_until(lambda: len(browse()) == 3, 15, message="3 messages to browse")
    assert [json.loads(str(m["value"]))["a"] for m in browse("--filter", "/a >= 1")] == [1, 2]
    assert len(browse("--limit", "1")) == 1
    table = qlayer("browse", q, *server)
    assert table.returncode == 0 and table.stdout.startswith("BOOKMARK"), table.stderr
    assert len(table.stdout.splitlines()) == 4  # a header and a line per message

    r = qlayer("ack-where", q, "/a = 1", *server)
    assert (r.returncode, r.stdout.strip()) == (0, "acked 1, skipped 0"), r.stderr
    assert [json.loads(str(m["value"]))["a"] for m in browse()] == [0, 2]
    bad = qlayer("ack-where", q, "/a = ", *server)
    assert bad.returncode == 2, bad.stderr  # bad usage: the expression names its column
    assert len(bad.stderr.strip().splitlines()) == 1 and "column" in bad.stderr


def test_unknown_queue_exits_3_with_one_line(broker, coordinator_factory, names) -> None:
    c = coordinator_factory([{"name": names("q"), "underlying_topic": names("t")}])
    r = qlayer("consume", "nope", "--server", str(c.address), "--count", "1")
    assert r.returncode == 3
    assert len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr


def test_unreachable_coordinator_exits_1() -> None:
    r = qlayer("stats", "--server", "127.0.0.1:1")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1


def test_tls_and_token_end_to_end(broker, coordinator_factory, names, tmp_path) -> None:
    from layer.client import QueueClient
    from layer.exceptions import ClientError
    from tests.helpers import self_signed_cert

    cert, key = self_signed_cert(tmp_path)
    topic, q = names("t"), names("q")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic}],
        tls_cert=str(cert),
        tls_key=str(key),
        auth_token="s3cret",
    )
    secure = ["--server", str(c.address), "--tls-ca", str(cert), "--token", "s3cret"]
    r = qlayer("publish", q, '{"x": 1}', *secure)
    assert r.returncode == 0, r.stderr
    r = qlayer("consume", q, "--count", "1", *secure)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"] == {"x": 1}
    # without the token, or without TLS, the coordinator refuses
    assert qlayer("stats", q, "--server", str(c.address), "--tls-ca", str(cert)).returncode == 3
    with QueueClient(str(c.address), token="s3cret") as plain, pytest.raises(ClientError):
        plain.stats(q)
