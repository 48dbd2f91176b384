"""SessionGuard: a member that did not run for most of its session holds its pushes until the
group keeps or takes its partitions (layer.coordinator.session_guard)."""

from __future__ import annotations

import asyncio

from layer.coordinator.session_guard import TICK_S, SessionGuard


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _guard() -> tuple[SessionGuard, Clock]:
    clock = Clock()
    guard = SessionGuard(session_s=2.0, heartbeat_s=0.5, clock=clock)  # gap 1 s, probation 2.5 s
    return guard, clock


def _run(guard: SessionGuard, clock: Clock, seconds: float) -> None:
    """The ticker runs on for ``seconds``."""
    end = clock.now + seconds
    while clock.now < end:
        clock.now += TICK_S
        guard.tick()


def test_a_member_that_runs_delivers() -> None:
    guard, clock = _guard()
    _run(guard, clock, 10.0)
    assert guard.deliverable(guard.losses) is True


def test_a_push_right_after_a_wake_is_held_before_the_ticker_runs() -> None:
    guard, clock = _guard()
    _run(guard, clock, 1.0)
    clock.now += 6.0  # stopped: neither the ticker nor the sender ran
    assert guard.deliverable(guard.losses) is None
    _run(guard, clock, 0.5)
    assert guard.deliverable(guard.losses) is None  # still suspect: the session may be gone


def test_the_ticker_finding_the_gap_holds_pushes_too() -> None:
    guard, clock = _guard()
    clock.now += 1.5
    guard.tick()
    assert guard.deliverable(guard.losses) is None


def test_a_short_pause_holds_nothing() -> None:
    guard, clock = _guard()
    clock.now += 0.9  # under the session less two heartbeats
    assert guard.deliverable(guard.losses) is True


def test_pushes_go_again_after_a_session_with_no_loss() -> None:
    guard, clock = _guard()
    clock.now += 6.0
    assert guard.deliverable(guard.losses) is None
    _run(guard, clock, 2.4)
    assert guard.deliverable(guard.losses) is None
    _run(guard, clock, 0.2)
    assert guard.deliverable(guard.losses) is True


def test_another_gap_during_probation_starts_it_again() -> None:
    guard, clock = _guard()
    clock.now += 6.0
    guard.tick()
    _run(guard, clock, 2.0)
    clock.now += 1.2
    guard.tick()
    _run(guard, clock, 2.0)
    assert guard.deliverable(guard.losses) is None


def test_held_pushes_are_dropped_when_the_partitions_are_lost() -> None:
    guard, clock = _guard()
    clock.now += 6.0

    async def held() -> bool:
        waiting = asyncio.ensure_future(guard.wait())
        await asyncio.sleep(0.1)
        assert not waiting.done()
        guard.lose()
        return await asyncio.wait_for(waiting, 5)

    assert asyncio.run(held()) is False
    # pushes decided after the loss (the group gave partitions back) go once the probation ends
    _run(guard, clock, 3.0)
    assert guard.deliverable(guard.losses) is True


def test_a_loss_after_a_gap_is_the_members_own_stop() -> None:
    guard, clock = _guard()
    _run(guard, clock, 1.0)
    assert not guard.suspect()
    clock.now += 6.0  # the loss is reported before the ticker ran again
    assert guard.suspect()
    _run(guard, clock, 3.0)  # the group kept the partitions after all
    assert guard.deliverable(guard.losses) is True
    assert not guard.suspect()


def test_an_assignment_right_after_a_gap_may_be_stale_until_a_loss() -> None:
    guard, clock = _guard()
    _run(guard, clock, 1.0)
    assert not guard.stale_assignment()
    clock.now += 6.0  # woken: an assignment queued before the stop may come first
    assert guard.stale_assignment()
    guard.lose()  # the group took the partitions: its next assignment is a fresh one
    assert not guard.stale_assignment()
    _run(guard, clock, 0.5)
    clock.now += 6.0  # another stop
    assert guard.stale_assignment()


def test_a_stall_too_short_for_a_reassignment_makes_no_assignment_stale() -> None:
    guard, clock = _guard()
    _run(guard, clock, 1.0)
    clock.now += 2.0  # a loaded machine's stall: suspect, but no other member was given
    assert guard.suspect()  # its partitions within it
    assert not guard.stale_assignment()


def test_a_frame_decided_before_a_gap_is_stale_once_partitions_are_lost() -> None:
    guard, clock = _guard()
    _run(guard, clock, 1.0)
    made_at = clock.now  # decided, handed to the transport, then the member stopped
    clock.now += 6.0
    assert guard.settled_since(made_at) is None  # woken: the session may be gone
    _run(guard, clock, 0.5)
    guard.lose()
    assert guard.settled_since(made_at) is False
    _run(guard, clock, 10.0)
    assert guard.settled_since(made_at) is False  # a loss after it, for good
    assert guard.settled_since(clock.now) is True  # a frame decided after the loss is fine


def test_a_frame_decided_before_a_gap_the_group_rode_out_is_current_after_probation() -> None:
    guard, clock = _guard()
    made_at = clock.now
    clock.now += 1.5
    assert guard.settled_since(made_at) is None
    _run(guard, clock, 1.0)
    assert guard.settled_since(made_at) is None
    _run(guard, clock, 2.0)  # a session and a heartbeat with no gap, no loss
    assert guard.settled_since(made_at) is True


def test_a_frame_of_a_member_that_ran_is_current_and_the_client_asks_at_half_the_gap() -> None:
    guard, clock = _guard()
    made_at = clock.now
    _run(guard, clock, 5.0)  # a slow client: the frame waited in the transport
    assert guard.settled_since(made_at) is True
    assert guard.stale_after_s == 0.5  # half the 1 s gap that makes the member suspect
    assert asyncio.run(guard.wait_since(made_at)) is True
