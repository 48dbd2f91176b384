"""A client follows its queue away from a member that hangs (issue 12, "clients follow the
work"): three coordinator processes of one cluster over the embedded broker, a consumer
following a queue; its owner is stopped (SIGSTOP) mid-stream and stays stopped.

The stopped process's kernel keeps the client's TCP connection open, so nothing ends the
stream; the client's watch of its member (``layer.client._follow.HungOwner``) finds it not
answering and another member saying it serves the queue, gives the stream up (its leases
come again from the new owner, its acks unconfirmed) and subscribes there while the old owner
is still stopped. Then the old owner is woken: fenced, it exits; every message is confirmed
once and nothing whose ack was confirmed is delivered again. The stop -> first delivery from
the new owner is printed (``python -m bench.failover --how stop`` reports it over many stops).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import AsyncQueueClient, QueueClient, Reconnected
from layer.exceptions import LeaseLost, NotOwner
from tests.fault.test_cluster_failover import DEADLINE_S, N, Run, three_members
from tests.helpers import wait_until

pytestmark = pytest.mark.fault


def owner_process(admin: QueueClient, procs: list[Any], q: str) -> Any:
    owner = next(o.address for o in admin.cluster().queues if o.queue == q)
    return next(p for p in procs if str(p.address) == owner)


def check(run: Run, published: set[str], owner: Any, events: list[Reconnected]) -> None:
    took = run.followed_at - run.stopped_at
    print(f"\nSIGSTOP: first delivery from the new owner {took:.2f}s after the stop")
    assert run.followed_at, "no delivery from another member while the owner was stopped"
    # it left the stopped member for the member that said it serves the queue, not because
    # the connection ended (gRPC's keepalive) or the woken member exited
    assert events and isinstance(events[0].error, NotOwner), events
    assert "does not answer" in str(events[0].error), events
    # the ack sent to the stopped member was never confirmed (LeaseLost: it comes again)
    assert run.unconfirmed, "the ack sent to the stopped member was confirmed"
    assert len(run.confirmed) == len(set(run.confirmed)), "a message acked twice"
    assert set(run.confirmed) == published
    # woken, the old owner finds itself fenced and exits
    wait_until(lambda: not owner.running, timeout=60, message="the stopped owner serves on")
    assert "fenced" in owner.log_path.read_text(errors="replace")


def test_a_consumer_leaves_a_stopped_owner_for_the_member_serving_its_queue(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    procs, q, published, admin = three_members(coordinator_factory, names)
    owner = owner_process(admin, procs, q)
    run = Run()
    events: list[Reconnected] = []
    addresses = [str(p.address) for p in procs]
    try:
        with (
            QueueClient(addresses, on_reconnect=events.append) as client,
            client.subscribe(q, 5) as sub,
        ):
            assert sub.address == str(owner.address)
            deadline = time.monotonic() + DEADLINE_S
            while set(run.confirmed) != published and time.monotonic() < deadline:
                msg = sub.next(timeout=5)
                if msg is None:
                    continue
                run.deliveries.append((msg.bookmark, str(sub.address), msg.deliveries))
                assert msg.bookmark not in run.confirmed, f"{msg.bookmark} came again after its ack"
                if run.stopped_at and not run.followed_at and sub.address != str(owner.address):
                    run.followed_at = time.monotonic()
                    assert owner.running  # still stopped: not woken, not exited
                if not run.stopped_at and len(run.confirmed) >= N // 3:
                    owner.proc.send_signal(signal.SIGSTOP)
                    run.stopped_at = time.monotonic()
                try:
                    msg.ack(wait=True, timeout=60)
                    run.confirmed.append(msg.bookmark)
                except LeaseLost:
                    run.unconfirmed.append(msg.bookmark)
            owner.proc.send_signal(signal.SIGCONT)
            # woken: it delivers nothing more (its stream was given up), and nothing comes again
            late = sub.next(timeout=3)
            assert late is None, f"{late.bookmark} delivered after every ack was confirmed"
    finally:
        if owner.running:
            owner.proc.send_signal(signal.SIGCONT)
        admin.close()
    check(run, published, owner, events)


def test_an_asyncio_consumer_leaves_a_stopped_owner(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    procs, q, published, admin = three_members(coordinator_factory, names)
    owner = owner_process(admin, procs, q)
    run = Run()
    events: list[Reconnected] = []
    addresses = [str(p.address) for p in procs]

    async def consume() -> None:
        async with (
            AsyncQueueClient(addresses, on_reconnect=events.append) as client,
            client.subscribe(q, 5) as sub,
        ):
            assert sub.address == str(owner.address)
            deadline = time.monotonic() + DEADLINE_S
            while set(run.confirmed) != published and time.monotonic() < deadline:
                msg = await sub.next(timeout=5)
                if msg is None:
                    continue
                assert msg.bookmark not in run.confirmed, f"{msg.bookmark} came again after its ack"
                if run.stopped_at and not run.followed_at and sub.address != str(owner.address):
                    run.followed_at = time.monotonic()
                    assert owner.running
                if not run.stopped_at and len(run.confirmed) >= N // 3:
                    owner.proc.send_signal(signal.SIGSTOP)
                    run.stopped_at = time.monotonic()
                try:
                    await msg.ack(wait=True, timeout=60)
                    run.confirmed.append(msg.bookmark)
                except LeaseLost:
                    run.unconfirmed.append(msg.bookmark)
            owner.proc.send_signal(signal.SIGCONT)
            late = await sub.next(timeout=3)
            assert late is None, f"{late.bookmark} delivered after every ack was confirmed"

    try:
        asyncio.run(consume())
    finally:
        if owner.running:
            owner.proc.send_signal(signal.SIGCONT)
        admin.close()
    check(run, published, owner, events)
