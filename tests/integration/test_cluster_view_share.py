"""Queues of a cluster with view topics (issue 12): two queues served by different members, the
view of each equal to its browse while their view topics roll on into new generations
(``view_snapshot_interval`` short), read with the ``qlayer_view`` reader itself (its batch
reader, without a Spark session); and a view topic that another queue of the cluster has
refused, through the API, the CLI and a member's config file.

Before the refusal, two queues sharing one view topic on two members were each dropped from
the views by the other's member (each member rolls and deletes the generations of the view
topics it writes, snapshotting only its own queues): the quiet queue's view read 0 messages
where its browse had 8."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pytest

from connectors.spark_kafka import follow as following
from connectors.spark_kafka.view import ViewBatchReader, ViewSourceOptions, read_view_range
from layer.client import QueueClient
from layer.coordinator.membership import partition_of
from layer.exceptions import ConfigError
from layer.viewgen import generations
from tests.harness import ROOT, qlayer, serving, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def view_of(bootstrap: str, view_topic: str, queue: str) -> set[str]:
    """The bookmarks a batch ``qlayer_view`` read of ``queue``'s rounds shows live."""
    reader = ViewBatchReader(
        ViewSourceOptions.parse(
            {"kafka.bootstrap.servers": bootstrap, "subscribe": view_topic, "queue": queue}
        )
    )
    live: set[str] = set()
    for task in reader.partitions():
        for arrow in read_view_range(reader._view, task):
            for row in pa.Table.from_batches([arrow]).to_pylist():
                assert row["sign"] == 1, row  # a snapshot read: the live contents
                live.add(row["bookmark"])
    return live


def name_on(names: Callable[[str], str], base: str, partitions: list[int]) -> str:
    """A unique queue name whose control partition is one of ``partitions``."""
    for i in range(1000):
        name = names(f"{base}{i}")
        if partition_of(name) in partitions:
            return name
    raise AssertionError(f"no name found on partitions {partitions}")


def churn(client: QueueClient, q: str, publish: int, ack: int) -> None:
    """``publish`` messages through ``q``, then ``ack`` of them consumed: changes to its view."""
    for i in range(publish):
        client.publish(q, f"m{i}".encode())
    if ack:
        with client.subscribe(q, max_backlog=ack) as sub:
            for _ in range(ack):
                msg = sub.next(timeout=30)
                assert msg is not None, f"{q}: nothing to consume"
                msg.ack()
            sub.flush()


def view_equals_browse(client: QueueClient, bootstrap: str, view_topic: str, q: str) -> None:
    browsed = {str(m.bookmark) for m in client.browse(q)}
    assert browsed, f"{q}: nothing to compare"
    wait_until(
        lambda: view_of(bootstrap, view_topic, q) == browsed,
        30,
        message=lambda: (
            f"view of {q}: {len(view_of(bootstrap, view_topic, q))} messages, browse {len(browsed)}"
        ),
    )


def test_queues_on_two_members_keep_their_views_as_generations_roll(
    broker: Any,
    topic_admin: Any,
    coordinator_factory: Any,
    names: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(following, "_CACHE", following.MessageCache())
    monkeypatch.setattr(following, "_TAILS", {})
    cluster = names("cluster")
    procs = [coordinator_factory([], cluster=cluster) for _ in range(2)]
    addresses = [str(p.address) for p in procs]
    bootstrap = broker.bootstrap_servers
    with QueueClient(addresses) as client:

        def split() -> dict[str, list[int]] | None:
            members = client.cluster().members
            parts = {m.address: m.partitions for m in members}
            return parts if len(members) == 2 and all(parts.values()) else None

        parts = wait_until(split, 90, message=lambda: f"not split: {client.cluster()}")
        busy = name_on(names, "busy", parts[addresses[0]])
        quiet = name_on(names, "quiet", parts[addresses[1]])
        views = {q: f"{q}.view" for q in (busy, quiet)}
        for q in (busy, quiet):
            client.create_queue(
                {
                    "name": q,
                    "underlying_topic": q,
                    "message_type": "bytes",
                    "view_topic": views[q],
                    "view_snapshot_interval": "1s",
                }
            )
        # a third queue on the busy one's view topic: refused, through the API and the CLI,
        # in one line, and nothing changes
        shared = {"name": names("third"), "underlying_topic": quiet, "view_topic": views[busy]}
        with pytest.raises(ConfigError) as info:
            client.create_queue(shared)
        assert str(info.value).startswith(
            f"queue create: queue {shared['name']!r}: option 'view_topic': {views[busy]!r} is"
            f" also the view topic of queue {busy!r}: in a cluster each queue needs a view"
            " topic of its own"
        ), info.value
        r = qlayer("queue", "create", shared["name"], "--underlying-topic", quiet,
                   "--option", f'view_topic="{views[busy]}"', "--server", addresses[1])  # fmt: skip
        assert r.returncode == 2, r.stdout + r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"is also the view topic of queue {busy!r}" in lines[0], lines
        r = qlayer("queue", "alter", quiet, "--option", f'view_topic="{views[busy]}"',
                   "--server", addresses[1])  # fmt: skip
        assert r.returncode == 2 and "option 'view_topic'" in r.stderr, r.stdout + r.stderr
        assert {d.name for d in client.queue_definitions()} == {busy, quiet}

        wait_until(lambda: serving(client, [busy, quiet]), 60, message="not served")
        owners = {o.queue: o.address for o in client.cluster().queues}
        assert owners[busy] != owners[quiet], owners
        churn(client, quiet, 10, 2)
        # the busy queue's member rolls its view topic's generations on, the quiet one's
        # member its own once
        deadline = time.monotonic() + 180
        while generations(views[busy], topic_admin.list_topics())[-1][0] < 3:
            assert time.monotonic() < deadline, generations(views[busy], topic_admin.list_topics())
            churn(client, busy, 20, 10)
            time.sleep(1.1)  # view_snapshot_interval: a generation a second at most
        while generations(views[quiet], topic_admin.list_topics())[-1][0] < 1:
            assert time.monotonic() < deadline, generations(views[quiet], topic_admin.list_topics())
            churn(client, quiet, 4, 4)
            time.sleep(1.1)
        for q in (busy, quiet):
            view_equals_browse(client, bootstrap, views[q], q)
    following.close()


def test_a_member_whose_file_shares_a_view_topic_of_the_cluster_exits_2(
    broker: Any, coordinator_factory: Any, names: Callable[[str], str], tmp_path: Any
) -> None:
    cluster, view_topic = names("cluster"), names("view")
    first, second = names("first"), names("second")
    proc = coordinator_factory(
        [{"name": first, "underlying_topic": first, "view_topic": view_topic}], cluster=cluster
    )
    config = write_config(
        tmp_path / "second.toml",
        broker.bootstrap_servers,
        [{"name": second, "underlying_topic": second, "view_topic": view_topic}],
        {"id": names("c2"), "cluster": cluster, "state_dir": str(tmp_path / "state")},
    )
    r = subprocess.run(
        [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr[-3000:]
    # its log lines before (the state directory...), then the error in one line
    lines = r.stderr.strip().splitlines()
    assert "Traceback" not in r.stderr and lines[-1].startswith("qlayer coordinator: "), lines
    assert lines[-1].endswith(
        f"second.toml: queue {second!r}: option 'view_topic': {view_topic!r} is also the view"
        f" topic of queue {first!r}: in a cluster each queue needs a view topic of its own (the"
        " members serving the two would each roll its generations and delete the other's)"
    ), lines[-1]
    with QueueClient(str(proc.address)) as client:
        assert {d.name for d in client.queue_definitions()} == {first}
        # a reload of the first member's file is checked against the API's queues as well
        made = names("made")
        made_view = f"{made}.view"
        client.create_queue({"name": made, "underlying_topic": made, "view_topic": made_view})
        edited = [
            {"name": first, "underlying_topic": first, "view_topic": view_topic},
            {"name": second, "underlying_topic": second, "view_topic": made_view},
        ]
        coordinator = {"id": proc_id(proc), "cluster": cluster}
        write_config(proc.config_path, broker.bootstrap_servers, edited, coordinator)
        r = qlayer("reload", "--server", str(proc.address))
        assert r.returncode == 2, r.stdout + r.stderr
        expected = f"queue {second!r}: option 'view_topic': {made_view!r} is also the view topic"
        assert expected in r.stderr, r.stderr
        assert {d.name for d in client.queue_definitions()} == {first, made}


def proc_id(proc: Any) -> str:
    """The coordinator id its config file gives."""
    for line in proc.config_path.read_text().splitlines():
        if line.startswith("id = "):
            return str(line.split('"')[1])
    raise AssertionError(f"no id in {proc.config_path}")
