"""What beginning a round's transaction early saves: ``ChangelogWriter.commit`` timed alone.

A round's commit produces its changelog records and commits them in one Kafka transaction.
librdkafka adds a partition to a transaction about a millisecond after the first record for it
is produced (its registration timer, then AddPartitionsToTxn), and sends the records only after
that: a commit that produces all its records at once waits that long first. The coordinator
therefore begins the next round's transaction right after a round commits
(``ChangelogWriter.begin``, with the queue's last counters record written again), and the
partition has joined it by the time the next round commits.

Each commit here writes ``--records`` changelog-sized records to a one-partition topic after a
pause of ``--gap`` ms (the acks coming and the round deciding); the variants alternate, commit
by commit, on one embedded broker (or ``--bootstrap``):

- ``cold``: the commit begins its own transaction (as every round did before);
- ``begun``: ``begin`` was called right after the previous commit, before the pause.

    python -m bench.txn_begin --commits 300 --out bench/results/txn-begin-ab-20261207
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench.harness import loadavg
from connectors.embedded import EmbeddedBroker
from layer.codec import encode_change
from layer.engine.model import LowWater, TopicPartition
from layer.state.changelog import ChangelogRecord, ChangelogWriter

VARIANTS = ("cold", "begun")


def _records(topic: str, n: int, i: int) -> list[ChangelogRecord]:
    """``n`` position records of about the size of a round's (a counters record among them)."""
    return [
        (topic, *encode_change("q~counters", LowWater(TopicPartition(f"c{j}", 0), i), i))
        for j in range(n)
    ]


def measure(bootstrap: str, commits: int, records: int, gap_ms: float) -> dict[str, Any]:
    """``commits`` commits of each variant, alternating; their times in ms."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    writers: dict[str, ChangelogWriter] = {}
    topics: dict[str, str] = {}
    try:
        for v in VARIANTS:
            topic = topics[v] = f"txn-{v}-{uuid.uuid4().hex[:8]}"
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
            writers[v] = ChangelogWriter({"bootstrap.servers": bootstrap}, f"bench-{topic}")
            writers[v].commit(_records(topic, records, 0))  # topic metadata known, warm
        load_before = loadavg()
        for i in range(1, commits + 1):
            for v in VARIANTS:
                batch = _records(topics[v], records, i)
                if v == "begun":
                    writers[v].begin(batch[-1:])
                time.sleep(gap_ms / 1000)
                began = time.perf_counter()
                writers[v].commit(batch)
                times[v].append((time.perf_counter() - began) * 1000)
    finally:
        for writer in writers.values():
            writer.close()
        if topics:
            admin.delete_topics(list(topics.values()))
    out: dict[str, Any] = {"loadavg_before": load_before, "loadavg_after": loadavg()}
    for v, ms in times.items():
        ms.sort()
        out[v] = {
            "commits": len(ms),
            "p50_ms": round(statistics.median(ms), 3),
            "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
            "mean_ms": round(statistics.fmean(ms), 3),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.txn_begin", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--commits", type=int, default=300, help="commits per variant (default 300)")
    p.add_argument("--records", type=int, default=5, help="records per commit (default 5)")
    p.add_argument("--gap", type=float, default=2.0, help="ms before each commit (default 2)")
    p.add_argument("--bootstrap", help="an external broker instead of the embedded one")
    p.add_argument("--out", type=Path, help="a directory for txn-begin-<time>.json")
    args = p.parse_args(argv)
    if args.commits < 1 or args.records < 1 or args.gap < 0:
        p.error("--commits and --records must be at least 1, --gap at least 0")

    def run(bootstrap: str) -> dict[str, Any]:
        return measure(bootstrap, args.commits, args.records, args.gap)

    if args.bootstrap:
        result = run(args.bootstrap)
    else:
        with EmbeddedBroker() as broker:
            result = run(broker.bootstrap_servers)
    for v in VARIANTS:
        r = result[v]
        print(f"{v}: commit p50 {r['p50_ms']} / p90 {r['p90_ms']} ms over {r['commits']} commits")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"txn-begin-{time.strftime('%Y%m%d-%H%M%S')}.json"
        doc = {"command": " ".join(["python -m bench.txn_begin", *(argv or sys.argv[1:])]),
               "records": args.records, "gap_ms": args.gap, **result}  # fmt: skip
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
