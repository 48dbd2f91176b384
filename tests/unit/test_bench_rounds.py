"""The benchmark's per-round figures: a round's fixed cost (CPU, thread wake-ups) beside the
per-message one, and what a wake-up costs on the machine."""

from __future__ import annotations

import os
import threading
import time

from bench.harness import (
    handoff_cpu_us,
    per_round,
    thread_group,
    thread_groups,
    thread_split,
    thread_wakeups,
)
from bench.report import round_notes, thread_notes


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


def test_thread_group_by_name_and_the_main_thread() -> None:
    assert thread_group(10, 10, "python") == "main"
    assert thread_group(11, 10, "python") == "python"
    assert thread_group(12, 10, "rdk:broker-1") == "librdkafka"
    assert thread_group(13, 10, "event_engine") == "grpc"
    assert thread_group(14, 10, "grpc_global_tim") == "grpc"
    assert thread_group(15, 10, "rocksdb:low") == "rocksdb"
    assert thread_group(16, 10, "jemalloc_bg_thd") == "other"


def test_thread_groups_sees_a_busy_thread_of_this_process() -> None:
    """A real reading of /proc: a Python thread that spins and blocks shows as CPU and
    wake-ups of the ``python`` group, apart from the main thread's."""
    before = thread_groups(os.getpid())
    assert before is not None and "main" in before
    stop = threading.Event()
    spun = threading.Event()

    def spinner() -> None:
        end = time.process_time() + 0.3
        while time.process_time() < end:
            pass
        for _ in range(20):
            stop.wait(0.001)  # blocks: a voluntary switch each
        spun.set()
        stop.wait()

    t = threading.Thread(target=spinner)
    t.start()
    try:
        assert spun.wait(30)
        after = thread_groups(os.getpid())
    finally:
        stop.set()
        t.join()
    assert after is not None
    woken, cpu = after["python"]
    woken0, cpu0 = before.get("python", (0, 0.0))
    assert cpu - cpu0 >= 0.1
    assert woken - woken0 >= 10
    assert thread_groups(2**22 + 12345) is None


def test_thread_split_per_message_share_and_per_round() -> None:
    before = {"main": (100, 1.0), "librdkafka": (1_000, 0.5)}
    after = {"main": (300, 4.0), "librdkafka": (9_000, 1.5), "grpc": (400, 0.0)}
    assert thread_split(before, after, rounds=100, messages=100_000) == {
        "main": {"cpu_us_per_msg": 30.0, "cpu_share": 75.0, "wakeups_per_round": 2.0},
        "librdkafka": {"cpu_us_per_msg": 10.0, "cpu_share": 25.0, "wakeups_per_round": 80.0},
        "grpc": {"cpu_us_per_msg": 0.0, "cpu_share": 0.0, "wakeups_per_round": 4.0},
    }
    assert thread_split(None, after, 100, 100_000) == {}
    assert thread_split(before, after, 0, 100_000) == {}


def test_thread_notes_list_each_group_for_each_size() -> None:
    split = {
        "main": {"cpu_us_per_msg": 19.0, "cpu_share": 79.6, "wakeups_per_round": 3.0},
        "librdkafka": {"cpu_us_per_msg": 1.5, "cpu_share": 6.3, "wakeups_per_round": 26.0},
    }
    bigger = {
        "main": {"cpu_us_per_msg": 24.0, "cpu_share": 80.0, "wakeups_per_round": 3.0},
        "librdkafka": {"cpu_us_per_msg": 1.6, "cpu_share": 5.3, "wakeups_per_round": 25.0},
    }
    results = {
        "throughput": {
            "qlayer": [
                {"message_bytes": 200, "coordinator_threads": split},
                {"message_bytes": 1024, "coordinator_threads": bigger},
            ]
        }
    }
    assert thread_notes(results) == [
        "- qlayer's coordinator by its threads in the throughput runs (200 B / 1,024 B), CPU a"
        " message (share) and wake-ups a round: the event loop 19.0 / 24.0 µs (80 / 80%),"
        " 3 / 3 wake-ups; librdkafka's 1.5 / 1.6 µs (6 / 5%), 26 / 25 wake-ups."
    ]
    # a results file from before the split, or a run without it: no line
    assert thread_notes({"throughput": {"qlayer": [{"message_bytes": 200}]}}) == []
    assert thread_notes({}) == []
