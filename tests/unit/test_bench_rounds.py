"""The benchmark's per-round figures: a round's fixed cost (CPU, thread wake-ups) beside the
per-message one, and what a wake-up costs on the machine."""

from __future__ import annotations

import os
import threading

from bench.harness import handoff_cpu_us, per_round, thread_wakeups
from bench.report import round_notes


def test_thread_wakeups_counts_a_thread_that_blocks_and_is_woken() -> None:
    before = thread_wakeups(os.getpid())
    assert before is not None
    go, done, finish = threading.Event(), threading.Event(), threading.Event()

    def sleeper() -> None:
        for _ in range(20):
            go.wait()
            go.clear()
            done.set()
        finish.wait()  # alive while counted: an exited thread's switches are not

    t = threading.Thread(target=sleeper)
    t.start()
    try:
        for _ in range(20):
            go.set()
            done.wait()
            done.clear()
        after = thread_wakeups(os.getpid())
    finally:
        finish.set()
        t.join()
    assert after is not None
    # 40 waits between the two threads, nearly every one of them blocking
    assert after - before >= 20


def test_thread_wakeups_of_a_process_that_is_gone_is_none() -> None:
    assert thread_wakeups(2**22 + 12345) is None


def test_handoff_cost_is_positive() -> None:
    assert handoff_cpu_us(200) > 0


def test_per_round_divides_by_the_rounds() -> None:
    assert per_round(2.0, 40_000, 500, 200_000) == {
        "messages": 400.0,
        "cpu_ms": 4.0,
        "wakeups": 80.0,
    }
    assert per_round(2.0, None, 500, 200_000) == {"messages": 400.0, "cpu_ms": 4.0}
    assert per_round(2.0, 10, 0, 100) == {}


def _results(rounds: list[dict[str, float]], handoff: float | None = 19.0) -> dict[str, object]:
    runs = [
        {"message_bytes": size, "coordinator_per_round": r}
        for size, r in zip((200, 1024), rounds, strict=True)
    ]
    machine = {} if handoff is None else {"thread_handoff_cpu_us": handoff}
    return {"throughput": {"qlayer": runs}, "machine": machine}


def test_round_notes_name_each_size_and_the_handoff_cost() -> None:
    notes = round_notes(
        _results(
            [
                {"messages": 357.4, "cpu_ms": 4.91, "wakeups": 52.2},
                {"messages": 1360.0, "cpu_ms": 6.33, "wakeups": 55.0},
            ]
        )
    )
    assert notes == [
        "- qlayer's coordinator per round in the throughput runs (200 B / 1,024 B): 357 / 1,360"
        " messages, 4.9 / 6.3 ms of CPU, 52 / 55 thread wake-ups (a hand-off between two"
        " threads costs 19.0 µs of CPU on this machine)."
    ]


def test_round_notes_leave_out_what_was_not_measured() -> None:
    no_wakeups = [{"messages": 400.0, "cpu_ms": 5.0}, {"messages": 400.0, "cpu_ms": 6.0}]
    assert round_notes(_results(no_wakeups, handoff=None)) == [
        "- qlayer's coordinator per round in the throughput runs (200 B / 1,024 B): 400 / 400"
        " messages, 5.0 / 6.0 ms of CPU."
    ]
    # an older results file (no per-round figures) gets no line
    assert round_notes({"throughput": {"qlayer": [{"message_bytes": 200}]}}) == []
    assert round_notes({}) == []
