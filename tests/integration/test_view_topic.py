"""The view topic (``view_topic``): its rounds of changes, reduced last-per-bookmark, are exactly
what a browse shows, through leases, cancels, lease timeouts, acks, expirations,
target_queue_depth and coordinator restarts (SIGKILL, with the state kept and wiped)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from confluent_kafka import Producer

from connectors.admin import TopicSpec
from layer.client import QueueClient
from layer.engine.model import ViewChange
from layer.viewcodec import decode_round
from tests.harness import ROOT, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[dict[str, Any]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for doc in docs:
        p.produce(topic, json.dumps(doc).encode())
    assert p.flush(10) == 0


class ViewReader:
    """Reads the view topic as a Spark view does: the rounds of ``queue`` expanded, running sums
    and the last change per bookmark, with the messages from the underlying ``topic``."""

    def __init__(self, consume_all: Any, view_topic: str, queue: str, topic: str) -> None:
        self.consume_all, self.view_topic = consume_all, view_topic
        self.queue, self.topic = queue, topic

    def read(self) -> tuple[dict[str, ViewChange], dict[str, int], dict[str, float]]:
        values = {
            f"{m.topic()}/{m.partition()}/{m.offset()}": m.value()
            for m in self.consume_all(self.topic)
        }
        last: dict[str, ViewChange] = {}
        signs: dict[str, int] = {}
        qty: dict[str, float] = {}
        leases: dict[str, ViewChange] = {}
        for msg in self.consume_all(self.view_topic):
            assert msg.key() == self.queue.encode()
            round_ = decode_round(msg.value())
            assert round_.queue == self.queue and (round_.changes or round_.leases)
            for lease in round_.leases:
                bm = str(lease.bookmark)
                if lease.sign > 0:
                    assert bm not in leases, f"{bm}: leased twice without an end"
                    leases[bm] = lease
                else:
                    assert leases.pop(bm).holder == lease.holder, bm
            for change in round_.changes:
                bm = str(change.bookmark)
                last[bm] = change
                signs[bm] = signs.get(bm, 0) + change.sign
                assert signs[bm] in (0, 1), f"{bm}: the signs of its changes sum to {signs[bm]}"
                doc = json.loads(values[bm])
                qty[doc["sym"]] = qty.get(doc["sym"], 0) + change.sign * doc["qty"]
        self.leases = leases
        return {bm: c for bm, c in last.items() if c.sign > 0}, signs, qty


def browse_state(client: QueueClient, q: str) -> tuple[set[str], dict[str, float]]:
    browsed = client.browse(q)
    qty: dict[str, float] = {}
    for m in browsed:
        doc = m.json()
        qty[doc["sym"]] = qty.get(doc["sym"], 0) + doc["qty"]
    return {str(m.bookmark) for m in browsed}, qty


def assert_view_matches(client: QueueClient, q: str, view: ViewReader) -> dict[str, Any]:
    """At a quiet moment: the view's members, counts and per-symbol sums equal a browse's."""
    state: dict[str, Any] = {}

    def same() -> bool:
        members, _, qty = view.read()
        bookmarks, browse_qty = browse_state(client, q)
        state.update(members=members, bookmarks=bookmarks, qty=qty, browse_qty=browse_qty)
        nonzero = {k: v for k, v in qty.items() if v}
        state.update(leases=view.leases, leased=client.stats(q)[0].leased)
        return (
            set(members) == bookmarks
            and nonzero == browse_qty
            and len(view.leases) == state["leased"]
        )

    wait_until(same, 15, message=lambda: f"view == browse: {state}")
    by_bm = {str(m.bookmark): m for m in client.browse(q)}
    for bm, change in state["members"].items():
        assert (change.deliveries, change.cancels) == (
            by_bm[bm].deliveries,
            by_bm[bm].cancels,
        ), bm
    return state


def test_view_topic_follows_the_live_contents(
    broker, coordinator_factory, names, consume_all
) -> None:
    topic, q, vt = names("orders"), names("orders"), names("orders-view")
    c = coordinator_factory(
        [
            {
                "name": q,
                "underlying_topic": topic,
                "view_topic": vt,
                "lease_period": "2s",
                "expiration": "6s",
                "dead_letter_topic": names("dlq"),
            }
        ]
    )
    view = ViewReader(consume_all, vt, q, topic)
    docs = [{"id": i, "sym": "AB"[i % 2], "qty": i + 1} for i in range(20)]
    produce(broker.bootstrap_servers, topic, docs)
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 20, 15, message="20 available")
        assert_view_matches(client, q, view)
        with client.subscribe(q, max_backlog=8) as sub:
            got = [sub.next(timeout=10) for _ in range(8)]
            assert all(m is not None for m in got)
            state = assert_view_matches(client, q, view)  # 8 leased: out of the view
            assert len(state["members"]) == 12
            # ... and in the view's leases, held by this subscription
            assert set(state["leases"]) == {str(m.bookmark) for m in got}
            assert {lease.holder for lease in state["leases"].values()} == {sub.id}
            got[0].ack()
            got[1].ack()
            got[2].cancel()
            got[3].expire()
            sub.flush()
            state = assert_view_matches(client, q, view)
            # the cancelled one came back (and went straight out again to the subscription)
            stats = client.stats(q)[0]
            assert len(state["members"]) == stats.available == 20 - 3 - stats.leased
            # 4 leases time out (lease_period 2 s) while the subscription holds them
            wait_until(lambda: client.stats(q)[0].leased == 0, 15, message="the leases time out")
        # every message expires (6 s in the queue): the view empties
        wait_until(lambda: client.stats(q)[0].available == 0, 20, message="all expired")
        state = assert_view_matches(client, q, view)
        assert state["members"] == {}


def test_view_topic_leaves_out_inactive_messages(
    broker, coordinator_factory, names, consume_all
) -> None:
    topic, q, vt = names("jobs"), names("jobs"), names("jobs-view")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "view_topic": vt, "target_queue_depth": 5}]
    )
    view = ViewReader(consume_all, vt, q, topic)
    produce(broker.bootstrap_servers, topic, [{"sym": "A", "qty": i} for i in range(12)])
    with QueueClient(c.address) as client:
        wait_until(
            lambda: client.stats(q)[0].inactive == 7,
            15,
            message=lambda: f"7 inactive: {client.stats(q)[0]}",
        )
        state = assert_view_matches(client, q, view)
        assert len(state["members"]) == 5
        assert client.stats(q)[0].extra["unread"] == 7  # the lag, for autoscalers
        with client.subscribe(q, max_backlog=3) as sub:
            for _ in range(3):
                msg = sub.next(timeout=10)
                assert msg is not None
                msg.ack()
            sub.flush()
            # 3 acked, 3 leased; the depth stays at 5 live, so 2 of the inactive ones enter
            wait_until(lambda: client.stats(q)[0].inactive == 4, 15, message="4 inactive")
            state = assert_view_matches(client, q, view)
            assert len(state["members"]) == 2


@pytest.mark.parametrize("wipe", [False, True], ids=["state-kept", "from-changelog"])
def test_view_topic_is_reconciled_after_a_sigkill(
    broker, coordinator_factory, names, consume_all, wipe: bool
) -> None:
    topic, q, vt = names("orders"), names("orders"), names("orders-view")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "view_topic": vt, "lease_period": "3s"}]
    )
    view = ViewReader(consume_all, vt, q, topic)
    produce(broker.bootstrap_servers, topic, [{"sym": "AB"[i % 2], "qty": i} for i in range(10)])
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 10, 15, message="10 available")
        sub = client.subscribe(q, max_backlog=4)
        held = [sub.next(timeout=10) for _ in range(4)]
        assert all(m is not None for m in held)
        held[0].ack(wait=True)
        assert_view_matches(client, q, view)
    c.kill()  # 3 leases outstanding; their holder dies with the coordinator
    if wipe:
        c.wipe_state()
    started = time.monotonic()
    c.start()
    with QueueClient(c.address) as client:
        # the leases come back when they time out; the view follows, with no double count
        wait_until(lambda: client.stats(q)[0].available == 9, 20, message="9 available")
        state = assert_view_matches(client, q, view)
        assert len(state["members"]) == 9
    assert time.monotonic() - started < 30


def test_the_view_topic_keeps_every_round_and_a_compacted_one_is_refused(
    broker, coordinator_factory, names, topic_admin, tmp_path
) -> None:
    """A queue's rounds share one key, so compaction would keep only the last: the coordinator
    creates its view topic with deletion off, and will not start on a compacted one."""
    topic, q, vt = names("orders"), names("orders"), names("orders-view")
    coordinator_factory([{"name": q, "underlying_topic": topic, "view_topic": vt}])
    created = topic_admin.topic_config(vt)
    assert (created.get("cleanup.policy"), created.get("retention.ms")) == ("delete", "-1")

    compacted = names("compacted-view")
    topic_admin.ensure_topics([TopicSpec(compacted, config={"cleanup.policy": "compact"})])
    config = write_config(
        tmp_path / "qlayer.toml",
        broker.bootstrap_servers,
        [{"name": q, "underlying_topic": topic, "view_topic": compacted}],
    )
    r = subprocess.run(
        [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(config),
         "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state")],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2, r.stderr
    assert f"topic {compacted!r} has cleanup.policy=compact" in r.stderr, r.stderr
