"""Temporary queues in a cluster (issue 12): the member that serves a temporary queue watches
it, whichever member it was created through, so it goes with its state once its client is
gone; and a move to another member (its client following) starts the grace again there
instead of losing the queue or leaking it.

Real coordinator processes of one cluster over the embedded broker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from connectors.admin import TopicAdmin
from layer.client import QueueClient
from layer.coordinator.membership import partition_of
from layer.exceptions import UnknownQueue
from tests.harness import serving
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

# long enough for a client to follow its queue to the next owner on a loaded machine (a
# follow after a SIGTERM took up to 2.4 s, measured)
GRACE = 8.0


def name_on(base: str, partitions: list[int]) -> str:
    """A queue name whose control partition is one of ``partitions``."""
    i = 0
    while partition_of(f"{base}-{i}") not in partitions:
        i += 1
    return f"{base}-{i}"


def owner(client: QueueClient, queue: str) -> str | None:
    return next((q.member for q in client.cluster().queues if q.queue == queue), None)


def defined(client: QueueClient) -> set[str]:
    return {d.name for d in client.queue_definitions()}


def test_a_temporary_queue_goes_from_whichever_member_serves_it_and_survives_a_move(
    broker: Any, coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster = names("cluster")
    options = {"cluster": cluster, "temporary_queue_grace": f"{GRACE:g}s"}
    first = coordinator_factory([], **options)
    second = coordinator_factory([], **options)
    admin = TopicAdmin({"bootstrap.servers": broker.bootstrap_servers})
    a, b = QueueClient(str(first.address)), QueueClient(str(second.address))
    try:
        ida, idb = a.cluster().member, b.cluster().member

        def held() -> dict[str, list[int]]:
            return {m.id: m.partitions for m in a.cluster().members}

        wait_until(
            lambda: all(held().get(m) for m in (ida, idb)),
            timeout=60,
            message=lambda: f"no split: {a.cluster()}",
        )
        on_second = held()[idb]

        # 1. created through the first member, served by the second: the second deletes it
        q = name_on(names("replies"), on_second)
        changelog = f"qlayer.changelog.{cluster}.{q}"
        info = a.create_temporary_queue(q, names("replies-topic"), message_type="bytes")
        assert info.temporary and info.origin == f"temporary:{ida}"
        with a.subscribe(q) as sub:
            assert sub.address == second.address  # followed to the owner
            a.publish(q, b"reply-1")
            got = sub.next(timeout=30)
            assert got is not None and got.data == b"reply-1"
            got.ack(wait=True, timeout=30)
            # open for more than a grace: it stays
            time.sleep(GRACE + 2)
            assert q in defined(a)
        wait_until(lambda: changelog in admin.list_topics(), timeout=30)
        gone_at = time.monotonic()
        wait_until(
            lambda: q not in defined(a) and q not in defined(b),
            timeout=60,
            message=lambda: f"not deleted by its owner; log:\n{second.log_tail()}",
        )
        assert time.monotonic() - gone_at >= GRACE - 1.0
        with pytest.raises(UnknownQueue):
            a.stats(q)
        wait_until(lambda: changelog not in admin.list_topics(), timeout=60)
        # the owner wiped its local state (each member wipes what it holds)
        wait_until(
            lambda: "temporary queues deleted with their state" in second.log_path.read_text(),
            timeout=30,
        )

        # 2. created through the second, which then stops: the queue moves to the first with
        # its subscription following; it stays while followed (past a grace), keeps its acks,
        # and the first member (not its creator) deletes it once its client is gone
        q2 = name_on(names("moving"), on_second)
        changelog2 = f"qlayer.changelog.{cluster}.{q2}"
        b.create_temporary_queue(q2, names("moving-topic"), message_type="bytes")
        with QueueClient(f"{second.address},{first.address}") as c, c.subscribe(q2) as sub:
            assert sub.address == second.address
            c.publish(q2, b"before")
            got = sub.next(timeout=30)
            assert got is not None and got.data == b"before"
            got.ack(wait=True, timeout=30)
            assert second.stop() == 0
            wait_until(
                lambda: owner(a, q2) == ida and serving(a, [q2]),
                timeout=60,
                message=lambda: f"not taken over; log:\n{first.log_tail()}",
            )
            a.publish(q2, b"after")
            got = sub.next(timeout=60)
            assert got is not None and got.data == b"after"  # 'before' stays acked
            assert sub.address == first.address
            got.ack(wait=True, timeout=30)
            time.sleep(GRACE + 2)  # followed on the new owner: not deleted
            assert q2 in defined(a)
        wait_until(
            lambda: q2 not in defined(a),
            timeout=60,
            message=lambda: f"not deleted by its new owner; log:\n{first.log_tail()}",
        )
        wait_until(lambda: changelog2 not in admin.list_topics(), timeout=60)
    finally:
        a.close()
        b.close()
