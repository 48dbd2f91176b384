"""``replace`` in a cluster (issue 12): a subscription lives on the member serving its queue, so
a replace to a queue another member serves is refused with ``NotOwner`` naming that member's
address (not as an unknown queue), and the subscription goes on as it was.

Real coordinator processes of one cluster over the embedded broker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from layer.exceptions import NotOwner
from tests.harness import serving
from tests.helpers import wait_until
from tests.integration.test_cluster import one_per_partition, served_by

pytestmark = pytest.mark.integration


def test_a_replace_to_a_queue_of_another_member_names_it_and_changes_nothing(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster = names("cluster")
    queues = one_per_partition(names("q"))
    tables = [{"name": q, "underlying_topic": q, "message_type": "bytes"} for q in queues]
    first = coordinator_factory(tables, cluster=cluster)
    second = coordinator_factory([], cluster=cluster)
    with QueueClient(f"{first.address},{second.address}") as client:
        ida, idb = (QueueClient(str(p.address)).cluster().member for p in (first, second))

        def split() -> bool:
            mine, theirs = served_by(client, ida, queues), served_by(client, idb, queues)
            return bool(mine) and bool(theirs) and serving(client, queues)

        wait_until(split, timeout=60, message=lambda: f"no split: {client.cluster()}")
        here = sorted(served_by(client, ida, queues))[0]
        there = sorted(served_by(client, idb, queues))[0]
        with client.subscribe(here) as sub:
            assert sub.address == first.address
            with pytest.raises(NotOwner, match=re.escape(str(second.address))):
                sub.replace(queue=there)
            assert sub.queue == here
            client.publish(here, b"still-here")
            msg = sub.next(timeout=30)
            assert msg is not None and msg.data == b"still-here"
            msg.ack(wait=True, timeout=30)
