"""CPU of the changelog commit thread per record, against a real broker (the embedded one).

``--commits`` transactions of ``--records`` changelog records each (run keys, ~60 B values, as
a round writes them) go through ``ChangelogWriter.commit`` to a one-partition changelog topic,
as the coordinator creates it. The figure is the committing thread's CPU time
(``time.thread_time``: the Python around ``produce`` and the delivery reports, which hold the
GIL; librdkafka's own threads are not counted) per record, the best of ``--runs``; the wall
time per commit is printed too. Results go to ``bench/results/changelog-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.changelog_cpu --label after
"""

from __future__ import annotations

import argparse
import struct
import sys
import time
import uuid
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

from bench import cpu_result
from connectors import start_broker
from connectors.kafka import client_settings
from layer.state.changelog import ChangelogWriter


def one_run(settings: dict[str, Any], commits: int, per: int) -> tuple[float, float]:
    """(thread CPU seconds, wall seconds) of ``commits`` commits of ``per`` records."""
    topic = f"bench-changelog-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(settings)
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    writer = ChangelogWriter(settings, f"bench-{topic}")
    value = b"v" * 60
    try:
        writer.commit([(topic, b"warm-up", value)])
        cpu = wall = 0.0
        offset = 0
        for _ in range(commits):
            records = []
            for i in range(per):
                records.append((topic, b"q\x00run\x00" + struct.pack(">qI", offset, 8), value))
                offset += 8 + i % 3
            began, began_wall = time.thread_time(), time.perf_counter()
            last = writer.commit(records)
            cpu += time.thread_time() - began
            wall += time.perf_counter() - began_wall
            assert list(last) == [(topic, 0)], last
        return cpu, wall
    finally:
        writer.close()
        admin.delete_topics([topic])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=200)
    parser.add_argument("--records", type=int, default=100, help="records per commit")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    broker = start_broker("embedded")
    try:
        settings = client_settings(broker.bootstrap_servers, {})
        runs = [one_run(settings, args.commits, args.records) for _ in range(args.runs)]
    finally:
        broker.stop()
    n = args.commits * args.records
    best = min(cpu for cpu, _wall in runs) / n * 1e6
    result = {
        **cpu_result.head("changelog-cpu", args, ("commits", "records", "runs")),
        "us_per_record_best": round(best, 3),
        "us_per_record_runs": [round(cpu / n * 1e6, 3) for cpu, _wall in runs],
        "ms_per_commit_runs": [round(wall / args.commits * 1e3, 2) for _cpu, wall in runs],
    }
    out = cpu_result.write(result)
    print(
        f"changelog commit thread: {best:.3f} us/record (best of {args.runs}),"
        f" {min(w for _c, w in runs) / args.commits * 1e3:.2f} ms/commit\nwritten: {out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
