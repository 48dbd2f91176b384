"""The fault-run history checker (tests/fault/history.py) on hand-made histories: none of a
correct run's events is a violation, and each kind of violation is reported."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tests.fault.history import QueueSpec, Violation, check, read_history, summarize, write_history

LEASE = 10.0
ALO = QueueSpec("q", lease_period=LEASE, max_deliveries=3, max_cancels=2, expiration=60.0)
AMO = QueueSpec("q", semantics="at-most-once", expiration=60.0)


class History:
    """A history builder; times are seconds from 0 on the run's one clock."""

    def __init__(self, spec: QueueSpec = ALO, changelog: bool = True) -> None:
        self.spec = spec
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._counts: dict[str, int] = {}
        if changelog:
            self.add("changelog_read", 0.0, q="q")

    def add(self, ev: str, t: float, **fields: Any) -> History:
        self.events.append({"ev": ev, "t": t, **fields})
        return self

    def start(self, epoch: int, t: float, wiped: bool = False) -> History:
        return self.add("coordinator_start", t, epoch=epoch, wiped=wiped)

    def kill_coordinator(self, epoch: int, t: float) -> History:
        self.add("coordinator_kill", t, epoch=epoch)
        return self.add("coordinator_dead", t + 0.01, epoch=epoch)

    def publish(self, *bookmarks: str, t: float = 0.1) -> History:
        for b in bookmarks:
            self.add("publish", t, q="q", b=b)
        return self

    def subscribe(self, w: str, epoch: int = 1, t: float = 0.2) -> History:
        return self.add("subscribed", t, q="q", w=w, sub=f"{w}-s", epoch=epoch)

    def got(self, w: str, b: str, grant: float, *, n: int | None = None, lease: bool = True,
            durable: bool = True) -> History:  # fmt: skip
        """``w`` reads ``b``, granted at ``grant`` (read 5 ms later); durable: its lease record."""
        n = n if n is not None else self._counts.get(b, 0) + 1
        self._counts[b] = n
        dl = grant + self.spec.lease_period if lease else None
        if durable and lease:
            self.add("durable", grant, q="q", b=b, kind="LEASED", n=n, c=0, reason=None)
        return self.add("got", grant + 0.005, q="q", w=w, sub=f"{w}-s", b=b, n=n, c=0, dl=dl)

    def op(self, w: str, b: str, op: str, t: float, outcome: str | None = "ok",
           answered: float | None = None, seconds: float = 0.0) -> History:  # fmt: skip
        """``w`` sends ``op`` on ``b`` at ``t``; the answer (ok, refused, lost; None: no answer
        at all) comes at ``answered`` (default 10 ms later)."""
        i = next(self._ids)
        self.add("op", t, q="q", w=w, sub=f"{w}-s", b=b, op=op, id=i, s=seconds)
        if outcome is not None:
            self.add(f"op_{outcome}", answered if answered is not None else t + 0.01, q="q", w=w,
                     id=i, error=None if outcome != "refused" else "not_lease_holder")  # fmt: skip
        return self

    def done(self, b: str, reason: str, t: float, n: int = 1, c: int = 0) -> History:
        return self.add("durable", t, q="q", b=b, kind="DONE", n=n, c=c, reason=reason)

    def dead_letter(self, b: str, reason: str, t: float, n: int = 1, c: int = 0) -> History:
        self.done(b, reason, t, n, c)
        return self.add("dead_letter", t, q="q", b=b, reason=reason, n=n, c=c)

    def acked(self, w: str, b: str, t: float) -> History:
        """A confirmed ack whose done record is durable."""
        self.op(w, b, "ack", t)
        return self.done(b, "acked", t + 0.005, n=self._counts.get(b, 1))

    def check(self) -> list[Violation]:
        return check(self.events, self.spec)


def kinds(violations: list[Violation]) -> list[str]:
    return sorted(v.kind for v in violations)


def correct() -> History:
    """At-least-once, two coordinators, two consumers: an ack, a lease timeout, a consumer
    SIGKILLed, a cancel, a consumer expire and a SIGSTOP past a deadline, all handled right."""
    h = History().start(1, 0.0).publish("t/0/0", "t/0/1", "t/0/2", "t/0/3", "t/0/4")
    h.subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).acked("A", "t/0/0", 2.0)
    # t/0/1: A lets the lease run out (deadline 11); B gets it after
    h.got("A", "t/0/1", 1.0).add("durable", 11.0, q="q", b="t/0/1", kind="RETURNED", n=1, c=0,
                                  reason="timeout")  # fmt: skip
    h.got("B", "t/0/1", 11.2).acked("B", "t/0/1", 11.5)
    # a late ack from A after the lease went to B is refused: it ends nothing
    h.op("A", "t/0/1", "ack", 11.3, outcome="refused")
    # t/0/2: A is SIGKILLed holding it; B gets it and expires it
    h.got("A", "t/0/2", 3.0).add("consumer_kill", 4.0, w="A")
    h.got("B", "t/0/2", 4.1).op("B", "t/0/2", "expire", 4.5)
    h.dead_letter("t/0/2", "consumer_expire", 4.505, n=2)
    # t/0/3: B cancels it twice: the second cancel dead-letters it
    h.got("B", "t/0/3", 5.0).op("B", "t/0/3", "cancel", 5.1)
    h.got("B", "t/0/3", 5.2).op("B", "t/0/3", "cancel", 5.3)
    h.dead_letter("t/0/3", "max_cancels", 5.305, n=2, c=2)
    # t/0/4: granted by coordinator 1 at 20, which is SIGSTOPped 21..32 (past the deadline 30)
    # and then SIGKILLed; coordinator 2 grants it to C and C's ack is confirmed
    h.got("B", "t/0/4", 20.0)
    h.add("coordinator_stop", 21.0, epoch=1).add("coordinator_cont", 32.0, epoch=1)
    h.kill_coordinator(1, 33.0).start(2, 34.0, wiped=True).subscribe("C", epoch=2, t=35.0)
    h.got("C", "t/0/4", 35.5).acked("C", "t/0/4", 36.0)
    h.add("stats", 40.0, q="q", epoch=2, available=0, leased=0, inactive=0, delivered_total=1,
          acked_total=1, dead_lettered_total=0)  # fmt: skip
    return h


def test_a_correct_history_has_no_violations() -> None:
    assert correct().check() == []


def test_a_correct_history_without_the_changelog_has_no_violations() -> None:
    h = correct()
    h.events = [e for e in h.events if e["ev"] not in ("durable", "changelog_read")]
    assert h.check() == []


def test_summary_counts_operations_and_faults(tmp_path) -> None:
    h = correct()
    write_history(tmp_path / "h.jsonl", h.events)
    with (tmp_path / "h.jsonl").open("a") as f:
        f.write('{"ev": "got", "t": 1')  # a last line cut short by a SIGKILL
    events = read_history([tmp_path / "h.jsonl"])
    assert len(events) == len(h.events)
    s = summarize(events, ALO, check(events, ALO))
    assert s.operations["publish"] == 5 and s.operations["deliver"] == 9
    assert s.operations["ack"] == 4 and s.operations["cancel"] == 2
    assert s.faults["coordinator SIGKILL"] == 1 and s.faults["coordinator SIGSTOP"] == 1
    assert s.faults["consumer SIGKILL"] == 1 and s.faults["lease timeout"] == 1
    assert s.faults["state wiped"] == 1
    assert "violations=0" in s.line()


# --- at-least-once ----------------------------------------------------------------------------


def test_an_unacked_message_is_lost() -> None:
    h = History().start(1, 0).publish("t/0/0", "t/0/1").subscribe("A")
    h.got("A", "t/0/0", 1.0).acked("A", "t/0/0", 1.5)
    h.got("A", "t/0/1", 1.0)  # never acked, never dead-lettered
    (v,) = h.check()
    assert v.kind == "lost" and v.bookmark == "t/0/1"


def test_an_ack_whose_answer_was_lost_counts_only_if_it_is_durable() -> None:
    def run(durable: bool) -> list[str]:
        h = History().start(1, 0).publish("t/0/0").subscribe("A")
        h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "ack", 1.5, outcome="lost")
        h.kill_coordinator(1, 1.6)
        if durable:
            h.done("t/0/0", "acked", 1.55)
        return kinds(h.check())

    assert run(durable=True) == []
    assert run(durable=False) == ["lost"]
    # durable, yet delivered again after its done record
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "ack", 1.5, outcome="lost")
    h.done("t/0/0", "acked", 1.55)
    h.kill_coordinator(1, 1.6).start(2, 2.0).subscribe("B", epoch=2, t=2.1)
    h.got("B", "t/0/0", 2.2).op("B", "t/0/0", "ack", 2.5, outcome="refused")
    assert kinds(h.check()) == ["redelivered_after_ack"]


def test_a_message_delivered_after_its_confirmed_ack() -> None:
    h = correct()
    h.got("B", "t/0/0", 3.0)  # acked by A at 2.0
    assert kinds(h.check()) == ["redelivered_after_ack"]


def test_a_late_ack_acts_on_the_current_lease_of_the_same_subscription() -> None:
    # A's lease 1 ran out; lease 2 went to A again before A's late ack arrived: the ack acted
    # on lease 2, so nothing was delivered after it
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).got("A", "t/0/0", 11.1)
    h.op("A", "t/0/0", "ack", 11.05, answered=11.2).done("t/0/0", "acked", 11.15, n=2)
    assert h.check() == []


def test_two_valid_leases_at_once() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0)  # valid until 11
    h.got("B", "t/0/0", 8.0).acked("B", "t/0/0", 8.5)
    assert kinds(h.check()) == ["double_lease"]


def test_a_refused_ack_does_not_end_the_lease() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "ack", 2.0, outcome="refused")
    h.got("B", "t/0/0", 3.0).acked("B", "t/0/0", 3.5)
    assert kinds(h.check()) == ["double_lease"]


def test_an_ack_sent_ends_the_lease_even_if_its_answer_was_lost() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "cancel", 2.0, outcome=None)  # no answer logged
    h.got("B", "t/0/0", 2.5).acked("B", "t/0/0", 3.0)
    assert h.check() == []


def test_the_holders_death_or_disconnect_ends_its_leases() -> None:
    for end in ("consumer_kill", "closing", "broken"):
        h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
        h.got("A", "t/0/0", 1.0)
        h.add(end, 2.0, w="A", sub="A-s")
        h.got("B", "t/0/0", 2.1).acked("B", "t/0/0", 3.0)
        assert h.check() == [], end
        # but not before it happened
        h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
        h.got("A", "t/0/0", 1.0)
        h.add(end, 2.0, w="A", sub="A-s")
        h.got("B", "t/0/0", 1.9).acked("B", "t/0/0", 3.0)
        assert kinds(h.check()) == ["double_lease"], end


def test_a_confirmed_extend_moves_the_deadline() -> None:
    def run(outcome: str) -> list[str]:
        h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
        h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "extend", 2.0, outcome=outcome, seconds=20)
        h.got("B", "t/0/0", 15.0).acked("B", "t/0/0", 16.0)  # after 11, before 22
        return kinds(h.check())

    assert run("ok") == ["double_lease"]
    assert run("refused") == []


def test_deadlines_are_compared_within_the_skew() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).got("B", "t/0/0", 10.999).acked("B", "t/0/0", 12.0)
    assert h.check() == []
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).got("B", "t/0/0", 10.99).acked("B", "t/0/0", 12.0)
    assert kinds(h.check()) == ["double_lease"]


def test_a_sigstopped_coordinator_grants_nothing_and_its_leases_run_to_their_deadline() -> None:
    def run(regrant: float) -> list[str]:
        h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
        h.got("A", "t/0/0", 1.0)
        h.add("coordinator_stop", 2.0, epoch=1).add("coordinator_cont", 20.0, epoch=1)
        h.got("B", "t/0/0", regrant).acked("B", "t/0/0", regrant + 1)
        return kinds(h.check())

    assert run(20.5) == []
    assert run(15.0) == ["granted_while_down"]  # after the deadline, but while stopped
    assert run(5.0) == ["double_lease", "granted_while_down"]


def test_a_killed_coordinators_leases_end_with_it() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).kill_coordinator(1, 2.0).start(2, 2.5).subscribe("B", epoch=2, t=3)
    h.got("B", "t/0/0", 3.1).acked("B", "t/0/0", 3.5)
    assert h.check() == []
    # nothing is granted between its death and its successor's start
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.kill_coordinator(1, 0.5).start(2, 2.5)
    h.got("A", "t/0/0", 1.0).acked("A", "t/0/0", 3.5)
    assert kinds(h.check()) == ["granted_while_down"]


def test_delivery_counts_must_grow_and_stay_within_max_deliveries() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0, n=2).add("closing", 1.5, w="A", sub="A-s")
    h.got("B", "t/0/0", 2.0, n=2).acked("B", "t/0/0", 2.5)
    assert kinds(h.check()) == ["count_regressed"]
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0, n=4).acked("A", "t/0/0", 1.5)
    assert kinds(h.check()) == ["over_max_deliveries"]


def test_dead_letter_reasons_must_be_allowed_by_the_config() -> None:
    h = History().start(1, 0).publish("t/0/0", "t/0/1", "t/0/2", "t/0/3", t=0.0)
    h.dead_letter("t/0/0", "max_deliveries", 5.0, n=2)  # max_deliveries is 3
    h.dead_letter("t/0/1", "consumer_expire", 5.0)  # no consumer expired it
    h.dead_letter("t/0/2", "expiration", 59.0)  # expiration is 60 s
    h.dead_letter("t/0/3", "max_deliveries", 5.0, n=3)  # allowed
    found = h.check()
    assert kinds(found) == ["dead_letter_reason"] * 3
    assert {v.bookmark for v in found} == {"t/0/0", "t/0/1", "t/0/2"}
    no_expiration = QueueSpec("q", lease_period=LEASE)
    h.spec = no_expiration
    h.events = [e for e in h.events if e.get("b") in (None, "t/0/3")]
    h.dead_letter("t/0/3", "expiration", 90.0)
    assert "dead_letter_reason" in kinds(h.check())


def test_a_message_dead_lettered_twice_or_acked_and_dead_lettered() -> None:
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "expire", 2.0)
    h.dead_letter("t/0/0", "consumer_expire", 2.005).dead_letter("t/0/0", "consumer_expire", 3.0)
    assert kinds(h.check()) == ["dead_lettered_twice"]
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).acked("A", "t/0/0", 2.0)
    h.add("dead_letter", 2.0, q="q", b="t/0/0", reason="max_deliveries", n=3, c=0)
    assert "acked_and_dead_lettered" in kinds(h.check())


def test_dead_letters_and_done_records_go_together() -> None:
    h = History().start(1, 0).publish("t/0/0", "t/0/1").subscribe("A")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "expire", 2.0)
    h.done("t/0/0", "consumer_expire", 2.005)  # its dead letter is missing
    h.got("A", "t/0/1", 1.0).op("A", "t/0/1", "expire", 2.0)
    h.add("dead_letter", 2.005, q="q", b="t/0/1", reason="consumer_expire", n=1, c=0)  # no done
    assert kinds(h.check()) == ["dead_letter_missing", "dead_letter_without_done", "lost"]


def test_a_delivery_after_the_dead_letter() -> None:
    h = correct()
    h.got("A", "t/0/3", 6.0, n=3)  # dead-lettered at 5.305
    assert "delivered_after_dead_letter" in kinds(h.check())


def test_changelog_evidence_leases_and_acks_must_be_durable() -> None:
    h = History().start(1, 0).publish("t/0/0", "t/0/1").subscribe("A")
    h.got("A", "t/0/0", 1.0, durable=False).acked("A", "t/0/0", 1.5)
    h.got("A", "t/0/1", 1.0).op("A", "t/0/1", "ack", 1.5)  # confirmed, never written
    assert kinds(h.check()) == ["ack_not_durable", "lease_not_durable"]
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "ack", 1.5, outcome="refused")
    h.done("t/0/0", "acked", 1.6)  # done as acked, but every ack was refused
    assert kinds(h.check()) == ["lost", "phantom_ack"]


def test_unknown_messages_are_reported() -> None:
    h = History().start(1, 0).subscribe("A")
    h.got("A", "x/0/9", 1.0).acked("A", "x/0/9", 1.5)
    assert kinds(h.check()) == ["unknown_delivery"]


def test_stats_must_match_the_history_of_the_last_coordinator() -> None:
    h = correct()
    h.events = [e for e in h.events if e["ev"] != "stats"]
    h.add("stats", 40.0, q="q", epoch=2, available=0, leased=1, inactive=0, delivered_total=2,
          acked_total=1, dead_lettered_total=0)  # fmt: skip
    (v,) = h.check()
    assert v.kind == "stats_mismatch"
    assert "leased: stats 1, history 0" in v.detail and "delivered_total: stats 2" in v.detail


# --- at-most-once -----------------------------------------------------------------------------


def amo() -> History:
    h = History(AMO).start(1, 0.0).publish("t/0/0", "t/0/1", "t/0/2").subscribe("A")
    h.done("t/0/0", "delivered", 1.0).got("A", "t/0/0", 1.0, lease=False)
    h.op("A", "t/0/0", "ack", 1.1)
    # handed out to A just before A was SIGKILLed: lost, as at-most-once allows
    h.done("t/0/1", "delivered", 2.0).add("consumer_kill", 2.5, w="A")
    h.dead_letter("t/0/2", "expiration", 70.0)
    return h


def test_a_correct_at_most_once_history_has_no_violations() -> None:
    assert amo().check() == []


@pytest.mark.parametrize(
    ("spoil", "expected"),
    [
        (lambda h: h.got("B", "t/0/0", 3.0, lease=False), ["delivered_twice"]),
        (lambda h: h.got("B", "t/0/2", 3.0, lease=False).done("t/0/2", "delivered", 3.0),
         ["delivered_and_dead_lettered"]),  # fmt: skip
        (lambda h: h.publish("t/0/3").got("B", "t/0/3", 3.0, lease=False),
         ["handed_out_not_durable"]),  # fmt: skip
        (lambda h: h.publish("t/0/3"), ["lost"]),  # vanished without a trace
        (lambda h: h.publish("t/0/3").done("t/0/3", "delivered", 9.0), ["lost"]),  # no fault after
    ],
)
def test_at_most_once_violations(spoil: Callable[[History], Any], expected: list[str]) -> None:
    h = amo()
    spoil(h)
    assert kinds(h.check()) == expected
