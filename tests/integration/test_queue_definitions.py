"""Queues defined in Kafka, changed live (issue 12): ``qlayer queue create|alter|delete|list``
against real coordinator processes over the embedded broker.

A queue created with the CLI serves at once (no restart); an alter of a live option shows in
the next lease; a delete ends its subscriptions; a second coordinator of the same cluster reads
the definitions from the topic; a SIGKILLed coordinator comes back with them; refused input is
one line with exit code 2 (or 3) and changes nothing; the calls are admin-only when tokens are
on; a malformed record in the topic is logged and skipped while the others serve.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.admin import TopicAdmin
from layer.client import QueueClient
from layer.definitions import Definition
from layer.exceptions import QueueRemoved, UnknownQueue
from tests.harness import qlayer
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def ok(*args: str) -> str:
    r = qlayer(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def refused(code: int, *args: str) -> str:
    """A refused command: its exit code, and one line on stderr, no traceback."""
    r = qlayer(*args)
    assert r.returncode == code, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def listed(address: str) -> dict[str, dict[str, Any]]:
    out = ok("queue", "list", "--json", "--server", address)
    return {d["name"]: d for d in map(json.loads, out.splitlines())}


def lease_left(client: QueueClient, queue: str, data: bytes) -> float:
    """Publish ``data``, receive it, ack it; how long its lease had left when it arrived."""
    client.publish(queue, data)
    with client.subscribe(queue) as sub:
        msg = sub.next(timeout=30)
        assert msg is not None and msg.data == data
        assert msg.lease_deadline is not None
        left = msg.lease_deadline - time.time()
        msg.ack(wait=True, timeout=30)
    return left


def test_create_alter_delete_live_and_kept_across_a_kill(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q, topic = names("defq"), names("deft")
    proc = coordinator_factory([])
    address = str(proc.address)
    server = ("--server", address)
    # created with the CLI: serves at once, no restart
    ok("queue", "create", q, "--underlying-topic", topic, "--option", "message_type=bytes", *server)
    assert listed(address)[q]["options"]["message_type"] == '"bytes"'
    client = QueueClient(address)
    try:
        assert 50 < lease_left(client, q, b"one") <= 60.5  # the default lease_period
        # alter a live option: the next lease has the new period
        ok("queue", "alter", q, "--option", "lease_period=10s", "--option", "max_deliveries=3",
           *server)  # fmt: skip
        assert 5 < lease_left(client, q, b"two") <= 10.5
        info = {i.name: i for i in client.queues()}[q]
        assert info.lease_period_s == 10.0

        # SIGKILL and restart: the queue and its options come back from the topic
        proc.kill()
        proc.listen = address
        proc.start()
        client.close()
        client = QueueClient(address)
        assert {i.name: i for i in client.queues()}[q].lease_period_s == 10.0
        assert listed(address)[q]["options"]["max_deliveries"] == "3"
        assert 5 < lease_left(client, q, b"three") <= 10.5

        # delete: its subscriptions end, it is gone from the lists and from stats
        client.publish(q, b"four")
        sub = client.subscribe(q)
        got = sub.next(timeout=30)
        assert got is not None and got.data == b"four"
        line = refused(3, "queue", "delete", q, *server)  # a leased message: refused
        assert "leased" in line and "force" in line, line
        ok("queue", "delete", q, "--force", *server)
        with pytest.raises(QueueRemoved, match="deleted by"):
            while sub.next(timeout=30) is not None:
                pass
        assert q not in listed(address)
        with pytest.raises(UnknownQueue):
            client.stats(q)
    finally:
        client.close()


def test_refused_input_is_one_line_and_changes_nothing(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q, topic = names("refq"), names("reft")
    proc = coordinator_factory([{"name": q, "underlying_topic": topic, "message_type": "bytes"}])
    server = ("--server", str(proc.address))
    before = listed(str(proc.address))
    assert before[q]["origin"].startswith("file:")  # seeded from the config file

    line = refused(2, "queue", "create", names("x"), "--underlying-topic", topic,
                   "--option", "lease_period=-1", *server)  # fmt: skip
    assert "option 'lease_period'" in line and "expected a duration" in line, line
    line = refused(2, "queue", "create", names("x"), "--underlying-topic", topic,
                   "--option", "LeasePeriod=3", *server)  # fmt: skip
    assert "unknown option 'LeasePeriod'" in line and "lease_period" in line, line
    line = refused(2, "queue", "create", q, "--underlying-topic", topic, *server)
    assert "exists" in line, line
    line = refused(2, "queue", "alter", q, "--option", "semantics=at-most-once", *server)
    assert "option 'semantics' cannot change while the queue serves" in line, line
    line = refused(2, "queue", "alter", q, "--option", "max_deliveries=-2", *server)
    assert "option 'max_deliveries'" in line, line
    line = refused(3, "queue", "alter", names("nope"), "--option", "max_deliveries=2", *server)
    assert "is not defined" in line, line
    line = refused(3, "queue", "delete", names("nope"), *server)
    assert "is not defined" in line, line
    assert listed(str(proc.address)) == before


def test_a_second_coordinator_of_the_cluster_reads_the_definitions(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster = names("cluster")
    q, topic = names("shared"), names("sharedt")
    first = coordinator_factory([], cluster=cluster)
    ok("queue", "create", q, "--underlying-topic", topic, "--option", "message_type=bytes",
       "--server", str(first.address))  # fmt: skip
    second = coordinator_factory([], cluster=cluster)  # started later, its file has no queue
    assert q in listed(str(second.address))
    client = QueueClient(str(second.address))
    try:
        assert client.stats(q)[0].queue == q
        # a change through the first reaches the second live
        ok("queue", "alter", q, "--option", "lease_period=7s", "--server", str(first.address))
        wait_until(
            lambda: {i.name: i for i in client.queues()}[q].lease_period_s == 7.0,
            timeout=60,
            message="the second coordinator did not take the alter",
        )
        ok("queue", "delete", q, "--server", str(first.address))
        wait_until(lambda: q not in {i.name for i in client.queues()}, timeout=60)
    finally:
        client.close()


def test_the_file_seeds_and_cli_changes_survive_a_restart(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    kept, altered, gone = names("kept"), names("altered"), names("gone")
    queues = [
        {"name": n, "underlying_topic": n, "message_type": "bytes"} for n in (kept, altered, gone)
    ]
    proc = coordinator_factory(queues)
    address = str(proc.address)
    ok("queue", "alter", altered, "--option", "max_deliveries=4", "--server", address)
    ok("queue", "delete", gone, "--server", address)
    proc.stop()
    proc.listen = address
    proc.start()
    after = listed(address)
    assert sorted(after) == sorted([kept, altered])  # the deleted one is not re-created
    assert after[altered]["options"]["max_deliveries"] == "4"  # the alter stands
    assert "was deleted with `qlayer queue delete`: not re-created" in proc.log_path.read_text()


def test_queue_calls_are_admin_only_with_tokens(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q = names("authq")
    proc = coordinator_factory([], auth_token="user-token-1", admin_token="admin-token-1")
    server = ("--server", str(proc.address))
    create = ("queue", "create", q, "--underlying-topic", q, *server)
    line = refused(3, *create, "--token", "user-token-1")
    assert "admin" in line, line
    assert q not in listed_with(str(proc.address), "admin-token-1")
    ok(*create, "--token", "admin-token-1")
    refused(3, "queue", "delete", q, *server, "--token", "user-token-1")
    assert q in listed_with(str(proc.address), "user-token-1")  # list needs browse only


def listed_with(address: str, token: str) -> set[str]:
    out = ok("queue", "list", "--json", "--server", address, "--token", token)
    return {json.loads(line)["name"] for line in out.splitlines()}


def test_a_malformed_record_is_logged_and_skipped(
    broker: Any, coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cid = names("malformed")
    q, topic = names("good"), names("goodt")
    proc = coordinator_factory([{"name": q, "underlying_topic": topic}], id=cid)
    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce(f"qlayer.queues.{cid}", key=b"broken", value=b"\x01not avro")
    producer.produce(f"qlayer.queues.{cid}", key=q.encode(), value=b"\x01garbage")
    # valid, but written around the checks of `queue alter`: a fixed option changed
    key, value = Definition(
        q, {"name": q, "underlying_topic": topic, "semantics": "at-most-once"}
    ).encode()
    producer.produce(f"qlayer.queues.{cid}", key=key, value=value)
    assert producer.flush(30) == 0
    wait_until(
        lambda: (
            proc.log_path.read_text().count("definitions record") >= 2
            and "not applied while it serves" in proc.log_path.read_text()
        ),
        timeout=60,
        message=lambda: proc.log_tail(),
    )
    text = proc.log_path.read_text()
    assert f"qlayer.queues.{cid}/0/" in text and "skipped" in text
    assert f"queue {q!r}: option 'semantics'" in text
    # it keeps serving with its running definition
    with QueueClient(str(proc.address)) as client:
        assert client.stats(q)[0].queue == q
        assert {i.name: i for i in client.queues()}[q].semantics == "at-least-once"
    # a restart reads past the broken ones, and starts the queue as the topic last says
    address = str(proc.address)
    proc.kill()
    proc.listen = address
    proc.start()
    assert q in listed(address)
    with QueueClient(address) as client:
        assert {i.name: i for i in client.queues()}[q].semantics == "at-most-once"
    other = names("other")
    ok("queue", "create", other, "--underlying-topic", other, "--server", address)
    assert sorted(listed(address)) == sorted([q, other])


def test_a_temporary_queue_goes_with_its_state_once_its_client_is_gone(
    broker: Any, coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q, topic = names("replies"), names("repliest")
    proc = coordinator_factory([], temporary_queue_grace="2s")
    address = str(proc.address)
    admin = TopicAdmin({"bootstrap.servers": broker.bootstrap_servers})
    changelog = f"qlayer.changelog.{proc_id(proc)}.{q}"
    with QueueClient(address) as client:
        info = client.create_temporary_queue(q, topic, message_type="bytes")
        assert info.temporary and info.origin.startswith("temporary:")
        assert listed(address)[q]["temporary"] is True
        with client.subscribe(q) as sub:
            client.publish(q, b"reply-1")
            got = sub.next(timeout=30)
            assert got is not None and got.data == b"reply-1"
            got.ack(wait=True, timeout=30)
            # while a subscription is open it stays, however long (here: 3 graces)
            deadline = time.monotonic() + 6
            while time.monotonic() < deadline:
                assert q in {i.name for i in client.queues()}
                time.sleep(0.5)
        # the client comes back within the grace: the queue is still there, state and all
        with client.subscribe(q) as sub:
            client.publish(q, b"reply-2")
            got = sub.next(timeout=30)
            assert got is not None and got.data == b"reply-2"  # reply-1 stays acked
            got.ack(wait=True, timeout=30)
        assert changelog in admin.list_topics()
        # gone for good: deleted with its state once the grace has passed
        wait_until(
            lambda: q not in {i.name for i in client.queues()},
            timeout=60,
            message=lambda: proc.log_tail(),
        )
        assert q not in listed(address)
        with pytest.raises(UnknownQueue):
            client.stats(q)
        wait_until(lambda: changelog not in admin.list_topics(), timeout=60)
    assert "temporary queues deleted with their state" in proc.log_path.read_text()


def proc_id(proc: Any) -> str:
    text = proc.config_path.read_text()
    return next(
        line.split("=", 1)[1].strip().strip('"')
        for line in text.splitlines()
        if line.startswith("id = ")
    )


def test_create_from_a_toml_snippet(
    tmp_path: Any, coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q = names("snippet")
    proc = coordinator_factory([])
    snippet = tmp_path / "queue.toml"
    snippet.write_text(
        f'[[queue]]\nname = "{q}"\nunderlying_topic = "{q}"\nmessage_type = "bytes"\n'
        'lease_period = "45s"\n'
        'redelivery_backoff = { initial = "1s", multiplier = 2, max = "1m" }\n'
    )
    ok("queue", "create", "--from-file", str(snippet), "--server", str(proc.address))
    options = listed(str(proc.address))[q]["options"]
    assert options["lease_period"] == "45.0"
    assert options["redelivery_backoff"] == "{ initial = 1.0, multiplier = 2.0, max = 60.0 }"
    snippet.write_text("[[queue]]\nname = ")
    line = refused(2, "queue", "create", "--from-file", str(snippet), "--server", str(proc.address))
    assert str(snippet) in line, line
