"""A Spark view of a partitioned queue (issue 12): the reader merges the view topics of the
queue's shards (``<view_topic>.shard-<i>``) and keeps the rounds of the queue and its shards."""

from __future__ import annotations

import pytest

from connectors.spark_kafka.view import rounds_of
from layer.config import loads
from layer.exceptions import ConfigError
from spark.settings import view_settings

CONFIG = """
[broker]
bootstrap_servers = "127.0.0.1:9"

[[queue]]
name = "orders"
underlying_topic = "orders"
distribution = "partitioned"
partitions = 3
view_topic = "orders.view"

[[queue]]
name = "plain"
underlying_topic = "plain"
view_topic = "plain.view"

[[queue]]
name = "parts"
underlying_topic = "parts"
distribution = "partitioned"
partitions = 2
"""


def test_a_partitioned_queue_is_read_from_its_shards_view_topics() -> None:
    cfg = loads(CONFIG)
    shards = ("orders.view.shard-0", "orders.view.shard-1", "orders.view.shard-2")
    settings = view_settings("orders", config=cfg)
    assert settings.view_topics == shards and settings.view_topic == "orders.view"
    assert settings.options["subscribe"] == ",".join(shards)
    # view_topic= names the queue's view topic, whose shards are read
    moved = view_settings("orders", config=cfg, view_topic="v")
    assert moved.options["subscribe"] == "v.shard-0,v.shard-1,v.shard-2"
    assert view_settings("plain", config=cfg).options["subscribe"] == "plain.view"
    # without a config, the topics given are read as they are
    given = view_settings("orders", bootstrap_servers="b:9", view_topic="a.shard-0,a.shard-1")
    assert given.options["subscribe"] == "a.shard-0,a.shard-1"
    with pytest.raises(ConfigError, match=r"queue 'parts': option 'view_topic' is not set"):
        view_settings("parts", config=cfg)


def test_the_rounds_of_a_queue_are_its_own_and_its_shards() -> None:
    mine = rounds_of("orders")
    assert mine is not None
    for key in (b"orders", b"orders#0", b"orders#12"):
        assert mine(key), key
    for key in (None, b"", b"orders#", b"orders#x", b"orders2", b"orders2#0", b"order", b"x#1"):
        assert not mine(key), key
    shard = rounds_of("orders#1")  # one shard: its rounds only
    assert shard is not None and shard(b"orders#1") and not shard(b"orders#10")
    assert rounds_of(None) is None
