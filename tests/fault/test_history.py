"""Randomized fault runs, checked from their history (tests/fault/history.py).

One coordinator process serves three queues over a broker of the test's own (a Tansu process
behind a TCP proxy: pausing or cutting it must not disturb other tests): at-least-once with
max_deliveries and max_cancels, at-least-once with an expiration, and at-most-once with an
expiration. Consumer processes (tests/fault/history_worker.py) act at random and record every
delivery and every operation: per queue, one reconnects through the library (``reconnect=True``)
via a second proxy in front of the coordinator's fixed address, one connects straight to the
coordinator and subscribes again by itself when its stream breaks (the library's reconnection
off). A plain Kafka producer publishes throughout and records every bookmark. Meanwhile the
harness injects faults at random, each once the queues made progress since the last one:

- the coordinator: SIGKILL and restart (sometimes with its state directory wiped), SIGSTOP past
  the lease deadlines;
- a consumer: SIGKILL;
- the broker: SIGSTOP for 1-8 s; its proxy (between the coordinator and the broker): reset every
  connection, stop forwarding for a few seconds, or refuse new connections for a few seconds;
- the client proxy (between the reconnecting consumers and the coordinator): the same three.

The consumers also disconnect and let leases run out on their own. Publishing goes on until the
profile's number of faults was injected. At the end the coordinator is restarted one last time
with no more faults, the queues drain, and the underlying, dead-letter and changelog topics are
read back. The checker must find no violation.

The run is seeded: the seed is printed (``QLAYER_HISTORY_SEED=N`` replays the choices; the
timing of processes is not replayable). ``QLAYER_SOAK=1`` (``make soak``) selects the long profile.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from connectors import (
    TopicAdmin,
    TopicSpec,
    admin_settings,
    client_settings,
)
from connectors.embedded import bound_to_parent
from layer.client import QueueClient
from layer.codec import ChangeKind, decode, decode_change, decode_key
from layer.exceptions import QLayerError
from tests.fault.history import QueueSpec, check, read_history, summarize, write_history
from tests.fault.proxied_broker import Tansu, free_port
from tests.harness import ROOT, CoordinatorProcess, write_config
from tests.helpers import wait_until
from tests.proxy import TcpProxy

pytestmark = pytest.mark.fault


@dataclass(frozen=True)
class Profile:
    name: str
    rate: float  # messages per second and queue, published until the faults are in
    duration: float  # seconds of publishing under faults, at least
    faults: int  # faults injected while publishing, at least (asserted)
    progress: int  # deliveries between two faults
    drain: float  # seconds allowed for the queues to empty at the end
    timeout: int  # for pytest-timeout
    start: float  # seconds allowed for a coordinator start (a wiped one replays the changelog)


SHORT = Profile("short", 15.0, duration=40.0, faults=110, progress=5, drain=90.0, timeout=420,
                start=60.0)  # fmt: skip
SOAK = Profile("soak", 35.0, duration=600.0, faults=800, progress=60, drain=600, timeout=3600,
               start=600)  # fmt: skip
PROFILE = SOAK if os.environ.get("QLAYER_SOAK") == "1" else SHORT
LEASE = 1.5
# (fault, weight): the cheap ones (a reset, a consumer SIGKILL) often, the ones that take seconds
# (restarts, pauses, stalls) less, so that a run injects over a hundred in about two minutes
FAULTS = {
    "restart-wiped": 0.25,  # SIGKILL and restart the coordinator, its state wiped
    "restart": 0.3,  # the same, state wiped at random
    "pause": 0.25,  # SIGSTOP the coordinator past the lease deadlines
    "consumer": 2.0,  # SIGKILL a consumer
    "broker-pause": 0.25,  # SIGSTOP the broker for 1-8 s
    "broker-drop": 3.0,  # reset every connection between the coordinator and the broker
    "broker-stall": 0.4,  # ... stop forwarding for a few seconds
    "broker-refuse": 0.4,  # ... refuse new connections (and reset the open ones) for a while
    "client-drop": 4.0,  # reset every connection between the consumers and the coordinator
    "client-stall": 0.4,
    "client-refuse": 0.4,
}


@dataclass(frozen=True)
class QueueSetup:
    key: str
    options: dict[str, Any]
    partitions: int = 1

    def spec(self, name: str) -> QueueSpec:
        o = self.options
        return QueueSpec(
            name,
            semantics=o.get("semantics", "at-least-once"),
            lease_period=float(o.get("lease_period", 60.0)),
            max_deliveries=int(o.get("max_deliveries", 0)),
            max_cancels=int(o.get("max_cancels", 0)),
            expiration=float(o["expiration"]) if "expiration" in o else None,
        )


SETUPS = [
    QueueSetup("alo", {"lease_period": LEASE, "max_deliveries": 3, "max_cancels": 2}, 2),
    QueueSetup("exp", {"lease_period": LEASE, "expiration": 8.0}),
    QueueSetup("amo", {"semantics": "at-most-once", "lease_period": LEASE, "expiration": 8.0}),
]


class Run:
    """One randomized run: the processes, the faults, and the events the harness records."""

    setups = SETUPS  # the queues
    rate = PROFILE.rate  # messages per second and queue

    def __init__(self, tmp: Path, broker: Tansu, seed: int) -> None:
        self.tmp = tmp
        self.broker = broker
        bootstrap = self.bootstrap = broker.bootstrap
        self.rng = random.Random(seed)
        self.seed = seed
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        suffix = uuid.uuid4().hex[:8]
        self.coordinator_id = f"hist-{suffix}"
        self.queues = {s.key: f"{s.key}-{suffix}" for s in self.setups}
        self.topics = {s.key: f"hist-{s.key}-{suffix}" for s in self.setups}
        self.dlqs = {s.key: f"hist-{s.key}-{suffix}.dlq" for s in self.setups}
        self.probe_queue = f"probe-{suffix}"  # never published to: tells coordinators apart
        self.addr_file = tmp / "addr"  # "EPOCH HOST:PORT" of the coordinator, empty while down
        self.proxy_addr_file = tmp / "proxy-addr"  # the client proxy's address, for good
        self.stop_file = tmp / "stop"
        self.quiet_file = tmp / "quiet"
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.workers: dict[str, tuple[subprocess.Popen[bytes], QueueSetup]] = {}
        self.incarnations = 0
        self.epoch = 0
        self.start_failures: list[str] = []
        self._read_to: dict[Path, int] = {}
        self.done: set[str] = set()
        self._got = 0
        admin = TopicAdmin(admin_settings(client_settings(bootstrap, {})))
        admin.ensure_topics(
            [TopicSpec(self.topics[s.key], s.partitions) for s in self.setups]
            + [TopicSpec(self.probe_queue, 1)]
        )
        queues = [
            {
                "name": self.queues[s.key],
                "underlying_topic": self.topics[s.key],
                "dead_letter_topic": self.dlqs[s.key],
                "max_per_subscription_backlog": 20,
                **s.options,
            }
            for s in self.setups
        ]
        queues.append({"name": self.probe_queue, "underlying_topic": self.probe_queue})
        config = write_config(tmp / "qlayer.toml", bootstrap, queues, {"id": self.coordinator_id})
        self.coordinator = CoordinatorProcess(config, tmp / "state", tmp / "coordinator.log")
        # one address for every coordinator of the run, so that the library's reconnection
        # finds the restarted one by itself, behind a proxy the harness can cut
        self.coordinator.listen = f"127.0.0.1:{free_port()}"
        self.client_proxy = TcpProxy(int(self.coordinator.listen.rsplit(":", 1)[1])).start()
        self.proxy_addr_file.write_text(f"0 {self.client_proxy.address}")
        self.injected = 0
        self.fault_seconds: Counter[str] = Counter()  # time spent in each kind of fault

    # --- recording ----------------------------------------------------------------------------

    def record(self, ev: str, **fields: Any) -> None:
        with self.lock:
            self.events.append({"ev": ev, "t": time.time(), **fields})

    def worker_events(self) -> list[dict[str, Any]]:
        return read_history(sorted(self.logs.glob("*.jsonl")))

    # --- the coordinator ----------------------------------------------------------------------

    def _set_address(self, text: str) -> None:
        tmp = self.addr_file.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.addr_file)

    def start_coordinator(self, wiped: bool = False) -> None:
        while True:
            self.epoch += 1
            self.record("coordinator_start", epoch=self.epoch, wiped=wiped)
            try:
                address = self.coordinator.start(timeout=PROFILE.start)
                instance = self.instance(address)
            except AssertionError as exc:  # recorded, reported at the end; the run goes on
                self.coordinator.kill()
                self.record("coordinator_dead", epoch=self.epoch)
                self.start_failures.append(f"start {self.epoch}: {exc}\n{self.diagnose()}")
                wiped = False
                continue
            break
        self.record("coordinator_instance", epoch=self.epoch, instance=instance)
        self._set_address(f"{self.epoch} {address}")

    def instance(self, address: str) -> str:
        """The coordinator's instance id: the prefix of the ids of its subscriptions (the
        checker derives each subscription's epoch from it)."""
        try:
            with (
                QueueClient(address, timeout=10, reconnect=False) as client,
                client.subscribe(self.probe_queue) as probe,
            ):
                return probe.id.split("-", 1)[0]
        except QLayerError as exc:
            raise AssertionError(f"probe subscription failed: {exc}") from exc

    def diagnose(self) -> str:
        """How far each changelog reads, committed and uncommitted, from the beginning."""
        lines = []
        for s in self.setups:
            topic = f"qlayer.changelog.{self.coordinator_id}.{self.queues[s.key]}"
            for isolation in ("read_committed", "read_uncommitted"):
                c = Consumer(
                    {"bootstrap.servers": self.bootstrap, "group.id": uuid.uuid4().hex,
                     "isolation.level": isolation, "enable.partition.eof": True}
                )  # fmt: skip
                c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
                records, deadline, end = 0, time.monotonic() + 20, "no end of partition in 20s"
                while time.monotonic() < deadline:
                    m = c.poll(0.2)
                    if m is not None and m.error() is None:
                        records += 1
                    elif m is not None and m.error().code() == KafkaError._PARTITION_EOF:
                        end = "end of partition"
                        break
                position = c.position([TopicPartition(topic, 0)])[0].offset
                _low, high = c.get_watermark_offsets(TopicPartition(topic, 0), cached=True)
                c.close()
                lines.append(
                    f"{topic} {isolation}: {records} records, position {position},"
                    f" high watermark {high}, {end}"
                )
        return "\n".join(lines)

    def kill_coordinator(self, wipe: bool = False) -> None:
        self._set_address("")
        self.record("coordinator_kill", epoch=self.epoch)
        self.coordinator.kill()
        self.record("coordinator_dead", epoch=self.epoch)
        if wipe:
            self.coordinator.wipe_state()

    def restart_coordinator(self, wipe: bool | None = None) -> None:
        wipe = self.rng.random() < 0.35 if wipe is None else wipe
        self.kill_coordinator(wipe)
        self.start_coordinator(wiped=wipe)

    def pause_coordinator(self) -> None:
        proc = self.coordinator.proc
        assert proc is not None
        pid = proc.pid
        os.kill(pid, signal.SIGSTOP)
        wait_until(
            lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 5,
            message="the coordinator to stop",
        )  # fmt: skip
        self.record("coordinator_stop", epoch=self.epoch)
        # past the deadline of every lease it granted
        threading.Event().wait(LEASE + self.rng.uniform(0.3, 2.0))
        self.record("coordinator_cont", epoch=self.epoch)
        os.kill(pid, signal.SIGCONT)

    # --- the broker and the proxies -----------------------------------------------------------

    def pause_broker(self) -> None:
        pid = self.broker.proc.pid
        self.record("broker_stop")
        self.broker.pause()
        wait_until(
            lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 5,
            message="the broker to stop",
        )  # fmt: skip
        threading.Event().wait(self.rng.uniform(1.0, 8.0))
        self.record("broker_cont")
        self.broker.resume()

    def cut(self, side: str, action: str) -> None:
        """``action`` on the broker's or the client proxy; stall and refuse last 0.5-2 s."""
        proxy = self.broker.proxy if side == "broker" else self.client_proxy
        self.record("proxy", side=side, action=action, drop=action == "refuse")
        if action == "drop":
            proxy.drop()
            return
        if action == "stall":
            proxy.stall()
        else:  # refuse: the open connections are reset too, or the refusal changes nothing
            proxy.refuse()
            proxy.drop()
        threading.Event().wait(self.rng.uniform(0.5, 2.0))
        self.record("proxy", side=side, action="heal")
        proxy.heal()

    def inject(self, fault: str) -> None:
        self.injected += 1
        began = time.monotonic()
        try:
            self._inject(fault)
        finally:
            self.fault_seconds[fault] += time.monotonic() - began

    def _inject(self, fault: str) -> None:
        if fault.startswith("restart"):
            self.restart_coordinator(wipe=fault == "restart-wiped" or None)
        elif fault == "pause":
            self.pause_coordinator()
        elif fault == "consumer":
            self.kill_worker()
        elif fault == "broker-pause":
            self.pause_broker()
        else:
            side, action = fault.split("-")
            self.cut(side, action)

    # --- consumers ----------------------------------------------------------------------------

    def start_worker(self, setup: QueueSetup, slot: int) -> None:
        """Slot 0 reconnects through the library via the client proxy, slot 1 connects
        straight to the coordinator and subscribes again by itself."""
        self.incarnations += 1
        name = f"{setup.key}{slot}.{self.incarnations}"
        stderr = open(self.logs / f"{name}.err", "wb")  # noqa: SIM115 - the child owns it
        reconnect = slot == 0
        addr_file = self.proxy_addr_file if reconnect else self.addr_file
        proc = subprocess.Popen(
            bound_to_parent([
                sys.executable, str(ROOT / "tests" / "fault" / "history_worker.py"),
                *(["--reconnect"] if reconnect else []),
                "--addr-file", str(addr_file), "--queue", self.queues[setup.key],
                "--semantics", setup.spec("").semantics, "--log", str(self.logs / f"{name}.jsonl"),
                "--stop-file", str(self.stop_file), "--quiet-file", str(self.quiet_file),
                "--name", name, "--seed", str(self.rng.randrange(2**32)),
                "--backlog", str(self.rng.choice([1, 3, 5, 10])),
            ]),
            cwd=ROOT,
            stderr=stderr,
        )  # fmt: skip
        stderr.close()
        self.workers[name] = (proc, setup)

    def kill_worker(self) -> None:
        name = self.rng.choice(sorted(self.workers))
        proc, setup = self.workers.pop(name)
        self.record("consumer_kill", w=name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        self.start_worker(setup, int(name[len(setup.key)]))

    # --- publishing ---------------------------------------------------------------------------

    def publish(self, stop: threading.Event) -> None:
        producer = Producer(
            # critical only: every cut connection is a line at the default level
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True,
             "log_level": 2}
        )  # fmt: skip
        rng = random.Random(self.seed + 1)

        def report(queue: str) -> Callable[[Any, Any], None]:
            def delivered(err: Any, msg: Any) -> None:
                assert err is None, f"publish failed: {err}"
                if msg.offset() is None or msg.offset() < 0:
                    return  # confirmed after retries without its offset: read back at the end
                _kind, ts = msg.timestamp()
                b = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"
                with self.lock:
                    self.events.append({"ev": "publish", "q": queue, "b": b, "t": ts / 1000})

            return delivered

        interval = 1 / self.rate
        started = time.monotonic()
        for i in itertools.count():
            if stop.is_set():
                break
            for s in self.setups:
                roll = rng.random()
                kind = "poison" if roll < 0.01 else "cancel" if roll < 0.02 else "ok"
                kind = "expire" if 0.02 <= roll < 0.03 else kind
                value = json.dumps({"i": i, "kind": kind, "pad": "x" * rng.randrange(200)})
                producer.produce(
                    self.topics[s.key], value=value.encode(), key=str(i).encode(),
                    on_delivery=report(self.queues[s.key]),
                )  # fmt: skip
            producer.poll(0)
            stop.wait(max(0.0, started + (i + 1) * interval - time.monotonic()))
        assert producer.flush(60) == 0
        producer.close()

    # --- reading back -------------------------------------------------------------------------

    def deliveries_seen(self) -> int:
        """Deliveries the consumers recorded so far (their logs read on from last time)."""
        for path in self.logs.glob("*.jsonl"):
            start = self._read_to.get(path, 0)
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self._got += data[:end].count(b'"ev": "got"')
            self._read_to[path] = start + end
        return self._got

    def all_done(self, tails: list[Consumer]) -> bool:
        """Every published message has a done record, and every queue is empty."""
        with QueueClient(self.coordinator.address or "", timeout=10) as client:
            for stats in client.stats():
                if stats.available or stats.leased or stats.inactive or stats.extra["delayed"]:
                    return False
                if stats.extra.get("unread"):  # not read from the topic yet
                    return False
        for tail in tails:  # the changelogs, read on from where the last call stopped
            while batch := tail.consume(1000, 0.2):
                for m in batch:
                    if m.error() is None:
                        for key, value in _changes(m.key(), m.value()):
                            if value is not None and value["kind"] == ChangeKind.DONE.value:
                                self.done.add(str(key.bookmark))
        with self.lock:
            published = {e["b"] for e in self.events if e["ev"] == "publish"}
        return published <= self.done

    def drain_report(self, tails: list[Consumer]) -> str:
        """What keeps the queues from draining: their stats, the messages without a done
        record, where the changelog tails are, and how far fresh readers get."""
        lines = []
        with QueueClient(self.coordinator.address or "", timeout=10) as client:
            lines.extend(repr(stats) for stats in client.stats())
        with self.lock:
            published = {e["b"] for e in self.events if e["ev"] == "publish"}
        missing = sorted(published - self.done)
        lines.append(f"{len(missing)} published messages without a done record: {missing[:10]}")
        for tail in tails:
            for tp in tail.position(tail.assignment()):
                _low, high = tail.get_watermark_offsets(tp, cached=True)
                lines.append(f"tail {tp.topic}: position {tp.offset}, high watermark {high}")
        lines.append(self.diagnose())
        return "\n".join(lines)

    def changelog_tails(self, profile: Any) -> list[Consumer]:
        settings = self.reader_settings(profile)
        tails = []
        for s in self.setups:
            topic = f"qlayer.changelog.{self.coordinator_id}.{self.queues[s.key]}"
            tail = Consumer(settings)
            tail.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            tails.append(tail)
        return tails

    def reader_settings(self, profile: Any) -> dict[str, Any]:
        # librdkafka's own settings (its 500 ms fetch wait), not the Tansu profile's: once the
        # broker holds this much data, fetches of a few milliseconds come back empty
        settings = client_settings(self.bootstrap, {})
        settings.update(
            {"group.id": f"history-{uuid.uuid4().hex}", "enable.auto.commit": False,
             "isolation.level": "read_committed"}
        )  # fmt: skip
        return settings

    def read_topic(
        self, topic: str, profile: Any, timeout: float = 120, partitions: int = 1
    ) -> list[Any]:
        """Every record of a topic, read to its end."""
        consumer = Consumer({**self.reader_settings(profile), "enable.partition.eof": True})
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        records: list[Any] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        try:
            while True:
                for m in consumer.consume(1000, 0.2):
                    if m.error() is None:
                        records.append(m)
                    elif m.error().code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition())
                        if len(at_end) == partitions:
                            return records
                assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout}s"
        finally:
            consumer.close()

    def broker_events(self, profile: Any) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        with self.lock:
            reported = {e["b"] for e in self.events if e["ev"] == "publish"}
        for s in self.setups:
            queue = self.queues[s.key]
            # what the publisher's delivery reports missed: a producer's retry across a cut
            # connection can write a message twice (both are queued, so both are published)
            for m in self.read_topic(self.topics[s.key], profile, partitions=s.partitions):
                b = f"{m.topic()}/{m.partition()}/{m.offset()}"
                if b not in reported:
                    events.append({"ev": "publish", "q": queue, "b": b, "retried": True,
                                   "t": m.timestamp()[1] / 1000})  # fmt: skip
            for m in self.read_topic(self.dlqs[s.key], profile):
                letter = decode("dead_letter", m.value())
                events.append(
                    {"ev": "dead_letter", "q": queue, "b": letter["bookmark"],
                     "reason": letter["reason"], "n": letter["deliveries"],
                     "c": letter["cancels"], "t": letter["dead_lettered_at_ms"] / 1000}
                )  # fmt: skip
            topic = f"qlayer.changelog.{self.coordinator_id}.{queue}"
            for m in self.read_topic(topic, profile):
                for key, value in _changes(m.key(), m.value()):
                    if value is None or key.is_position:
                        continue
                    events.append(
                        {"ev": "durable", "q": queue, "b": str(key.bookmark),
                         "kind": value["kind"], "n": value["deliveries"], "c": value["cancels"],
                         "reason": value["reason"], "t": value["at_ms"] / 1000}
                    )  # fmt: skip
            events.append({"ev": "changelog_read", "q": queue, "t": time.time()})
        return events


def _changes(key: bytes | None, value: bytes | None) -> list[tuple[Any, Any]]:
    """A changelog record as per-message changes: a run record gives one per message of its
    run; snapshots and their confirmations give none (format 2)."""
    ck = decode_key(key or b"")
    if ck.offset < -1:
        return []
    decoded = decode_change(key or b"", value)[1]
    return [(ck._replace(offset=ck.offset + i, length=1), decoded) for i in range(ck.length)]


def _seed() -> int:
    given = os.environ.get("QLAYER_HISTORY_SEED")
    return int(given) if given else random.randrange(2**31)


@pytest.fixture
def own_broker(tmp_path: Path) -> Any:
    """A Tansu broker of this test's own, behind a proxy (``.proxy``) it advertises."""
    broker = Tansu(tmp_path / "tansu.log")
    yield broker
    broker.stop()


@pytest.mark.timeout(PROFILE.timeout)
def test_history_of_a_randomized_fault_run_has_no_violations(
    tmp_path: Path, own_broker: Tansu
) -> None:
    seed = _seed()
    print(f"\nhistory run: profile={PROFILE.name} seed={seed} (QLAYER_HISTORY_SEED={seed})")
    run = Run(tmp_path, own_broker, seed)
    started = time.monotonic()
    run.start_coordinator()
    for s in SETUPS:
        for slot in (0, 1):
            run.start_worker(s, slot)
    stop = threading.Event()
    failure: list[BaseException] = []

    def publish() -> None:
        try:
            run.publish(stop)
        except BaseException as exc:
            failure.append(exc)

    publisher = threading.Thread(target=publish, name="publisher", daemon=True)
    publisher.start()
    planned = run.rng.sample(sorted(FAULTS), len(FAULTS))
    kinds, weights = zip(*sorted(FAULTS.items()), strict=True)
    try:
        while run.injected < PROFILE.faults or time.monotonic() - started < PROFILE.duration:
            assert publisher.is_alive(), f"the publisher stopped: {failure}"
            seen = run.deliveries_seen()
            wait_until(
                lambda seen=seen: run.deliveries_seen() >= seen + PROFILE.progress,
                60, interval=0.1, message=f"{PROFILE.progress} deliveries since the last fault",
            )  # fmt: skip
            stop.wait(run.rng.uniform(0.05, 0.3))
            # each kind of fault at least once, then at random
            run.inject(planned.pop() if planned else run.rng.choices(kinds, weights)[0])
        faulted = time.monotonic() - started
        stop.set()
        publisher.join(90)
        assert not failure, failure
        # the last coordinator: no more faults from here on
        run.quiet_file.write_text("quiet")
        run.restart_coordinator()
        tails = run.changelog_tails(None)
        undrained = ""  # if the queues do not drain, the history is still checked, then reported
        try:
            wait_until(
                lambda: run.all_done(tails), PROFILE.drain, interval=0.5,
                message=lambda: "every published message done and every queue empty\n"
                + run.drain_report(tails),
            )  # fmt: skip
        except AssertionError as exc:
            undrained = str(exc)
        finally:
            for tail in tails:
                tail.close()
        run.stop_file.write_text("stop")
        for name, (proc, _setup) in run.workers.items():
            assert proc.wait(60) == 0, f"worker {name} failed: see {run.logs / name}.err"
        with QueueClient(run.coordinator.address or "", timeout=10) as client:
            for stats in client.stats() if not undrained else []:
                run.record(
                    "stats", q=stats.queue, epoch=run.epoch, available=stats.available,
                    leased=stats.leased, inactive=stats.inactive,
                    delivered_total=stats.delivered_total, acked_total=stats.acked_total,
                    dead_lettered_total=stats.dead_lettered_total,
                )  # fmt: skip
        assert run.coordinator.stop() == 0, run.coordinator.log_tail()
    finally:
        stop.set()
        run.stop_file.write_text("stop")
        for proc, _setup in run.workers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        run.coordinator.kill()
        run.client_proxy.close()

    history = [*run.events, *run.worker_events(), *run.broker_events(None)]
    write_history(tmp_path / "history.jsonl", history)
    elapsed = time.monotonic() - started
    violations = []
    total_ops = 0
    for s in SETUPS:
        spec = s.spec(run.queues[s.key])
        found = check(history, spec)
        summary = summarize(history, spec, found)
        print(summary.line())
        total_ops += summary.total_operations
        violations.extend(found)
    # the harness's faults apply to every queue: counted once, from one queue's summary
    faults = summarize(history, SETUPS[0].spec(run.queues["alo"]), [])
    by_kind = ", ".join(f"{n} {k}" for k, n in sorted(faults.injected.items()))
    reconnects = sum(
        summarize(history, s.spec(run.queues[s.key]), []).faults["client reconnect"] for s in SETUPS
    )
    print(
        f"history run: profile={PROFILE.name} seed={seed}: {total_ops:,} operations checked,"
        f" {run.injected} faults injected in {faulted:.0f}s ({by_kind}; the last restart not"
        f" counted), {reconnects} library reconnects, {len(run.start_failures)} failed"
        f" coordinator starts, violations={len(violations)}, {elapsed:.0f}s (in faults:"
        f" {', '.join(f'{k} {v:.0f}s' for k, v in run.fault_seconds.most_common())});"
        f" history in {tmp_path / 'history.jsonl'}"
    )
    problems = []
    if violations:
        kinds_found = Counter(v.kind for v in violations)
        shown = sorted(violations, key=lambda v: v.kind == "lost")[:10]  # the rarer kinds first
        problems.append(
            f"{len(violations)} violations {dict(kinds_found)}:\n"
            + "\n".join(v.excerpt() for v in shown)
        )
    if undrained:
        problems.append(f"the queues did not drain: {undrained}")
    if run.start_failures:
        problems.append(
            f"{len(run.start_failures)} coordinator starts failed (each was retried):\n"
            + "\n\n".join(run.start_failures)
        )
    if run.injected < PROFILE.faults:
        problems.append(f"{run.injected} faults injected, fewer than {PROFILE.faults}")
    assert not problems, f"seed={seed}: " + "\n\n".join(problems)
