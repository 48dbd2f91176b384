"""What a queue's ``view_topic`` (the change stream Spark views read) costs the delivery path.

The same at-least-once workload runs on two queues of identical configuration, one with a view
topic, alternating runs so machine noise falls on both: publish N JSON messages of 200 B with a
plain producer, then 4 consumer threads take and ack them all (max_backlog 200). Two phases:

- ``backlog``: everything is published before the consumers start, so each message enters the
  view when it is read and leaves when it is leased: two view records per message (worst case);
- ``flow``: consumers wait while messages are published at a steady rate, so most messages are
  leased in the round that admits them: no view record at all (the engine nets changes per round).

Reported per phase: coordinator CPU seconds per 1,000 messages (from /proc, the coordinator
process only) and end-to-end throughput, with and without the view, and the overhead ratio.

Run: ``python -m bench.view_cost [--messages N] [--runs R]``; JSON to ``bench/results/``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.kafka_systems import Coordinator  # noqa: E402
from connectors.admin import TopicAdmin, TopicSpec  # noqa: E402
from connectors.embedded import EmbeddedBroker  # noqa: E402
from connectors.kafka import client_settings  # noqa: E402
from layer.client import QueueClient  # noqa: E402

CONSUMERS = 4
BACKLOG = 200
QUEUE = "bench"  # the queue name bench.kafka_systems.Coordinator configures


def publish(bootstrap: str, topic: str, n: int, rate: float | None) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    body = {"symbol": "IBM", "qty": 0, "pad": "x" * 150}
    started = time.monotonic()
    for i in range(n):
        body["qty"] = i
        producer.produce(topic, json.dumps(body).encode())
        if i % 1000 == 0:
            producer.poll(0)
            if rate is not None:
                ahead = started + i / rate - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)  # pacing the offered load, not waiting for a condition
    if producer.flush(60):
        raise RuntimeError("publish did not complete")


def consume_all(address: str, n: int, deadline: float) -> None:
    done = [0]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            with QueueClient(address) as client, client.subscribe(QUEUE, BACKLOG) as sub:
                while time.monotonic() < deadline:
                    with lock:
                        if done[0] >= n:
                            return
                    msg = sub.next(timeout=0.5)
                    if msg is None:
                        continue
                    msg.ack()
                    with lock:
                        done[0] += 1
                sub.flush()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    if done[0] < n:
        raise RuntimeError(f"only {done[0]} of {n} messages consumed in time")


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def one_run(bootstrap: str, workdir: Path, view: bool, phase: str, n: int) -> dict[str, float]:
    topic = f"viewcost-{uuid.uuid4().hex[:8]}"
    TopicAdmin(client_settings(bootstrap, {})).ensure_topics([TopicSpec(topic, partitions=4)])
    opts: dict[str, Any] = {"view_topic": f"{topic}.view"} if view else {}
    coordinator = Coordinator(workdir / f"{topic}", bootstrap, topic, **opts)
    coordinator.start()
    try:
        with QueueClient(coordinator.address) as client:
            client.stats(QUEUE)
        cpu0 = cpu(coordinator.pid)
        t0 = time.monotonic()
        if phase == "backlog":
            publish(bootstrap, topic, n, None)
            consume_all(coordinator.address, n, time.monotonic() + 600)
        else:
            feeder = threading.Thread(target=publish, args=(bootstrap, topic, n, 2000.0))
            feeder.start()
            consume_all(coordinator.address, n, time.monotonic() + 600)
            feeder.join()
        seconds = time.monotonic() - t0
        used = cpu(coordinator.pid) - cpu0
    finally:
        coordinator.stop()
    return {"cpu_s_per_1k": used / n * 1000, "throughput": n / seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--phases", default="backlog,flow", help="comma-separated: backlog, flow")
    args = ap.parse_args()
    broker = EmbeddedBroker()
    broker.start()
    results: dict[str, Any] = {
        "bench": "view_cost",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cores": psutil.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": list(psutil.getloadavg()),
        },
        "settings": {
            "messages": args.messages,
            "runs": args.runs,
            "consumers": CONSUMERS,
            "max_backlog": BACKLOG,
            "payload_bytes": 200,
            "flow_rate_msg_s": 2000,
            "broker": "embedded Tansu",
        },
        "phases": {},
    }
    try:
        with tempfile.TemporaryDirectory(prefix="qlayer-viewcost-") as tmp:
            for phase in args.phases.split(","):
                runs: dict[str, list[dict[str, float]]] = {"plain": [], "view": []}
                for _ in range(args.runs):
                    for kind in ("plain", "view"):
                        r = one_run(
                            broker.bootstrap_servers,
                            Path(tmp),
                            kind == "view",
                            phase,
                            args.messages,
                        )
                        runs[kind].append(r)
                        print(f"{phase:8} {kind:6} {r}", flush=True)
                med = {
                    kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]}
                    for kind, rs in runs.items()
                }
                overhead = med["view"]["cpu_s_per_1k"] / med["plain"]["cpu_s_per_1k"] - 1
                results["phases"][phase] = {
                    "runs": runs,
                    "median": med,
                    "cpu_overhead": overhead,
                    "throughput_ratio": med["view"]["throughput"] / med["plain"]["throughput"],
                }
                print(f"{phase}: coordinator CPU overhead of the view {overhead:+.1%}", flush=True)
    finally:
        broker.stop()
    results["machine"]["loadavg_after"] = list(psutil.getloadavg())
    out = ROOT / "bench" / "results" / f"view-cost-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
