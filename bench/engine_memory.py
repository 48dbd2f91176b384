"""The queue engine alone: bytes per queued message and CPU per message, no Kafka, no coordinator.

Each case runs in a fresh process: ``queued`` messages are added in batches of ``batch`` (one
partition per 1/4 of them, as the coordinator admits a fetch), and the resident memory (RSS) grown
by the engine, divided by ``queued``, is its cost per queued message. Then 1% are leased and acked,
and the time of ingest and of that delivery is reported per message.

    python -m bench.engine_memory [--queued N] [--cases plain,priority,sorted,ttl] [--out DIR]

``sorted``: a sorted queue (``sort_key``), 100 distinct keys; ``ttl``: every message with a TTL of
its own (``ttl``): both single every message out (an entry each, no runs).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

PARTITIONS = 4
BATCH = 1000


def _one(case: str, queued: int) -> dict[str, Any]:
    from layer.engine.model import AckOp, Arrival, Bookmark, EngineSettings, TopicPartition
    from layer.engine.queue import QueueEngine

    settings = EngineSettings(
        priority=case == "priority",
        sort=case == "sorted",
        message_ttl=case == "ttl",
        max_per_subscription_backlog=1000,
    )
    engine = QueueEngine("q", settings)
    for p in range(PARTITIONS):
        engine.start_partition(TopicPartition("t", p), 0)
    gc.collect()
    proc = psutil.Process()
    base = proc.memory_info().rss
    per = queued // PARTITIONS
    t0 = time.process_time()
    now = 1000.0
    for start in range(0, per, BATCH):
        n = min(BATCH, per - start)
        for p in range(PARTITIONS):
            arrivals = [
                Arrival(
                    Bookmark("t", p, o),
                    now + o * 1e-6,
                    (o // 100) % 3 if case == "priority" else None,
                    sort_key=f"key-{o % 100:03d}" if case == "sorted" else None,
                    expires_at=now + 3600.0 if case == "ttl" else None,
                )
                for o in range(start, start + n)
            ]
            engine.add(arrivals, now)
            engine.mark_read(TopicPartition("t", p), start + n)
        engine.drain()
    ingest = time.process_time() - t0
    gc.collect()
    rss = proc.memory_info().rss
    total = per * PARTITIONS
    assert engine.stats(now).available == total
    leased = total // 100
    engine.subscribe("s", 1000, now)
    t0 = time.process_time()
    done = 0
    while done < leased:
        engine.dispatch(now)
        eff = engine.drain()
        bms = [d.bookmark for d in eff.deliveries]
        engine.ack("s", bms, AckOp.ACK, now)
        engine.drain()
        done += len(bms)
    lease_ack = time.process_time() - t0
    return {
        "case": case,
        "queued": total,
        "engine_bytes_per_queued_message": round((rss - base) / total, 1),
        "ingest_us_per_message": round(ingest / total * 1e6, 2),
        "lease_ack_us_per_message": round(lease_ack / done * 1e6, 2),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queued", type=int, default=1_000_000)
    p.add_argument("--cases", default="plain,priority")
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(_one(args.one, args.queued)))
        return
    results = []
    for case in args.cases.split(","):
        out = subprocess.run(
            [sys.executable, "-m", "bench.engine_memory", "--one", case, "--queued",
             str(args.queued)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        row = json.loads(out.stdout)
        print(row, flush=True)
        results.append(row)
    if args.out:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"engine-memory-{args.label + '-' if args.label else ''}{stamp}.json"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / name).write_text(json.dumps({"results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
