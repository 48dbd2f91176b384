"""CPU per message of the live path's admission, in process: ``QueueRuntime.admit`` and the
store write of what it admits, for one plain JSON queue over a RocksDB store.

``--messages`` JSON messages of ``--size`` bytes (no key, no headers, as ``bench.run``
publishes them) over ``--partitions`` partitions, handed over as a reader hands fetches (in
offset order per partition), are admitted 4,096 at a time, each round's batch written. The
figure is process CPU time (user + system, ``time.process_time``) per message, the best of
``--runs`` (a fresh queue and store each): the least disturbed by a shared machine. Results
go to ``bench/results/admit-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.admit_cpu --label after
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Message

from bench import cpu_result
from layer.config import QueueConfig
from layer.coordinator.ingest import Fetched, PartitionStarted
from layer.coordinator.runtime import QueueRuntime
from layer.engine.model import TopicPartition
from layer.engine.queue import QueueEngine
from layer.state.base import StoreBatch
from layer.state.rocksdb import RocksDBStore

TOPIC = "orders"


def fetched_runtime(n: int, size: int, partitions: int) -> QueueRuntime:
    """A plain JSON queue's runtime holding ``n`` fetched messages of ``size`` bytes over
    ``partitions`` partitions (in offset order per partition, as a reader hands them over),
    none admitted yet."""
    q = QueueConfig(name="q", underlying_topic=TOPIC)
    rt = QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), "q-changelog")
    per = n // partitions
    pad = b"x" * max(0, size - 40)
    messages = [
        Message(
            topic=TOPIC,
            partition=p,
            offset=o,
            value=b'{"i": %d, "pad": "%s"}' % (p * per + o, pad),
            timestamp=(1, 1_700_000_000_000 + o // 100),
        )
        for p in range(partitions)
        for o in range(per)
    ]
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    rt.take_fetched(
        Fetched(messages, dict.fromkeys(tps, per), [PartitionStarted(tp, 0) for tp in tps])
    )
    return rt


def one_run(n: int, size: int, partitions: int) -> float:
    """Seconds of process CPU to admit and store ``n`` messages."""
    rt = fetched_runtime(n, size, partitions)
    workdir = tempfile.mkdtemp(prefix="qlayer-admit-cpu-")
    store = RocksDBStore(Path(workdir))
    try:
        began = time.process_time()
        while rt.inbox:
            batch = StoreBatch()
            rt.admit(100.0, batch)
            store.write(batch)
        return time.process_time() - began
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    n = args.messages - args.messages % args.partitions
    runs = [one_run(n, args.size, args.partitions) for _ in range(args.runs)]
    best = min(runs) / n * 1e6
    result = {
        **cpu_result.head("admit-cpu", args, ("messages", "size", "partitions", "runs")),
        "us_per_msg_best": round(best, 2),
        "us_per_msg_runs": [round(r / n * 1e6, 2) for r in runs],
    }
    out = cpu_result.write(result)
    print(f"admission + store write: {best:.2f} us/msg (best of {args.runs})\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
