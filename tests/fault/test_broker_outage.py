"""The coordinator rides out Kafka outages: the broker paused (SIGSTOP) or its connections cut
or stalled by a TCP proxy, while consumer processes ack and a producer publishes.

Each test has its own Tansu broker (pausing it must not disturb other tests), advertised at the
proxy's address so that every Kafka client of the coordinator goes through the proxy. Checked:
the coordinator process stays up; stats answer during the outage; publishes through the API
fail fast with UNAVAILABLE and the reason; its log says "unreachable" once and "reachable again
after N s" once; afterwards every published message was acked by a consumer, nothing whose ack
was confirmed is delivered again, and leases that ran out during the outage came back.
``QLAYER_SOAK=1`` makes the long pause longer.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    Producer,
    TopicPartition,
)

from layer.client import QueueClient
from tests.fault.proxied_broker import Tansu
from tests.harness import CoordinatorProcess, start_worker, worker_events, write_config
from tests.helpers import wait_until
from tests.proxy import TcpProxy

pytestmark = pytest.mark.fault

SOAK = os.environ.get("QLAYER_SOAK") == "1"
LONG_PAUSE = 300.0 if SOAK else 120.0
WORKERS = 2
HELD = 5  # messages a consumer takes and never acks: their leases run out in the outage
LEASE = "4s"
UNREACHABLE = "Kafka is unreachable"
REACHABLE = "Kafka is reachable again after"


@dataclass
class Publisher:
    """Publishes numbered messages straight to Kafka (as any producer would), ~200 a second,
    and keeps the keys of those whose delivery the broker confirmed (a delivery confirmed
    after retries across the outage may come without its offset)."""

    bootstrap: str
    topic: str
    confirmed: set[bytes] = field(default_factory=set)
    sent: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )

        def delivered(err: object, msg: object) -> None:
            if err is None:
                m: Message = msg  # type: ignore[assignment]
                self.confirmed.add(m.key() or b"")

        while not self.stop.is_set():
            for _ in range(10):
                producer.produce(
                    self.topic, key=str(self.sent).encode(), value=json.dumps({"i": self.sent}),
                    on_delivery=delivered,
                )  # fmt: skip
                self.sent += 1
            producer.poll(0.05)
        assert producer.flush(120) == 0, "published messages not delivered after the outage"


def _slow_stats(probe: ApiProbe, coord: CoordinatorProcess) -> str:
    """The stats calls that took 2 s or more, each with when it began (the coordinator log's
    clock) and the coordinator's log lines while it waited."""
    slow = [
        (began, seconds)
        for began, seconds in zip(probe.stats_began, probe.stats_seconds, strict=True)
        if seconds >= 2.0
    ]
    lines = coord.log_tail(400).splitlines()
    out = [f"{len(probe.stats_seconds)} stats calls, {len(slow)} took 2 s or more"]
    for began, seconds in slow:
        start, end = _log_stamp(began - 1), _log_stamp(began + seconds + 1)
        out.append(f"began {_log_stamp(began)}, took {seconds:.2f} s; the log meanwhile:")
        out += [line for line in lines if start <= line[:23] <= end]
    return "\n".join(out)


def _log_stamp(wall: float) -> str:
    """``wall`` as the coordinator log writes its time (``2026-12-07 22:47:55,401``)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))
    return f"{stamp},{int(wall % 1 * 1000):03d}"


@dataclass
class ApiProbe:
    """What the API answered during the outage: stats latencies and publish outcomes."""

    stats_seconds: list[float] = field(default_factory=list)
    # the wall-clock start of each stats call (the coordinator log's clock)
    stats_began: list[float] = field(default_factory=list)
    # (seconds, error text or None)
    publishes: list[tuple[float, str | None]] = field(default_factory=list)

    def sample(self, client: QueueClient, queue: str) -> None:
        started = time.monotonic()
        self.stats_began.append(time.time())
        client.stats(queue)
        self.stats_seconds.append(time.monotonic() - started)
        started = time.monotonic()
        try:
            client.publish(queue, {"api": True})
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.publishes.append((time.monotonic() - started, error))


def get(address: str, path: str) -> tuple[int, dict]:
    """One HTTP GET on a new connection: (status, JSON body)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        return response.status, json.loads(body) if body else {}
    finally:
        connection.close()


class ReadinessPoller:
    """Polls ``/readyz`` from a thread and keeps every change: (monotonic time, status, reasons).
    The HTTP listener is the coordinator's own, untouched by any Kafka fault: it must answer
    throughout."""

    def __init__(self, address: str, interval: float = 0.1) -> None:
        self._address = address
        self._interval = interval
        self._stop = threading.Event()
        self.changes: list[tuple[float, int, list[str]]] = []
        self.answers = 0
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadinessPoller:
        self._thread.start()
        wait_until(lambda: self.answers or self.errors, 30, message="no /readyz answer")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, body = get(self._address, "/readyz")
            except OSError as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            else:
                self.answers += 1
                if not self.changes or self.changes[-1][1] != status:
                    self.changes.append((time.monotonic(), status, list(body.get("reasons", []))))
            self._stop.wait(self._interval)  # the pace of the polls, not a wait for a condition

    @property
    def status(self) -> int | None:
        return self.changes[-1][1] if self.changes else None

    def first(self, status: int, after: float) -> tuple[float, list[str]] | None:
        """When readiness first turned ``status`` after ``after`` (monotonic), and why."""
        return next(((t, r) for t, s, r in self.changes if s == status and t >= after), None)


def _acks_sent(log_dir: Path) -> set[str]:
    """The bookmarks the workers handed an ack to their client for."""
    return {e["b"] for e in worker_events(log_dir) if e["ev"] == "sent"}


def _read_topic(bootstrap: str, topic: str) -> dict[str, bytes]:
    """bookmark -> key of every message in ``topic`` (one partition), read to its end."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex}",
         "enable.auto.commit": False, "enable.partition.eof": True}
    )  # fmt: skip
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    found: dict[str, bytes] = {}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                if m.error() is None:
                    found[f"{topic}/{m.partition()}/{m.offset()}"] = m.key() or b""
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    return found
        raise AssertionError(f"{topic} not read to its end in 60 s")
    finally:
        consumer.close()


def _log_count(coord: CoordinatorProcess, text: str) -> int:
    return coord.log_path.read_text(errors="replace").count(text)


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Callable[[], tuple[Tansu, CoordinatorProcess, str, str]]]:
    """Make (broker, coordinator, queue, topic); all stopped at teardown."""
    made: list[tuple[Tansu, CoordinatorProcess]] = []

    def make() -> tuple[Tansu, CoordinatorProcess, str, str]:
        broker = Tansu(tmp_path / "tansu.log")
        topic = f"outage-{uuid.uuid4().hex[:8]}"
        queue = f"q-{uuid.uuid4().hex[:8]}"
        cfg = write_config(
            tmp_path / "qlayer.toml",
            broker.bootstrap,
            [{"name": queue, "underlying_topic": topic, "lease_period": LEASE,
              "max_per_subscription_backlog": 50, "dead_letter_topic": f"{topic}.dlq"}],
            coordinator={"id": f"c-{uuid.uuid4().hex[:8]}", "http": "127.0.0.1:0"},
        )  # fmt: skip
        coord = CoordinatorProcess(cfg, tmp_path / "state", tmp_path / "coordinator.log")
        made.append((broker, coord))
        coord.start()
        return broker, coord, queue, topic

    yield make
    for broker, coord in made:
        coord.stop()
        broker.stop()


def _ride_out(
    tmp_path: Path,
    made: tuple[Tansu, CoordinatorProcess, str, str],
    fault: Callable[[Tansu], None],
    heal: Callable[[Tansu], None],
    outage: float,
    label: str,
) -> None:
    broker, coord, queue, topic = made
    assert coord.address is not None
    addr_file, stop_file = tmp_path / "addr", tmp_path / "stop"
    addr_file.write_text(coord.address)
    publisher = Publisher(broker.bootstrap, topic)
    pub_thread = threading.Thread(target=publisher.run, daemon=True)
    pub_thread.start()
    workers = [
        start_worker(addr_file, queue, tmp_path / f"worker-{i}.jsonl", stop_file, f"w{i}")
        for i in range(WORKERS)
    ]
    probe = ApiProbe()
    assert coord.http_address is not None
    readiness = ReadinessPoller(coord.http_address)
    try:
        with readiness, QueueClient(coord.address, timeout=30) as client:
            wait_until(
                lambda: sum(e["ev"] == "acked" for e in worker_events(tmp_path)) >= 300,
                60,
                message="consumers acking before the outage",
            )
            # a consumer that takes messages and never acks them: the leases run out while
            # Kafka is away, and the messages must come back to the others afterwards
            with client.subscribe(queue, max_backlog=HELD) as holder:
                held = []
                while len(held) < HELD:
                    msg = holder.next(timeout=30)
                    assert msg is not None, "the holder got no message"
                    held.append(msg.bookmark)
                # no more for it: what it holds must go to the others when its leases run out
                holder.replace(max_backlog=0)
                assert readiness.status == 200, readiness.changes
                fault(broker)
                faulted = time.monotonic()
                wait_until(
                    lambda: _log_count(coord, UNREACHABLE) >= 1,
                    15,
                    message=lambda: f"no '{UNREACHABLE}' line; log:\n{coord.log_tail()}",
                )
                detected = time.monotonic() - faulted
                not_ready = wait_until(
                    lambda: readiness.first(503, faulted),
                    15,
                    message=lambda: f"/readyz never said 503: {readiness.changes}",
                )
                while time.monotonic() - faulted < outage:
                    probe.sample(client, queue)
                    assert coord.running, f"the coordinator exited:\n{coord.log_tail()}"
                    time.sleep(0.3)  # the pace of the API samples, not a wait for a condition
                heal(broker)
                sent_at_heal = publisher.sent
                healed_at = time.time()
                healed = time.monotonic()
                wait_until(
                    lambda: _log_count(coord, REACHABLE) >= 1,
                    60,
                    message=lambda: f"no '{REACHABLE}' line; log:\n{coord.log_tail()}",
                )
                back = time.monotonic() - healed
                ready_again = wait_until(
                    lambda: readiness.first(200, healed),
                    30,
                    message=lambda: f"/readyz not 200 again after the heal: {readiness.changes}",
                )
                resumed = wait_until(
                    lambda: next(
                        (e["t"] for e in worker_events(tmp_path)
                         if e["ev"] == "acked" and e["t"] > healed_at),
                        None,
                    ),
                    120,
                    message="no confirmed ack after the outage",
                )  # fmt: skip
                # the holder is still subscribed: only its leases running out bring these back
                wait_until(
                    lambda: set(held) <= _acks_sent(tmp_path),
                    60,
                    message="the held messages did not come back to the consumers",
                )
            # publish on for a moment after the outage, then let everything drain
            wait_until(lambda: len(publisher.confirmed) >= sent_at_heal, 120)
            publisher.stop.set()
            pub_thread.join(150)
            # every message in the topic (a producer's retry may have written one twice: both
            # are queued), and every confirmed publish among them
            in_topic = _read_topic(broker.bootstrap, topic)
            assert publisher.confirmed <= set(in_topic.values()), "a confirmed publish is lost"
            expected = set(in_topic)

            def all_acked() -> bool:
                if not expected <= _acks_sent(tmp_path):
                    return False
                stats = client.stats(queue)[0]
                return stats.available == 0 and stats.leased == 0 and stats.inactive == 0

            def left() -> str:
                offset = lambda b: int(b.rsplit("/", 1)[1])  # noqa: E731
                missing = sorted(expected - _acks_sent(tmp_path), key=offset)
                return (
                    f"messages left after the outage: {len(missing)} published never acked"
                    f" ({missing[:3]}...{missing[-3:]}), stats {client.stats(queue)[0]}"
                )

            wait_until(all_acked, 180, interval=0.5, message=left)
            final = client.stats(queue)[0]
    finally:
        publisher.stop.set()
        stop_file.write_text("stop")
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()

    assert coord.running, f"the coordinator exited:\n{coord.log_tail()}"
    events = worker_events(tmp_path)
    stale = _check(events, expected, held, final.acked_total, final.dead_lettered_total)
    # the API during the outage: stats from memory, publishes refused at once with the reason
    assert probe.stats_seconds and max(probe.stats_seconds) < 2.0, _slow_stats(probe, coord)
    refused = [(s, e) for s, e in probe.publishes if e is not None and "refused" in e]
    assert refused, f"no publish refused during the outage: {probe.publishes}"
    # BrokerError: the client's class for the wire's UNAVAILABLE / "unavailable" (one table)
    assert all(
        e.startswith("BrokerError: ") and "Kafka unreachable for" in e for _, e in refused
    ), refused
    assert max(s for s, _ in refused) < 1.0, refused
    assert _log_count(coord, UNREACHABLE) == 1, coord.log_tail(80)
    assert _log_count(coord, REACHABLE) == 1, coord.log_tail(80)
    # readiness: ready, not ready while Kafka was away (saying why), ready again; the
    # listener answered every poll
    assert not readiness.errors, readiness.errors[:3]
    assert [s for _, s, _ in readiness.changes] == [200, 503, 200], readiness.changes
    assert any(r.startswith("Kafka unreachable for ") for r in not_ready[1]), not_ready
    print(
        f"\n{label}: outage {outage:.1f} s, detected after {detected:.1f} s"
        f" (/readyz 503 after {not_ready[0] - faulted:.1f} s),"
        f" reachable again {back:.1f} s after the heal (/readyz 200 after"
        f" {ready_again[0] - healed:.1f} s), first confirmed ack"
        f" {resumed - healed_at:.2f} s after the heal; {len(expected)} published,"
        f" {sum(e['ev'] == 'acked' for e in events)} acks confirmed,"
        f" {len(probe.publishes)} API publishes in the outage ({len(refused)} refused,"
        f" slowest refusal {max(s for s, _ in refused) * 1000:.0f} ms),"
        f" stats answered in {max(probe.stats_seconds) * 1000:.0f} ms at worst;"
        f" {stale} stale copies read after their message's confirmed ack"
    )


def _check(
    events: list[dict],
    expected: set[str],
    held: list[str],
    acked_total: int,
    dead_lettered_total: int,
) -> int:
    """The outcome's invariants; returns how many copies a consumer read after its message's
    ack was confirmed that the coordinator had handed out before (stale copies, allowed).

    When a message was leased is the coordinator's clock: its lease deadline less the lease
    period (``dl`` of a "got" event). A consumer's read time is no measure of it: a consumer
    that waits on its acks' answers through an outage leaves pushed messages unread, their
    leases run out and the coordinator leases them again (to it or to the other consumer)
    before any of its acks is answered; copies it reads after that are older than the ack."""
    period = float(LEASE.rstrip("s"))
    # bookmark -> (leased at, worker) of every delivery a consumer saw
    grants: dict[str, list[tuple[float, str]]] = defaultdict(list)
    got: dict[str, list[tuple[float, int]]] = defaultdict(list)
    acks: list[tuple[str, str, float]] = []  # (bookmark, worker, confirmed at)
    sent: set[str] = set()
    for e in events:
        if e["ev"] == "got":
            got[e["b"]].append((e["t"], e["n"]))
            grants[e["b"]].append((e["dl"] - period, e["w"]))
        elif e["ev"] == "sent":
            sent.add(e["b"])
        elif e["ev"] == "acked":
            acks.append((e["b"], e["w"], e["t"]))
    missing = expected - sent
    assert not missing, f"{len(missing)} published messages never acked, e.g. {sorted(missing)[:5]}"
    assert dead_lettered_total == 0
    acked_at: dict[str, float] = {}
    for bookmark, _w, t in acks:
        acked_at[bookmark] = min(t, acked_at.get(bookmark, t))
    # nothing whose ack was confirmed is leased again
    again = [
        (b, sorted(grants[b]), acked_at[b])
        for b in acked_at
        if any(leased > acked_at[b] for leased, _ in grants[b])
    ]
    assert not again, f"leased again after a confirmed ack (leases, ack): {again[:3]}"
    # leasing is strict: an ack is confirmed only to the subscription that held the lease, so
    # the last lease before the confirmation went to the consumer that acked (every lease a
    # consumer was handed is in its log: none leaves its subscription before the end)
    wrong = []
    for bookmark, worker, t in acks:
        before = [g for g in grants[bookmark] if g[0] < t]
        if before and max(before)[1] != worker:
            wrong.append((bookmark, worker, t, sorted(grants[bookmark])))
    assert not wrong, f"an ack confirmed to a consumer that no longer held the lease: {wrong[:3]}"
    # the held messages' leases ran out during the outage: each came back and was acked
    for bookmark in held:
        assert bookmark in sent, f"held message {bookmark} never came back"
        assert max(n for _, n in got[bookmark]) >= 2, got[bookmark]
    assert acked_total >= len(expected)
    return sum(1 for b, ds in got.items() if b in acked_at for t, _ in ds if t > acked_at[b])


def test_broker_paused_5s(tmp_path: Path, setup) -> None:
    _ride_out(tmp_path, setup(), Tansu.pause, Tansu.resume, 5.0, "broker SIGSTOP 5 s")


def test_broker_paused_30s(tmp_path: Path, setup) -> None:
    _ride_out(tmp_path, setup(), Tansu.pause, Tansu.resume, 30.0, "broker SIGSTOP 30 s")


@pytest.mark.timeout(LONG_PAUSE + 420)
def test_broker_paused_long(tmp_path: Path, setup) -> None:
    label = f"broker SIGSTOP {LONG_PAUSE:.0f} s"
    _ride_out(tmp_path, setup(), Tansu.pause, Tansu.resume, LONG_PAUSE, label)


def _cut(broker: Tansu) -> None:
    broker.proxy.refuse()
    broker.proxy.drop()


def _heal(broker: Tansu) -> None:
    broker.proxy.heal()


def test_connections_cut_by_the_proxy(tmp_path: Path, setup) -> None:
    _ride_out(tmp_path, setup(), _cut, _heal, 10.0, "proxy drop + refuse 10 s")


def test_connections_stalled_by_the_proxy(tmp_path: Path, setup) -> None:
    stall = TcpProxy.stall
    _ride_out(tmp_path, setup(), lambda b: stall(b.proxy), _heal, 10.0, "proxy stall 10 s")


# --- a coordinator started while Kafka is down ---------------------------------------------------

WAITING = "waiting for Kafka"


def _start_while_down(
    tmp_path: Path, broker: Tansu, down: str, name: str
) -> tuple[CoordinatorProcess, str]:
    """A coordinator started against the unreachable ``broker``; returns once its HTTP listener
    answers. Paused, it waits to detect the broker's kind; refused, it is told the kind
    (``profile = "tansu"``) and waits all the same: what follows needs the broker."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    cfg = write_config(
        tmp_path / f"{name}.toml",
        broker.bootstrap,
        [{"name": queue, "underlying_topic": f"late-{uuid.uuid4().hex[:8]}"}],
        coordinator={"id": f"c-{uuid.uuid4().hex[:8]}", "http": "127.0.0.1:0"},
        broker={} if down == "paused" else {"profile": "tansu"},
    )
    coord = CoordinatorProcess(cfg, tmp_path / f"{name}-state", tmp_path / f"{name}.log")
    coord.start(until="http")
    return coord, queue


def _waits_for_kafka(coord: CoordinatorProcess) -> tuple[int, dict]:
    """Alive, not ready, and saying that it waits for Kafka (within a deadline)."""
    assert coord.http_address is not None
    address = coord.http_address

    def waiting() -> tuple[int, dict] | None:
        assert coord.running, f"the coordinator exited:\n{coord.log_tail()}"
        status, body = get(address, "/readyz")
        if status == 503 and any(WAITING in r for r in body.get("reasons", [])):
            return status, body
        return None

    answer = wait_until(
        waiting,
        30,
        interval=0.1,
        message=lambda: f"/readyz never said '{WAITING}': {get(address, '/readyz')}",
    )
    assert get(address, "/healthz") == (200, {"status": "alive"})
    return answer


@pytest.mark.parametrize("down", ["paused", "refused"])
def test_started_while_kafka_is_down(tmp_path: Path, down: str) -> None:
    """Two coordinators started while the broker is paused by SIGSTOP, or refused by the
    proxy: both stay up and say they wait for Kafka; one is stopped by SIGTERM meanwhile (it
    exits 0 at once), the other serves once Kafka is back."""
    broker = Tansu(tmp_path / "tansu.log")
    coords: list[CoordinatorProcess] = []
    try:
        if down == "paused":
            broker.pause()
        else:
            _cut(broker)
        coord, queue = _start_while_down(tmp_path, broker, down, "served")
        coords.append(coord)
        stopped, _ = _start_while_down(tmp_path, broker, down, "stopped")
        coords.append(stopped)
        _, body = _waits_for_kafka(coord)
        _waits_for_kafka(stopped)
        # SIGTERM while it waits: a clean stop, at once
        assert stopped.proc is not None
        began = time.monotonic()
        stopped.proc.send_signal(signal.SIGTERM)
        try:
            code = stopped.proc.wait(30)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"SIGTERM did not stop it in 30 s:\n{stopped.log_tail()}"
            ) from None
        took = time.monotonic() - began
        assert code == 0, stopped.log_tail()
        assert took < 5.0, f"stopping took {took:.1f} s"
        # the other stays up, not ready, for as long as Kafka is away (here a few seconds)
        assert coord.http_address is not None
        address = coord.http_address
        while time.monotonic() - began < 4.0:
            assert coord.running, f"the coordinator exited:\n{coord.log_tail()}"
            status, later = get(address, "/readyz")
            assert status == 503 and later["ready"] is False, later
            assert get(address, "/healthz")[0] == 200
            time.sleep(0.2)  # the pace of the polls, not a wait for a condition
        assert _log_count(coord, WAITING) == 1, coord.log_tail(40)
        if down == "paused":
            broker.resume()
        else:
            _heal(broker)
        healed = time.monotonic()
        api = coord.wait_serving(60)
        serving = time.monotonic() - healed
        status, ready = wait_until(
            lambda: (r := get(address, "/readyz"))[0] == 200 and r,
            30,
            message="not ready once serving",
        )
        assert ready["ready"] is True and ready["kafka_reachable"] is True, ready
        # it serves: publish through the API, consume and ack
        with QueueClient(api, timeout=30) as client:
            published = {str(client.publish(queue, {"i": i})) for i in range(5)}
            with client.subscribe(queue, max_backlog=5) as sub:
                got = set()
                while got != published:
                    msg = sub.next(timeout=30)
                    assert msg is not None, f"got {got} of {published}"
                    msg.ack(wait=True)
                    got.add(msg.bookmark)
        assert coord.stop() == 0, coord.log_tail()
        print(
            f"\nstarted while Kafka was {down}: /readyz said {body['reasons']}; SIGTERM meanwhile:"
            f" exit 0 after {took:.2f} s; the other served {serving:.1f} s after the heal,"
            " published and consumed 5"
        )
    finally:
        for c in coords:
            c.kill()
        broker.stop()
