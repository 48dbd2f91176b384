"""A takeover's backlog read when little or nothing waits (issue 12, failover): the time of
``KafkaSource.backlog`` from the end of an underlying partition (nothing to read) and from two
messages before it, on a partition of many small batches (one publish a batch, as a queue fed
message by message has), over the embedded broker.

``python -m bench.backlog_end [--messages 1500] [--tries 10]``; results in
``bench/results/backlog-end-<time>.json`` with the load average.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaPartition
from confluent_kafka.admin import AdminClient, NewTopic

from bench.harness import loadavg

RESULTS = Path(__file__).resolve().parent / "results"


def run(messages: int, tries: int) -> dict[str, Any]:
    from connectors import start_broker
    from layer.coordinator.restore import KafkaSource
    from layer.engine.model import TopicPartition

    broker = start_broker("embedded")
    try:
        settings: dict[str, str | int | float | bool] = {
            "bootstrap.servers": broker.bootstrap_servers
        }
        topic = f"backlog-end-{uuid.uuid4().hex[:6]}"
        admin = AdminClient(settings)
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        producer = Producer({**settings, "linger.ms": 0})
        for i in range(messages):
            producer.produce(topic, b"m%d" % i)
            producer.flush(10)
        consumer = Consumer({**settings, "group.id": f"b-{uuid.uuid4().hex}"})
        _low, high = consumer.get_watermark_offsets(KafkaPartition(topic, 0), timeout=10)
        consumer.close()
        source = KafkaSource(settings)
        out: dict[str, list[float]] = {"empty": [], "two": []}
        before = loadavg()
        for _ in range(tries):
            for kind, back in (("empty", 0), ("two", 2)):
                started = time.monotonic()
                got = sum(
                    len(f.messages) for f in source.backlog({TopicPartition(topic, 0): high - back})
                )
                assert got == back, (kind, got)
                out[kind].append(time.monotonic() - started)
        return {
            "bench": "backlog-end",
            "messages": messages,
            "tries": tries,
            "loadavg": [before, loadavg()],
            **{
                kind: {
                    "p50": round(statistics.median(xs), 4),
                    "max": round(max(xs), 4),
                    "all": [round(x, 4) for x in xs],
                }
                for kind, xs in out.items()
            },
        }
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--tag", default="", help="added to the results file name")
    args = parser.parse_args()
    result = run(args.messages, args.tries)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"backlog-end{args.tag}-{stamp}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("empty", "two")}))
    for kind in ("empty", "two"):
        print(kind, result[kind]["p50"], result[kind]["max"])
    print(f"results in {out}")


if __name__ == "__main__":
    main()
