"""A regex subscription in a cluster (issue 12): which queues it opens a stream on
(``_follow.matching_queues``), how its backlog is split, where operations by bookmark go, and
how the end of one stream is taken: no sockets, no threads."""

from __future__ import annotations

from typing import Any

import pytest

from layer.api.service import ClusterInfo, ClusterMember, QueueOwner
from layer.client._core import Addresses
from layer.client._follow import ClusterView, matching_queues
from layer.client.partitioned import ROUTES_KEPT, ShardsFields, split_backlog
from layer.exceptions import (
    ClientError,
    ConnectionLost,
    InvalidRequest,
    MalformedBookmark,
    QueueRemoved,
    UnknownBookmark,
    UnknownQueue,
)

CLUSTER_QUEUES = [
    "invoices",
    "orders-eu",
    "orders-us",
    "parts#0",
    "parts#1",
    "parts#10",
    "parts#2",
    "xorders-old",
]


def test_a_regex_matches_queue_names_as_a_coordinator_does() -> None:
    # re.search: "^orders-" is anchored by its caret, "orders" alone matches anywhere
    assert matching_queues("^orders-", CLUSTER_QUEUES) == ["orders-eu", "orders-us"]
    assert matching_queues("orders", CLUSTER_QUEUES) == ["orders-eu", "orders-us", "xorders-old"]


def test_a_partitioned_queue_is_matched_by_its_name_and_taken_whole() -> None:
    # its shards in shard order, though the cluster lists them by name (#10 before #2)
    assert matching_queues("^parts$", CLUSTER_QUEUES) == [
        "parts#0",
        "parts#1",
        "parts#2",
        "parts#10",
    ]
    # a shard's own name is not what is matched
    with pytest.raises(UnknownQueue, match="matches no queue of the cluster"):
        matching_queues("#1$", CLUSTER_QUEUES)


def test_a_bad_or_empty_regex_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequest, match=r"queue pattern '\^orders\(' is not a regex"):
        matching_queues("^orders(", CLUSTER_QUEUES)
    with pytest.raises(UnknownQueue, match=r"'\^nope' matches no queue .*invoices, orders-eu"):
        matching_queues("^nope", CLUSTER_QUEUES)


def test_the_view_resolves_a_regex_only_for_a_cluster() -> None:
    view = ClusterView(Addresses("a:1"))
    alone = ClusterInfo("c1", "c1", [ClusterMember("c1", "a:1", [])], [QueueOwner("orders-eu", 3)])
    view.learn(alone, "a:1")
    assert view.regex_streams("^orders") is None  # a coordinator alone resolves it itself
    members = [ClusterMember("m1", "a:1", [0]), ClusterMember("m2", "b:1", [1])]
    owners = [QueueOwner("orders-eu", 0, "m1", "a:1"), QueueOwner("orders-us", 1, "m2", "b:1")]
    view.learn(ClusterInfo("c", "m1", members, owners), "a:1")
    assert view.regex_streams("^orders") == ["orders-eu", "orders-us"]
    assert view.owner("orders-us") == "b:1"


def test_the_backlog_is_split_over_the_queues_at_least_one_each() -> None:
    assert split_backlog(10, 3) == [4, 3, 3]
    assert split_backlog(10, 1) == [10]
    assert split_backlog(2, 5) == [1, 1, 1, 1, 1]  # at most max(total, queues) leased
    assert split_backlog(0, 3) == [0, 0, 0]  # barrier messages only, everywhere
    assert split_backlog(-1, 2) == [-1, -1]  # the server refuses it, naming it
    for total in range(1, 40):
        for n in range(1, 9):
            shares = split_backlog(total, n)
            assert len(shares) == n and min(shares) >= 1
            assert sum(shares) == max(total, n)


class FakeStream:
    """What ShardsFields reads of a stream's subscription."""

    def __init__(self, queue: str, address: str, backlog: int = 2) -> None:
        self.queue, self.address = queue, address
        self.filter, self.max_backlog, self.backlog = None, backlog, backlog
        self.acked_count, self.ack_failures, self.unconfirmed_acks = 3, [], 0
        self.reconnects, self.closed = 0, False


class RegexFields(ShardsFields[Any]):
    regex = True


def regex_of(*streams: FakeStream, max_backlog: int = 5) -> RegexFields:
    merged = RegexFields()
    merged._queue = "^orders-"
    merged._take_shards(list(streams), max_backlog)
    return merged


def test_operations_by_bookmark_go_to_the_stream_that_delivered_it() -> None:
    eu, us = FakeStream("orders-eu", "a:1"), FakeStream("orders-us", "b:1")
    merged = regex_of(eu, us)
    # both queues read topic "orders": the bookmark alone does not say which queue
    merged._handing("orders/0/7", eu)
    merged._handing("orders/0/8", us)
    assert merged._shard_of("orders/0/7") is eu
    assert merged._shard_of("orders/0/8") is us
    merged._handing("orders/0/7", us)  # delivered again, by the other queue: goes there now
    assert merged._shard_of("orders/0/7") is us
    with pytest.raises(UnknownBookmark, match="not delivered by this subscription to '\\^orders-'"):
        merged._shard_of("orders/0/9")
    with pytest.raises(MalformedBookmark, match="malformed bookmark"):
        merged._shard_of("orders/x/9")
    # one queue alone: every bookmark is its
    single = regex_of(eu)
    assert single._shard_of("orders/0/9") is eu


def test_the_routes_kept_are_bounded() -> None:
    eu = FakeStream("orders-eu", "a:1")
    merged = regex_of(eu, FakeStream("orders-us", "b:1"))
    for offset in range(ROUTES_KEPT + 10):
        merged._handing(f"orders/0/{offset}", eu)
    assert len(merged._routes) == ROUTES_KEPT
    assert merged._shard_of(f"orders/0/{ROUTES_KEPT + 9}") is eu
    with pytest.raises(UnknownBookmark):
        merged._shard_of("orders/0/0")  # the oldest went first


def test_shown_figures_and_replace_of_a_regex() -> None:
    eu, us, uk = (
        FakeStream(q, a)
        for q, a in [("orders-eu", "a:1"), ("orders-us", "b:1"), ("orders-uk", "b:1")]
    )
    merged = regex_of(eu, us, uk, max_backlog=5)
    assert (merged.queue, merged.max_backlog, merged.backlog) == ("^orders-", 5, 6)
    assert (merged.acked_count, merged.address) == (9, "a:1,b:1")
    with pytest.raises(ClientError, match="open a new subscription"):
        merged._check_replace("^invoices")
    merged._check_replace("^orders-")  # the same regex: the queues it has
    merged._check_replace(None)
    assert merged._replacing(None) == [(eu, None), (us, None), (uk, None)]
    assert merged._replacing(7) == [(eu, 3), (us, 2), (uk, 2)]
    assert merged.max_backlog == 7
    eu.closed = True  # a queue that left: the others share the backlog
    assert merged._replacing(4) == [(us, 2), (uk, 2)]
    assert merged.address == "b:1"


def test_a_deleted_queue_leaves_a_regex_and_the_last_end_is_its() -> None:
    eu, us = FakeStream("orders-eu", "a:1"), FakeStream("orders-us", "b:1")
    merged = regex_of(eu, us)
    assert merged._stream_ended(eu, QueueRemoved("queue 'orders-eu' was deleted")) is False
    with pytest.raises(QueueRemoved, match="orders-us"):
        merged._stream_ended(us, QueueRemoved("queue 'orders-us' was deleted"))
    # any other error ends it at once, as it ends a partitioned queue's
    other = regex_of(FakeStream("orders-eu", "a:1"), FakeStream("orders-us", "b:1"))
    with pytest.raises(ConnectionLost):
        other._stream_ended(other.shards[0], ConnectionLost("gone"))
    # closed without an error: over once every stream is
    quiet = regex_of(eu, us)
    assert quiet._stream_ended(eu, None) is False
    assert quiet._stream_ended(us, None) is True


def test_a_partitioned_queue_ends_at_the_first_error() -> None:
    merged: ShardsFields[Any] = ShardsFields()
    merged._queue = "o"
    merged._take_shards([FakeStream("o#0", "a:1"), FakeStream("o#1", "b:1")])
    with pytest.raises(QueueRemoved):
        merged._stream_ended(merged.shards[0], QueueRemoved("queue 'o' was deleted"))
    assert merged._backlogs(3, 2) == [3, 3]
