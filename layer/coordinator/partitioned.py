"""Calls that name a partitioned queue itself, answered from its shards (``layer.shards``).

The shards are ordinary queues, each served by whichever member owns it; these functions take
the per-shard call (the service's own, which answers locally or forwards to the owner) and
combine: stats summed into one line, browse merged oldest first, publish through shard 0
(which writes to the topic: Kafka's partitioner picks the partition by key).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from layer.api.service import DeadLetter, DeliveredMessage, QueueStats

__all__ = ["browse_shards", "dead_letters_of_shards", "stats_of_shards", "sum_stats"]

T = TypeVar("T")

# measures that combine as the largest of the shards' (every other extra figure is summed)
_MAX_SUFFIXES = ("_s", "_ms")


def sum_stats(queue: str, parts: Sequence[QueueStats]) -> QueueStats:
    """One line for ``queue`` from its shards' lines: counts summed, ages and measures the
    largest, ``owner`` the members serving it (comma-separated, sorted)."""
    ages = [p.oldest_available_age_s for p in parts if p.oldest_available_age_s is not None]
    extra: dict[str, float | int] = {}
    for p in parts:
        for name, value in p.extra.items():
            if name.endswith(_MAX_SUFFIXES):
                extra[name] = max(extra.get(name, value), value)
            else:
                extra[name] = extra.get(name, 0) + value
    return QueueStats(
        queue=queue,
        available=sum(p.available for p in parts),
        leased=sum(p.leased for p in parts),
        inactive=sum(p.inactive for p in parts),
        subscriptions=sum(p.subscriptions for p in parts),
        oldest_available_age_s=max(ages) if ages else None,
        delivered_total=sum(p.delivered_total for p in parts),
        acked_total=sum(p.acked_total for p in parts),
        dead_lettered_total=sum(p.dead_lettered_total for p in parts),
        extra=extra,
        owner=",".join(sorted({p.owner for p in parts if p.owner})),
    )


async def stats_of_shards(
    queue: str, shards: Sequence[str], stats: Callable[[str], Awaitable[list[QueueStats]]]
) -> list[QueueStats]:
    """``queue``'s one line, summed over its shards (each asked at once; one that fails
    fails the call, naming its error)."""
    answers = await asyncio.gather(*(stats(s) for s in shards))
    return [sum_stats(queue, [line for lines in answers for line in lines])]


async def _merged(
    shards: Sequence[str],
    call: Callable[[str], Awaitable[list[T]]],
    order: Callable[[T], Any],
    limit: int | None,
) -> list[T]:
    """Each shard asked at once (one that fails fails the call), the answers merged in
    ``order``, at most ``limit``."""
    answers = await asyncio.gather(*(call(s) for s in shards))
    merged = sorted((item for items in answers for item in items), key=order)
    return merged if limit is None else merged[:limit]


async def browse_shards(
    shards: Sequence[str],
    browse: Callable[[str], Awaitable[list[DeliveredMessage]]],
    limit: int | None,
) -> list[DeliveredMessage]:
    """The shards' available messages merged, oldest (by record timestamp) first, at most
    ``limit``."""
    return await _merged(
        shards,
        browse,
        lambda m: (m.timestamp_ms, m.bookmark.partition, m.bookmark.offset),
        limit,
    )


async def dead_letters_of_shards(
    shards: Sequence[str],
    dead_letters: Callable[[str], Awaitable[list[DeadLetter]]],
    limit: int | None,
) -> list[DeadLetter]:
    """The shards' dead letters merged in the order they were dead-lettered, at most
    ``limit``."""
    return await _merged(shards, dead_letters, lambda d: (d.dead_lettered_at_ms, d.bookmark), limit)
