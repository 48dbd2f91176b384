"""Spark views benchmark: the batch view of a large queue, and streaming freshness under load.

Measures, against the embedded broker and real coordinator processes (results to
``bench/results/spark-views-<time>.json``):

- **batch view**: ``queue_contents(spark, queue).count()`` and a ``live_aggregate`` by symbol
  over a queue holding ``--messages`` (default 1,000,000) available messages, i.e. that many
  +1 records in its view topic; the first action of the session (Python workers start) and
  the best of two more; plus the ``qlayer_view`` range reader alone, without Spark.
- **streaming freshness**: ``--rate`` (default 1,000) msg/s offered to a queue that consumers
  drain (ack as they go) while a streaming ``live_aggregate`` runs with a ``--trigger``
  processing-time trigger. The load (a publisher process, ``--ackers`` consumer processes)
  begins once the stream has caught up with the queue (its first micro-batch done: a
  dashboard that is running) and its processes are connected; the rate reported is what the
  broker confirmed while it ran, with its slowest second, and the acks a second. Every ``--probe-every``-th message is a probe with a symbol of its
  own, leased once the aggregate has shown it and acked with ``wait=True``; its freshness is
  the time from the ack's return (the done record is durable) to the ``foreachBatch`` call
  whose result shows its group emptied. A message leaves the live contents when it is leased,
  before the consumer gets and acks it, so an update can come before the ack returns (a
  negative figure); delivery-to-update is reported too, and **change-to-update**: from the
  time of the coordinator round that leased the probe (its -1 change's ``changed_at``, taken
  just before the round's transaction commits) to the update, the delay a dashboard adds to
  what the queue does. Also publish-to-update for the probe entering the aggregate.

Run: ``python -m bench.spark_bench [--quick]`` (needs the ``spark`` extra and Java 17).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from connectors import TopicAdmin, TopicSpec, admin_settings, client_settings  # noqa: E402
from connectors.embedded import EmbeddedBroker  # noqa: E402
from connectors.kafka import read_watermarks  # noqa: E402
from layer.client import QueueClient  # noqa: E402

#: the first seconds of the offered load, apart in ``ack_to_update_steady``
WARMUP_S = 10.0
SCHEMA = "id INT, sym STRING, qty INT, price DOUBLE, probe BOOLEAN"
SYMBOLS = ("ACME", "INIT", "TECH", "QLAY", "KAFK")
_PAD = "x" * 120


def say(text: str) -> None:
    print(f"[spark-bench] {text}", flush=True)


def percentiles(values: list[float]) -> dict[str, float]:
    """Percentiles in milliseconds of ``values`` in seconds."""
    if not values:
        return {}
    v = sorted(values)

    def at(q: float) -> float:
        return round(v[min(len(v) - 1, int(q * len(v)))] * 1000.0, 1)

    return {
        "count": len(v),
        "p50_ms": at(0.50),
        "p90_ms": at(0.90),
        "p99_ms": at(0.99),
        "max_ms": round(v[-1] * 1000.0, 1),
        "mean_ms": round(statistics.fmean(v) * 1000.0, 1),
    }


def order(i: int, probe: bool = False) -> bytes:
    """A ~200-byte JSON order; a probe has a symbol of its own."""
    doc = {
        "id": i,
        "sym": f"P-{i}" if probe else SYMBOLS[i % len(SYMBOLS)],
        "qty": 1 + i % 9,
        "price": 10 + (i % 7) * 0.25,
        "pad": _PAD,
    }
    if probe:
        doc["probe"] = True
    return json.dumps(doc).encode()


class Coordinator:
    """``qlayer coordinator`` as a child process with one queue that has a view topic."""

    def __init__(self, workdir: Path, bootstrap: str, queue: str, topic: str) -> None:
        self.config = workdir / f"{queue}.toml"
        self.config.write_text(
            f'[broker]\nbootstrap_servers = "{bootstrap}"\n\n'
            f'[coordinator]\nid = "bench-{queue}"\nlisten = "127.0.0.1:0"\n'
            f'state_dir = "{workdir / (queue + "-state")}"\n\n'
            f'[[queue]]\nname = "{queue}"\nunderlying_topic = "{topic}"\n'
            f'view_topic = "{queue}.view"\nlease_period = "60s"\n'
            "max_per_subscription_backlog = 1000\n"
        )
        log = open(workdir / f"{queue}-coordinator.log", "wb")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(self.config)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
        )
        log.close()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("qlayer coordinator serving on"):
            raise RuntimeError(f"the coordinator did not start; see {workdir}")
        self.address = line.rsplit(" ", 1)[1]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


#: settings of the measured session, as ``spark.local_session`` starts one (more with
#: $BENCH_SPARK_CONF="key=value,key=value"; $BENCH_DEFAULT_CONF=1: without these)
SESSION_CONF: dict[str, str] = {}


def start_spark() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master("local[2]")
        .appName("qlayer-spark-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        # every micro-batch's progress, for the freshness stages (not only the last 100)
        .config("spark.sql.streaming.numRecentProgressUpdates", "2000")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
    )
    from spark.session import STREAMING_CONF

    defaults = {} if os.environ.get("BENCH_DEFAULT_CONF") else STREAMING_CONF
    # one shuffle partition (STREAMING_CONF's too): one state store, and live_aggregate runs
    # each micro-batch as one stage
    shuffle = os.environ.get("BENCH_SHUFFLE_PARTITIONS", "1")
    for key, value in {**defaults, "spark.sql.shuffle.partitions": shuffle, **SESSION_CONF}.items():
        builder = builder.config(key, value)
    for pair in filter(None, os.environ.get("BENCH_SPARK_CONF", "").split(",")):
        key, _, value = pair.partition("=")
        builder = builder.config(key.strip(), value.strip())
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def view_end(bootstrap: str, topic: str) -> int:
    """Where a read_committed reader ends, summed over the generations of the view topic."""
    from layer.viewgen import generations

    admin = TopicAdmin(admin_settings(client_settings(bootstrap, {})))
    topics = [t for _n, t in generations(topic, admin.list_topics())]
    settings = {"bootstrap.servers": bootstrap}
    parts = [(t, 0) for t in topics]
    marks = read_watermarks(settings, parts, isolation_level="read_committed")
    return sum(mark.high for mark in marks.values())


def _epoch(timestamp: str) -> float:
    """Seconds since the epoch of a progress report's ISO timestamp (UTC, ``...Z``)."""
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


class LoadSampler:
    """The machine's 1-minute load average every 2 s while a measurement runs (it is shared)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(2.0):
                return

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, float]:
        v = self.samples or [os.getloadavg()[0]]
        return {"min": round(min(v), 2), "median": round(statistics.median(v), 2),
                "max": round(max(v), 2)}  # fmt: skip


def timed(action: Any) -> tuple[float, Any]:
    started = time.monotonic()
    result = action()
    return time.monotonic() - started, result


def patient_stats(client: QueueClient, queue: str) -> Any:
    """The queue's stats, asked again while the coordinator is too busy to answer in time (a
    view snapshot of millions of messages holds its event loop for seconds)."""
    from layer.exceptions import ClientError

    for _ in range(30):
        try:
            return client.stats(queue)[0]
        except ClientError as exc:
            say(f"  stats: {exc}; asking again")
            time.sleep(2)
    return client.stats(queue)[0]


def spark_cpu_s(spark: Any) -> dict[str, float]:
    """CPU seconds (user + system) used so far by Spark's JVM (``jvm``) and the Python
    processes it started (``python``: the data source's driver-side process, the workers):
    less at the mercy of the shared machine's load than wall time, to compare settings by."""
    import psutil

    root = psutil.Process(spark.sparkContext._gateway.proc.pid)
    total = {"jvm": 0.0, "python": 0.0}
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            kind = "jvm" if "java" in proc.name() else "python"
        except psutil.Error:
            continue  # a worker that ended: its time is lost to both ends of a difference
        total[kind] += times.user + times.system
    return total


class PeakMemory:
    """The peak resident memory of Spark's processes while running: the JVM (driver and, on
    local[N], the executor) and its Python workers, sampled every 0.2 s."""

    def __init__(self, spark: Any) -> None:
        import psutil

        self._root = psutil.Process(spark.sparkContext._gateway.proc.pid)
        self.jvm = self.workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        import psutil

        while not self._stop.wait(0.2):
            try:
                procs = [self._root, *self._root.children(recursive=True)]
                jvm = workers = 0
                for proc in procs:
                    rss = proc.memory_info().rss
                    if "java" in proc.name():
                        jvm += rss
                    elif "python" in proc.name():
                        workers += rss
            except psutil.Error:
                continue
            self.jvm, self.workers = max(self.jvm, jvm), max(self.workers, workers)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def as_dict(self) -> dict[str, float]:
        return {
            "jvm_peak_mb": round(self.jvm / 2**20),
            "python_workers_peak_mb": round(self.workers / 2**20),
        }


# -- the batch view --------------------------------------------------------------------------


def batch_view(spark: Any, broker: EmbeddedBroker, workdir: Path, messages: int) -> dict[str, Any]:
    from connectors.spark_kafka import ViewInputPartition, ViewSourceOptions
    from connectors.spark_kafka.view import read_view_range
    from spark import live_aggregate, queue_contents

    bootstrap = broker.bootstrap_servers
    admin = TopicAdmin(admin_settings(client_settings(bootstrap, {})))
    admin.ensure_topics([TopicSpec("big.orders", partitions=4)])
    coordinator = Coordinator(workdir, bootstrap, "big", "big.orders")
    try:
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "queue.buffering.max.messages": 1_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
            }
        )
        started = time.monotonic()
        for i in range(messages):
            while True:
                try:
                    producer.produce("big.orders", order(i), partition=i % 4)
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 10_000 == 0:
                producer.poll(0)
        producer.flush(60)
        say(f"published {messages:,} orders in {time.monotonic() - started:.1f}s")
        with QueueClient(coordinator.address) as client:
            last = time.monotonic()
            while (stats := patient_stats(client, "big")).available < messages:
                if time.monotonic() - last > 10:
                    say(f"  queued {stats.available:,} of {messages:,}")
                    last = time.monotonic()
                time.sleep(0.5)
        ingest_s = time.monotonic() - started
        end = view_end(bootstrap, "big.view")
        while True:  # the last rounds' view records are committed with their state
            time.sleep(1)
            now = view_end(bootstrap, "big.view")
            if now == end:
                break
            end = now
        say(f"queue holds {messages:,} available; view topic ends at {end:,} ({ingest_s:.1f}s)")
        config = coordinator.config

        def count() -> int:
            return int(queue_contents(spark, "big", config=config).count())

        def aggregate() -> list[Any]:
            contents = queue_contents(spark, "big", config=config, schema=SCHEMA)
            totals = live_aggregate(contents, by="sym", sum={"value": "price * qty"})
            return list(totals.collect())

        with PeakMemory(spark) as memory:
            first_s, rows = timed(count)
        say(f"peak memory of Spark's processes during the count: {memory.as_dict()}")
        assert rows == messages, f"the view has {rows:,} rows, the queue {messages:,}"
        say(f"batch view count, first action of the session: {first_s:.1f}s")
        repeats = 2 if messages <= 2_000_000 else 1  # 10M: each action takes minutes
        warm = [timed(count)[0] for _ in range(repeats)]
        say(f"batch view count, warm: {min(warm):.1f}s")
        aggregate_runs = [timed(aggregate) for _ in range(repeats)]
        groups = aggregate_runs[-1][1]
        assert sum(row["count"] for row in groups) == messages
        say(f"batch aggregate by symbol: {min(t for t, _ in aggregate_runs):.1f}s")

        options = ViewSourceOptions.parse(
            {"kafka.bootstrap.servers": bootstrap, "subscribe": "big.view"}
        )
        from layer.viewgen import generations

        admin = TopicAdmin(admin_settings(client_settings(bootstrap, {})))
        newest, newest_end = "big.view", 0
        for _n, topic in reversed(generations("big.view", admin.list_topics())):
            newest, newest_end = topic, view_end(bootstrap, topic)
            if newest_end:
                break  # the newest generation holding records: one snapshot and the tail
        whole = ViewInputPartition(newest, 0, 0, newest_end, True)
        reader_s, read = timed(lambda: sum(b.num_rows for b in read_view_range(options, whole)))
        assert read == messages
        say(f"qlayer_view reader alone (one process, no Spark): {reader_s:.1f}s")
        return {
            "messages": messages,
            "view_records": end,
            "ingest_s": round(ingest_s, 1),
            "count_first_action_s": round(first_s, 2),
            "count_first_action_memory": memory.as_dict(),
            "splits": spark.sparkContext.defaultParallelism,
            "count_warm_s": round(min(warm), 2),
            "aggregate_by_symbol_s": round(min(t for t, _ in aggregate_runs), 2),
            "reader_alone_s": round(reader_s, 2),
            "reader_alone_messages_per_s": round(messages / reader_s),
        }
    finally:
        coordinator.stop()


# -- streaming freshness ---------------------------------------------------------------------


def publisher_main(
    bootstrap: str, rate: int, probe_every: int, ready: Any, go: Any, stop: Any, out: Any
) -> None:
    """The offered load's publisher, in a process of its own: ``rate`` orders a second from
    ``go`` until ``stop``, every ``probe_every``-th a probe. Counts what the broker confirmed
    (delivery reports) while the load ran: the rate achieved, not only the rate asked for."""
    # linger 5 ms: a publisher that batches (one-message batches at linger 1 ms fell behind on
    # the shared broker: ~790 of the 1,000 msg/s offered reached it, and they slow fetches)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "queue.buffering.max.messages": 1_000_000}
    )
    producer.list_topics("fresh.orders", timeout=30)  # connected before the clock starts
    delivered = [0]
    per_second: dict[int, int] = {}
    began = [0.0]

    def confirmed(err: Any, _msg: Any) -> None:
        if err is None:
            delivered[0] += 1
            second = int(time.monotonic() - began[0])
            per_second[second] = per_second.get(second, 0) + 1

    published: dict[int, float] = {}
    ready.set()
    go.wait()
    started = began[0] = time.monotonic()
    i = 0
    while not stop.is_set():
        pause = started + i / rate - time.monotonic()
        if pause > 0.001:  # else go on: a late loop catches up, the rate is kept on average
            time.sleep(pause)
        probe = i % probe_every == 0
        while True:
            try:
                producer.produce("fresh.orders", order(i, probe=probe), on_delivery=confirmed)
                break
            except BufferError:
                producer.poll(0.05)
        if probe:
            published[i] = time.time()
        producer.poll(0)
        i += 1
    window = time.monotonic() - started
    producer.poll(0)
    in_window = delivered[0]
    producer.flush(60)
    whole = [n for s, n in per_second.items() if s + 1 <= window]  # full seconds of the load
    out.put(
        {
            "kind": "publisher",
            "published": i,
            "delivered_in_window": in_window,
            "delivered": delivered[0],
            "window_s": window,
            "delivered_per_s_min_1s": min(whole, default=0),
            "probes": published,
        }
    )


def acker_main(server: str, ready: Any, go: Any, stop: Any, out: Any) -> None:
    """One of the load's consumers, in a process of its own: acks every order that is not a
    probe from ``go`` until ``stop``."""
    acked = 0
    with (
        QueueClient(server) as client,
        client.subscribe("fresh", max_backlog=500, filter="/probe IS NULL") as sub,
    ):
        ready.set()
        go.wait()
        started = time.monotonic()
        while not stop.is_set():
            msg = sub.next(timeout=0.2)
            if msg is not None:
                msg.ack()
                acked += 1
        window = time.monotonic() - started
        sub.flush(30)
    out.put({"kind": "acker", "acked": acked, "window_s": window})


class Load:
    """The offered load: a publisher process and ``ackers`` consumer processes (the measuring
    process keeps its GIL for Spark's callbacks), started and connected before ``begin()``."""

    def __init__(self, bootstrap: str, server: str, rate: int, probe_every: int, ackers: int):
        ctx = mp.get_context("spawn")
        self._go, self._stop, self._out = ctx.Event(), ctx.Event(), ctx.Queue()
        self._ready = [ctx.Event() for _ in range(1 + ackers)]
        self._procs = [
            ctx.Process(
                target=publisher_main,
                args=(
                    bootstrap,
                    rate,
                    probe_every,
                    self._ready[0],
                    self._go,
                    self._stop,
                    self._out,
                ),
            )
        ] + [
            ctx.Process(target=acker_main, args=(server, r, self._go, self._stop, self._out))
            for r in self._ready[1:]
        ]
        for proc in self._procs:
            proc.start()
        deadline = time.monotonic() + 120
        for event in self._ready:
            if not event.wait(max(0.0, deadline - time.monotonic())):
                self.close()
                raise RuntimeError("the load's processes did not get ready within 120 s")

    def begin(self) -> None:
        self._go.set()

    def end(self) -> dict[str, Any]:
        """Stop the load; what it achieved."""
        self._stop.set()
        reports = [self._out.get(timeout=120) for _ in self._procs]
        for proc in self._procs:
            proc.join(30)
        publisher = next(r for r in reports if r["kind"] == "publisher")
        ackers = [r for r in reports if r["kind"] == "acker"]
        return {
            **publisher,
            "acked": sum(r["acked"] for r in ackers),
            "acked_per_s": round(sum(r["acked"] / r["window_s"] for r in ackers)),
        }

    def close(self) -> None:
        self._go.set()
        self._stop.set()
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def freshness(
    spark: Any,
    broker: EmbeddedBroker,
    workdir: Path,
    rate: int,
    duration: float,
    probe_every: int,
    trigger: str,
    ackers: int = 1,
) -> dict[str, Any]:
    """Probes are leased only once the aggregate has shown them (a message leased in the round
    it arrives never enters the live contents, so it would never leave them either)."""
    from pyspark.sql import functions as F

    from spark import foreach_batch, live_aggregate, queue_contents_stream

    bootstrap = broker.bootstrap_servers
    admin = TopicAdmin(admin_settings(client_settings(bootstrap, {})))
    # one partition: probes enter the view in id order, so "every probe up to N has entered"
    admin.ensure_topics([TopicSpec("fresh.orders", partitions=1)])
    coordinator = Coordinator(workdir, bootstrap, "fresh", "fresh.orders")
    published: dict[int, float] = {}
    entered: dict[int, float] = {}
    updated: dict[int, float] = {}
    left_at: dict[int, float] = {}  # when the coordinator's round took the probe out
    left_in: dict[int, int] = {}  # the micro-batch that showed it gone
    called: dict[int, float] = {}  # when foreachBatch called on_batch, by micro-batch
    lock = threading.Lock()  # on_batch runs on py4j's callback thread
    highest_entered = [-1]

    def on_batch(df: Any, batch_id: int) -> None:
        called[batch_id] = time.time()
        rows = df.collect()
        now = time.time()
        with lock:
            for row in rows:
                if row["sym"].startswith("P-"):
                    probe = int(row["sym"][2:])
                    (entered if row["count"] else updated).setdefault(probe, now)
                    if not row["count"]:
                        left_at.setdefault(probe, -row["left_at"])
                        left_in.setdefault(probe, batch_id)
            highest_entered[0] = max(entered, default=-1)

    def not_updated() -> set[int]:
        with lock:
            return set(acked) - set(updated)

    changes = queue_contents_stream(spark, "fresh", config=coordinator.config, schema=SCHEMA)
    # the signed sum of the -1 changes' times: once a probe's group is empty, minus the time of
    # the round that took the probe out of the live contents (its lease)
    leaving = F.when(F.col("sign") < 0, F.unix_micros("changed_at") / 1e6).otherwise(0.0)
    query = (
        live_aggregate(changes, by="sym", sum={"left_at": leaving})
        .writeStream.outputMode("update")
        # query.stop() while on_batch collects: a clean stop, not Spark's StackOverflowError
        .foreachBatch(foreach_batch(on_batch))
        .option("checkpointLocation", str(workdir / "fresh-checkpoint"))
        .trigger(processingTime=trigger)
        .start()
    )
    received: dict[int, float] = {}
    acked: dict[int, float] = {}
    stop = threading.Event()
    counts = {"acked": 0}
    load_procs: Load | None = None
    try:
        # The load begins once the stream has caught up with the queue (its first micro-batch
        # done: a dashboard that is running) and the load's processes are connected.
        while query.lastProgress is None:
            if not query.isActive:  # failed before its first micro-batch: say why, not hang
                raise RuntimeError(f"the streaming query failed: {query.exception()}")
            time.sleep(0.2)
        load_procs = Load(bootstrap, coordinator.address, rate, probe_every, ackers)
        with QueueClient(coordinator.address) as client:

            def consume_probes() -> None:
                gate = -1
                with client.subscribe("fresh", max_backlog=10, filter="/id < 0") as sub:
                    while not stop.is_set():
                        seen = highest_entered[0]
                        if seen > gate:  # lease only probes the aggregate has shown
                            sub.replace(filter=f"/probe = TRUE AND /id <= {seen}")
                            gate = seen
                        msg = sub.next(timeout=0.05)
                        if msg is None:
                            continue
                        probe = int(msg.json()["id"])
                        received[probe] = time.time()
                        msg.ack(wait=True)
                        acked[probe] = time.time()
                        counts["acked"] += 1

            prober = threading.Thread(target=consume_probes, daemon=True)
            load_began = time.time()
            cpu_began, batch_began = spark_cpu_s(spark), query.lastProgress.batchId
            loads = LoadSampler().start()
            load_procs.begin()
            prober.start()
            time.sleep(duration)
            loads.stop()
            cpu_ended, batches = spark_cpu_s(spark), query.lastProgress.batchId - batch_began
            cpu = {kind: cpu_ended[kind] - cpu_began[kind] for kind in cpu_ended}
            stop.set()
            load = load_procs.end()
            prober.join(30)
            coordinator_stages = {
                k: v for k, v in patient_stats(client, "fresh").extra.items() if "stage_" in k
            }
        published.update(load["probes"])
        deadline = time.monotonic() + 60
        while not_updated() and time.monotonic() < deadline:
            time.sleep(0.2)
        missing = not_updated()
        if query.exception() is not None:
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        every = {p.batchId: p for p in query.recentProgress}
        progress = [p for p in every.values() if p.numInputRows]
        batch_ms = [p.durationMs.get("triggerExecution", 0) / 1000 for p in progress]
        phases = (
            {
                phase: round(statistics.median(p.durationMs.get(phase, 0) for p in progress))
                for phase in sorted({k for p in progress for k in p.durationMs})
            }
            if progress
            else {}
        )
    finally:
        if load_procs is not None:
            load_procs.close()
        query.stop()
        coordinator.stop()
    done = [p for p in acked if p in updated]
    # a probe's way from its change to the update: to the start of the micro-batch that showed
    # it (its round's commit, the micro-batch under way, the trigger), then within that one
    began = {b: _epoch(p.timestamp) for b, p in every.items()}
    placed = [p for p in done if left_in.get(p) in began]
    result = {
        "offered_rate_per_s": rate,
        # what the broker confirmed while the load ran (delivery reports), a second at a time
        # the lowest of its full seconds; what the load's consumers acked (probes apart)
        "published_per_s": round(load["delivered_in_window"] / load["window_s"]),
        "published_per_s_lowest_second": load["delivered_per_s_min_1s"],
        "published_total": load["published"],
        "acked_per_s": load["acked_per_s"],
        "probes_acked_per_s": round(counts["acked"] / load["window_s"], 1),
        "ackers": ackers,
        "duration_s": round(load["window_s"], 1),
        "trigger": trigger,
        "probes_acked": len(acked),
        "probes_never_seen_leaving": len(missing),
        "ack_to_update": percentiles([updated[p] - acked[p] for p in done]),
        # the same without the probes acked in the first WARMUP_S of the load (the load
        # process starting, the queue's first backlog, the first micro-batches' Python workers)
        "ack_to_update_steady": percentiles(
            [updated[p] - acked[p] for p in done if acked[p] - load_began >= WARMUP_S]
        ),
        # per probe: seconds since the load began at its ack, ack -> update, change -> update
        "probes": [
            [
                round(acked[p] - load_began, 2),
                round(updated[p] - acked[p], 3),
                round(updated[p] - left_at[p], 3),
            ]
            for p in sorted(done, key=acked.__getitem__)
        ],
        "change_to_update": percentiles([updated[p] - left_at[p] for p in done]),
        "change_to_update_stages": {
            "change_to_batch_start": percentiles([began[left_in[p]] - left_at[p] for p in placed]),
            "batch_start_to_update": percentiles([updated[p] - began[left_in[p]] for p in placed]),
            # of which: to foreachBatch's call (latestOffset, offset log, planning), then the
            # Spark job that collect() runs (read, aggregate, state store) and its rows
            "batch_start_to_call": percentiles(
                [called[left_in[p]] - began[left_in[p]] for p in placed if left_in[p] in called]
            ),
            "call_to_update": percentiles(
                [updated[p] - called[left_in[p]] for p in placed if left_in[p] in called]
            ),
        },
        "load_average_1m_during": loads.summary(),
        "coordinator_stages_ms": coordinator_stages,
        "delivery_to_update": percentiles([updated[p] - received[p] for p in done]),
        "publish_to_update": percentiles(
            [entered[p] - published[p] for p in entered if p in published]
        ),
        "micro_batch_duration": percentiles(batch_ms),
        "micro_batch_phases_median_ms": phases,
        # Spark's CPU (JVM and its Python processes) while the load ran, per micro-batch
        "spark_cpu_s": {kind: round(seconds, 1) for kind, seconds in cpu.items()},
        "spark_cpu_ms_per_micro_batch": {
            kind: round(1000 * seconds / max(batches, 1)) for kind, seconds in cpu.items()
        },
        "micro_batches_during_load": batches,
        "micro_batches_with_data": len(progress),
        # each micro-batch with data: rows and phases, to tell a stall's cause (the first
        # micro-batches, a large range, the state store's maintenance...) from the machine
        "micro_batches": [
            {"id": p.batchId, "start": p.timestamp, "rows": p.numInputRows, **p.durationMs}
            for p in progress
        ],
    }
    say(f"freshness ack -> aggregate update: {result['ack_to_update']}")
    say(
        f"  steady (probes acked {WARMUP_S:.0f} s or more after the load began): "
        f"{result['ack_to_update_steady']}"
    )
    say(f"freshness change (the lease's round) -> aggregate update: {result['change_to_update']}")
    say(f"  of which: {result['change_to_update_stages']}")
    say(f"load average (1 min) during the run: {result['load_average_1m_during']}")
    say(f"freshness delivery -> aggregate update: {result['delivery_to_update']}")
    say(f"freshness publish -> aggregate update: {result['publish_to_update']}")
    say(f"micro-batch durations: {result['micro_batch_duration']}")
    say(f"micro-batch phases (median ms): {phases}")
    say(
        f"Spark's CPU during the load: {result['spark_cpu_s']} s,"
        f" {result['spark_cpu_ms_per_micro_batch']} ms a micro-batch ({batches} micro-batches)"
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="batch view queue size")
    parser.add_argument("--rate", type=int, default=1000, help="offered msg/s for freshness")
    parser.add_argument("--duration", type=float, default=60.0, help="freshness run seconds")
    parser.add_argument("--probe-every", type=int, default=20, help="one probe per N messages")
    parser.add_argument("--trigger", default="250 milliseconds", help="processing-time trigger")
    parser.add_argument("--ackers", type=int, default=1, help="consumer processes of the load")
    parser.add_argument("--quick", action="store_true", help="100k messages, 20 s of load")
    parser.add_argument("--skip-batch", action="store_true")
    parser.add_argument("--skip-stream", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.messages, args.duration = 100_000, 20.0
    results: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            # the machine is shared: the 1-minute load average before and after each part
            "load_average_1m": {"start": round(os.getloadavg()[0], 2)},
        },
        "spark": {"master": "local[2]"},
    }
    workdir = Path(tempfile.mkdtemp(prefix="qlayer-spark-bench-"))
    broker = EmbeddedBroker().start()
    try:
        spark = start_spark()
        results["spark"]["version"] = spark.version
        load = results["machine"]["load_average_1m"]
        if not args.skip_stream:
            results["freshness"] = freshness(
                spark,
                broker,
                workdir,
                args.rate,
                args.duration,
                args.probe_every,
                args.trigger,
                args.ackers,
            )
            load["after_freshness"] = round(os.getloadavg()[0], 2)
        if not args.skip_batch:
            results["batch_view"] = batch_view(spark, broker, workdir, args.messages)
            load["after_batch_view"] = round(os.getloadavg()[0], 2)
        spark.stop()
    finally:
        broker.stop()
    out = ROOT / "bench" / "results" / f"spark-views-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    say(f"results in {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
