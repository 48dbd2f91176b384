"""Frames that came late are held until the server says they are current (layer.client._late,
through the subscription core): no sockets, no threads, the clocks given."""

from __future__ import annotations

import random

from layer.api.frames import AckResult, Batch, Check, Checked, Messages, Subscribed
from layer.api.service import DeliveredMessage
from layer.client._core import Addresses, ReconnectPolicy, SubscriptionCore
from layer.engine.model import Bookmark

# The server's clock runs 1000 s behind the client's; the Subscribe round trip took 0.1 s:
# the client's bound of the offset is 1000 - 0.1 (sent at 5000.0, the server read 4000.1).
SENT_AT, SERVER_AT = 5000.0, 4000.1
OFFSET = 1000.0


def msg(offset: int) -> DeliveredMessage:
    return DeliveredMessage(Bookmark("t", 0, offset), None, b"x", [], 0, 1, 0, None)


def core(stale_after: float = 0.5) -> SubscriptionCore[str]:
    c: SubscriptionCore[str] = SubscriptionCore(
        "q", 5, None, "me", Addresses("a:1"), ReconnectPolicy(), random.Random(1)
    )
    subscribed = Subscribed("s1", 5, 60.0, SERVER_AT, stale_after)
    c.on_subscribed(subscribed, "a:1", now=SENT_AT + 0.1, sent_at=SENT_AT)
    return c


def frame(made_at_server: float, *offsets: int) -> Messages:
    return Messages([msg(o) for o in offsets], True, made_at_server)


def test_a_frame_on_time_goes_at_once_and_asks_nothing() -> None:
    c = core()
    # decided at server 4001.0 = client 5001.0; arrives 0.3 s later (bound: at most 0.4 s old)
    assert c.on_frame(frame(4001.0, 1), now=5001.3).messages == [msg(1)]
    assert c.take_checks() == []


def test_a_late_frame_is_held_with_what_follows_until_the_server_says_current() -> None:
    c = core()
    late = c.on_frame(frame(4001.0, 1, 2), now=5003.0)  # 2 s old: decided before a stop?
    assert late.messages == []
    [check] = c.take_checks()
    assert check == Check(check.request_id, 4001.0)
    # what comes meanwhile waits behind it, in order; acks' answers still go through
    after = c.on_frame(Batch([AckResult(9, []), frame(4003.05, 3)]), now=5003.1)
    assert after.messages == []
    assert c.take_checks() == []  # one question at a time
    answer = c.on_frame(Checked(check.request_id, True, 4003.2), now=5003.3)
    assert answer.messages == [msg(1), msg(2), msg(3)]
    assert c.late.dropped == 0


def test_a_late_frame_the_server_no_longer_owns_is_dropped_with_what_waited_behind_it() -> None:
    c = core()
    c.on_frame(frame(4001.0, 1, 2), now=5009.0)  # stopped 8 s after deciding it
    c.on_frame(frame(4001.1, 3), now=5009.0)
    [check] = c.take_checks()
    answer = c.on_frame(Checked(check.request_id, False, 4010.0), now=5010.1)
    assert answer.messages == []
    assert c.late.dropped == 3
    # the member's frames decided after that (if any) are judged on their own
    assert c.on_frame(frame(4010.2, 4), now=5010.3).messages == [msg(4)]


def test_a_held_frame_decided_after_the_answer_and_late_is_asked_about_again() -> None:
    c = core()
    c.on_frame(frame(4001.0, 1), now=5003.0)
    [first] = c.take_checks()
    c.on_frame(frame(4003.5, 2), now=5003.6)  # held behind the first, on time itself
    c.on_frame(frame(4003.6, 3), now=5006.0)  # held, and late too
    answer = c.on_frame(Checked(first.request_id, True, 4003.55), now=5006.1)
    assert answer.messages == [msg(1), msg(2)]
    [second] = c.take_checks()
    assert second.made_at == 4003.6
    assert c.on_frame(Checked(second.request_id, True, 4006.2), now=5006.3).messages == [msg(3)]


def test_an_answer_tightens_the_clock_bound() -> None:
    # a slow Subscribe round trip (2 s) leaves a loose bound: a frame 0.1 s old looks 2 s old
    c: SubscriptionCore[str] = SubscriptionCore(
        "q", 5, None, "me", Addresses("a:1"), ReconnectPolicy(), random.Random(1)
    )
    c.on_subscribed(Subscribed("s1", 5, 60.0, 4002.0, 0.5), "a:1", now=5004.0, sent_at=5000.0)
    assert c.on_frame(frame(4010.0, 1), now=5010.1).messages == []
    [check] = c.take_checks()
    # asked at 5010.1, answered with the server at 4010.15: the bound is now 999.95
    assert c.on_frame(Checked(check.request_id, True, 4010.15), now=5010.2).messages == [msg(1)]
    assert c.on_frame(frame(4011.0, 2), now=5011.1).messages == [msg(2)]
    assert c.take_checks() == []


def test_a_coordinator_alone_says_never_and_nothing_is_held() -> None:
    c = core(stale_after=0.0)
    assert c.on_frame(frame(4001.0, 1), now=9999.0).messages == [msg(1)]
    # an older server: no stamps at all
    assert c.on_frame(Messages([msg(2)]), now=9999.0).messages == [msg(2)]
    assert c.take_checks() == []


def test_a_dropped_connection_takes_the_held_frames_with_it() -> None:
    c = core()
    c.on_frame(frame(4001.0, 1), now=5003.0)
    [check] = c.take_checks()
    c.lost(None, now=5004.0)
    assert c.late.holding == 0
    assert c.late.dropped == 1
    # an answer from the old connection no longer counts
    assert c.on_frame(Checked(check.request_id, True, 4004.0), now=5004.1).messages == []


def test_messages_whose_leases_ran_out_while_held_are_dropped() -> None:
    c = core()
    leased = [
        DeliveredMessage(Bookmark("t", 0, o), None, b"x", [], 0, 1, 0, deadline)
        for o, deadline in ((1, 1_000_500), (2, 1_002_000), (3, None))  # 3: at-most-once
    ]
    c.on_frame(Messages(leased, True, 4001.0), now=5003.0)
    [check] = c.take_checks()
    # current, but the server's wall clock at the answer is past the first lease's deadline
    answer = c.on_frame(Checked(check.request_id, True, 4003.1, 1_001_000), now=5003.2)
    assert [m.bookmark.offset for m in answer.messages] == [2, 3]
    assert c.late.dropped == 1
