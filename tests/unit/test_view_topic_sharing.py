"""A view topic shared by queues (issue 12): allowed for a coordinator alone, refused in a
cluster wherever the queues are defined (the file, the definitions topic, the API), since the
members serving two queues would each roll the topic's generations and delete the other's."""

from __future__ import annotations

from typing import Any, cast

import pytest

from layer.config import Config, CoordinatorConfig, QueueConfig, loads, queue_from_table
from layer.config.model import shared_view_topic
from layer.coordinator.cluster_queues import ClusterQueues
from layer.definitions import Definition, Definitions, Manifest, Write, file_origin
from layer.exceptions import ConfigError

ALONE = CoordinatorConfig(id="c1")
MEMBER = CoordinatorConfig(id="c1", cluster="prod")


def queue(name: str, view: str | None = "v", **options: object) -> QueueConfig:
    table = {"name": name, "underlying_topic": name, **options}
    if view is not None:
        table["view_topic"] = view
    return queue_from_table(table, "test", ALONE)


def toml(cluster: bool, *views: str) -> str:
    head = '[coordinator]\nid = "c1"\n' + ('cluster = "prod"\n' if cluster else "")
    tables = (
        f'[[queue]]\nname = "q{i}"\nunderlying_topic = "t{i}"\nview_topic = "{v}"\n'
        for i, v in enumerate(views)
    )
    return head + "\n".join(tables)


def test_a_file_of_a_cluster_refuses_two_queues_on_one_view_topic_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        loads(toml(True, "orders.view", "orders.view"), source="qlayer.toml")
    assert str(info.value) == (
        "qlayer.toml: queue 'q1': option 'view_topic': 'orders.view' is also the view topic"
        " of queue 'q0': in a cluster each queue needs a view topic of its own (the members"
        " serving the two would each roll its generations and delete the other's)"
    )
    assert "\n" not in str(info.value)
    # a coordinator alone keeps one series of generations for both: allowed, as before
    alone = loads(toml(False, "orders.view", "orders.view"), source="qlayer.toml")
    assert [q.view_topic for q in alone.queues] == ["orders.view", "orders.view"]
    # topics of their own are fine in a cluster
    assert len(loads(toml(True, "a.view", "b.view"), source="qlayer.toml").queues) == 2


@pytest.mark.parametrize(
    ("mine", "theirs", "clash"),
    [
        (queue("a", "v"), queue("b", "v"), "'v' is also the view topic of queue 'b'"),
        # one queue's view topic is a generation of the other's (layer.viewgen)
        (
            queue("a", "v.g2"),
            queue("b", "v"),
            "'v.g2' is a generation of 'v', the view topic of queue 'b'",
        ),
        (
            queue("a", "v"),
            queue("b", "v.g1"),
            "'v.g1', the view topic of queue 'b', is a generation of 'v'",
        ),
        # a partitioned queue's shards write v.shard-i (layer.shards)
        (
            queue("a", "v.shard-1"),
            queue("p", "v", distribution="partitioned", partitions=3),
            "'v.shard-1' is also the view topic of queue 'p'",
        ),
        (
            queue("a", "v", distribution="partitioned", partitions=2),
            queue("p", "v", distribution="partitioned", partitions=3),
            "'v.shard-0' is also the view topic of queue 'p'",
        ),
        (queue("a", "v"), queue("b", "v2"), None),
        (queue("a", "v"), queue("b", "v.gx"), None),
        (queue("a", "v"), queue("p", "v", distribution="partitioned", partitions=2), None),
        (queue("a", None), queue("b", None), None),
        (queue("a", "v"), queue("a", "v"), None),  # itself (an alter)
    ],
)
def test_what_counts_as_sharing(mine: QueueConfig, theirs: QueueConfig, clash: str | None) -> None:
    found = shared_view_topic(mine, [theirs])
    if clash is None:
        assert found is None
    else:
        assert found is not None and found.startswith(clash + ":"), found


def reduce(exclusive: bool, *records: Definition) -> tuple[Definitions, list[str | None]]:
    def validate(d: Definition, where: str) -> QueueConfig:
        return queue_from_table(d.table, f"definitions topic {where}", ALONE)

    defs = Definitions(validate, "qlayer.queues.prod", exclusive_views=exclusive)
    problems = []
    for offset, d in enumerate(records):
        w = Write.of(d)
        problems.append(defs.apply(w.key, w.value, offset))
    return defs, problems


def d(name: str, view: str, **options: object) -> Definition:
    table = {"name": name, "underlying_topic": name, "view_topic": view, **options}
    return Definition(name, table)


def test_the_definitions_topic_of_a_cluster_keeps_the_first_of_two_sharing_a_view_topic() -> None:
    # two members each took a create before reading the other's: every member reduces the
    # same records in the same order, so all keep "a" and skip "b"
    defs, problems = reduce(True, d("a", "v"), d("b", "v"), d("a", "v", lease_period=9))
    assert [q.name for q in defs.defined()] == ["a"]
    assert defs.queues["a"].lease_period == 9.0  # altering the one kept is fine
    assert problems[0] is None and problems[2] is None
    assert problems[1] == defs.rejected[1]
    assert problems[1] is not None and problems[1].startswith(
        "definitions record qlayer.queues.prod/0/1 skipped, queue 'b' keeps its last"
        " definition: option 'view_topic': 'v' is also the view topic of queue 'a'"
    )
    # an alter onto another queue's view topic is skipped: the queue keeps its old one
    defs, problems = reduce(True, d("a", "v"), d("b", "w"), d("b", "v"))
    assert defs.queues["b"].view_topic == "w" and 2 in defs.rejected
    # once "a" is deleted, "b" may take its view topic
    defs, _ = reduce(True, d("a", "v"), d("b", "w"))
    defs.apply(b"a", None, 2)
    w = Write.of(d("b", "v"))
    assert defs.apply(w.key, w.value, 3) is None and defs.queues["b"].view_topic == "v"
    # a coordinator alone shares as before
    defs, problems = reduce(False, d("a", "v"), d("b", "v"))
    assert [q.name for q in defs.defined()] == ["a", "b"] and problems == [None, None]


def cluster_queues(coordinator: CoordinatorConfig, *records: Definition) -> ClusterQueues:
    # create / alter / check_file only read the reduced topic: the log is never used here
    cq = ClusterQueues(coordinator, cast(Any, None), clock=lambda: 0.0)
    for offset, record in enumerate(records):
        w = Write.of(record)
        assert cq.definitions.apply(w.key, w.value, offset) is None
    return cq


def test_create_and_alter_in_a_cluster_refuse_a_view_topic_another_queue_has() -> None:
    cq = cluster_queues(MEMBER, d("a", "v"), d("b", "w"))
    with pytest.raises(ConfigError) as info:
        cq.create({"name": '"c"', "underlying_topic": '"c"', "view_topic": '"v"'}, "admin")
    assert str(info.value).startswith(
        "queue create: queue 'c': option 'view_topic': 'v' is also the view topic of queue 'a'"
    )
    with pytest.raises(ConfigError, match=r"^queue alter: queue 'b': option 'view_topic': 'v'"):
        cq.alter("b", {"view_topic": '"v"'}, "admin")
    # its own view topic, and a topic of its own, are fine
    assert cq.alter("a", {"lease_period": '"9s"'}, "admin").table["view_topic"] == "v"
    assert cq.create({"name": '"c"', "underlying_topic": '"c"', "view_topic": '"x"'}, "admin")
    # alone, sharing is allowed
    alone = cluster_queues(ALONE, d("a", "v"))
    alone.create({"name": '"c"', "underlying_topic": '"c"', "view_topic": '"v"'}, "admin")


def test_a_file_read_in_a_cluster_is_checked_against_the_queues_of_the_topic() -> None:
    # "a" was created through the API (or another member's file)
    cq = cluster_queues(MEMBER, d("a", "v"))
    file = Config("qlayer.toml", coordinator=MEMBER, queues=(queue("b", "v"),))
    with pytest.raises(ConfigError) as info:
        cq.file_writes(file)
    assert str(info.value).startswith(
        "qlayer.toml: queue 'b': option 'view_topic': 'v' is also the view topic of queue 'a'"
    )
    # a file that deletes "a" and defines "b" on its view topic is fine: "a" was the file's
    cq = cluster_queues(MEMBER, d("a", "v"))
    manifest = Manifest("c1", "qlayer.toml", {"a": dict(d("a", "v").table)})
    w = Write.of(manifest)
    cq.definitions.apply(w.key, w.value, 1)
    assert file_origin("c1") in cq.definitions.manifests
    writes = cq.file_writes(file)
    assert [x.key for x in writes] == [b"a", b"b", b"file:c1"]  # the deletion first
    for offset, x in enumerate(writes, start=2):  # ... so the topic's reduce takes them
        assert cq.definitions.apply(x.key, x.value, offset) is None
    assert [q.name for q in cq.defined()] == ["b"]
    # two tables swapping view topics in one edit would pass through a clash: refused
    swap = cluster_queues(MEMBER, d("a", "v"), d("b", "w"))
    swapped = (queue("a", "w"), queue("b", "v"))
    with pytest.raises(ConfigError, match="^qlayer.toml: queue 'a': option 'view_topic': 'w'"):
        swap.file_writes(Config("qlayer.toml", coordinator=MEMBER, queues=swapped))
    # a coordinator alone writes it as it is
    alone = cluster_queues(ALONE, d("a", "v"))
    assert [x.key for x in alone.file_writes(file)] == [b"b", b"file:c1"]
