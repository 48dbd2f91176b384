"""Pure parts of riding out Kafka outages: the librdkafka log rate limit, backoff, and the
durable changelog's retry policy (over a scripted writer; the real one is exercised against a
real broker in tests/fault/test_broker_outage.py)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest

from connectors.kafka import RateLimit
from layer.coordinator.outage import Backoff
from layer.exceptions import StateError
from layer.state.changelog import DurableChangelog
from tests.helpers import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _record(text: str, level: int = logging.ERROR) -> logging.LogRecord:
    args = ("FAIL", "rdkafka#1", text)
    return logging.LogRecord("x", level, __file__, 1, "%s [%s] %s", args, None)


def test_rate_limit_lets_one_line_of_a_kind_through_a_minute_and_counts_the_rest() -> None:
    clock = Clock()
    limit = RateLimit(60.0, clock)
    first = _record("Connect to ipv4#127.0.0.1:4001 failed (after 0ms in state CONNECT)")
    assert limit.filter(first)
    # the same failure from another client and port, numbers aside: held back
    for port in range(100):
        clock.now += 0.1
        text = f"Connect to ipv4#127.0.0.1:{port} failed (after 1ms in state CONNECT)"
        assert not limit.filter(_record(text))
    assert limit.filter(_record("Metadata request timed out"))  # another kind passes
    assert limit.filter(_record("Connect failed", logging.WARNING))  # so does another level
    clock.now = 61.0
    again = _record("Connect to ipv4#127.0.0.1:4001 failed (after 0ms in state CONNECT)")
    assert limit.filter(again)
    assert "(100 similar lines in the last 61 s not shown)" in again.getMessage()


def test_backoff_doubles_to_its_cap_with_jitter_and_resets() -> None:
    backoff = Backoff(base=0.2, cap=1.0)
    waits = [backoff.next() for _ in range(6)]
    for wait, nominal in zip(waits, [0.2, 0.4, 0.8, 1.0, 1.0, 1.0], strict=True):
        assert nominal / 2 <= wait <= nominal
    backoff.reset()
    assert backoff.next() <= 0.2


class ScriptedWriter:
    """Stands in for ChangelogWriter: fails its commits as scripted, then succeeds."""

    fenced = False  # a "fatal" failure is a fenced writer's (a subclass says so)

    def __init__(self, failures: list[str], made: list[ScriptedWriter]) -> None:
        self.failures = failures  # "abort": aborted, still usable; "fatal": unusable
        self.usable = True
        self.closed = False
        self.transactional_id = "t"
        self.committed: list[Sequence[object]] = []
        made.append(self)

    def commit(
        self, records: Sequence[object], extra: Sequence[object] = (), bulk: Sequence[object] = ()
    ) -> dict[tuple[str, int], int]:
        if self.failures:
            kind = self.failures.pop(0)
            if kind == "fatal":
                self.usable = False
            raise StateError(f"scripted {kind}")
        self.committed.append(records)
        return {("c", 0): len(records)}

    def close(self) -> None:
        self.closed = True


def test_durable_changelog_redoes_the_same_batch_and_replaces_a_failed_writer() -> None:
    made: list[ScriptedWriter] = []
    script = [["abort", "fatal"], []]  # the first writer aborts once, then fails fatally
    troubles: list[str] = []
    waits: list[float] = []
    log = DurableChangelog(
        lambda: ScriptedWriter(script.pop(0), made),  # type: ignore[arg-type, return-value]
        wait_reachable=lambda timeout: waits.append(timeout) or True,
        on_trouble=troubles.append,
        interrupt=threading.Event(),
    )
    log.open()
    records = [("c", b"k", b"v")]
    assert log.commit(records) == {("c", 0): 1}
    assert troubles == ["scripted abort", "scripted fatal"]
    assert len(waits) == 2  # waited for Kafka before each redo
    wait_until(lambda: made[0].closed, 5)  # closed in the background
    assert not made[0].committed
    assert made[1].committed == [records]  # the very same records, in the new writer
    assert log.writers_made == 2 and log.redone == 1


def test_durable_changelog_gives_up_only_when_interrupted() -> None:
    interrupt = threading.Event()
    made: list[ScriptedWriter] = []

    def trouble(reason: str) -> None:
        interrupt.set()  # the process stops while a commit fails

    log = DurableChangelog(
        lambda: ScriptedWriter(["abort"] * 100, made),  # type: ignore[arg-type, return-value]
        wait_reachable=lambda timeout: True,
        on_trouble=trouble,
        interrupt=interrupt,
    )
    with pytest.raises(StateError, match="stopping"):
        log.commit([("c", b"k", b"v")])


def test_a_stop_ends_the_wait_for_kafka_at_once() -> None:
    """Kafka away: a failed commit waits (up to 30 s) for it before the redo; a stop (the
    interrupt) meanwhile ends that wait within a second, not at its end."""
    interrupt = threading.Event()
    asked = threading.Event()
    away = threading.Event()  # never set: Kafka stays away

    def wait_reachable(timeout: float) -> bool:
        asked.set()
        return away.wait(timeout)

    log = DurableChangelog(
        lambda: ScriptedWriter(["abort"] * 100, []),  # type: ignore[arg-type, return-value]
        wait_reachable=wait_reachable,
        on_trouble=lambda reason: None,
        interrupt=interrupt,
    )
    failed: list[BaseException] = []

    def commit() -> None:
        try:
            log.commit([("c", b"k", b"v")])
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    assert asked.wait(10), "the commit never waited for Kafka"
    interrupt.set()
    thread.join(10)  # 30 s if the wait took no notice of the stop
    assert not thread.is_alive(), "the wait for Kafka outlived the stop"
    assert len(failed) == 1 and isinstance(failed[0], StateError)
    assert "stopping" in str(failed[0])


def _cluster_log(
    script: list[list[str]], made: list[ScriptedWriter], confirm: object, dead: list[StateError]
) -> DurableChangelog:
    return DurableChangelog(
        lambda: ScriptedWriter(script.pop(0), made),  # type: ignore[arg-type, return-value]
        wait_reachable=lambda timeout: True,
        on_trouble=lambda reason: None,
        interrupt=threading.Event(),
        replace_failed=False,
        confirm_replacement=confirm,  # type: ignore[arg-type]
        on_dead=dead.append,
    )


def test_a_cluster_member_replaces_a_failed_writer_once_no_one_took_its_queues() -> None:
    made: list[ScriptedWriter] = []
    asked: list[int] = []
    answers: list[object] = [StateError("Kafka away again"), None]

    def confirm() -> str | None:
        asked.append(len(made))  # asked once the new writer started
        answer = answers.pop(0)
        if isinstance(answer, StateError):
            raise answer  # cannot tell yet: asked again, nothing committed meanwhile
        return answer  # type: ignore[return-value]

    dead: list[StateError] = []
    log = _cluster_log([["fatal"], []], made, confirm, dead)
    log.open()
    records = [("c", b"k", b"v")]
    assert log.commit(records) == {("c", 0): 1}
    assert asked == [2, 2] and not dead
    assert made[1].committed == [records]


def test_a_cluster_member_whose_queues_were_claimed_stops_and_a_fenced_one_too() -> None:
    made: list[ScriptedWriter] = []
    dead: list[StateError] = []
    log = _cluster_log([["fatal"], []], made, lambda: "partitions [3] were claimed", dead)
    log.open()
    with pytest.raises(StateError, match=r"failed, and partitions \[3\] were claimed"):
        log.commit([("c", b"k", b"v")])
    assert len(dead) == 1 and not made[1].committed

    class Fenced(ScriptedWriter):
        fenced = True

    fenced: list[ScriptedWriter] = []
    log = DurableChangelog(
        lambda: Fenced(["fatal"], fenced),  # type: ignore[arg-type, return-value]
        wait_reachable=lambda timeout: True,
        on_trouble=lambda reason: None,
        interrupt=threading.Event(),
        replace_failed=False,
        confirm_replacement=lambda: None,
        on_dead=dead.append,
    )
    log.open()
    with pytest.raises(StateError, match="was fenced by another member"):
        log.commit([("c", b"k", b"v")])
    assert len(fenced) == 1 and len(dead) == 2  # never replaced
