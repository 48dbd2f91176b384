"""The fetch-wait policy (``FetchWait``) of the ingest reader and the Spark range reader: pure."""

from __future__ import annotations

from connectors.kafka import FetchWait


def yes() -> bool:
    return True


def no() -> bool:
    return False


def test_the_wait_grows_only_while_fetches_are_empty_and_a_partition_lags() -> None:
    wait = FetchWait(10, cap_ms=5_000, factor=5, patience=0.2)
    assert wait.empty(0.0, yes) is None  # the first empty fetch only starts the clock
    assert wait.empty(0.1, yes) is None  # not patient long enough yet
    assert wait.empty(0.25, no) is None  # idle, not stuck: the clock starts again
    assert wait.empty(0.4, yes) is None
    assert wait.empty(0.46, yes) == 50
    assert wait.wait_ms == 50
    # patience is at least four waits: 250 ms waits need a second of empty fetches
    wait.empty(1.0, yes)
    assert wait.empty(1.25, yes) == 250
    wait.empty(2.0, yes)
    assert wait.empty(2.5, yes) is None
    assert wait.empty(3.0, yes) == 1_250
    wait.empty(4.0, yes)
    assert wait.empty(9.0, yes) == 5_000
    wait.empty(10.0, yes)
    assert wait.empty(99.0, yes) is None  # capped
    assert wait.wait_ms == 5_000


def test_messages_reset_the_clock_and_the_wait_steps_back_once_caught_up_and_settled() -> None:
    wait = FetchWait(10, patience=0.2, settle=30.0)
    wait.empty(0.0, yes)
    assert wait.empty(0.3, yes) == 50
    wait.empty(1.0, yes)
    assert wait.fetched(1.1, yes) is None  # not settled: 30 s after the last change
    assert wait.empty(1.2, yes) is None  # the clock started again with the messages
    assert wait.fetched(40.0, no) is None  # settled but still lagging
    assert wait.fetched(41.0, yes) == 10  # back to the profile's wait
    assert wait.fetched(99.0, yes) is None  # never below it


def test_a_pause_is_not_an_empty_fetch() -> None:
    wait = FetchWait(10, patience=0.2)
    wait.empty(0.0, yes)
    wait.reset()  # paused by flow control from 0.0 to 5.0
    assert wait.empty(5.0, yes) is None
    assert wait.empty(5.1, yes) is None
    assert wait.empty(5.3, yes) == 50


def test_a_long_base_wait_is_its_own_floor() -> None:
    """Kafka's profile waits 500 ms: a fetch answers as soon as data is there, so a lag with
    empty fetches only lasts a moment; if it ever lasted 2 s the wait would grow, never shrink
    below 500."""
    wait = FetchWait(500, cap_ms=5_000, patience=0.2)
    wait.empty(0.0, yes)
    assert wait.empty(1.0, yes) is None
    assert wait.empty(2.0, yes) == 2_500
    assert wait.fetched(40.0, yes) == 500
