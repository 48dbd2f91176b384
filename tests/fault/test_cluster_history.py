"""A randomized fault run of a three-member cluster, checked from its history (issue 12).

Three coordinator processes of one cluster (``[coordinator] cluster``) serve six at-least-once
queues over a broker of the test's own (a Tansu process): the group spreads the queues over the
members. One consumer process per queue (tests/fault/history_worker.py) is given every member's
address and lets the library follow its queue from owner to owner (``reconnect=True``); it acts
at random and records every delivery and every operation. A plain Kafka producer publishes
throughout. Meanwhile the harness injects faults, each once every queue delivered again since
the last one:

- a member: SIGKILL, restarted (its state wiped at random) after 0.5-3 s, as a supervisor would;
- a member: SIGSTOP past the group's session (another member takes its queues over and fences
  it), then SIGCONT: the woken zombie grants and confirms nothing, exits, and is restarted;
- a member: SIGTERM (a graceful handover), restarted;
- a consumer: SIGKILL.

A member that stops on its own after losing its session (a machine too loaded for it to
heartbeat) is restarted as a supervisor would; the run prints how many did. Every start and
stop of a member is a rebalance that moves queues. At the end the queues drain
with no more faults, and the underlying, dead-letter and changelog topics are read back. The
checker (tests/fault/history.py, in its cluster mode: the members' epochs overlap) must find no
violation: no confirmed ack redelivered, no message leased to two consumers at once, nothing
lost, no delivery count going back. The failover times are printed: for each member fault, the
time from the kill (stop, SIGTERM) to the first delivery of each queue it owned from another
member.

The run is seeded (``QLAYER_HISTORY_SEED=N``); ``QLAYER_SOAK=1`` (``make soak``) selects the long
profile.
"""

from __future__ import annotations

import math
import os
import signal
import statistics
import threading
import time
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from connectors import TopicAdmin, TopicSpec, admin_settings, client_settings
from layer.client import QueueClient
from layer.coordinator.membership import CONTROL_PARTITIONS
from layer.exceptions import QLayerError
from tests.fault.history import check, summarize, write_history
from tests.fault.proxied_broker import Tansu, free_port
from tests.fault.test_history import LEASE, QueueSetup, Run, _seed
from tests.harness import SELF_STOPS, CoordinatorProcess, serving, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

MEMBERS = 3


@dataclass(frozen=True)
class Profile:
    name: str
    rate: float  # messages per second and queue
    duration: float  # seconds of publishing under faults, at least
    faults: int  # faults injected, at least (every member fault kind at least once)
    progress: int  # deliveries of every queue between two faults
    drain: float  # seconds allowed for the queues to empty at the end
    timeout: int  # for pytest-timeout


SHORT = Profile("short", 4.0, duration=30.0, faults=7, progress=2, drain=120.0, timeout=420)
SOAK = Profile("soak", 10.0, duration=900.0, faults=120, progress=20, drain=600.0, timeout=3600)
PROFILE = SOAK if os.environ.get("QLAYER_SOAK") == "1" else SHORT
# (fault, weight) once each kind came once
FAULTS = {"kill": 1.0, "stop": 1.0, "term": 1.0, "consumer": 1.0}

_ALO = {"lease_period": LEASE, "max_deliveries": 3, "max_cancels": 2}
_EXP = {"lease_period": LEASE, "expiration": 8.0}
SETUPS = [
    *(QueueSetup(f"alo{i}", _ALO, 2) for i in range(3)),
    *(QueueSetup(f"exp{i}", _EXP) for i in range(3)),
]


def _spread(keys: list[str], suffix: str) -> dict[str, str]:
    """A queue name per key, each on a control partition of its own (so the group can spread
    them over the members)."""
    names: dict[str, str] = {}
    taken: set[int] = set()
    for key in keys:
        for i in range(1000):
            name = f"{key}-{suffix}-{i}"
            p = zlib.crc32(name.encode()) % CONTROL_PARTITIONS
            if p not in taken:
                taken.add(p)
                names[key] = name
                break
    return names


class _Member:
    """One member slot: its process (restarted in place, at a fixed address) and epochs."""

    def __init__(self, slot: int, member_id: str, proc: CoordinatorProcess) -> None:
        self.slot = slot
        self.id = member_id
        self.proc = proc
        self.epoch = 0  # of the running process, 0: none yet


class _AnyMember:
    """What ``Run``'s drain checks take for the coordinator: a running member."""

    def __init__(self, run: ClusterRun) -> None:
        self.run = run

    @property
    def address(self) -> str | None:
        running = [m.proc.address for m in self.run.members if m.proc.running]
        return running[0] if running else None


class ClusterRun(Run):
    setups = SETUPS
    rate = PROFILE.rate

    def __init__(self, tmp: Path, broker: Tansu, seed: int) -> None:  # noqa: PLR0915
        import random

        self.tmp = tmp
        self.broker = broker
        bootstrap = self.bootstrap = broker.bootstrap
        self.rng = random.Random(seed)
        self.seed = seed
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        suffix = uuid.uuid4().hex[:8]
        # the changelogs are qlayer.changelog.<cluster>.<queue>: Run reads them by this name
        self.coordinator_id = self.cluster = f"chist-{suffix}"
        self.queues = _spread([s.key for s in SETUPS], suffix)
        self.topics = {s.key: f"chist-{s.key}-{suffix}" for s in SETUPS}
        self.dlqs = {s.key: f"chist-{s.key}-{suffix}.dlq" for s in SETUPS}
        self.addr_file = tmp / "addr"
        self.stop_file = tmp / "stop"
        self.quiet_file = tmp / "quiet"
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.workers = {}
        self.incarnations = 0
        self.epoch = 0
        self.start_failures: list[str] = []
        self.self_exits: list[str] = []  # members that stopped on their own (``check_stopped``)
        self.restarts: list[str] = []  # members ``supervise`` found exited and restarted
        self._read_to: dict[Path, int] = {}
        self._got_by_key: Counter[str] = Counter()
        self.done: set[str] = set()
        self._got = 0
        self.injected = 0
        self.fault_seconds: Counter[str] = Counter()
        # (kind, fault time, epoch, queues the member owned then)
        self.member_faults: list[tuple[str, float, int, list[str]]] = []
        admin = TopicAdmin(admin_settings(client_settings(bootstrap, {})))
        admin.ensure_topics([TopicSpec(self.topics[s.key], s.partitions) for s in SETUPS])
        tables = [
            {
                "name": self.queues[s.key],
                "underlying_topic": self.topics[s.key],
                "dead_letter_topic": self.dlqs[s.key],
                "max_per_subscription_backlog": 20,
                **s.options,
            }
            for s in SETUPS
        ]
        self.members: list[_Member] = []
        for slot in range(MEMBERS):
            home = tmp / f"member-{slot}"
            home.mkdir()
            member_id = f"m{slot}-{suffix}"
            config = write_config(
                home / "qlayer.toml", bootstrap, tables if slot == 0 else [],
                {"id": member_id, "cluster": self.cluster},
            )  # fmt: skip
            proc = CoordinatorProcess(config, home / "state", home / "coordinator.log")
            proc.listen = f"127.0.0.1:{free_port()}"  # restarted where clients expect it
            self.members.append(_Member(slot, member_id, proc))
        # every worker is given every member's address, for good: the library follows
        self.proxy_addr_file = self.addr_file
        self.addr_file.write_text("0 " + ",".join(m.proc.listen for m in self.members))
        self.coordinator = _AnyMember(self)  # type: ignore[assignment]

    # --- members ------------------------------------------------------------------------------

    def start_member(self, m: _Member, wiped: bool = False) -> None:
        while True:
            self.epoch += 1
            m.epoch = self.epoch
            self.record("rebalance", why=f"member {m.slot} starts")
            self.record(
                "coordinator_start", epoch=m.epoch, wiped=wiped, member=m.id, addr=m.proc.listen
            )
            try:
                m.proc.start(timeout=90)
            except AssertionError as exc:
                m.proc.kill()
                self.record("coordinator_dead", epoch=m.epoch)
                self.start_failures.append(f"member {m.slot} start {m.epoch}: {exc}")
                wiped = False
                continue
            break

    def supervise(self) -> None:
        """Restart a member that exited (a woken zombie exits once it finds itself fenced; a
        member whose session a machine stall cost exits once another member claims its
        queues). Called whenever the run waits, as a supervisor watches all the time: in one
        stall at load 20 all three members lost their sessions, fenced one another and exited
        while the run waited for deliveries, and nothing started them again."""
        for m in self.members:
            if not m.proc.running:
                if m.epoch:
                    m.proc.kill()  # reaps it
                    self.record("coordinator_dead", epoch=m.epoch)
                    self.restarts.append(f"member {m.slot} (epoch {m.epoch})")
                self.start_member(m)

    def supervised(self, check: Callable[[], bool]) -> Callable[[], bool]:
        """``check`` for ``wait_until``, restarting exited members first."""

        def supervised_check() -> bool:
            self.supervise()
            return check()

        return supervised_check

    def owned(self, m: _Member) -> list[str]:
        """The queues ``m`` serves, as another running member says."""
        others = [o for o in self.members if o is not m and o.proc.running]
        for o in others:
            try:
                with QueueClient(o.proc.address or "", timeout=5, reconnect=False) as client:
                    info = client.cluster()
            except QLayerError:
                continue
            mine = set(self.queues.values())
            return sorted(q.queue for q in info.queues if q.member == m.id and q.queue in mine)
        return []

    def all_served(self) -> bool:
        address = self.coordinator.address
        if address is None:
            return False
        try:
            with QueueClient(address, timeout=5, reconnect=False) as client:
                return serving(client, self.queues.values())
        except QLayerError:
            return False

    def member_fault(self, kind: str) -> None:
        m = self.rng.choice([m for m in self.members if m.proc.running])
        owned = self.owned(m)
        proc = m.proc.proc
        assert proc is not None
        at = time.time()
        self.member_faults.append((kind, at, m.epoch, owned))
        if kind == "kill":
            self.record("coordinator_kill", epoch=m.epoch, member=m.id)
            m.proc.kill()
            self.record("coordinator_dead", epoch=m.epoch)
            threading.Event().wait(self.rng.uniform(0.5, 3.0))
            if self.rng.random() < 0.35:
                m.proc.wipe_state()
            self.start_member(m, wiped=not m.proc.state_dir.exists())
        elif kind == "term":
            self.record("rebalance", why=f"member {m.slot} SIGTERM")
            self.record("coordinator_term", epoch=m.epoch, member=m.id)
            code = m.proc.stop(timeout=60)
            self.record("coordinator_dead", epoch=m.epoch)
            self.check_stopped(m, code)
            threading.Event().wait(self.rng.uniform(0.5, 3.0))
            self.start_member(m)
        else:  # stop: past the group's session (2 s on Tansu), so another member takes over
            pid = proc.pid
            os.kill(pid, signal.SIGSTOP)
            wait_until(
                lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 5,
                message="the member to stop",
            )  # fmt: skip
            self.record("coordinator_stop", epoch=m.epoch, member=m.id)
            threading.Event().wait(self.rng.uniform(5.0, 8.0))
            self.record("rebalance", why=f"member {m.slot} SIGCONT")
            self.record("coordinator_cont", epoch=m.epoch)
            os.kill(pid, signal.SIGCONT)

    def check_stopped(self, m: _Member, code: int) -> None:
        """A member SIGTERMed exits 0, unless it had stopped on its own meanwhile after losing
        its session (as a stopped zombie does): a supervisor restarts it, and so does this
        run; counted in ``self_exits``, printed at the end."""
        if code == 0:
            return
        since_start = m.proc.log_since_start()
        # what may have stopped it before the signal (-15: the signal came after its stop had
        # ended, so something else had begun it): its warnings and errors since it started
        notable = [
            line
            for line in since_start.splitlines()
            if any(f" {level} " in line for level in ("WARNING", "ERROR", "CRITICAL"))
        ]
        assert any(said in since_start for said in SELF_STOPS), (
            f"member {m.slot} exited {code} on SIGTERM; where its stop waited:\n"
            f"{m.proc.stop_report()}\nits warnings and errors since its start (the last 25):\n"
            + "\n".join(notable[-25:])
            + f"\nits log's end:\n{m.proc.log_tail(15)}"
        )
        self.self_exits.append(f"member {m.slot} (epoch {m.epoch})")

    def inject(self, fault: str) -> None:
        self.injected += 1
        began = time.monotonic()
        try:
            if fault == "consumer":
                self.kill_worker()
            else:
                self.member_fault(fault)
        finally:
            self.fault_seconds[fault] += time.monotonic() - began

    def drained(self, tails: list[Any]) -> bool:
        """Every member up (a zombie that exited is restarted), every queue served, empty, and
        every message done."""
        self.supervise()
        try:
            return self.all_served() and self.all_done(tails)
        except QLayerError:  # the member asked went away meanwhile
            return False

    def drain_report_safe(self, tails: list[Any]) -> str:
        try:
            return self.drain_report(tails)
        except QLayerError as exc:
            return f"(no drain report: {exc})"

    def got_by_key(self) -> Counter[str]:
        """Deliveries recorded so far per queue key (the logs read on from last time)."""
        for path in self.logs.glob("*.jsonl"):
            start = self._read_to.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1
            key = path.name.split(".", 1)[0][:-1]  # the worker's name: key, slot, incarnation
            self._got_by_key[key] += data[:end].count(b'"ev": "got"')
            self._read_to[path] = start + end
        return self._got_by_key


def instances(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ``coordinator_instance`` event per member process that made a subscription: which
    epoch made each subscription (the prefix of its id names the process, the address in
    ``subscribed`` the member slot, and the process there was the last one started before the
    first sign of the instance). A regex probe cannot ask a member for its instance as in the
    one-coordinator run: a member that serves no queue refuses it."""
    starts: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in history:
        if e["ev"] == "coordinator_start":
            starts[str(e["addr"])].append((float(e["t"]), int(e["epoch"])))
    addr: dict[str, set[str]] = defaultdict(set)
    first: dict[str, float] = {}
    for e in history:
        if e["ev"] in ("subscribed", "got"):
            instance = str(e["sub"]).split("-", 1)[0]
            first[instance] = min(first.get(instance, math.inf), float(e["t"]))
            if e["ev"] == "subscribed" and e.get("addr"):
                addr[instance].add(str(e["addr"]))
    found = []
    for instance, where in addr.items():
        assert len(where) == 1, f"subscriptions of instance {instance} on {where}"
        before = [(t, epoch) for t, epoch in starts[next(iter(where))] if t <= first[instance]]
        assert before, f"instance {instance}: no member started at {where} before it"
        epoch = max(before)[1]
        found.append({"ev": "coordinator_instance", "epoch": epoch, "instance": instance,
                      "t": first[instance]})  # fmt: skip
    epochs = Counter(e["epoch"] for e in found)
    assert all(n == 1 for n in epochs.values()), f"two instances in one epoch: {found}"
    return found


def failover_times(
    history: list[dict[str, Any]], faults: list[tuple[str, float, int, list[str]]]
) -> dict[str, list[float]]:
    """Per kind of member fault: for each queue the member owned, seconds from the fault to
    the first delivery of that queue by another member (its subscription's epoch)."""
    instances = {
        str(e["instance"]): int(e["epoch"]) for e in history if e["ev"] == "coordinator_instance"
    }
    gots: dict[str, list[tuple[float, int | None]]] = defaultdict(list)
    for e in history:
        if e["ev"] == "got":
            gots[e["q"]].append((float(e["t"]), instances.get(str(e["sub"]).split("-", 1)[0])))
    times: dict[str, list[float]] = defaultdict(list)
    for kind, at, epoch, queues in faults:
        for q in queues:
            after = [t for t, ep in gots[q] if t > at and ep is not None and ep != epoch]
            if after:
                times[kind].append(min(after) - at)
    return times


def _p50_max(xs: list[float]) -> str:
    return f"p50 {statistics.median(xs):.1f} s, max {max(xs):.1f} s (n={len(xs)})" if xs else "-"


@pytest.fixture
def own_broker(tmp_path: Path) -> Any:
    broker = Tansu(tmp_path / "tansu.log")
    yield broker
    broker.stop()


@pytest.mark.timeout(PROFILE.timeout)
def test_history_of_a_three_member_cluster_under_faults_has_no_violations(
    tmp_path: Path, own_broker: Tansu
) -> None:
    seed = _seed()
    print(f"\ncluster history run: profile={PROFILE.name} seed={seed}")
    run = ClusterRun(tmp_path, own_broker, seed)
    started = time.monotonic()
    stop = threading.Event()
    failure: list[BaseException] = []
    try:
        for m in run.members:
            run.start_member(m)
        wait_until(run.supervised(run.all_served), 120, interval=0.5, message="every queue served")
        for s in SETUPS:
            run.start_worker(s, 0)

        def publish() -> None:
            try:
                run.publish(stop)
            except BaseException as exc:
                failure.append(exc)

        publisher = threading.Thread(target=publish, name="publisher", daemon=True)
        publisher.start()
        planned = run.rng.sample(["kill", "stop", "term"], 3)
        kinds, weights = zip(*sorted(FAULTS.items()), strict=True)
        faulting = time.monotonic()
        while run.injected < PROFILE.faults or time.monotonic() - faulting < PROFILE.duration:
            assert publisher.is_alive(), f"the publisher stopped: {failure}"
            run.supervise()
            seen = dict(run.got_by_key())
            wait_until(
                run.supervised(lambda seen=seen: all(
                    run.got_by_key()[s.key] >= seen.get(s.key, 0) + PROFILE.progress
                    for s in SETUPS
                )),
                120, interval=0.2,
                message=lambda seen=seen: f"{PROFILE.progress} deliveries of every queue since"
                f" the last fault: {dict(run.got_by_key())} (before: {seen})",
            )  # fmt: skip
            stop.wait(run.rng.uniform(0.05, 0.5))
            run.inject(planned.pop() if planned else run.rng.choices(kinds, weights)[0])
        faulted = time.monotonic() - started
        stop.set()
        publisher.join(90)
        assert not failure, failure
        run.quiet_file.write_text("quiet")
        run.supervise()
        tails = run.changelog_tails(None)
        undrained = ""
        try:
            wait_until(
                lambda: run.drained(tails), PROFILE.drain, interval=0.5,
                message=lambda: "every published message done and every queue empty\n"
                + run.drain_report_safe(tails),
            )  # fmt: skip
        except AssertionError as exc:
            undrained = str(exc)
        finally:
            for tail in tails:
                tail.close()
        run.stop_file.write_text("stop")
        for name, (proc, _setup) in run.workers.items():
            assert proc.wait(60) == 0, f"worker {name} failed: see {run.logs / name}.err"
        for m in run.members:
            run.check_stopped(m, m.proc.stop(timeout=60))
    finally:
        stop.set()
        run.stop_file.write_text("stop")
        for proc, _setup in run.workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for m in run.members:
            m.proc.kill()

    history = [*run.events, *run.worker_events(), *run.broker_events(None)]
    history.extend(instances(history))
    write_history(tmp_path / "history.jsonl", history)
    violations = []
    total_ops = 0
    for s in SETUPS:
        spec = s.spec(run.queues[s.key])
        found = check(history, spec, cluster=True)
        summary = summarize(history, spec, found)
        print(summary.line())
        total_ops += summary.total_operations
        violations.extend(found)
    kinds_done = Counter(kind for kind, *_rest in run.member_faults)
    times = failover_times(history, run.member_faults)
    print(
        f"cluster history run: seed={seed}: {total_ops:,} operations checked, {run.injected}"
        f" faults in {faulted:.0f}s ({dict(kinds_done)}, {run.injected - sum(kinds_done.values())}"
        f" consumer SIGKILL), {len(run.start_failures)} failed member starts,"
        f" {len(run.self_exits)} members stopped on their own after losing their session"
        f" {run.self_exits}, {len(run.restarts)} exited members restarted (woken zombies"
        f" included) {run.restarts},"
        f" violations={len(violations)}, {time.monotonic() - started:.0f}s; load"
        f" {os.getloadavg()[0]:.1f}; history in {tmp_path / 'history.jsonl'}"
    )
    for kind, label in (("kill", "SIGKILL"), ("stop", "SIGSTOP"), ("term", "SIGTERM")):
        print(f"failover {label} -> first delivery from the new owner: {_p50_max(times[kind])}")
    problems = []
    if violations:
        kinds_found = Counter(v.kind for v in violations)
        shown = sorted(violations, key=lambda v: v.kind == "lost")[:10]
        problems.append(
            f"{len(violations)} violations {dict(kinds_found)}:\n"
            + "\n".join(v.excerpt() for v in shown)
        )
    if undrained:
        problems.append(f"the queues did not drain: {undrained}")
    if run.start_failures:
        failed = "\n".join(run.start_failures)
        problems.append(f"member starts failed (each was retried):\n{failed}")
    assert not problems, f"seed={seed}: " + "\n\n".join(problems)
