"""CPU per message of the coordinator's rounds and acks, in process: no gRPC, no Kafka.

One plain JSON queue (at-least-once) over a RocksDB store, its changelog a port that answers
each commit at once. ``--messages`` messages (``--size`` bytes, over ``--partitions``
partitions) are admitted first, as the coordinator ingests a backlog; then ``--consumers``
subscriptions (``max_backlog=--window`` each) take them: rounds lease and record, and after
each round every message handed out is acked, as offset runs, through the subscriptions (as
the API hands acks over), until all are done. The figure is process CPU time (user + system,
``time.process_time``, the collector tuned as the coordinator tunes it) of that phase per
message: what leasing, recording, the store batch and acks cost, without the wire. Each run
gets a fresh queue and store; the best and the median of ``--runs`` go to
``bench/results/round-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.round_cpu --consumers 4 --label after
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from bench import cpu_result
from bench.admit_cpu import TOPIC, fetched_runtime
from layer.api.service import DeliveredMessage, OffsetRuns
from layer.coordinator.app import tune_gc
from layer.coordinator.commits import Offsets
from layer.coordinator.round import Rounds, RoundSignal
from layer.coordinator.subscriptions import Subscriptions
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import QLayerError
from layer.state.changelog import ChangelogRecord, ExtraRecord
from layer.state.rocksdb import RocksDBStore


class _Changelog:
    """Commits at once, numbering the records per changelog topic as Kafka would."""

    def __init__(self) -> None:
        self.next: dict[str, int] = {}
        self.records = 0

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        views: Sequence[ExtraRecord] = (),
    ) -> asyncio.Future[Offsets]:
        fut: asyncio.Future[Offsets] = asyncio.get_running_loop().create_future()
        offsets: Offsets = {}
        for topic, _key, _value in records:
            n = self.next.get(topic, 0)
            offsets[(topic, 0)] = n
            self.next[topic] = n + 1
        self.records += len(records)
        fut.set_result(offsets)
        return fut


class _Sink:
    """Keeps the bookmarks handed out, to ack them; reads a DeliveryBatch's column as the
    server writes it, without building its messages (a list of messages from a build
    without batches)."""

    def __init__(self) -> None:
        self.messages: list[Bookmark] = []

    def deliver(self, messages: Sequence[DeliveredMessage]) -> None:
        bookmarks = getattr(messages, "bookmarks", None)
        if bookmarks is None:
            bookmarks = [m.bookmark for m in messages]
        self.messages.extend(bookmarks)

    @property
    def unsent(self) -> int:
        return 0

    def close(self, reason: str, error: QLayerError | None = None) -> None:
        pass


def _runs(bookmarks: Sequence[Bookmark]) -> list[OffsetRuns]:
    """The acks of ``bookmarks`` as the client sends them: inclusive offset runs per
    partition."""
    by_partition: dict[int, list[int]] = {}
    for b in sorted(bookmarks, key=lambda b: (b.partition, b.offset)):
        runs = by_partition.setdefault(b.partition, [])
        offset = b.offset
        if runs and runs[-1] == offset - 1:
            runs[-1] = offset
        else:
            runs.extend((offset, offset))
    return [OffsetRuns(TOPIC, p, runs) for p, runs in by_partition.items()]


async def one_run(n: int, size: int, partitions: int, consumers: int, window: int) -> dict:
    rt = fetched_runtime(n, size, partitions)
    q = rt.config
    runtimes = {q.name: rt}
    per = n // partitions
    workdir = tempfile.mkdtemp(prefix="qlayer-round-cpu-")
    store = RocksDBStore(Path(workdir))
    signal = RoundSignal()
    clock = time.time
    changelog = _Changelog()
    subs = Subscriptions(
        runtimes,
        store,
        clock=clock,
        wake=signal.wake,
        next_commit=signal.next_commit,
        check_alive=lambda: None,
        instance="bench",
    )
    rounds = Rounds(
        runtimes,
        store,
        changelog,
        signal,
        clock=clock,
        before_dispatch=subs.apply_backlogs,
        readers=list,
        commit_interval=0.0,
        interrupt=threading.Event(),
    )
    try:
        while rt.inbox:  # the backlog, admitted before anything is measured
            await rounds.one()
        total = per * partitions
        tune_gc()  # as the coordinator does before it serves
        sinks = [_Sink() for _ in range(consumers)]
        handles = [await subs.subscribe(q.name, window, sink) for sink in sinks]
        acked = count = 0
        began = time.process_time()
        while acked < total:
            await rounds.one()
            count += 1
            acks = []
            for handle, sink in zip(handles, sinks, strict=True):
                if sink.messages:
                    taken, sink.messages = sink.messages, []
                    acked += len(taken)
                    acks.append(asyncio.ensure_future(handle.ack(AckOp.ACK, _runs(taken))))
            await asyncio.sleep(0)  # the acks are taken; they wait on the next commit
            await rounds.one()
            count += 1
            for ack in acks:
                if await ack:
                    raise RuntimeError("an ack was refused")
        cpu = time.process_time() - began
        return {"cpu_s": round(cpu, 4), "us_per_msg": round(cpu / total * 1e6, 2), "rounds": count}
    finally:
        store.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--window", type=int, default=500, help="each consumer's max_backlog")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    cpu_result.repeat(
        "round-cpu",
        args,
        ("messages", "size", "partitions", "consumers", "window", "runs"),
        lambda: asyncio.run(
            one_run(args.messages, args.size, args.partitions, args.consumers, args.window)
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
