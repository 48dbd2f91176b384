"""qlayer only: restore from the changelog after a long history (issue 11: restore bounded by the
live contents, not the history).

1. ``acked + queued`` messages of 200 B are produced to a 4-partition topic; the coordinator
   reads them all.
2. ``acked`` of them are leased and acked (the changelog then holds that history), the other
   ``queued`` stay available.
3. The coordinator is SIGKILLed and started again on its state directory: the time to the
   "serving" line and to every queued message available again.
4. Killed again, its state directory deleted, started again: the same two times, now rebuilt
   from the changelog, and the changelog records that restore replayed (from the coordinator's
   log line ``restored queue=...: N changelog records``).
5. The changelog's size: records and bytes (key + value) per acked message.

``python -m bench.restore [--acked N] [--queued N] [--config-extra 'k=v']``; results in
``bench/results/restore-<time>.json``. Every wait has a deadline; nothing sleeps and hopes.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError
from confluent_kafka import TopicPartition as KafkaPartition

from bench.harness import loadavg
from bench.kafka_systems import QUEUE, Coordinator, kafka_publish
from bench.memory import _wait, available
from connectors.admin import TopicAdmin, TopicSpec

log = logging.getLogger(__name__)

RESTORED = re.compile(rb"restored queue=\S+: (\d+) changelog records")


def changelog_size(bootstrap: str, topic: str) -> tuple[int, int, dict[str, list[int]]]:
    """(records, key + value bytes, {kind: [records, messages]}) of the changelog topic, read
    to its end."""
    from layer.codec import CHANGELOG_VALUE, decode, decode_key

    kinds: dict[str, list[int]] = {}
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    try:
        c.assign([KafkaPartition(topic, 0, OFFSET_BEGINNING)])
        records = size = 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            msgs = c.consume(10_000, 1.0)
            eof = False
            for m in msgs:
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        eof = True
                    continue
                key, value = m.key(), m.value()
                records += 1
                size += len(key or b"") + len(value or b"")
                ck = decode_key(key or b"")
                if ck.offset < -1:
                    kind = "SNAPSHOT" if ck.offset <= -3 else "CONFIRM"
                elif value is None:
                    kind = "TOMBSTONE"
                else:
                    kind = decode(CHANGELOG_VALUE, value)["kind"]
                counts = kinds.setdefault(kind, [0, 0])
                counts[0] += 1
                counts[1] += getattr(ck, "length", 1)  # format 1: no runs
            if eof:
                return records, size, kinds
        raise RuntimeError(f"changelog {topic} not read to its end in 300 s")
    finally:
        c.close()


def restore_history(
    bootstrap: str, workdir: Path, acked: int, queued: int, extra: dict[str, Any]
) -> dict[str, Any]:
    from layer.client import QueueClient

    admin = TopicAdmin({"bootstrap.servers": bootstrap})
    topic = f"rst-{uuid.uuid4().hex[:8]}"
    admin.ensure_topics([TopicSpec(topic, partitions=4)])
    coord = Coordinator(workdir / topic, bootstrap, topic)
    if extra:
        text = coord.config.read_text()
        text = text.replace(
            "[[queue]]", "\n".join(f"{k} = {v}" for k, v in extra.items()) + "\n[[queue]]"
        )
        coord.config.write_text(text)
    total = acked + queued
    out: dict[str, Any] = {"acked": acked, "queued": queued, "extra_config": extra,
                           "loadavg_before": loadavg()}  # fmt: skip
    limit = 300 + total / 1000
    try:
        coord.start()
        kafka_publish(bootstrap, topic, total, 200)
        _wait("ingest", lambda: available(coord) >= total, limit, every=0.25)
        t0 = time.monotonic()
        with QueueClient(coord.address) as c, c.subscribe(QUEUE, max_backlog=2000) as sub:
            for _ in range(acked):
                m = sub.next(timeout=30)
                if m is None:
                    raise RuntimeError("no message within 30 s while acking")
                m.ack()
            sub.flush(timeout=60)
        out["ack_s"] = round(time.monotonic() - t0, 2)
        _wait("leases back", lambda: available(coord) >= queued, limit)

        def restart(label: str) -> None:
            mark = coord.log.stat().st_size if coord.log.exists() else 0
            serving = coord.start(timeout=limit)
            waited = _wait(f"{label}: all available",
                           lambda: available(coord) >= queued, limit)  # fmt: skip
            out[f"restart_{label}_serving_s"] = round(serving, 2)
            out[f"restart_{label}_all_available_s"] = round(serving + waited, 2)
            with open(coord.log, "rb") as f:
                f.seek(mark)
                found = RESTORED.findall(f.read())
            out[f"restart_{label}_records_replayed"] = int(found[-1]) if found else None
            log.info("restart (%s): serving %.2f s, all available %.2f s, %s records replayed",
                     label, serving, serving + waited, found[-1:] )  # fmt: skip

        coord.kill()
        cid = re.search(r'id = "([^"]+)"', coord.config.read_text())[1]  # type: ignore[index]
        records, size, kinds = changelog_size(bootstrap, f"qlayer.changelog.{cid}.{QUEUE}")
        out["changelog_records"] = records
        out["changelog_records_by_kind"] = kinds  # kind: [records, messages]
        out["changelog_bytes_per_ack"] = round(size / max(acked, 1), 1)
        restart("state_intact")
        coord.kill()
        shutil.rmtree(coord.state)
        restart("from_changelog")
    finally:
        coord.stop()
        if coord.log.exists():  # kept for a look when the run failed
            shutil.copy(coord.log, workdir.parent / f"{workdir.name}-coordinator.log")
        shutil.rmtree(coord.workdir, ignore_errors=True)
    out["loadavg_after"] = loadavg()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--acked", type=int, default=100_000)
    p.add_argument("--queued", type=int, default=50_000)
    p.add_argument("--config-extra", action="append", default=[],
                   help="a [coordinator] setting as TOML, e.g. snapshot_every=500")  # fmt: skip
    p.add_argument("--label", default="")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    extra = dict(kv.split("=", 1) for kv in args.config_extra)
    from connectors.embedded import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.start()
    work = Path("/tmp") / f"qlayer-restore-bench-{uuid.uuid4().hex[:6]}"
    try:
        result = restore_history(broker.bootstrap_servers, work, args.acked, args.queued, extra)
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    result["label"] = args.label
    name = f"restore-{time.strftime('%Y%m%d-%H%M%S')}{'-' + args.label if args.label else ''}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
