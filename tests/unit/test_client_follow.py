"""The client's cluster bookkeeping (``layer.client._follow``) and the core's handling of a
queue that moved to another member: no sockets, no threads."""

from __future__ import annotations

import grpc

from layer.api.frames import Subscribed
from layer.api.service import ClusterInfo, ClusterMember, QueueOwner
from layer.client._core import Addresses, End, ReconnectPolicy, Retry, SubscriptionCore
from layer.client._follow import (
    WATCH_S,
    ClusterView,
    HungOwner,
    is_cluster,
    locate_timeout,
    may_have_moved,
    moved_unless_asked,
    others,
)
from layer.engine.model import AckOp
from layer.exceptions import (
    ConnectionLost,
    LeaseLost,
    NotOwner,
    QueueRemoved,
    UnknownQueue,
)


def two_members() -> ClusterInfo:
    return ClusterInfo(
        "c",
        "m1",
        [ClusterMember("m1", "10.0.0.1:7070", [0, 1]), ClusterMember("m2", "10.0.0.2:7070", [2])],
        [
            QueueOwner("q1", 0, "m1", "10.0.0.1:7070"),
            QueueOwner("q2", 2, "m2", "10.0.0.2:7070"),
            QueueOwner("q3", 5),  # moving: no owner
        ],
    )


def alone() -> ClusterInfo:
    return ClusterInfo(
        "c1", "c1", [ClusterMember("c1", "0.0.0.0:7070")], [QueueOwner("q1", 0, "c1")]
    )


def test_a_cluster_answer_teaches_owners_and_member_addresses() -> None:
    ring = Addresses("localhost:7070")
    view = ClusterView(ring)
    located = view.locate(two_members(), "localhost:7070", "q2")
    assert view.clustered and view.asked
    assert located.defined and located.address == "10.0.0.2:7070"
    # the member asked is reached as the client reaches it, not by its advertised address
    assert view.owner("q1") == "localhost:7070"
    assert view.owner("q3") is None and view.locate(two_members(), "x:1", "q3").address is None
    assert ring.all == ("localhost:7070", "10.0.0.2:7070")  # the other member, after the given
    assert not view.locate(two_members(), "localhost:7070", "gone").defined


def test_a_coordinator_alone_teaches_nothing() -> None:
    ring = Addresses("localhost:7070")
    view = ClusterView(ring)
    assert not is_cluster(alone()) and is_cluster(two_members())
    view.learn(alone(), "localhost:7070")
    assert view.asked and not view.clustered
    assert ring.all == ("localhost:7070",) and view.owner("q1") is None


def test_addresses_learn_once_and_keep_the_given_first() -> None:
    ring = Addresses("a:1,b:2")
    ring.failed("a:1")
    ring.learn(["c:3", "a:1", "c:3", ""])
    assert ring.all == ("a:1", "b:2", "c:3") and ring.current == "b:2"


def test_which_errors_may_mean_a_move() -> None:
    assert may_have_moved(NotOwner("served by m2")) and may_have_moved(QueueRemoved("moved"))
    assert not may_have_moved(UnknownQueue("no such queue"))
    assert not may_have_moved(ConnectionLost("gone")) and not may_have_moved(None)


def test_a_moved_queue_reconnects_and_says_why_its_acks_are_unconfirmed() -> None:
    c: SubscriptionCore[str] = SubscriptionCore(
        "q", 5, None, "me", Addresses("a:1,b:2"), ReconnectPolicy()
    )
    c.on_subscribed(Subscribed("s1", 5, 60.0), "a:1", now=0.0)
    c.operate(AckOp.ACK, "t/0/1", 0.0, "w", c.epoch)
    c.take()
    mark = c.flush_mark()
    moved = QueueRemoved("queue 'q' was moved to another member of the cluster")
    out, decision = c.lost(moved, now=1.0, moved=True)
    # the member that handed the queue over is not down: the addresses do not move on
    assert isinstance(decision, Retry) and decision.address == "a:1"
    ((waiter, _, error),) = out.done
    assert waiter == "w" and isinstance(error, LeaseLost)
    assert "moved to another member" in str(error) and "new owner" in str(error)
    assert "queue moved" in str(c.flush_error(mark))
    # without the face's check it is a refusal, as before; and never with reconnect off
    plain: SubscriptionCore[str] = SubscriptionCore(
        "q", 5, None, "me", Addresses("a:1"), ReconnectPolicy()
    )
    assert isinstance(plain.lost(moved, now=1.0)[1], End)
    off: SubscriptionCore[str] = SubscriptionCore(
        "q", 5, None, "me", Addresses("a:1"), ReconnectPolicy(enabled=False)
    )
    assert isinstance(off.lost(NotOwner("m2"), now=1.0, moved=True)[1], End)


def test_a_cluster_call_to_locate_a_queue_waits_two_connection_attempts_at_most() -> None:
    assert locate_timeout(ReconnectPolicy(connect_timeout=5.0), 30.0) == 10.0
    assert locate_timeout(ReconnectPolicy(connect_timeout=5.0), 4.0) == 4.0
    assert locate_timeout(ReconnectPolicy(connect_timeout=2.0), None) == 4.0


def test_what_a_stream_end_says_of_a_move_before_the_cluster_is_asked() -> None:
    def core(queue: str = "q", enabled: bool = True) -> SubscriptionCore[str]:
        return SubscriptionCore(
            queue, 5, None, "me", Addresses("a:1"), ReconnectPolicy(enabled=enabled)
        )

    moved, removed = NotOwner("served by m2"), QueueRemoved("moved or deleted")
    assert moved_unless_asked(core(), moved, clustered=True) is True
    assert moved_unless_asked(core(), removed, clustered=True) is None  # ask the cluster
    assert moved_unless_asked(core(), removed, clustered=False) is False  # alone: gone
    assert moved_unless_asked(core(), ConnectionLost("gone"), clustered=True) is False
    assert moved_unless_asked(core(enabled=False), moved, clustered=True) is False
    assert moved_unless_asked(core("^orders"), moved, clustered=True) is False  # regex
    closing = core()
    closing.closing = True
    assert moved_unless_asked(closing, moved, clustered=True) is False


def test_a_hung_owner_is_left_only_for_a_member_that_serves_the_queue_itself() -> None:
    watch = HungOwner("q2")
    m1_says_m2 = ("10.0.0.1:7070", two_members())  # m1 answers: m2 serves q2
    m2 = two_members()
    m2_says_itself = ("localhost:7072", ClusterInfo(m2.cluster, "m2", m2.members, m2.queues))
    # the member answers, slowly or not: it is never left, whatever the others say
    watch.probed(None)
    assert not watch.asking and watch.next_wait() == WATCH_S
    assert watch.moved_to([m2_says_itself]) is None
    watch.probed(grpc.StatusCode.PERMISSION_DENIED)  # an error is an answer too
    assert not watch.asking
    # it does not answer: ask the others, sooner; a third member's word is not enough, the
    # member serving the queue must say so itself (reached as this client reaches it)
    watch.probed(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert watch.asking and watch.next_wait() < WATCH_S
    assert watch.moved_to([]) is None
    assert watch.moved_to([m1_says_m2]) is None
    assert watch.moved_to([m1_says_m2, m2_says_itself]) == "localhost:7072"
    # while the queue moves (no owner) nobody serves it: stay
    assert HungOwner("q3").moved_to([m2_says_itself]) is None
    # it answers again: stay, and stop asking
    watch.probed(None)
    assert not watch.asking and watch.moved_to([m2_says_itself]) is None
    watch.probed(grpc.StatusCode.UNAVAILABLE)  # no connection: not answered either
    assert watch.moved_to([m2_says_itself]) == "localhost:7072"


def test_the_others_are_every_member_known_but_the_current() -> None:
    ring = Addresses(["a:1", "b:1"])
    ring.learn(["c:1"])
    assert others(ring, "b:1") == ["a:1", "c:1"]
