"""CPU per message of the API wire: the coordinator's and the consumer's, delivery + ack only.

One coordinator process (one queue, at-least-once) over the embedded broker. ``--messages``
messages are published straight to Kafka and the coordinator ingests them all before anything
is measured; then ``--consumers`` consumer processes (one by default) subscribe
(``max_backlog=--window`` each), take their share of the messages, ack them (``msg.ack()``,
batched by the client) and flush; what one holds beyond its share when it closes goes to the
others. Measured over that phase alone, with psutil's CPU times (user + system) of each
process (the consumers' summed):

- coordinator µs/msg: what leasing, sending and taking acks cost the server;
- consumer µs/msg: what receiving, decoding and acking cost the client process, and how that
  splits over its threads (``consumer_threads_us_per_msg``, from ``/proc``'s per-thread times,
  10 ms ticks): the consumer's own (``MainThread``), the subscription's runner
  (``qlayer-sub-*``), its flusher, and grpc's (``Thread-1 (_run)``: the channel's spin thread,
  which receives and decodes; ``Thread-2 (_run)``: the one writing the request iterator's
  frames; ``event_engine``: its poller).

Each figure is the median of ``--runs`` runs (a fresh queue each). The raw results go to
``bench/results/wire-cpu-<time>.json``.

    .venv/bin/python -m bench.wire_cpu --messages 50000 --runs 3 --label before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import cpu_result
from bench.kafka_systems import QLayer, kafka_publish
from bench.profile import Sampler, compact, render, summarize
from connectors import EmbeddedBroker

RESULTS = cpu_result.RESULTS


def thread_ticks() -> dict[str, int]:
    """CPU clock ticks (user + system) of each thread of this process, by thread name."""
    import os
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks: dict[str, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        name = names.get(int(tid), comm)
        ticks[name] = ticks.get(name, 0) + int(fields[11]) + int(fields[12])
    return ticks


def consume(address: str, queue: str, n: int, window: int) -> None:
    """The consumer process: take and ack ``n`` messages, print its CPU and wall time."""
    from layer.api.frames import Batch, Messages
    from layer.client import QueueClient
    from layer.client._core import SubscriptionCore

    # frames received, by kind (those inside a Batch too; "writes": the gRPC messages): how
    # many messages a Messages frame carries on average
    frames: dict[str, int] = {}
    on_frame = SubscriptionCore.on_frame

    def count(frame: Any) -> None:
        kind = type(frame).__name__
        frames[kind] = frames.get(kind, 0) + 1
        if isinstance(frame, Messages):
            frames["messages"] = frames.get("messages", 0) + len(frame.messages)
        elif isinstance(frame, Batch):
            for inner in frame.frames:
                count(inner)

    def counting(self: Any, frame: Any, *args: Any) -> Any:
        frames["writes"] = frames.get("writes", 0) + 1
        count(frame)
        return on_frame(self, frame, *args)

    SubscriptionCore.on_frame = counting  # type: ignore[method-assign,assignment]
    me = psutil.Process()
    with QueueClient(address) as client, client.subscribe(queue, max_backlog=window) as sub:
        ticks0 = thread_ticks()
        t0, wall0 = me.cpu_times(), time.monotonic()
        got = 0
        while got < n:
            msg = sub.next(timeout=60)
            if msg is None:
                raise SystemExit(f"consumer: no message within 60 s after {got}")
            msg.ack()
            got += 1
        sub.flush(timeout=60)
        t1, wall1 = me.cpu_times(), time.monotonic()
        ticks1 = thread_ticks()  # before the subscription's threads end
    cpu = (t1.user - t0.user) + (t1.system - t0.system)
    tick = os.sysconf("SC_CLK_TCK")
    threads = {
        name: (count - ticks0.get(name, 0)) / tick
        for name, count in ticks1.items()
        if count - ticks0.get(name, 0)
    }
    print(
        json.dumps(
            {
                "consumer_cpu_s": cpu,
                "wall_s": wall1 - wall0,
                "messages": got,
                "frames": frames,
                "threads_cpu_s": threads,
            }
        )
    )


def _wait(predicate: Any, timeout: float, what: str) -> None:
    """Until ``predicate()``; a coordinator too busy ingesting to answer (a gRPC connect that
    timed out on this loaded machine) is asked again, not a failure."""
    from layer.exceptions import ConnectionLost

    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except ConnectionLost:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.2)


def one_run(
    system: QLayer,
    n: int,
    size: int,
    window: int,
    profile: Path | None = None,
    consumers: int = 1,
) -> dict[str, Any]:
    target = system.create()
    coord = system.coordinator(target)
    sampler: Sampler | None = None
    try:
        kafka_publish(system.bootstrap, target["topic"], n, size)
        stats = coord.stats
        _wait(lambda: stats().available >= n, 300, f"{n} messages ingested")
        if profile is not None:
            sampler = Sampler(coord.pid, profile)
            sampler.start()
        cpu0 = coord.cpu_seconds()
        # each consumer takes its share; together they take all n
        shares = [n // consumers + (1 if i < n % consumers else 0) for i in range(consumers)]
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.wire_cpu",
                    "--consume",
                    target["server"],
                    target["queue"],
                    str(share),
                    str(window),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
            for share in shares
        ]
        outputs = [proc.communicate(timeout=600) for proc in procs]
        for proc, (_, err) in zip(procs, outputs, strict=True):
            if proc.returncode != 0:
                raise RuntimeError(f"consumer failed: {err[-2000:]}")
        cpu = coord.cpu_seconds() - cpu0
        if sampler is not None:
            sampler.stop()
            sampler.log.unlink(missing_ok=True)
        each = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        consumer_cpu = sum(c["consumer_cpu_s"] for c in each)
        wall = max(c["wall_s"] for c in each)
        frames: dict[str, int] = {}
        threads: dict[str, float] = {}
        for c in each:
            for kind, count in c["frames"].items():
                frames[kind] = frames.get(kind, 0) + count
            for name, seconds in c.get("threads_cpu_s", {}).items():
                threads[name] = threads.get(name, 0.0) + seconds
        return {
            "messages": n,
            "consumers": consumers,
            "coordinator_cpu_s": round(cpu, 3),
            "coordinator_us_per_msg": round(cpu / n * 1e6, 1),
            "consumer_cpu_s": round(consumer_cpu, 3),
            "consumer_us_per_msg": round(consumer_cpu / n * 1e6, 1),
            "consume_wall_s": round(wall, 2),
            "msgs_per_s": round(n / wall),
            "frames_received": frames,
            "consumer_threads_us_per_msg": {
                name: round(seconds / n * 1e6, 1)
                for name, seconds in sorted(threads.items(), key=lambda kv: -kv[1])
            },
        }
    finally:
        system.delete(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--window", type=int, default=500, help="the consumer's max_backlog")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--consumers", type=int, default=1,
        help="consumer processes, each with its share of the messages (leases in turn)",
    )  # fmt: skip
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    parser.add_argument(
        "--profile", action="store_true",
        help="sample the coordinator with py-spy during the last run's delivery + ack phase",
    )  # fmt: skip
    parser.add_argument("--consume", nargs=4, metavar=("ADDRESS", "QUEUE", "N", "WINDOW"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args(argv)
    if args.consume:
        address, queue, n, window = args.consume
        consume(address, queue, int(n), int(window))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="qlayer-wire-cpu-"))
    runs: list[dict[str, Any]] = []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    raw = RESULTS / f"wire-cpu-{args.label or 'run'}-{stamp}-pyspy.txt"
    with EmbeddedBroker() as broker:
        system = QLayer(broker.bootstrap_servers, workdir, embedded=True, window=args.window)
        for i in range(args.runs):
            last = i == args.runs - 1
            sampled = raw if args.profile and last else None
            run = one_run(system, args.messages, args.size, args.window, sampled, args.consumers)
            runs.append(run)
            print(f"run {i + 1}/{args.runs}: {json.dumps(run)}", flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    median = {
        key: statistics.median(r[key] for r in runs)
        for key in ("coordinator_us_per_msg", "consumer_us_per_msg", "msgs_per_s")
    }
    result = {
        **cpu_result.head("wire-cpu", args, ("messages", "size", "window", "runs", "consumers")),
        "median": median,
        "runs": runs,
    }
    if args.profile:
        packed = compact(raw)
        summary = summarize(packed)
        print(render(summary))
        result["profile"] = {"raw_file": packed.name, "of_run": args.runs, **summary}
    out = cpu_result.write(result, stamp)
    print(f"median: {json.dumps(median)}\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
