"""CPU per message of reading payloads back from blobs (``KeyValueStore.get_messages``).

A backlog beyond the runtime's payload cache is read back from the store when it is
delivered. ``--messages`` plain messages (``--size`` bytes, no key) over ``--partitions``
partitions are written as blobs of ``--blob`` messages each into a RocksDB store; then they
are read back in calls of ``--run`` consecutive offsets of one partition (the partitions taken
in turn, as deliveries take them), so each blob is first found by a seek and then from the
store's cache of decoded blobs. The figure is process CPU time of the reads per message; the
best and the median of ``--runs`` go to ``bench/results/payload-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.payload_cpu --label after
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import cpu_result
from layer.coordinator.app import tune_gc
from layer.engine.model import Bookmark, TopicPartition
from layer.state.base import StoreBatch
from layer.state.rocksdb import RocksDBStore

TOPIC = "payload-cpu"


def one_run(messages: int, size: int, partitions: int, blob: int, run: int) -> dict[str, float]:
    workdir = Path(tempfile.mkdtemp(prefix="payload-cpu-"))
    store = RocksDBStore(workdir / "state")
    try:
        per = messages // partitions
        value = b"x" * size
        for p in range(partitions):
            for first in range(0, per, blob):
                offsets = list(range(first, min(first + blob, per)))
                batch = StoreBatch()
                batch.put_blob(
                    "q",
                    TopicPartition(TOPIC, p),
                    offsets,
                    [None] * len(offsets),
                    [value] * len(offsets),
                    [1_700_000_000_000 + o for o in offsets],
                )
                store.write(batch)
        calls = [
            [Bookmark(TOPIC, p, o) for o in range(first, min(first + run, per))]
            for first in range(0, per, run)
            for p in range(partitions)
        ]
        tune_gc()
        began = time.process_time()
        found = 0
        for bookmarks in calls:
            found += len(store.get_messages("q", bookmarks))
        cpu = time.process_time() - began
        assert found == per * partitions
        return {"cpu_s": round(cpu, 4), "us_per_msg": round(cpu / found * 1e6, 3)}
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--blob", type=int, default=1024, help="messages per blob")
    parser.add_argument("--run", type=int, default=100, help="consecutive offsets per read")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    cpu_result.repeat(
        "payload-cpu",
        args,
        ("messages", "size", "partitions", "blob", "run", "runs"),
        lambda: one_run(args.messages, args.size, args.partitions, args.blob, args.run),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
