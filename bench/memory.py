"""qlayer only: coordinator memory per queued message, and restart-to-serving with that many queued.

1. A coordinator serves an empty queue; its resident memory (RSS) is the base.
2. ``queued`` messages of 200 B are produced to the topic; once the coordinator counts them all
   available and its RSS has stopped growing, (RSS - base) / queued is the memory per message.
3. 1% of them are leased and acked, so the changelog holds acks as well as positions.
4. The coordinator is SIGKILLed and started again on its state directory: the time to the
   "serving" line, and to every message available again.
5. Killed again, its state directory deleted, started again: the same two times, now rebuilt from
   the changelog topic.

Every wait has a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from bench.harness import loadavg, settled_rss
from bench.kafka_systems import QUEUE, Coordinator, kafka_publish
from connectors.admin import TopicAdmin, TopicSpec

log = logging.getLogger(__name__)

MESSAGE_BYTES = 200


def _wait(what: str, done: Callable[[], bool], timeout: float, every: float = 0.05) -> float:
    """Poll ``done`` until true; return the seconds it took. RuntimeError after ``timeout``."""
    t0 = time.monotonic()
    while not done():
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what}: not done after {timeout:.0f} s")
        time.sleep(every)
    return time.monotonic() - t0


def available(coord: Coordinator) -> int:
    """The queue's available count; -1 while the coordinator does not answer (reading a large
    backlog, it can miss a new connection's deadline: measured at 500,000 queued)."""
    from layer.exceptions import QLayerError

    try:
        return int(coord.stats().available)
    except QLayerError:
        return -1


def memory_and_restart(bootstrap: str, workdir: Path, queued: int) -> dict[str, Any]:
    from layer.client import QueueClient

    admin = TopicAdmin({"bootstrap.servers": bootstrap})
    topic = f"mem-{uuid.uuid4().hex[:8]}"
    admin.ensure_topics([TopicSpec(topic, partitions=4)])
    coord = Coordinator(workdir / topic, bootstrap, topic)
    out: dict[str, Any] = {
        "queued": queued,
        "message_bytes": MESSAGE_BYTES,
        "loadavg_before": loadavg(),
    }
    # generous limits: a slow shared machine must not fail the run, a hung one must
    limit = 300 + queued / 2000
    try:
        coord.start()
        coord.stats()  # the API answers: everything lazy is loaded
        base = settled_rss(coord.rss)
        t0 = time.monotonic()
        kafka_publish(bootstrap, topic, queued, MESSAGE_BYTES)
        out["publish_s"] = round(time.monotonic() - t0, 2)
        _wait("ingest", lambda: available(coord) >= queued, limit, every=0.25)
        ingest = time.monotonic() - t0
        out["ingest_s"] = round(ingest, 2)
        out["ingest_msgs_per_s"] = round(queued / ingest)
        rss = settled_rss(coord.rss)
        out["rss_base_mib"] = round(base / 2**20, 1)
        out["rss_queued_mib"] = round(rss / 2**20, 1)
        out["bytes_per_queued_message"] = round((rss - base) / queued)
        log.info(
            "  memory: %d B per queued message (%.0f MiB at %d queued), ingest %d msg/s",
            out["bytes_per_queued_message"], out["rss_queued_mib"], queued,
            out["ingest_msgs_per_s"],
        )  # fmt: skip

        acked = queued // 100
        with QueueClient(coord.address) as c, c.subscribe(QUEUE, max_backlog=1000) as sub:
            for _ in range(acked):
                m = sub.next(timeout=30)
                if m is None:
                    raise RuntimeError("no message within 30 s while acking 1% of the queue")
                m.ack()
            sub.flush(timeout=60)
        expected = queued - acked
        out["acked_before_restart"] = acked

        def restart(label: str) -> None:
            serving = coord.start(timeout=limit)
            waited = _wait(
                f"{label}: all {expected} available",
                lambda: available(coord) >= expected,
                limit,
            )
            out[f"restart_{label}_serving_s"] = round(serving, 2)
            out[f"restart_{label}_all_available_s"] = round(serving + waited, 2)
            # the coordinator's CPU seconds up to then (all its threads): on a busy shared
            # machine a steadier figure than the wall time
            cpu = psutil.Process(coord.pid).cpu_times()
            out[f"restart_{label}_cpu_s"] = round(cpu.user + cpu.system, 2)
            log.info(
                "  restart (%s): serving in %.2f s, all %d available in %.2f s",
                label, serving, expected, serving + waited,
            )  # fmt: skip

        coord.kill()
        restart("state_intact")
        coord.kill()
        shutil.rmtree(coord.state)
        restart("from_changelog")
    finally:
        coord.stop()
        shutil.rmtree(coord.workdir, ignore_errors=True)
        try:
            admin.delete_topics([topic, f"{topic}.warmup"])
        except Exception as exc:  # the broker is stopped after this anyway
            log.warning("could not delete topic %s: %s", topic, exc)
    out["loadavg_after"] = loadavg()
    return out
