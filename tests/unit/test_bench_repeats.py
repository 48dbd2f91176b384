"""``bench.run --repeat``: each system's throughput taken several times in turn, the median run
reported whole, and every run listed under the table."""

from __future__ import annotations

from typing import Any

import pytest

from bench.report import markdown, repeat_notes
from bench.run import complete, median_run, parse_args


def _run(rate: float, cpu: float | None = None, load: float = 1.0) -> dict[str, Any]:
    r: dict[str, Any] = {"msgs_per_s": rate, "loadavg_before": [load, 0.0, 0.0]}
    if cpu is not None:
        r["coordinator_cpu_us_per_msg"] = cpu
    return r


def test_a_full_run_repeats_three_times_and_a_quick_one_once() -> None:
    assert parse_args([]).repeat == 3
    assert parse_args(["--quick"]).repeat == 1
    assert parse_args(["--repeat", "5"]).repeat == 5


def test_a_repeat_below_one_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--repeat", "0"])
    assert exited.value.code == 2
    assert "--repeat" in capsys.readouterr().err


def test_the_median_run_is_reported_whole_with_every_run_in_order() -> None:
    runs = [_run(300.0, 14.0, 2.0), _run(100.0, 20.0, 5.0), _run(200.0, 17.0, 3.0)]
    chosen = median_run(runs)
    # the figures of one run (its CPU goes with its rate), not a median of each
    assert chosen["msgs_per_s"] == 200.0
    assert chosen["coordinator_cpu_us_per_msg"] == 17.0
    assert [r["msgs_per_s"] for r in chosen["repeats"]] == [300.0, 100.0, 200.0]
    assert chosen["repeats"][1] == {
        "msgs_per_s": 100.0,
        "coordinator_cpu_us_per_msg": 20.0,
        "loadavg_before": [5.0, 0.0, 0.0],
    }
    assert "repeats" not in runs[2]  # the run itself is left as it was


def test_an_even_count_takes_the_lower_middle_run() -> None:
    assert median_run([_run(4.0), _run(1.0), _run(3.0), _run(2.0)])["msgs_per_s"] == 2.0


def test_failed_runs_are_left_out_of_the_median_but_listed() -> None:
    failed = {"error": "RuntimeError: coordinator not serving after 600 s"}
    chosen = median_run([failed, _run(10.0), _run(30.0)])
    assert chosen["msgs_per_s"] == 10.0
    assert chosen["repeats"][0] == failed
    # none measured: the first failure stands for them all
    skipped = {"skipped": "time budget of 40 min spent"}
    assert median_run([failed, skipped])["error"] == failed["error"]


def test_a_single_run_is_reported_as_it_was() -> None:
    run = _run(123.0, 9.0)
    assert median_run([run]) == run


def _results(qlayer: list[dict[str, Any]], redis: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": "queue-test",
        "started": "2026-12-06T21:00:00+0000",
        "machine": {
            "cpus": 2,
            "cpu": "test",
            "memory_gib": 1,
            "platform": "linux",
            "loadavg_before": [1, 1, 1],
            "loadavg_after": [1, 1, 1],
        },
        "versions": {
            k: "1"
            for k in (
                "python",
                "confluent-kafka",
                "grpcio",
                "rocksdict",
                "pika",
                "nats-py",
                "redis",
            )
        },
        "settings": {
            "qlayer": {"broker": "tansu", "queue": "a queue", "consumer": "acks"},
            "redis": {"server": "Redis", "queue": "a stream", "durability": "none", "ack": "XACK"},
        },
        "workload": {
            "semantics": "at-least-once",
            "consumers": 4,
            "consumer_window": 100,
            "throughput_messages": 1000,
            "throughput_repeats": 3,
            "sizes": [200, 1024],
            "latency_rates": [],
            "latency_seconds": 20,
            "latency_message_bytes": 200,
        },
        "throughput": {"qlayer": qlayer, "redis": redis},
        "latency": {},
    }


def test_the_report_lists_every_run_under_the_table() -> None:
    q200 = median_run([_run(30_000.0, 15.0), _run(38_000.0, 13.5), _run(40_000.0, 12.9)])
    q1k = median_run([_run(27_000.0, 21.0), _run(25_000.0, 22.5), _run(29_000.0, 20.0)])
    r200 = median_run([_run(70_000.0), _run(90_000.0), _run(80_000.0)])
    r1k = median_run([_run(60_000.0), _run(61_000.0), _run(59_000.0)])
    results = _results([q200, q1k], [r200, r1k])
    notes = repeat_notes(results)
    assert notes[0].startswith("- Throughput: the rows above show the median of 3 runs")
    assert "(200 B; 1,024 B)" in notes[0]
    assert notes[1] == (
        "  - qlayer: 30,000 / 38,000 / 40,000; 27,000 / 25,000 / 29,000 msg/s"
        " (coordinator 15.0 / 13.5 / 12.9; 21.0 / 22.5 / 20.0 µs a message)"
    )
    assert notes[2] == "  - Redis Streams: 70,000 / 90,000 / 80,000; 60,000 / 61,000 / 59,000 msg/s"
    text = markdown(results)
    # the table shows the median runs, and says so
    assert "| 38,000 |" in text and "| 80,000 |" in text
    assert "(3 of each system and size, the median shown)" in text
    assert notes[1] in text


def test_a_run_of_one_each_has_no_repeat_notes() -> None:
    assert repeat_notes(_results([_run(1.0), _run(2.0)], [_run(3.0), _run(4.0)])) == []


def test_a_run_with_a_repeat_skipped_is_not_complete() -> None:
    skipped = {"skipped": "time budget of 40 min spent"}
    whole = _results([median_run([_run(1.0), _run(2.0)])], [median_run([_run(3.0), _run(4.0)])])
    assert complete(whole, failed=False)
    assert not complete(whole, failed=True)
    cut = _results([median_run([_run(1.0), skipped, _run(2.0)])], [median_run([_run(3.0)])])
    # the median run itself was measured: the skip is one of its repeats
    assert "skipped" not in cut["throughput"]["qlayer"][0]
    assert not complete(cut, failed=False)
