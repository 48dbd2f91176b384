"""The history of a randomized fault run, and a checker in the style of Jepsen's queue checkers.

A *history* is a list of events (plain dicts, one JSON line each when stored). Every event has
``ev`` (its kind) and ``t`` (wall-clock epoch seconds: the coordinator, the consumers and the
harness run on one machine, so they share one clock). Events of one queue carry ``q``; the
harness's fault events carry none and apply to every queue.

Who records what:

- the publisher (a plain Kafka producer, from its delivery reports)
  ``publish`` {q, b (topic/partition/offset), t: the message's Kafka timestamp}
- each consumer process, to its own file, flushed line by line (a SIGKILL keeps what came before)
  ``subscribed`` {w, q, sub, epoch}; ``got`` {w, q, sub, b, n: delivery count, c: cancel count,
  dl: lease deadline (s) or None}; ``op`` {w, q, sub, b, op: ack|cancel|expire|extend, id, s:
  seconds} logged *before* the operation is handed to the client; its outcome ``op_ok`` /
  ``op_refused`` {w, id, error} / ``op_lost`` {w, id} (the stream broke before the answer: it may
  or may not have taken effect; an ``op`` with no outcome at all counts as lost too);
  ``closing`` {w, sub} before a voluntary disconnect; ``broken`` {w, sub} when the stream failed
  (a consumer without the library's reconnection); with it, ``reconnected`` {w, sub: the old
  subscription, new: the new one, lost_at: when the client saw the connection drop} once the
  library re-subscribed by itself (then ``subscribed`` for the new one). The epoch in
  ``subscribed`` may be left out: it is then derived from ``coordinator_instance`` (below);
  ``proxied`` (true) in it: the subscription's connection goes through the client proxy
- the harness: ``coordinator_start`` {epoch, wiped} (before the process starts),
  ``coordinator_instance`` {epoch, instance} once it serves (see "Epochs" below),
  ``coordinator_kill`` {epoch} (before SIGKILL), ``coordinator_dead`` {epoch} (after it is
  reaped), ``coordinator_stop`` {epoch} (once the process is seen stopped by SIGSTOP),
  ``coordinator_cont`` {epoch} (before SIGCONT), ``consumer_kill`` {w} (before SIGKILL),
  ``broker_stop`` / ``broker_cont`` (before the broker's SIGSTOP / SIGCONT), ``proxy`` {side:
  broker|client, action: drop|stall|refuse|heal, drop: true when a refusal also reset the open
  connections} (before the proxy between the coordinator and the broker, or between the
  consumers and the coordinator, resets every connection, stops forwarding, refuses new
  connections, or forwards again),
  and at the end ``stats`` {q, epoch, available, leased, inactive, delivered_total, acked_total,
  dead_lettered_total} taken once every consumer has exited
- the broker, read back at the end: ``dead_letter`` {q, b, reason, n, c, t: dead-lettered at}
  from the dead-letter topic; ``durable`` {q, b, kind: LEASED|RETURNED|DONE, n, c, reason, t}
  from the changelog topic, announced by one ``changelog_read`` {q} (without it the checks that
  need the changelog are skipped)

``check(history, spec)`` is a pure function: it returns the violations (empty for a correct run).

A lease (at-least-once) starts when the coordinator grants it: its deadline minus the lease
period, both on the coordinator's clock. It ends at the earliest of: an ack, cancel or expire its
holder sent (from the moment it was sent, unless it was refused), its deadline (moved by a
confirmed extend), its holder's death (SIGKILL), its subscription's end (closing, broken), or the
death of the coordinator that granted it. A SIGSTOPped coordinator grants nothing until it
resumes; its leases run out on their deadlines. Two leases on one message must never overlap,
beyond ``skew`` seconds (the rounding of deadlines to milliseconds, and the clock's resolution).

Ends the coordinator saw first. A voluntary end (``closing``) is logged before the consumer
acts, so it bounds the end from below. An involuntary one (``broken``, ``reconnected``) is seen
by the client when it is already over on the coordinator's side, maybe seconds earlier: a
stalled connection is given up by whichever side's keepalive fires first, and the coordinator
returns the leases at once (to be granted to others within milliseconds). So such a
subscription's leases end no earlier than the first fault that began after its last sign of
life on the coordinator (a grant to it, an operation of it that was confirmed), and no later
than when the client saw it; a broker fault counts too (a coordinator may end streams while
Kafka is away). A reset of the client proxy ends every proxied subscription open then, whether
or not its client lived to record it (it may be closed or killed while reconnecting, and then
records a voluntary end or none, later). A library reconnect is a new subscription (a new id):
the old one's leases are over, and an operation on a message of the old one is never confirmed
(the client does not send it; the consumer records it as refused or lost, never as applied).

Epochs. Which coordinator granted a lease matters (its death ends the lease; the last one's
counters are compared with the history). Consumers that reconnect through the library find the
restarted coordinator at the same address without knowing which one it is, so the epoch of a
subscription is derived from its id: a coordinator names its subscriptions ``INSTANCE-N``, with
an instance id drawn at each process start (layer/coordinator/subscriptions.py), and the harness
learns each coordinator's instance by subscribing to it once it serves. Unlike times (a frame
sent by one coordinator can be read after its successor started, when a proxy held it), the id
cannot name the wrong process.

A cluster (``check(..., cluster=True)``, tests/fault/test_cluster_history.py). Each process of
each member is an epoch of its own, and several are alive at once: a member's death or stop ends
only the leases it granted, and "granted while down" is asked of the granting member alone (no
grant while it is SIGSTOPped, none after its death). A member stopped past the group's session
is fenced by the one that takes its queues over, which hands their leases out again: the leases
the stopped one granted end at its stop. The harness records ``rebalance`` {why} (a fault that
may end streams: a member starts, is SIGTERMed, wakes) and ``coordinator_term`` {epoch}; a
subscription's epoch comes from the member address it logged and its instance id.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "CONSEQUENCES",
    "DEFAULT_SKEW",
    "QueueSpec",
    "Summary",
    "Violation",
    "check",
    "read_history",
    "summarize",
    "write_history",
]

Event = Mapping[str, Any]

AT_LEAST_ONCE = "at-least-once"
AT_MOST_ONCE = "at-most-once"
DEFAULT_SKEW = 0.002
_FINISHING = ("ack", "cancel", "expire")
_NEVER = math.inf
# how far a client's time of a dropped connection (a wall-clock time computed from monotonic
# durations) may be off from the times of the operations around it
_DROP_SKEW = 0.05
# harness events that begin a fault that may end subscriptions' streams
_FAULT_BEGINS = ("coordinator_kill", "coordinator_stop", "broker_stop", "rebalance")
_PROXY_FAULTS = ("drop", "stall", "refuse")


@dataclass(frozen=True)
class QueueSpec:
    """What the checker needs to know of a queue's configuration."""

    name: str
    semantics: str = AT_LEAST_ONCE
    lease_period: float = 60.0
    max_deliveries: int = 0
    max_cancels: int = 0
    expiration: float | None = None


@dataclass(frozen=True)
class Violation:
    kind: str
    bookmark: str | None
    detail: str
    events: tuple[Event, ...] = ()

    def excerpt(self) -> str:
        lines = [f"{self.kind} {self.bookmark or ''}: {self.detail}"]
        lines.extend("    " + json.dumps(dict(e), sort_keys=True) for e in self.events)
        return "\n".join(lines)


@dataclass
class _Op:
    event: Event
    outcome: str = "lost"  # ok | refused | lost (no answer: it may have taken effect)
    done_at: float = _NEVER  # when the answer came; never, for a lost one

    @property
    def t(self) -> float:
        return float(self.event["t"])

    @property
    def kind(self) -> str:
        return str(self.event["op"])

    @property
    def effective(self) -> bool:
        """Could it have taken effect? (a refusal changes nothing)"""
        return self.outcome != "refused"


@dataclass
class _Delivery:
    event: Event
    grant: float | None  # when the coordinator granted the lease (at-least-once)
    epoch: int | None
    end: float = _NEVER  # the earliest the lease can have ended

    @property
    def t(self) -> float:
        return float(self.event["t"])

    @property
    def n(self) -> int:
        return int(self.event["n"])

    @property
    def holder(self) -> tuple[str, str, str]:
        """(consumer process, subscription, bookmark)"""
        return (str(self.event["w"]), str(self.event["sub"]), str(self.event["b"]))

    @property
    def start(self) -> float:
        return self.grant if self.grant is not None else self.t


def _v(kind: str, b: str | None, detail: str, *events: Event) -> Violation:
    return Violation(kind, b, detail, tuple(events))


class _Index:
    """One queue's history, indexed for the checks."""

    def __init__(
        self, history: Iterable[Event], spec: QueueSpec, skew: float, cluster: bool = False
    ) -> None:
        self.spec = spec
        self.skew = skew
        self.cluster = cluster
        self.published: dict[str, Event] = {}
        self.deliveries: dict[str, list[_Delivery]] = defaultdict(list)
        self.ops: dict[tuple[str, Any], _Op] = {}
        self.sub_epoch: dict[tuple[str, str], int] = {}
        # the earliest a subscription can have ended (its leases with it), and when its
        # consumer saw it end
        self.sub_end: dict[tuple[str, str], float] = {}
        self.sub_seen_end: dict[tuple[str, str], float] = {}
        self.fault_begins: list[float] = []
        instances: dict[str, int] = {}
        subscribed: list[Event] = []
        involuntary: dict[tuple[str, str], float] = {}
        client_resets: list[float] = []
        self.consumer_kill: dict[str, float] = {}
        self.starts: dict[int, Event] = {}
        self.kills: dict[int, float] = {}
        self.deaths: dict[int, float] = {}
        self.stops: list[tuple[float, float, int]] = []
        self.dead_letters: dict[str, list[Event]] = defaultdict(list)
        self.durable: dict[str, list[Event]] = defaultdict(list)
        self.changelog_read = False
        self.stats: Event | None = None
        stopped: dict[int, float] = {}
        outcomes: list[Event] = []
        gots: list[Event] = []
        for e in sorted(history, key=lambda e: float(e["t"])):
            if "q" in e and e["q"] != spec.name:
                continue
            ev, t = e["ev"], float(e["t"])
            if ev in _FAULT_BEGINS or (ev == "proxy" and e["action"] in _PROXY_FAULTS):
                self.fault_begins.append(t)
            if ev == "publish":
                self.published[e["b"]] = e
            elif ev == "subscribed":
                subscribed.append(e)
            elif (
                ev == "proxy" and e["side"] == "client" and (e["action"] == "drop" or e.get("drop"))
            ):
                client_resets.append(t)
            elif ev == "got":
                gots.append(e)
            elif ev == "op":
                self.ops[(e["w"], e["id"])] = _Op(e)
            elif ev in ("op_ok", "op_refused", "op_lost"):
                outcomes.append(e)
            elif ev == "closing":
                key = (e["w"], e["sub"])
                self.sub_end[key] = min(self.sub_end.get(key, _NEVER), t)
                self.sub_seen_end[key] = min(self.sub_seen_end.get(key, _NEVER), t)
            elif ev in ("broken", "reconnected"):
                key = (e["w"], e["sub"])
                seen = float(e.get("lost_at", t))
                involuntary[key] = min(involuntary.get(key, _NEVER), seen)
                self.sub_seen_end[key] = min(self.sub_seen_end.get(key, _NEVER), seen)
            elif ev == "coordinator_instance":
                instances[str(e["instance"])] = int(e["epoch"])
            elif ev == "consumer_kill":
                self.consumer_kill[e["w"]] = min(self.consumer_kill.get(e["w"], _NEVER), t)
            elif ev == "coordinator_start":
                self.starts[int(e["epoch"])] = e
            elif ev == "coordinator_kill":
                self.kills[int(e["epoch"])] = min(self.kills.get(int(e["epoch"]), _NEVER), t)
            elif ev == "coordinator_dead":
                self.deaths[int(e["epoch"])] = t
            elif ev == "coordinator_stop":
                stopped[int(e["epoch"])] = t
            elif ev == "coordinator_cont" and int(e["epoch"]) in stopped:
                self.stops.append((stopped.pop(int(e["epoch"])), t, int(e["epoch"])))
            elif ev == "dead_letter":
                # A redone changelog commit can leave a byte-identical copy of a letter in the
                # topic (an outcome-unknown commit, or an aborted attempt on a broker that shows
                # aborted records: DurableChangelog's docstring); redrive takes one per bookmark.
                # A copy is one dead-lettering; a letter that differs in anything is another.
                same = ("reason", "n", "c", "t")
                letters = self.dead_letters[e["b"]]
                if not any(all(d.get(k) == e.get(k) for k in same) for d in letters):
                    letters.append(e)
            elif ev == "durable":
                self.durable[e["b"]].append(e)
            elif ev == "changelog_read":
                self.changelog_read = True
            elif ev == "stats":
                self.stats = e
        for e in outcomes:
            op = self.ops.get((e["w"], e["id"]))
            if op is not None:
                op.outcome = e["ev"].removeprefix("op_")
                op.done_at = float(e["t"]) if op.outcome != "lost" else _NEVER
        for e in subscribed:
            # the instance in its id names the coordinator exactly (see "Epochs" above)
            epoch = instances.get(str(e["sub"]).split("-", 1)[0], e.get("epoch"))
            if epoch is not None:
                self.sub_epoch[(e["w"], e["sub"])] = int(epoch)
        alo = spec.semantics == AT_LEAST_ONCE
        # each holder's leases of a message, and its operations on it
        self.mine: dict[tuple[str, str, str], list[_Delivery]] = defaultdict(list)
        self.my_ops: dict[tuple[str, str, str], list[_Op]] = defaultdict(list)
        for e in gots:
            grant = float(e["dl"]) - spec.lease_period if alo and e.get("dl") is not None else None
            d = _Delivery(e, grant, self.sub_epoch.get((e["w"], e["sub"])))
            self.deliveries[e["b"]].append(d)
            self.mine[d.holder].append(d)
        for op in self.ops.values():
            self.my_ops[(op.event["w"], op.event["sub"], op.event["b"])].append(op)
        for ds in (*self.deliveries.values(), *self.mine.values()):
            ds.sort(key=lambda d: d.start)
        self.fault_begins.sort()
        # each subscription's last sign of life on the coordinator: a grant to it, or an
        # operation of it that the coordinator confirmed (it was alive when that was sent)
        alive: dict[tuple[str, str], float] = defaultdict(lambda: -_NEVER)
        for (w, sub, _b), ds in self.mine.items():
            for d in ds:
                alive[(w, sub)] = max(alive[(w, sub)], d.start)
        for op in self.ops.values():
            if op.outcome == "ok":
                key = (op.event["w"], op.event["sub"])
                alive[key] = max(alive[key], op.t)
        for key, seen in involuntary.items():
            # the first fault after its last sign of life, if the client saw the end later
            last = alive[key]
            first_fault = next((f for f in self.fault_begins if f >= last), _NEVER)
            end = max(last, min(seen, first_fault))
            self.sub_end[key] = min(self.sub_end.get(key, _NEVER), end)
        # a reset of the client proxy ends every subscription through it that was open then:
        # open from its first sign of life (its client may log ``subscribed`` a moment after)
        first: dict[tuple[str, str], float] = {}
        for (w, sub, _b), ds in self.mine.items():
            for d in ds:
                first[(w, sub)] = min(first.get((w, sub), _NEVER), d.start)
        for e in subscribed:
            if e.get("proxied"):
                key = (e["w"], e["sub"])
                began = min(first.get(key, _NEVER), float(e["t"]))
                reset = next((r for r in sorted(client_resets) if r >= began), _NEVER)
                self.sub_end[key] = min(self.sub_end.get(key, _NEVER), reset)
        if alo:
            for ds in self.mine.values():
                for d, nxt in zip(ds, [*ds[1:], None], strict=True):
                    d.end = self._lease_end(d, nxt)

    def _lease_end(self, d: _Delivery, nxt: _Delivery | None) -> float:
        """The earliest time the lease can have ended (``nxt``: its holder's next lease of the
        same message, if any)."""
        assert d.grant is not None
        next_start = nxt.start if nxt is not None else _NEVER
        # an operation answered after the coordinator granted the next lease may have been
        # applied to that one: a stalled or paused path delivers an extend sent in time after
        # the deadline, and the coordinator names leases by bookmark and holder only
        next_grant = _NEVER if nxt is None else nxt.grant if nxt.grant is not None else nxt.start
        deadline = float(d.event["dl"])
        ends = []
        for op in sorted(self.my_ops.get(d.holder, []), key=lambda o: o.t):
            skew = self.skew
            if not (op.effective and op.t < next_start + skew and op.done_at >= d.start - skew):
                continue  # refused, or it acted on an earlier or a later lease
            if op.kind in _FINISHING:
                ends.append(max(op.t, d.start))
            elif op.kind == "extend":  # the deadline moves to (the time it is applied) + s
                moved = max(op.t, d.start) + float(op.event.get("s", 0.0))
                surely_this_lease = op.outcome == "ok" and op.done_at < next_grant - skew
                deadline = moved if surely_this_lease else min(deadline, moved)
        w, sub, _b = d.holder
        ends.append(deadline)
        ends.append(self.consumer_kill.get(w, _NEVER))
        ends.append(self.sub_end.get((w, sub), _NEVER))
        if d.epoch is not None:
            ends.append(self.kills.get(d.epoch, _NEVER))
            if self.cluster:  # a member stopped past its session is fenced: its leases revoked
                ends.extend(lo for lo, _hi, e in self.stops if e == d.epoch and lo >= d.start)
        return min(ends)

    def acted_on(self, op: _Op) -> _Delivery | None:
        """The lease a confirmed operation acted on: its holder's lease of that message that was
        current when the answer came."""
        target = None
        for d in self.mine.get((op.event["w"], op.event["sub"], op.event["b"]), []):
            if d.start <= op.done_at + self.skew:
                target = d
        return target

    def down_windows(self, epoch: int | None = None) -> list[tuple[float, float, str]]:
        """Times when no coordinator could grant anything: dead (reaped, not restarted yet) or
        SIGSTOPped. In a cluster (the members' epochs overlap), the times when the member of
        ``epoch`` could not: stopped, or dead for good."""
        if self.cluster:
            windows = [(a, b, f"member {e} stopped") for a, b, e in self.stops if e == epoch]
            if epoch in self.deaths:
                windows.append((self.deaths[epoch], _NEVER, f"member {epoch} dead"))
            return windows
        windows = [(a, b, f"coordinator {epoch} stopped") for a, b, epoch in self.stops]
        for epoch, dead in self.deaths.items():
            nxt = self.starts.get(epoch + 1)
            windows.append((dead, float(nxt["t"]) if nxt else _NEVER, f"coordinator {epoch} dead"))
        return windows

    def done_records(self, reason: str) -> dict[str, Event]:
        """The first durable done record with this reason, per message."""
        found: dict[str, Event] = {}
        for b, records in self.durable.items():
            for r in records:
                if r["kind"] == "DONE" and r.get("reason") == reason:
                    found.setdefault(b, r)
                    break
        return found

    @property
    def final_epoch(self) -> int | None:
        return max(self.starts) if self.starts else None


def check(
    history: Iterable[Event], spec: QueueSpec, *, skew: float = DEFAULT_SKEW, cluster: bool = False
) -> list[Violation]:
    """Every violation of the queue's guarantees that ``history`` shows (none: a correct run).

    ``cluster``: the epochs are members of one cluster, alive at once (see "A cluster" above)."""
    ix = _Index(history, spec, skew, cluster)
    out: list[Violation] = []
    out += _check_dead_letters(ix, skew)
    out += _check_confirmed_after_end(ix)
    if spec.semantics == AT_LEAST_ONCE:
        out += _check_leases(ix, skew)
        out += _check_at_least_once(ix, skew)
    else:
        out += _check_at_most_once(ix, skew)
    out += _check_stats(ix, skew)
    return out


_NOT_DEAD = (None, "acked", "delivered", "barrier", "conflated")


def _check_dead_letters(ix: _Index, skew: float) -> list[Violation]:
    spec = ix.spec
    out: list[Violation] = []
    expired = {op.event["b"] for op in ix.ops.values() if op.kind == "expire" and op.effective}
    for b, letters in ix.dead_letters.items():
        letter = letters[0]
        if len(letters) > 1:
            out.append(_v("dead_lettered_twice", b, f"{len(letters)} dead letters", *letters))
        published = ix.published.get(b)
        if published is None:
            out.append(_v("unknown_dead_letter", b, "never published", letter))
            continue
        reason, n, c, at = letter["reason"], int(letter["n"]), int(letter["c"]), letter["t"]
        allowed = {
            "consumer_expire": b in expired,
            "max_deliveries": 0 < spec.max_deliveries <= n,
            "max_cancels": 0 < spec.max_cancels <= c,
            "expiration": spec.expiration is not None
            and float(at) >= float(published["t"]) + spec.expiration - skew,
        }
        if not allowed.get(reason, False):
            detail = f"reason {reason!r} (deliveries={n}, cancels={c}) is not allowed: {spec}"
            out.append(_v("dead_letter_reason", b, detail, published, letter))
        late = [d for d in ix.deliveries.get(b, []) if d.start > float(at) + skew]
        if late:
            detail = "delivered after it was dead-lettered"
            out.append(_v("delivered_after_dead_letter", b, detail, letter, late[0].event))
        if ix.changelog_read:
            done = [r for r in ix.durable.get(b, []) if r["kind"] == "DONE"]
            if not any(r.get("reason") == reason for r in done):
                detail = "no done record with the same reason"
                out.append(_v("dead_letter_without_done", b, detail, letter, *done))
    for b, records in ix.durable.items():
        for r in records:
            if r["kind"] == "DONE" and r.get("reason") not in _NOT_DEAD:
                if b not in ix.dead_letters:
                    detail = f"done ({r.get('reason')}) but no dead letter"
                    out.append(_v("dead_letter_missing", b, detail, r))
                break
    return out


def _check_confirmed_after_end(ix: _Index) -> list[Violation]:
    """An operation sent after its client saw the subscription end cannot have been applied
    to it (its leases were gone): the client must report it unconfirmed, never confirmed."""
    out: list[Violation] = []
    for op in ix.ops.values():
        key = (op.event["w"], op.event["sub"])
        seen = ix.sub_seen_end.get(key, _NEVER)
        if op.outcome == "ok" and op.t > seen + _DROP_SKEW:
            detail = f"{op.kind} sent at {op.t:.3f}, after its subscription ended at {seen:.3f}"
            out.append(_v("confirmed_after_end", op.event["b"], detail, op.event))
    return out


def _check_leases(ix: _Index, skew: float) -> list[Violation]:
    """At-least-once: counts grow; no lease granted while no coordinator could grant; never two
    valid leases on one message; every lease handed out was durable first."""
    limit = ix.spec.max_deliveries
    out: list[Violation] = []
    windows = ix.down_windows()
    for b, ds in ix.deliveries.items():
        if b not in ix.published:
            out.append(_v("unknown_delivery", b, "never published", ds[0].event))
        for d1, d2 in zip(ds, ds[1:], strict=False):
            if d2.n <= d1.n:
                detail = f"delivery count {d2.n} after {d1.n}"
                out.append(_v("count_regressed", b, detail, d1.event, d2.event))
        for d in ds:
            if limit and d.n > limit:
                out.append(_v("over_max_deliveries", b, f"delivery {d.n} > {limit}", d.event))
            if d.grant is None:
                out.append(_v("lease_without_deadline", b, "no lease deadline", d.event))
                continue
            for lo, hi, what in ix.down_windows(d.epoch) if ix.cluster else windows:
                if lo + skew < d.grant < hi - skew:
                    detail = f"granted at {d.grant:.3f} while {what} ({lo:.3f}..{hi:.3f})"
                    out.append(_v("granted_while_down", b, detail, d.event))
        valid: _Delivery | None = None  # of the leases so far, the one that may end last
        for d in ds:
            if d.grant is None:
                continue
            if valid is not None and valid.grant is not None and d.grant + skew < valid.end:
                ops = [op.event for op in ix.my_ops.get(valid.holder, [])]
                detail = (
                    f"granted at {d.grant:.3f} while the lease granted at {valid.grant:.3f}"
                    f" was valid until at least {valid.end:.3f}"
                )
                out.append(_v("double_lease", b, detail, valid.event, *ops, d.event))
            if valid is None or d.end > valid.end:
                valid = d
        if ix.changelog_read:
            leased = {int(r["n"]) for r in ix.durable.get(b, []) if r["kind"] == "LEASED"}
            for d in ds:
                if d.n not in leased:
                    detail = f"delivery {d.n} has no lease record in the changelog"
                    out.append(_v("lease_not_durable", b, detail, d.event))
    return out


def _check_at_least_once(ix: _Index, skew: float) -> list[Violation]:
    """Nothing acked is delivered again; every message ends acked or dead-lettered."""
    out: list[Violation] = []
    acked: dict[str, _Op] = {}
    unsure: dict[str, list[_Op]] = defaultdict(list)
    sent: set[str] = set()
    for op in sorted(ix.ops.values(), key=lambda o: o.done_at):
        if op.kind != "ack":
            continue
        b = op.event["b"]
        if op.effective:
            sent.add(b)
        if op.outcome == "ok":
            acked.setdefault(b, op)
        elif op.outcome == "lost":
            unsure[b].append(op)
    done_acked = ix.done_records("acked")
    for b, op in acked.items():
        target = ix.acted_on(op)
        again = [
            d
            for d in ix.deliveries.get(b, [])
            if d is not target
            and (d.start > op.done_at + skew or (target is not None and d.n > target.n))
        ]
        if again:
            detail = f"acked (confirmed at {op.done_at:.3f}), then delivered again"
            shown = [target.event] if target is not None else []
            out.append(_v("redelivered_after_ack", b, detail, *shown, op.event, again[0].event))
        if b in ix.dead_letters:
            detail = "a confirmed ack and a dead letter"
            out.append(_v("acked_and_dead_lettered", b, detail, op.event, *ix.dead_letters[b]))
        if ix.changelog_read and b not in done_acked:
            out.append(_v("ack_not_durable", b, "confirmed ack, no done record", op.event))
    for b, r in done_acked.items():
        if b not in sent:
            out.append(_v("phantom_ack", b, "done (acked), but every ack was refused", r))
        late = [d for d in ix.deliveries.get(b, []) if d.start > float(r["t"]) + skew]
        if late and b not in acked:  # else reported above
            detail = "delivered after its done (acked) record"
            out.append(_v("redelivered_after_ack", b, detail, r, late[0].event))
    for b, published in ix.published.items():
        if b in acked or b in ix.dead_letters:
            continue
        if b in unsure and (b in done_acked or not ix.changelog_read):
            continue  # the answer was lost, but the ack took effect
        ds = ix.deliveries.get(b, [])
        detail = f"neither acked nor dead-lettered ({len(ds)} deliveries)"
        shown = [d.event for d in ds[-3:]] + [op.event for op in unsure.get(b, [])]
        out.append(_v("lost", b, detail, published, *shown))
    return out


def _check_at_most_once(ix: _Index, skew: float) -> list[Violation]:
    """Nothing delivered twice; nothing handed out before it was done durably; what was handed
    out but never received is explained by a fault that came after."""
    out: list[Violation] = []
    for b, ds in ix.deliveries.items():
        if b not in ix.published:
            out.append(_v("unknown_delivery", b, "never published", ds[0].event))
        if len(ds) > 1:
            out.append(_v("delivered_twice", b, f"{len(ds)} deliveries", *(d.event for d in ds)))
        if b in ix.dead_letters:
            detail = "delivered and dead-lettered"
            out.append(
                _v("delivered_and_dead_lettered", b, detail, ds[0].event, *ix.dead_letters[b])
            )
    handed = ix.done_records("delivered")
    if ix.changelog_read:
        for b, ds in ix.deliveries.items():
            if b not in handed:
                detail = "delivered without a done record"
                out.append(_v("handed_out_not_durable", b, detail, ds[0].event))
        # in a cluster a done record does not name the member that handed the message out
        windows = [] if ix.cluster else ix.down_windows()
        for b, r in handed.items():
            for lo, hi, what in windows:
                if lo + skew < float(r["t"]) < hi - skew:
                    detail = f"handed out at {float(r['t']):.3f} while {what}"
                    out.append(_v("granted_while_down", b, detail, r))
    last_fault = max(
        [*ix.kills.values(), *ix.consumer_kill.values(), *ix.sub_seen_end.values(),
         *ix.fault_begins],
        default=-_NEVER,
    )  # fmt: skip
    for b, published in ix.published.items():
        if b in ix.deliveries or b in ix.dead_letters:
            continue
        record = handed.get(b)
        if record is None:
            if ix.changelog_read:
                detail = "never delivered, dead-lettered or handed out"
                out.append(_v("lost", b, detail, published))
        elif last_fault < float(record["t"]):
            # handed out, never received: only a crash or a disconnect after it explains that
            detail = "handed out, never received, and no fault came after"
            out.append(_v("lost", b, detail, published, record))
    return out


def _check_stats(ix: _Index, skew: float) -> list[Violation]:
    """The final coordinator's depths match the history, and its counters (kept across restarts)
    are at least what the history shows since it started."""
    stats, epoch = ix.stats, ix.final_epoch
    if stats is None or epoch is None:
        return []
    start = float(ix.starts[epoch]["t"])
    alo = ix.spec.semantics == AT_LEAST_ONCE
    confirmed_acks = sum(
        1
        for op in ix.ops.values()
        if op.kind == "ack"
        and op.outcome == "ok"
        and ix.sub_epoch.get((op.event["w"], op.event["sub"])) == epoch
    )
    expected = {
        "available": 0,
        "leased": 0,
        "inactive": 0,
        "delivered_total": sum(1 for ds in ix.deliveries.values() for d in ds if d.epoch == epoch),
        "acked_total": confirmed_acks if alo else 0,
        "dead_lettered_total": sum(
            1 for ls in ix.dead_letters.values() for e in ls if float(e["t"]) >= start - skew
        ),
    }
    # the *_total counters survive restarts (they count every epoch): at least this epoch's
    wrong = {
        k: (stats.get(k), v)
        for k, v in expected.items()
        if (stats.get(k) < v if k.endswith("_total") else stats.get(k) != v)  # type: ignore[operator]
    }
    if not wrong:
        return []
    detail = ", ".join(f"{k}: stats {got}, history {want}" for k, (got, want) in wrong.items())
    return [_v("stats_mismatch", None, f"coordinator {epoch} (the last): {detail}", stats)]


# --- summary ----------------------------------------------------------------------------------


# what the faults cause, rather than faults injected
RECONNECT = "client reconnect"
CONSEQUENCES = ("lease timeout", "consumer disconnect", RECONNECT)


@dataclass(frozen=True)
class Summary:
    queue: str
    operations: Counter[str]
    faults: Counter[str]
    violations: int

    @property
    def total_operations(self) -> int:
        return sum(self.operations.values())

    @property
    def injected(self) -> Counter[str]:
        """The faults the harness injected (not what they caused)."""
        return Counter({k: n for k, n in self.faults.items() if k not in CONSEQUENCES})

    def line(self) -> str:
        ops = ", ".join(f"{n:,} {k}" for k, n in sorted(self.operations.items()))
        faults = ", ".join(f"{n} {k}" for k, n in sorted(self.faults.items())) or "none"
        return (
            f"queue {self.queue}: {self.total_operations:,} operations ({ops});"
            f" faults: {faults}; violations={self.violations}"
        )


def summarize(
    history: Sequence[Event], spec: QueueSpec, violations: Sequence[Violation]
) -> Summary:
    """What was checked: operations on this queue, faults injected, violations found."""
    ops: Counter[str] = Counter()
    faults: Counter[str] = Counter()
    for e in history:
        ev = e["ev"]
        if "q" in e and e["q"] != spec.name:
            continue
        if ev in ("publish", "dead_letter"):
            ops[ev] += 1
        elif ev == "got":
            ops["deliver"] += 1
        elif ev == "op":
            ops[e["op"]] += 1
        elif ev == "coordinator_kill":
            faults["coordinator SIGKILL"] += 1
        elif ev == "coordinator_start" and e.get("wiped"):
            faults["state wiped"] += 1
        elif ev == "coordinator_stop":
            faults["coordinator SIGSTOP"] += 1
        elif ev == "consumer_kill":
            faults["consumer SIGKILL"] += 1
        elif ev == "closing":
            faults["consumer disconnect"] += 1
        elif ev == "broker_stop":
            faults["broker SIGSTOP"] += 1
        elif ev == "proxy" and e["action"] in _PROXY_FAULTS:
            faults[f"{e['side']} proxy {e['action']}"] += 1
        elif ev == "reconnected":
            faults[RECONNECT] += 1
        elif ev == "durable" and e["kind"] == "RETURNED" and e.get("reason") == "timeout":
            faults["lease timeout"] += 1
    return Summary(spec.name, ops, faults, len(violations))


# --- storage ----------------------------------------------------------------------------------


def write_history(path: Path, history: Iterable[Event]) -> None:
    with open(path, "w") as f:
        for e in sorted(history, key=lambda e: float(e["t"])):
            f.write(json.dumps(dict(e), sort_keys=True) + "\n")


def read_history(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Events from JSON-lines files; a last line cut short (a SIGKILLed writer) is skipped."""
    events: list[dict[str, Any]] = []
    for path in paths:
        text = Path(path).read_text()
        for line in text[: text.rfind("\n") + 1].splitlines():
            if line.strip():
                events.append(json.loads(line))
    return events
