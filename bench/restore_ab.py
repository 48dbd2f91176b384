"""qlayer only: restart from the changelog, before and after a change, in alternating runs.

On a shared machine the load drifts between two benchmark runs more than a change moves the
figure; this puts both versions of the code on one broker, one topic and one changelog, and
restarts them in turn (A B A B ...):

1. ``queued`` messages of 200 B are produced to a 4-partition topic; a coordinator of the
   ``after`` tree reads them all.
2. Each round, for each mode and for ``before`` then ``after``: SIGKILL, delete the state
   directory (mode ``changelog``; mode ``intact`` keeps it), start the coordinator of that tree
   (``python -m layer.cli`` with the tree as working directory), and time the "serving" line
   and every message available; the coordinator's CPU seconds then, also by thread name
   (Python's, RocksDB's compaction and flush threads; librdkafka's that have ended are only in
   the total).

``python -m bench.restore_ab --before DIR --after DIR [--queued N] [--rounds N]
[--modes changelog,intact]``, where a tree is a checkout of the repository
(``git archive main | tar -x -C DIR``); both must read the same changelog format and state
directory. Results in ``bench/results/restore-ab-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

import bench.kafka_systems as systems
from bench.kafka_systems import Coordinator, kafka_publish
from bench.memory import _wait, available
from connectors.admin import TopicAdmin, TopicSpec

log = logging.getLogger(__name__)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of a process's live threads, summed by thread name (Linux)."""
    found: dict[str, float] = {}
    for th in psutil.Process(pid).threads():
        try:
            name = Path(f"/proc/{pid}/task/{th.id}/comm").read_text().strip()
        except OSError:
            continue
        found[name] = round(found.get(name, 0.0) + th.user_time + th.system_time, 2)
    return {k: v for k, v in sorted(found.items(), key=lambda kv: -kv[1]) if v >= 0.01}


def alternate(
    bootstrap: str,
    workdir: Path,
    trees: dict[str, Path],
    queued: int,
    rounds: int,
    modes: tuple[str, ...] = ("changelog",),
) -> dict[str, Any]:
    admin = TopicAdmin({"bootstrap.servers": bootstrap})
    topic = f"ab-{uuid.uuid4().hex[:8]}"
    admin.ensure_topics([TopicSpec(topic, partitions=4)])
    limit = 300 + queued / 1000
    out: dict[str, Any] = {"queued": queued, "trees": {k: str(v) for k, v in trees.items()}}
    runs: list[dict[str, Any]] = out.setdefault("runs", [])
    systems.ROOT = trees["after"]  # where Coordinator.start runs the coordinator
    coord = Coordinator(workdir / topic, bootstrap, topic)
    try:
        coord.start()
        kafka_publish(bootstrap, topic, queued, 200)
        _wait("ingest", lambda: available(coord) >= queued, limit, every=0.25)
        for _ in range(rounds):
            for mode in modes:
                for label in ("before", "after"):
                    coord.kill()
                    if mode == "changelog":
                        shutil.rmtree(coord.state)
                    systems.ROOT = trees[label]
                    serving = coord.start(timeout=limit)
                    waited = _wait(
                        "all available", lambda: available(coord) >= queued, limit, every=0.02
                    )
                    cpu = psutil.Process(coord.pid).cpu_times()
                    run = {
                        "tree": label,
                        "mode": mode,
                        "serving_s": round(serving, 2),
                        "all_available_s": round(serving + waited, 2),
                        "cpu_s": round(cpu.user + cpu.system, 2),
                        "cpu_by_thread_s": thread_cpu(coord.pid),
                        "loadavg": [round(x, 2) for x in os.getloadavg()],
                    }
                    runs.append(run)
                    log.info("%s", run)
    finally:
        coord.stop()
        shutil.rmtree(coord.workdir, ignore_errors=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", type=Path, required=True, help="the tree of the code before")
    p.add_argument("--after", type=Path, default=Path(__file__).resolve().parents[1])
    p.add_argument("--queued", type=int, default=1_000_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--modes",
        default="changelog",
        help="comma-separated: changelog (state directory deleted), intact (kept)",
    )
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    modes = tuple(m for m in args.modes.split(",") if m)
    for mode in modes:
        if mode not in ("changelog", "intact"):
            p.error(f"--modes: {mode!r} is neither changelog nor intact")
    from connectors.embedded import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.start()
    work = Path("/tmp") / f"qlayer-restore-ab-{uuid.uuid4().hex[:6]}"
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    try:
        result = alternate(broker.bootstrap_servers, work, trees, args.queued, args.rounds, modes)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"restore-ab-{time.strftime('%Y%m%d-%H%M%S')}.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
