"""The fetch floor: how long a message takes from its producer to a plain consumer, alone.

The coordinator's ``fetch`` latency stage (Kafka timestamp to the ingest reader holding it) is
compared with this: one consumer over the topic's partitions with the ingest reader's own
settings (``connectors.kafka.consumer_settings`` of the broker's profile: read_committed, its
``fetch.wait.max.ms``), in a process doing nothing else, fed by the benchmark's publisher
(``bench.kafka_systems.kafka_publish``: idempotent, ``linger.ms`` 2, round-robin over the
partitions) at a paced rate. What the coordinator's stage measures above this floor is spent
inside the coordinator process, not in the broker or in the fetch settings.

    python -m bench.fetch_floor --waits 10,5,2 --reps 3 --out bench/results/latency

Variants (the fetch waits) alternate within each repetition, on one embedded broker (or
``--bootstrap``); each point records the load average, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.harness import loadavg, percentiles
from bench.kafka_systems import PARTITIONS, kafka_publish
from connectors.embedded import EmbeddedBroker
from connectors.kafka import TANSU, consumer_settings


def point(bootstrap: str, wait_ms: int, rate: float, seconds: float) -> dict[str, Any]:
    """One paced run through one consumer with ``fetch.wait.max.ms = wait_ms``."""
    topic = f"floor-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    settings = consumer_settings({"bootstrap.servers": bootstrap}, TANSU)
    settings["fetch.wait.max.ms"] = wait_ms
    consumer = Consumer(settings)
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    latencies: list[float] = []
    stop = threading.Event()

    def consume() -> None:
        # as the ingest reader does: wait for one message, then take what is already fetched
        while not stop.is_set():
            first = consumer.poll(0.05)
            if first is None:
                continue
            now = time.time()
            for m in [first, *consumer.consume(1999, 0)]:
                if m.error() is None:
                    latencies.append(now - m.timestamp()[1] / 1000.0)

    load_before = loadavg()
    reader = threading.Thread(target=consume, name="floor-consumer")
    reader.start()
    try:
        published = kafka_publish(bootstrap, topic, int(rate * seconds), 200, rate, seconds)
        deadline = time.monotonic() + 30
        while len(latencies) < published.count and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        reader.join()
        consumer.close()
        admin.delete_topics([topic, f"{topic}.warmup"])
    return {
        "fetch_wait_max_ms": wait_ms,
        "published": published.count,
        "received": len(latencies),
        "latency": percentiles(latencies),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fetch_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--waits", default=f"{TANSU.fetch_wait_max_ms}", help="fetch.wait.max.ms list")
    p.add_argument("--rate", type=float, default=1000.0, help="msg/s offered (default 1000)")
    p.add_argument("--seconds", type=float, default=8.0, help="length of each point (default 8)")
    p.add_argument("--reps", type=int, default=2, help="repetitions of the variants (default 2)")
    p.add_argument("--bootstrap", help="an external broker instead of the embedded one")
    p.add_argument("--out", type=Path, help="a directory for fetch-floor-<time>.json")
    args = p.parse_args(argv)
    try:
        waits = [int(w) for w in args.waits.split(",") if w.strip()]
    except ValueError:
        p.error(f"--waits: not a list of whole milliseconds: {args.waits!r}")
    if not waits or min(waits) < 1 or args.rate <= 0 or args.seconds <= 0 or args.reps < 1:
        p.error("--waits (each at least 1 ms), --rate, --seconds and --reps must be positive")

    def run(bootstrap: str) -> list[dict[str, Any]]:
        points = []
        for rep in range(args.reps):
            for wait_ms in waits:
                res = {**point(bootstrap, wait_ms, args.rate, args.seconds), "rep": rep}
                lat = res["latency"]
                print(
                    f"rep {rep} fetch.wait.max.ms={wait_ms}: p50 {lat.get('p50_ms')} / p99 "
                    f"{lat.get('p99_ms')} ms, {res['received']}/{res['published']} received, "
                    f"load {res['loadavg_before'][0]}",
                    flush=True,
                )
                points.append(res)
        return points

    if args.bootstrap:
        points = run(args.bootstrap)
    else:
        with EmbeddedBroker() as broker:
            points = run(broker.bootstrap_servers)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"fetch-floor-{time.strftime('%Y%m%d-%H%M%S')}.json"
        doc = {"command": " ".join(["python -m bench.fetch_floor", *(argv or sys.argv[1:])]),
               "rate": args.rate, "seconds": args.seconds, "points": points}  # fmt: skip
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
