"""The latency stages (``layer.coordinator.stages``): weighted percentiles, and a round over the
in-memory ports timing each stage once per batch with the batch's message count."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import Message

from layer.api.service import OffsetRuns
from layer.coordinator.ingest import Fetched, PartitionStarted
from layer.coordinator.stages import Stages
from layer.engine.model import AckOp
from tests.unit.ports import TOPIC, TP, fetch
from tests.unit.test_round import Bench


def test_percentiles_weigh_each_sample_by_its_messages() -> None:
    stages = Stages()
    stages.add("commit", 0.001, 99)
    stages.add("commit", 0.010, 1)
    p50, p99 = stages.percentiles("commit") or []
    assert 0.001 <= p50 <= 0.00105  # within its bucket: 5% above at most
    assert 0.010 <= p99 <= 0.0105
    stages.add("commit", 5.0, 0)  # a batch of no messages says nothing
    assert set(stages.extra()) == {"stage_commit_p50_ms", "stage_commit_p99_ms"}
    assert stages.percentiles("fetch") is None


def test_percentiles_agree_with_the_sorted_values_within_a_bucket() -> None:
    stages = Stages()
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms .. 1 s
    for v in values:
        stages.add("push", v)
    for q, at in zip(
        (0.5, 0.9, 0.99), stages.percentiles("push", (0.5, 0.9, 0.99)) or [], strict=True
    ):
        exact = values[int(q * len(values))]
        assert exact <= at <= exact * 1.051
    # out of range either way lands in the end buckets, never raises
    stages.add("push", -0.5)
    stages.add("push", 1e6)


def test_a_round_times_fetch_wait_decide_and_commit_for_its_messages() -> None:
    async def scenario() -> None:
        b = Bench()
        b.rt.stages = Stages()
        _, sink = await b.subscribe()
        now = time.time()
        sent_ms = int((now - 0.020) * 1000)  # produced 20 ms before the fetch
        messages = [
            Message(topic=TOPIC, partition=0, offset=i, value=b'{"n": 1}', timestamp=(1, sent_ms))
            for i in range(40)
        ]
        b.rt.take_fetched(Fetched(messages, {TP: 40}, [PartitionStarted(TP, 0)], now))
        await b.rounds.one()
        assert len(sink.messages) == 10  # the backlog
        extra = b.rt.stages.extra()
        assert set(extra) == {
            f"stage_{s}_{q}_ms"
            for s in ("fetch", "round_wait", "lease", "decide", "commit")
            for q in ("p50", "p99")
        }
        assert 19.0 <= extra["stage_fetch_p50_ms"] <= 22.0
        assert 0.0 <= extra["stage_round_wait_p50_ms"] < 60_000
        # each stage weighs the messages it covers: all 40 waited for the round, 10 were delivered
        assert sum(b.rt.stages._counts["round_wait"]) == 40
        assert sum(b.rt.stages._counts["commit"]) == 10
        assert sum(b.rt.stages._counts["lease"]) == 10
        # produced 20 ms before the fetch, leased by the round after it: at least the fetch
        assert extra["stage_lease_p50_ms"] >= extra["stage_fetch_p50_ms"]
        assert sum(b.rt.stages._counts["fetch"]) == 40
        assert not b.rt.fetched_at  # every fetch of the inbox was admitted

    asyncio.run(scenario())


def test_an_ack_is_timed_from_received_to_confirmed_per_acked_message() -> None:
    async def scenario() -> None:
        b = Bench()
        b.rt.stages = Stages()
        handle, _sink = await b.subscribe()
        fetch(b.rt, [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}'])
        await b.rounds.one()
        sent = time.time()
        ack = asyncio.ensure_future(handle.ack(AckOp.ACK, [OffsetRuns("orders", 0, [0, 0, 2, 2])]))
        await asyncio.sleep(0.01)  # taken, waiting on the next commit: not confirmed yet
        assert not ack.done() and not sum(b.rt.stages._counts["ack"])
        await b.rounds.one()
        assert await ack == []
        took = time.time() - sent
        assert sum(b.rt.stages._counts["ack"]) == 2
        # timed from the ack's arrival (not from the delivery, before it) to its confirmation
        # (after the round): within the call's own time, reported at a bucket's upper bound
        # (5% above); when the ack arrives on a loaded machine is not known more closely
        p50, _p99 = b.rt.stages.percentiles("ack") or []
        assert 0 < p50 <= took * 1.06 + 1e-4

    asyncio.run(scenario())
