"""Clients ride out coordinator restarts: real coordinator processes, stopped with SIGTERM and
SIGKILL, restarted on the same address or on the client's second one."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer

from layer.client import AsyncQueueClient, QueueClient
from layer.exceptions import ConnectionLost, InvalidRequest
from tests.harness import ROOT, CoordinatorProcess
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def coordinator_on(
    coordinator_factory: Callable[..., CoordinatorProcess], queue: str, address: str
) -> CoordinatorProcess:
    c = coordinator_factory(queues=[{"name": queue, "underlying_topic": queue}], start=False)
    c.listen = address
    c.start()
    return c


class Feed:
    """A plain Kafka producer publishing numbered messages until stopped (the coordinator may
    be down meanwhile: the topic does not care)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
        self._topic = topic
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._producer.produce(self._topic, json.dumps({"n": self.sent}).encode())
            self._producer.poll(0)
            self.sent += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(10)
        assert self._producer.flush(30) == 0
        return self.sent


def test_a_readme_consumer_rides_out_restarts_and_an_address_switch(
    broker: Any, coordinator_factory: Callable[..., CoordinatorProcess], names: Any
) -> None:
    q = names("orders")
    a, b = free_address(), free_address()
    c = coordinator_on(coordinator_factory, q, a)
    seen: dict[int, float] = {}  # n -> when first delivered
    deliveries: list[tuple[float, int]] = []  # (when, reconnects so far)
    result: dict[str, Any] = {}

    def consume() -> None:
        # exactly the README's Python example: no retry code of its own
        with QueueClient(f"{a},{b}") as client, client.subscribe(q, max_backlog=10) as sub:
            result["sub"] = sub  # for the test to watch, not part of the example
            for msg in sub:
                order = msg.json()
                if order.get("stop"):
                    msg.ack()
                    break
                deliveries.append((time.monotonic(), sub.reconnects))
                seen.setdefault(order["n"], time.monotonic())
                msg.ack()
            result["unconfirmed"] = sub.unconfirmed_acks
            result["reconnects"] = sub.reconnects
            result["address"] = sub.address

    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    feed = Feed(broker.bootstrap_servers, q)
    gaps: list[tuple[str, float]] = []
    for i, (how, to) in enumerate((("SIGTERM", a), ("SIGKILL", a), ("SIGTERM", a), ("SIGKILL", b))):
        wait_until(lambda: len(seen) >= 20 * (1 + len(gaps)), timeout=60, message="no progress")
        c.stop() if how == "SIGTERM" else c.kill()
        c.listen = to
        c.start()

        def resumed(n: int = i + 1) -> bool:
            return any(r == n for _, r in deliveries[-20:])

        wait_until(resumed, timeout=60, message=f"no delivery after restart {i + 1}")
        last_before = max(t for t, r in deliveries if r == i)
        first_after = min(t for t, r in deliveries if r == i + 1)
        gaps.append((f"{how} -> {to}", first_after - last_before))
    total = feed.stop()
    wait_until(lambda: len(seen) == total, timeout=60, message=lambda: f"{len(seen)}/{total}")
    with QueueClient(b) as client:
        client.publish(q, {"stop": True})
        consumer.join(30)
        assert not consumer.is_alive()
        # every message acked: nothing left in the queue (an unconfirmed ack's message came
        # back and was acked again)
        wait_until(lambda: (s := client.stats(q)[0]).available == 0 and s.leased == 0, timeout=30)
    assert sorted(seen) == list(range(total))
    assert result["reconnects"] == 4 and result["address"] == b, result
    assert result["unconfirmed"] >= 0
    print(
        "\nreconnect gaps (last delivery before -> first after): "
        + ", ".join(f"{what}: {gap:.2f}s" for what, gap in gaps)
        + f"; messages={total} unconfirmed_acks={result['unconfirmed']}"
    )


def test_async_client_rides_out_a_restart(
    broker: Any, coordinator_factory: Callable[..., CoordinatorProcess], names: Any
) -> None:
    q = names("orders")
    address = free_address()
    c = coordinator_on(coordinator_factory, q, address)
    events: list[Any] = []

    async def main() -> None:
        async with AsyncQueueClient(address, on_reconnect=events.append) as client:
            await client.publish(q, {"n": 1})
            async with client.subscribe(q, max_backlog=5) as sub:
                first = await sub.next(timeout=10)
                assert first is not None
                await first.ack(wait=True)
                held = await sub.next(timeout=0.2)
                assert held is None
                await client.publish(q, {"n": 2})
                held = await sub.next(timeout=10)
                assert held is not None and held.json() == {"n": 2}
                await asyncio.to_thread(c.kill)
                await asyncio.to_thread(c.start)
                again = await sub.next(timeout=60)  # n=2 comes back: its lease was returned
                assert again is not None and again.json() == {"n": 2} and again.deliveries == 2
                with pytest.raises(Exception) as lost:
                    await held.ack(wait=True)  # delivered on the dead connection
                assert type(lost.value).__name__ == "LeaseLost"
                await again.ack(wait=True)
                assert sub.reconnects == 1 and sub.unconfirmed_acks == 0

    asyncio.run(main())
    assert len(events) == 1 and events[0].address == address and events[0].downtime_s > 0


def test_cli_consume_keeps_running_across_a_restart(
    broker: Any, coordinator_factory: Callable[..., CoordinatorProcess], names: Any
) -> None:
    q = names("orders")
    address = free_address()
    c = coordinator_on(coordinator_factory, q, address)
    proc = subprocess.Popen(
        [sys.executable, "-m", "layer.cli", "consume", q, "--server", address, "--count", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with QueueClient(address) as client:
            client.publish(q, {"n": 1})
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["data"] == {"n": 1}
        c.stop()
        c.start()
        with QueueClient(address) as client:
            client.publish(q, {"n": 2})
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["data"] == {"n": 2}
        assert "reconnected" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_close_logs_nothing_and_reconnect_false_reports_the_loss(
    broker: Any,
    coordinator_factory: Callable[..., CoordinatorProcess],
    names: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    q = names("orders")
    address = free_address()
    c = coordinator_on(coordinator_factory, q, address)
    caplog.set_level(logging.DEBUG, logger="layer.client")
    with QueueClient(address) as client:
        client.publish(q, b'"x"')
        with client.subscribe(q) as sub:
            msg = sub.next(timeout=10)
            assert msg is not None
            msg.ack()
    assert [r for r in caplog.records if r.levelno >= logging.INFO] == []
    with QueueClient(address, reconnect=False) as client:
        sub = client.subscribe(q)
        c.stop()
        with pytest.raises(ConnectionLost):
            sub.next(timeout=30)
        with pytest.raises(ConnectionLost):
            client.stats(q)


def test_publish_to_a_pattern_queue_without_a_target_names_the_fix(
    broker: Any, coordinator_factory: Callable[..., CoordinatorProcess], names: Any
) -> None:
    q = names("pattern")
    c = coordinator_factory(queues=[{"name": q, "underlying_topic": f"^{q}-.*"}])
    with QueueClient(c.address or "") as client:
        with pytest.raises(InvalidRequest, match="default_publish_target") as refused:
            client.publish(q, b"x")
        assert q in str(refused.value)
