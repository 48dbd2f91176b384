"""Partitioned queues (issue 12, ``layer.shards``): the options' checks, shard names, the
control partitions of shards, the client's routing by bookmark, and combined stats."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from layer.api.access import Grant, Right
from layer.api.service import ClusterInfo, ClusterMember, QueueOwner, QueueStats
from layer.client._core import Addresses
from layer.client._follow import ClusterView
from layer.client.partitioned import ShardsFields
from layer.config import CoordinatorConfig, loads, queue_from_table, queue_table
from layer.coordinator.membership import CONTROL_PARTITIONS, partition_of
from layer.coordinator.partitioned import sum_stats
from layer.coordinator.reload import FIXED_OPTIONS
from layer.exceptions import ClientError, ConfigError, MalformedBookmark
from layer.shards import (
    expand,
    parse_shard,
    queue_of,
    shard_name,
    shard_names,
    shards_in,
    view_topics,
)

BASE = {"name": "orders", "underlying_topic": "orders"}
PARTITIONED = {**BASE, "distribution": "partitioned", "partitions": 4}


def load_one(table: dict[str, Any]) -> Any:
    return queue_from_table(table, "test.toml", CoordinatorConfig())


def test_a_partitioned_queue_loads_and_round_trips_through_its_table() -> None:
    q = load_one(PARTITIONED)
    assert q.partitioned and q.partitions == 4 and q.shard is None
    assert queue_table(q) == PARTITIONED
    assert not load_one(BASE).partitioned  # the default: the queue is the unit


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"distribution": "partitioned"}, "'distribution': \"partitioned\" needs partitions ="),
        ({"partitions": 3}, "'partitions': needs distribution = \"partitioned\""),
        ({"distribution": "spread", "partitions": 3}, "'distribution': expected one of"),
        ({**PARTITIONED, "partitions": 0}, "'partitions': expected an integer from 1"),
        (
            {**PARTITIONED, "underlying_topic": "^orders-.*"},
            "'distribution': \"partitioned\" needs underlying_topic to name one topic",
        ),
        ({**PARTITIONED, "group_key": "/customer"}, "'group_key': cannot be combined with"),
        ({**PARTITIONED, "conflate_key": "/id"}, "'conflate_key': cannot be combined with"),
        ({**PARTITIONED, "last_value": True}, "'last_value': cannot be combined with"),
        (
            {**PARTITIONED, "view_topic": "v" * 230},
            "'view_topic': its shards' view topics ('" + "v" * 230 + ".shard-3.g9999999999' at",
        ),
        (
            {**PARTITIONED, "default_publish_target": "orders"},
            "'default_publish_target': cannot be combined with",
        ),
    ],
)
def test_what_cannot_hold_per_partition_is_refused_in_one_line(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_one({**BASE, **extra})
    text = str(err.value)
    assert text.startswith("test.toml: queue 'orders': option ") and "\n" not in text
    assert message in text


def test_what_holds_per_partition_is_allowed() -> None:
    for option, value in [
        ("priority", "/p"),
        ("barrier", "/b = 1"),
        ("exclusive", True),
        ("sort_key", "/k"),
        ("fairness", "round-robin"),
    ]:
        assert getattr(load_one({**PARTITIONED, option: value}), option) == value


def test_the_file_says_the_same() -> None:
    text = '[[queue]]\nname = "o"\nunderlying_topic = "o"\ndistribution = "partitioned"\n'
    with pytest.raises(ConfigError, match=r"^<string>: queue 'o': option 'distribution'"):
        loads(text)
    assert loads(text + "partitions = 2\n").queues[0].partitions == 2


def test_distribution_and_partitions_cannot_change_while_the_queue_serves() -> None:
    assert "distribution" in FIXED_OPTIONS and "partitions" in FIXED_OPTIONS


def test_shards_are_ordinary_queues_one_per_partition() -> None:
    q = load_one({**PARTITIONED, "priority": "/p"})
    other = load_one({**BASE, "name": "plain"})
    served = expand([q, other])
    assert [s.name for s in served] == ["orders#0", "orders#1", "orders#2", "orders#3", "plain"]
    assert [s.shard for s in served] == [0, 1, 2, 3, None]
    assert all(s.priority == "/p" and s.underlying_topic == "orders" for s in served[:4])
    assert shard_names(q) == [s.name for s in served[:4]] and shard_names(other) == []


def test_each_shard_writes_a_view_topic_of_its_own() -> None:
    q = load_one({**PARTITIONED, "view_topic": "orders.view"})
    served = expand([q, load_one({**BASE, "name": "plain", "view_topic": "plain.view"})])
    expected = [f"orders.view.shard-{i}" for i in range(4)]
    assert [s.view_topic for s in served] == [*expected, "plain.view"]
    assert view_topics(q) == expected  # what a Spark view of the queue merges
    assert view_topics(served[4]) == ["plain.view"] and view_topics(load_one(BASE)) == []
    assert queue_table(q) == {**PARTITIONED, "view_topic": "orders.view"}


def test_shard_names() -> None:
    assert shard_name("a.b", 3) == "a.b#3"
    assert parse_shard("a.b#3") == ("a.b", 3)
    for name in ("a.b", "#3", "a#", "a#x"):
        assert parse_shard(name) is None
    assert queue_of("a#12") == "a" and queue_of("a") == "a"
    names = ["x#1", "orders#10", "orders#2", "orders", "orders2#0", "orders#0"]
    assert shards_in("orders", names) == ["orders#0", "orders#2", "orders#10"]


def test_each_shard_has_its_own_changelog_topic() -> None:
    c = CoordinatorConfig(id="c1", cluster="prod")
    assert c.changelog_topic("orders#3") == "qlayer.changelog.prod.orders.shard-3"
    assert c.changelog_topic("orders") == "qlayer.changelog.prod.orders"


def test_shards_are_on_consecutive_control_partitions() -> None:
    first = partition_of("orders#0")
    spread = [partition_of(shard_name("orders", i)) for i in range(CONTROL_PARTITIONS)]
    assert spread == [(first + i) % CONTROL_PARTITIONS for i in range(CONTROL_PARTITIONS)]
    assert len(set(spread)) == CONTROL_PARTITIONS


def test_a_grant_on_a_queue_covers_its_shards() -> None:
    grant = Grant("orders", frozenset({Right.CONSUME}))
    assert grant.covers(Right.CONSUME, "orders#2")
    assert not grant.covers(Right.CONSUME, "orders2#0")


def test_a_client_learns_the_shards_of_a_queue_from_the_cluster_call() -> None:
    view = ClusterView(Addresses("127.0.0.1:1"))
    owners = [QueueOwner(n, partition_of(n), "c1", "a:1") for n in ("o#1", "o#0", "p")]
    alone = ClusterInfo("c1", "c1", [ClusterMember("c1", "a:1", [])], owners, standalone=True)
    assert view.shards_of("o") == []
    view.learn(alone, "127.0.0.1:1")
    assert view.shards_of("o") == ["o#0", "o#1"] and view.shards_of("p") == []
    assert view.learn_shards(ClusterInfo("c1", "c1", [], [], standalone=True), "o") == []


def stats(queue: str, owner: str, n: int, age: float | None) -> QueueStats:
    return QueueStats(queue, n, 1, 0, 1, age, 10 * n, 5 * n, n, {"lag": n, "p99_ms": n}, owner)


def test_the_stats_of_a_partitioned_queue_sum_its_shards() -> None:
    total = sum_stats("o", [stats("o#0", "c2", 2, 1.5), stats("o#1", "c1", 3, None)])
    assert (total.queue, total.available, total.leased, total.subscriptions) == ("o", 5, 2, 2)
    assert (total.delivered_total, total.acked_total, total.dead_lettered_total) == (50, 25, 5)
    assert total.oldest_available_age_s == 1.5
    assert total.extra == {"lag": 5, "p99_ms": 3}
    assert total.owner == "c1,c2"


def test_the_readme_example_loads() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split('#### Partitioned queues: `distribution = "partitioned"`', 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    (q,) = loads(example, source="README.md", env={}).queues
    assert q.partitioned and q.partitions == 6
    assert [s.name for s in expand([q])] == [f"orders#{i}" for i in range(6)]


class FakeShard:
    """What ShardsFields reads of a shard's subscription."""

    def __init__(self, queue: str, address: str) -> None:
        self.queue, self.address = queue, address
        self.filter, self.max_backlog, self.backlog = None, 2, 2
        self.acked_count, self.ack_failures, self.unconfirmed_acks = 3, [], 1
        self.reconnects, self.closed = 1, False


def test_operations_by_bookmark_go_to_the_shard_of_its_partition() -> None:
    merged: ShardsFields[Any] = ShardsFields()
    merged._queue = "o"
    subs = [FakeShard("o#0", "b:1"), FakeShard("o#1", "a:1"), FakeShard("o#2", "b:1")]
    merged._take_shards(subs)
    assert merged._shard_of("o/1/42") is subs[1]
    assert merged._shard_of("o/2/0") is subs[2]
    with pytest.raises(MalformedBookmark, match="partition 3 is not one of queue 'o'"):
        merged._shard_of("o/3/1")
    assert (merged.queue, merged.backlog, merged.acked_count) == ("o", 6, 9)
    assert (merged.unconfirmed_acks, merged.reconnects, merged.address) == (3, 3, "a:1,b:1")
    assert not merged.closed
    with pytest.raises(ClientError, match="cannot be replaced by one to another queue"):
        merged._check_replace("p")
    merged._check_replace("o")
