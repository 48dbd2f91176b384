"""A benchmark consumer process: raw Kafka or a qlayer queue. Writes a JSON summary when done.

Each message carries its publish time (``"ts"``, epoch seconds) so the consumer can measure
publish-to-delivery latency. It stops after ``--count`` messages or ``--idle`` seconds idle.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


LAST = [0.0]  # when the last message arrived


def run_raw(args: argparse.Namespace) -> tuple[list[float], int]:
    from confluent_kafka import Consumer, TopicPartition

    # one partition per consumer, assigned: no group rebalancing in the measurement
    c = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.group,
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    c.assign([TopicPartition(args.topic, args.partition, 0)])
    Path(args.ready).touch()
    latencies: list[float] = []
    n = 0
    last = time.monotonic()
    while n < args.count and time.monotonic() - last < args.idle:
        for m in c.consume(500, 0.05):
            if m.error() is not None:
                continue
            now = time.time()
            latencies.append(now - json.loads(m.value())["ts"])
            n += 1
            last = time.monotonic()
            LAST[0] = now
    c.close()
    return latencies, n


def run_queue(args: argparse.Namespace) -> tuple[list[float], int]:
    from layer.client import QueueClient

    latencies: list[float] = []
    n = 0
    with (
        QueueClient(args.server) as client,
        client.subscribe(args.queue, max_backlog=args.backlog) as sub,
    ):
        Path(args.ready).touch()
        stop = Path(args.stop_file) if args.stop_file else None
        last = time.monotonic()
        while n < args.count and time.monotonic() - last < args.idle:
            msg = sub.next(timeout=0.1)
            if msg is None:
                if stop is not None and stop.exists():
                    break
                continue
            now = time.time()
            latencies.append(now - json.loads(msg.data)["ts"])
            LAST[0] = now
            msg.ack()
            n += 1
            last = time.monotonic()
        sub.flush(timeout=30)
    return latencies, n


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["raw", "queue"], required=True)
    p.add_argument("--bootstrap")
    p.add_argument("--topic")
    p.add_argument("--group", default="bench")
    p.add_argument("--partition", type=int, default=0)
    p.add_argument("--server")
    p.add_argument("--queue")
    p.add_argument("--backlog", type=int, default=100)
    p.add_argument("--count", type=int, default=10**9)
    p.add_argument("--idle", type=float, default=5.0)
    p.add_argument("--ready", default="/dev/null")
    p.add_argument("--stop-file", help="stop once this file exists and nothing is left to take")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    latencies, n = run_raw(args) if args.mode == "raw" else run_queue(args)
    Path(args.out).write_text(json.dumps({"n": n, "latencies": latencies, "end": LAST[0]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
