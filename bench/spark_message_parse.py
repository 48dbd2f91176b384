"""The ``message`` column's cost: ``message_column`` (a JSON payload parsed twice) against
``with_message`` (once), over the same payloads, alternated.

``python -m bench.spark_message_parse [--rows N] [--rounds R]``: a ``local[1]`` session sums a
field of ``message`` over ``--rows`` ~200-byte JSON orders (the bench's own, as the views'
``value``), each way in turn ``--rounds`` times; the JVM's CPU seconds each (less at the mercy
of the shared machine's load than wall time) and the load average go to
``bench/results/spark-message-parse-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.spark_bench import SCHEMA, order, say  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args(argv)
    import psutil
    from pyspark.sql import functions as F

    from layer.config import MessageType
    from spark.messages import message_column, with_message
    from spark.session import local_session

    spark = local_session("local[1]", "qlayer-message-parse")
    gateway: Any = spark.sparkContext._gateway
    jvm = psutil.Process(gateway.proc.pid)
    payloads = [(order(i),) for i in range(2_000)]
    base = spark.createDataFrame(payloads, "value BINARY").cache()
    base.count()
    repeat = max(1, args.rows // len(payloads))
    values = base.crossJoin(spark.range(repeat).select(F.col("id").alias("r"))).select("value")
    ways = {
        "message_column": values.withColumn(
            "message", message_column(MessageType.JSON, SCHEMA, None, "bench")
        ),
        "with_message": with_message(values, MessageType.JSON, SCHEMA, None, "bench"),
    }
    cpu: dict[str, list[float]] = {way: [] for way in ways}
    wall: dict[str, list[float]] = {way: [] for way in ways}
    loads = []
    for _ in range(args.rounds + 1):  # the first round warms both ways and is not kept
        for way, frame in ways.items():
            loads.append(os.getloadavg()[0])
            before, started = jvm.cpu_times(), time.monotonic()
            total = frame.agg(F.sum("message.qty")).collect()[0][0]
            after, took = jvm.cpu_times(), time.monotonic() - started
            cpu[way].append(after.user + after.system - before.user - before.system)
            wall[way].append(took)
            assert total == sum(1 + (i % 2_000) % 9 for i in range(2_000)) * repeat
    rows = len(payloads) * repeat
    result: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "rows": rows,
        "rounds": args.rounds,
        "load_average_1m": {"min": round(min(loads), 2), "max": round(max(loads), 2)},
        "jvm_cpu_s": {w: [round(s, 2) for s in v[1:]] for w, v in cpu.items()},
        "wall_s": {w: [round(s, 2) for s in v[1:]] for w, v in wall.items()},
        "jvm_cpu_us_per_row_median": {
            w: round(statistics.median(v[1:]) * 1e6 / rows, 2) for w, v in cpu.items()
        },
    }
    spark.stop()
    out = ROOT / "bench" / "results" / f"spark-message-parse-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    say(json.dumps(result))
    say(f"results in {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
