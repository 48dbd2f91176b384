"""The asyncio client's queue-definition calls against a real coordinator: create, alter,
list, delete, a temporary queue, and the refusals, raised as the sync client raises them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import AsyncQueueClient
from layer.exceptions import ConfigError, QueueBusy, QueueExists, UnknownQueue

pytestmark = pytest.mark.integration


async def _one(client: AsyncQueueClient, queue: str, data: bytes) -> float | None:
    """Publish ``data``, receive it and ack it; the lease period its queue reports."""
    await client.publish(queue, data)
    async with client.subscribe(queue) as sub:
        msg = await sub.next(timeout=30)
        assert msg is not None and msg.data == data
        await msg.ack(wait=True, timeout=30)
    info = {i.name: i for i in await client.queues()}[queue]
    return info.lease_period_s


def test_async_client_defines_alters_and_deletes_queues(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q, tmp, topic = names("aioq"), names("aiotmp"), names("aiot")
    proc = coordinator_factory([])

    async def scenario() -> None:
        async with AsyncQueueClient(str(proc.address)) as client:
            info = await client.create_queue(
                {"name": q, "underlying_topic": topic, "message_type": "bytes"}
            )
            assert info.name == q and info.options["message_type"] == '"bytes"'
            assert await _one(client, q, b"one") == 60.0  # the default lease_period

            with pytest.raises(QueueExists):
                await client.create_queue({"name": q, "underlying_topic": topic})
            with pytest.raises(ConfigError, match="lease_period"):
                await client.create_queue(
                    {"name": names("x"), "underlying_topic": topic, "lease_period": -1}
                )
            with pytest.raises(ConfigError, match="cannot change while the queue serves"):
                await client.alter_queue(q, {"semantics": "at-most-once"})
            with pytest.raises(UnknownQueue):
                await client.alter_queue(names("nope"), {"max_deliveries": 2})

            altered = await client.alter_queue(q, {"lease_period": "10s"})
            assert altered.options["lease_period"] == "10.0"  # stored in seconds
            assert await _one(client, q, b"two") == 10.0  # live, no restart

            made = await client.create_temporary_queue(tmp, names("replies"), message_type="bytes")
            assert made.temporary and made.origin.startswith("temporary:")
            defined = {d.name: d for d in await client.queue_definitions()}
            assert {q, tmp} <= set(defined) and defined[tmp].temporary

            # a leased message refuses a plain delete; force deletes
            await client.publish(q, b"three")
            async with client.subscribe(q) as sub:
                assert await sub.next(timeout=30) is not None
                with pytest.raises(QueueBusy):
                    await client.delete_queue(q)
                await client.delete_queue(q, force=True)
            assert q not in {d.name for d in await client.queue_definitions()}
            with pytest.raises(UnknownQueue):
                await client.stats(q)
            with pytest.raises(UnknownQueue):
                await client.delete_queue(q)

    asyncio.run(scenario())
