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

    def subscribe(self, w: str, epoch: int | None = 1, t: float = 0.2,
                  sub: str | None = None) -> History:  # fmt: skip
        """``w`` subscribes (``sub``: its id, default ``W-s``); ``epoch`` None: not known to
        the consumer (derived from ``coordinator_instance``)."""
        known = {} if epoch is None else {"epoch": epoch}
        return self.add("subscribed", t, q="q", w=w, sub=sub or f"{w}-s", **known)

    def got(self, w: str, b: str, grant: float, *, n: int | None = None, lease: bool = True,
            durable: bool = True, sub: str | None = None,
            read: float | None = None) -> History:  # fmt: skip
        """``w`` reads ``b``, granted at ``grant`` (read at ``read``, by default 5 ms later);
        durable: its lease record."""
        n = n if n is not None else self._counts.get(b, 0) + 1
        self._counts[b] = n
        dl = grant + self.spec.lease_period if lease else None
        if durable and lease:
            self.add("durable", grant, q="q", b=b, kind="LEASED", n=n, c=0, reason=None)
        at = read if read is not None else grant + 0.005
        return self.add("got", at, q="q", w=w, sub=sub or f"{w}-s", b=b, n=n, c=0,
                        dl=dl)  # fmt: skip

    def op(self, w: str, b: str, op: str, t: float, outcome: str | None = "ok",
           answered: float | None = None, seconds: float = 0.0,
           sub: str | None = None) -> History:  # fmt: skip
        """``w`` sends ``op`` on ``b`` at ``t``; the answer (ok, refused, lost; None: no answer
        at all) comes at ``answered`` (default 10 ms later)."""
        i = next(self._ids)
        self.add("op", t, q="q", w=w, sub=sub or f"{w}-s", b=b, op=op, id=i, s=seconds)
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


def test_an_extend_answered_after_the_holder_was_granted_the_message_again() -> None:
    # A sent the extend at 2.0, well in time; the coordinator was paused (or the path stalled)
    # and applied it only after lease 1 ran out at 11 and lease 2 went to A again at 11.1: its
    # "ok" may be lease 2's, so lease 1 is not known to have lasted past 11
    def run(answered: float) -> list[str]:
        h = History().start(1, 0).publish("t/0/0").subscribe("A")
        h.got("A", "t/0/0", 1.0)
        h.op("A", "t/0/0", "extend", 2.0, answered=answered, seconds=20)
        h.got("A", "t/0/0", 11.1, read=12.0).acked("A", "t/0/0", 12.1)
        return kinds(h.check())

    assert run(11.5) == []
    # answered before lease 2 was granted: it extended lease 1, and lease 2 overlapped it
    assert run(10.5) == ["double_lease"]


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


def test_a_byte_identical_copy_of_a_dead_letter_is_one_dead_lettering() -> None:
    # a redone changelog commit (its first attempt aborted but visible on Tansu, or its outcome
    # unknown) writes the same letter again: same reason, counts and time
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).op("A", "t/0/0", "expire", 2.0)
    h.dead_letter("t/0/0", "consumer_expire", 2.005).dead_letter("t/0/0", "consumer_expire", 2.005)
    assert kinds(h.check()) == []
    h.add("dead_letter", 2.005, q="q", b="t/0/0", reason="consumer_expire", n=2, c=0)
    assert kinds(h.check()) == ["dead_lettered_twice"]


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
    h.add("stats", 40.0, q="q", epoch=2, available=0, leased=1, inactive=0, delivered_total=0,
          acked_total=1, dead_lettered_total=0)  # fmt: skip
    (v,) = h.check()
    assert v.kind == "stats_mismatch"
    assert "leased: stats 1, history 0" in v.detail and "delivered_total: stats 0" in v.detail
    # the counters survive restarts: more than this coordinator's history is no mismatch
    h.events = [e for e in h.events if e["ev"] != "stats"]
    h.add("stats", 40.0, q="q", epoch=2, available=0, leased=0, inactive=0, delivered_total=9,
          acked_total=9, dead_lettered_total=9)  # fmt: skip
    assert h.check() == []


# --- reconnects through the library, broker and proxy faults ----------------------------------


def reconnected(h: History, w: str, lost_at: float, seen: float, new: str) -> History:
    """``w``'s library re-subscribed at ``seen`` (as ``new``) after the connection it saw
    drop at ``lost_at``."""
    h.add("reconnected", seen, q="q", w=w, sub=f"{w}-s", new=new, lost_at=lost_at)
    return h.subscribe(w, t=seen, sub=new)


@pytest.mark.parametrize(("regrant", "expected"), [(2.1, []), (1.9, ["double_lease"])])
def test_a_library_reconnect_ends_the_old_subscriptions_leases_from_the_fault_on(
    regrant: float, expected: list[str]
) -> None:
    # the proxy reset A's connection at 2.0; A's client saw it at 2.3: the coordinator may
    # have returned A's lease (and granted it to B) in between, but not before the drop
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).add("proxy", 2.0, side="client", action="drop")
    reconnected(h, "A", lost_at=2.3, seen=2.5, new="A-s2")
    h.got("B", "t/0/0", regrant).acked("B", "t/0/0", 3.0)
    assert kinds(h.check()) == expected


def test_a_stream_alive_after_a_fault_ends_no_earlier_than_its_client_saw_it_end() -> None:
    # a stall at 2.0 did not end A's stream: the coordinator confirmed an extend A sent at 2.05
    # (of another message); so with no fault after that, the lease ran until A saw the end
    h = History().start(1, 0).publish("t/0/0", "t/0/1").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).got("A", "t/0/1", 1.0)
    h.add("proxy", 2.0, side="client", action="stall").add("proxy", 2.02, side="client",
                                                           action="heal")  # fmt: skip
    h.op("A", "t/0/1", "extend", 2.05, seconds=20.0)
    reconnected(h, "A", lost_at=2.3, seen=2.5, new="A-s2")
    h.got("B", "t/0/0", 2.1).acked("B", "t/0/0", 3.0)
    h.got("B", "t/0/1", 2.4).acked("B", "t/0/1", 3.0)
    assert kinds(h.check()) == ["double_lease"]
    assert h.check()[0].bookmark == "t/0/0"  # t/0/1 came after A saw the end: fine


def test_a_broken_stream_ends_no_later_than_the_fault_that_broke_it() -> None:
    # without the library's reconnection: the same rule for a stream seen broken
    h = History().start(1, 0).publish("t/0/0").subscribe("A").subscribe("B")
    h.got("A", "t/0/0", 1.0).add("broker_stop", 2.0).add("broker_cont", 4.0)
    h.add("broken", 6.0, q="q", w="A", sub="A-s")
    h.got("B", "t/0/0", 4.5).acked("B", "t/0/0", 5.0)
    assert h.check() == []


@pytest.mark.parametrize(("proxied", "action", "expected"), [
    (True, {"action": "drop"}, []),
    (True, {"action": "refuse", "drop": True}, []),
    (True, {"action": "refuse", "drop": False}, ["double_lease"]),  # open connections go on
    (True, {"action": "stall"}, ["double_lease"]),  # a stall need not end a stream
    (False, {"action": "drop"}, ["double_lease"]),  # not through the proxy
])  # fmt: skip
def test_a_client_proxy_reset_ends_every_proxied_subscription_even_unrecorded(
    proxied: bool, action: dict[str, Any], expected: list[str]
) -> None:
    # A's client was closed while reconnecting: it records a voluntary end at 5.0, late
    h = History().start(1, 0).publish("t/0/0").subscribe("B")
    h.add("subscribed", 0.2, q="q", w="A", sub="A-s", proxied=proxied)
    h.got("A", "t/0/0", 1.0).add("proxy", 2.0, side="client", **action)
    h.add("closing", 5.0, q="q", w="A", sub="A-s")
    h.got("B", "t/0/0", 2.1).acked("B", "t/0/0", 3.0)
    assert kinds(h.check()) == expected


@pytest.mark.parametrize(("outcome", "expected"), [
    ("refused", ["lost"]), ("lost", ["lost"]),
    # recorded as applied, it would hide the lost message: only the new rule catches it
    ("ok", ["ack_not_durable", "confirmed_after_end"]),
])  # fmt: skip
def test_an_operation_on_a_message_of_the_old_subscription_is_not_applied(
    outcome: str, expected: list[str]
) -> None:
    # A acks, after the reconnect, a message it got before: the client does not send it
    # (LeaseLost, or counted unconfirmed), and the consumer must not record it as applied
    h = History().start(1, 0).publish("t/0/0").subscribe("A")
    h.got("A", "t/0/0", 1.0).add("proxy", 2.0, side="client", action="drop")
    reconnected(h, "A", lost_at=2.01, seen=2.2, new="A-s2")
    h.op("A", "t/0/0", "ack", 2.5, outcome=outcome)  # on the old subscription
    assert kinds(h.check()) == expected
    # the message comes back on the new subscription and is acked there
    h.got("A", "t/0/0", 2.6, sub="A-s2").op("A", "t/0/0", "ack", 2.7, sub="A-s2")
    h.done("t/0/0", "acked", 2.705, n=2)
    again = ["confirmed_after_end", "redelivered_after_ack"] if outcome == "ok" else []
    assert kinds(h.check()) == again


def coordinators_by_instance(regrant: float, instances: bool = True) -> History:
    """A's subscription ``i1-1`` is coordinator 1's, B's ``i2-1`` coordinator 2's; neither
    consumer knows which coordinator it reached (one address behind a proxy)."""
    h = History().start(1, 0).publish("t/0/0")
    if instances:
        h.add("coordinator_instance", 0.5, epoch=1, instance="i1")
    h.subscribe("A", epoch=None, sub="i1-1").got("A", "t/0/0", 1.0, sub="i1-1")
    h.kill_coordinator(1, 2.0).start(2, 2.5)
    if instances:
        h.add("coordinator_instance", 3.0, epoch=2, instance="i2")
    h.subscribe("B", epoch=None, t=3.0, sub="i2-1").got("B", "t/0/0", regrant, sub="i2-1")
    h.op("B", "t/0/0", "ack", regrant + 0.5, sub="i2-1").done("t/0/0", "acked", regrant + 0.51)
    h.add("stats", 9.0, q="q", epoch=2, available=0, leased=0, inactive=0, delivered_total=1,
          acked_total=1, dead_lettered_total=0)  # fmt: skip
    return h


def test_the_epoch_of_a_subscription_comes_from_its_coordinators_instance() -> None:
    assert coordinators_by_instance(3.1).check() == []
    # B's lease granted while coordinator 1 was dead: the instance says it was 2's, so that
    # is not a double lease with A's (which ended with 1), but a grant while none could grant
    assert kinds(coordinators_by_instance(2.2).check()) == ["granted_while_down"]
    # without the instances the epochs are unknown: A's lease outlives the kill
    assert kinds(coordinators_by_instance(3.1, instances=False).check()) == ["double_lease"]


def test_summary_counts_the_new_faults_and_tells_injected_ones_from_consequences() -> None:
    h = correct()
    h.add("broker_stop", 50.0).add("broker_cont", 51.0)
    for action in ("drop", "stall", "heal", "refuse", "heal"):
        h.add("proxy", 52.0, side="broker", action=action)
        h.add("proxy", 53.0, side="client", action=action)
    reconnected(h, "A", lost_at=53.0, seen=53.2, new="A-s2")
    s = summarize(h.events, ALO, [])
    assert s.faults["broker SIGSTOP"] == 1 and s.faults["client reconnect"] == 1
    for side in ("broker", "client"):
        for action in ("drop", "stall", "refuse"):
            assert s.faults[f"{side} proxy {action}"] == 1
    assert "client reconnect" not in s.injected and "lease timeout" not in s.injected
    assert sum(s.injected.values()) == 4 + 7  # correct()'s 4, these 7


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
        (
            lambda h: h.got("B", "t/0/2", 3.0, lease=False).done("t/0/2", "delivered", 3.0),
            ["delivered_and_dead_lettered"],
        ),
        (
            lambda h: h.publish("t/0/3").got("B", "t/0/3", 3.0, lease=False),
            ["handed_out_not_durable"],
        ),
        (lambda h: h.publish("t/0/3"), ["lost"]),  # vanished without a trace
        (lambda h: h.publish("t/0/3").done("t/0/3", "delivered", 9.0), ["lost"]),  # no fault after
    ],
)
def test_at_most_once_violations(spoil: Callable[[History], Any], expected: list[str]) -> None:
    h = amo()
    spoil(h)
    assert kinds(h.check()) == expected


def test_in_a_cluster_a_stopped_member_is_fenced_and_only_its_own_grants_are_checked() -> None:
    """Members 1 and 2 alive at once: member 1 stopped past its session, member 2 takes the
    queue over and leases the message again while member 1 is still stopped."""

    def run(cluster: bool, granter: int = 2, regrant: float = 5.0) -> list[str]:
        h = History().start(1, 0).start(2, 0.1).publish("t/0/0")
        h.subscribe("A", epoch=1).subscribe("B", epoch=granter)
        h.got("A", "t/0/0", 1.0)
        h.add("coordinator_stop", 2.0, epoch=1).add("coordinator_cont", 20.0, epoch=1)
        h.got("B", "t/0/0", regrant).acked("B", "t/0/0", regrant + 1)
        return kinds(check(h.events, h.spec, cluster=cluster))

    assert run(cluster=True) == []
    # one coordinator: the stop is everyone's, and its lease was valid until 11
    assert run(cluster=False) == ["double_lease", "granted_while_down"]
    # in a cluster the stopped member itself grants nothing while stopped
    assert run(cluster=True, granter=1, regrant=15.0) == ["granted_while_down"]


def test_in_a_cluster_a_dead_member_grants_nothing_but_the_others_do() -> None:
    h = History().start(1, 0).start(2, 0.1).publish("t/0/0")
    h.subscribe("A", epoch=1).subscribe("B", epoch=2)
    h.got("A", "t/0/0", 1.0).kill_coordinator(1, 2.0)
    h.got("B", "t/0/0", 3.0).acked("B", "t/0/0", 3.5)
    assert check(h.events, h.spec, cluster=True) == []
    h.publish("t/0/1").got("A", "t/0/1", 4.0).acked("A", "t/0/1", 4.5)  # after its death
    assert kinds(check(h.events, h.spec, cluster=True)) == ["granted_while_down"]
