"""CPU per message of the queue engine alone: leases and acks, no coordinator, no store.

``--messages`` plain messages of one partition, admitted as runs of 1,000, go to
``--subscriptions`` subscriptions of ``--backlog`` each; every step ticks, dispatches, drains
and acks what was handed out as offset runs per subscription (what a consumer's batched acks
send), until every message is done. The figure is process CPU time per message of those
steps, the best of ``--runs`` (a fresh engine each): the engine's share of ``bench.round_cpu``
without the round's records, store batch and payloads. Results go to
``bench/results/engine-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.engine_cpu --label after
"""

from __future__ import annotations

import argparse
import time

from bench import cpu_result
from layer.engine.model import AckOp, EngineSettings, TopicPartition
from layer.engine.queue import QueueEngine

TP = TopicPartition("orders", 0)
RUN = 1_000


def one_run(n: int, subscriptions: int, backlog: int) -> float:
    """CPU seconds to lease and ack ``n`` messages."""
    engine = QueueEngine("q", EngineSettings())
    engine.start_partition(TP, 0)
    engine.set_high_watermark(TP, n)
    for start in range(0, n, RUN):
        engine.add_run(TP, start, [0.0] * min(RUN, n - start), 0.0)
    engine.mark_read(TP, n)
    for i in range(subscriptions):
        engine.subscribe(f"s{i}", backlog, 0.0)
    began = time.process_time()
    now = 1.0
    done = 0
    while done < n:
        engine.tick(now)
        engine.dispatch(now)
        by_sub: dict[str, list[int]] = {}
        for d in engine.drain().deliveries:
            by_sub.setdefault(d.subscription, []).append(d.bookmark.offset)
        for sub, offsets in by_sub.items():
            runs: list[int] = []
            for o in offsets:
                if runs and o == runs[-1] + 1:
                    runs[-1] = o
                else:
                    runs += (o, o)
            engine.ack_runs(sub, TP, runs, AckOp.ACK, now)
            done += len(offsets)
        now += 0.001
    engine.drain()
    return time.process_time() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--subscriptions", type=int, default=4)
    parser.add_argument("--backlog", type=int, default=100, help="each subscription's")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    n = args.messages
    runs = [one_run(n, args.subscriptions, args.backlog) for _ in range(args.runs)]
    best = min(runs) / n * 1e6
    result = {
        **cpu_result.head("engine-cpu", args, ("messages", "subscriptions", "backlog", "runs")),
        "us_per_msg_best": round(best, 3),
        "us_per_msg_runs": [round(r / n * 1e6, 3) for r in runs],
    }
    out = cpu_result.write(result)
    print(f"engine lease + ack: {best:.3f} us/msg (best of {args.runs})\nwritten: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
