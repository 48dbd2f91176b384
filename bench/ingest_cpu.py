"""CPU per message of a queue's ingest reader thread, in process: ``IngestReader._run`` from a
consume to the batch it hands over (``on_batch``), without a broker.

The reader's consumer is replaced by a stand-in that hands out ``--messages`` prepared messages
of ``--size`` bytes over ``--partitions`` partitions, ``--batch`` at a time (each batch from one
partition, in offset order, as librdkafka's consume does), and says it is caught up. So the
figure is the reader's own Python per fetch (error check, last offset per partition, high
watermarks, hand-over), not librdkafka's fetch: process CPU time per message, the best of
``--runs``. Results go to ``bench/results/ingest-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.ingest_cpu --label after
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace
from typing import Any

from confluent_kafka import Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from bench import cpu_result
from layer.coordinator import ingest
from layer.coordinator.ingest import Fetched, IngestReader
from layer.engine.model import TopicPartition

TOPIC = "orders"


class _Consumer:
    """The part of ``confluent_kafka.Consumer`` the reader uses, over prepared batches."""

    batches: list[list[Message]] = []
    partitions = 1
    high = 0
    done: Any = None  # called when the last batch was handed out

    def __init__(self, settings: dict[str, object]) -> None:
        self._batches = iter(type(self).batches)

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Any:
        parts = dict.fromkeys(range(type(self).partitions))
        meta = SimpleNamespace(error=None, partitions=parts)
        return SimpleNamespace(topics={TOPIC: meta})

    def incremental_assign(self, assign: list[KafkaTopicPartition]) -> None:
        pass

    def consume(self, n: int, timeout: float) -> list[Message]:
        batch = next(self._batches, None)
        if batch is None:
            type(self).done()
            return []
        return batch

    def poll(self, timeout: float) -> None:
        return None

    def get_watermark_offsets(self, tp: KafkaTopicPartition, cached: bool = False) -> Any:
        return 0, type(self).high

    def position(self, tps: list[KafkaTopicPartition]) -> list[KafkaTopicPartition]:
        return [KafkaTopicPartition(t.topic, t.partition, type(self).high) for t in tps]

    def assignment(self) -> list[KafkaTopicPartition]:
        return []

    def close(self) -> None:
        pass


def one_run(n: int, size: int, partitions: int, batch: int) -> float:
    """Seconds of process CPU for the reader to take ``n`` messages."""
    per = n // partitions
    pad = b"x" * max(0, size - 40)
    batches: list[list[Message]] = []
    for start in range(0, per, batch):
        for p in range(partitions):
            batches.append(
                [
                    Message(
                        topic=TOPIC,
                        partition=p,
                        offset=o,
                        value=b'{"i": %d, "pad": "%s"}' % (o, pad),
                        timestamp=(1, 1_700_000_000_000 + o // 100),
                    )
                    for o in range(start, min(per, start + batch))
                ]
            )
    handed: list[Fetched] = []
    _Consumer.batches, _Consumer.partitions, _Consumer.high = batches, partitions, per
    reader = IngestReader(
        "q",
        {"fetch.wait.max.ms": 10},
        TOPIC,
        False,
        {TopicPartition(TOPIC, p): 0 for p in range(partitions)},
        "earliest",
        handed.append,
        lambda: 0,
        max_buffered=10**9,
        batch_size=batch,
        refresh_interval=1e9,
    )
    _Consumer.done = reader._stop.set
    real = ingest.Consumer
    setattr(ingest, "Consumer", _Consumer)  # noqa: B010 (a stand-in for the bench)
    try:
        began = time.process_time()
        reader._run()
        spent = time.process_time() - began
    finally:
        setattr(ingest, "Consumer", real)  # noqa: B010
    if reader.error is not None:
        raise reader.error
    taken = sum(len(f.messages) for f in handed)
    assert taken == per * partitions, (taken, per * partitions)
    return spent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batch", type=int, default=500, help="messages a consume hands out")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    n = args.messages - args.messages % args.partitions
    runs = [one_run(n, args.size, args.partitions, args.batch) for _ in range(args.runs)]
    best = min(runs) / n * 1e6
    result = {
        **cpu_result.head("ingest-cpu", args, ("messages", "size", "partitions", "batch", "runs")),
        "us_per_msg_best": round(best, 3),
        "us_per_msg_runs": [round(r / n * 1e6, 3) for r in runs],
    }
    out = cpu_result.write(result)
    print(f"ingest reader: {best:.3f} us/msg (best of {args.runs})\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
