"""Partitioned queues (issue 12, Solace's partitioned queues): ``distribution = "partitioned"``.

A partitioned queue ``q`` over a topic of ``partitions`` partitions runs as that many
**shards**, ``q#0`` .. ``q#N-1``: shard ``i`` is an ordinary queue (its own engine, changelog
``<prefix><cluster>.q.shard-i`` and control partition) that reads only partition ``i`` of the
topic (and, with ``view_topic = "v"``, writes the view topic ``v.shard-i`` and its
generations). So a cluster spreads the shards over its members as it spreads queues, and order,
priority, ``target_queue_depth``, barriers, fairness and ``exclusive`` hold per partition.

The coordinator serves shards (``expand``); calls naming ``q`` itself fan out to its shards
(stats summed, browse merged, publish to the topic, whose partitioner picks the partition), and
a client subscribing to ``q`` opens one stream per shard and merges them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from layer.config import QueueConfig
from layer.config.model import (
    parse_shard,
    queue_of,
    shard_name,
    shard_view_topic,
    shared_view_topic,
    view_topics,
)

__all__ = [
    "expand",
    "parse_shard",
    "queue_of",
    "shard_name",
    "shard_names",
    "shard_view_topic",
    "shared_view_topic",
    "shards_in",
    "view_topics",
]


def shard_names(queue: QueueConfig) -> list[str]:
    """The names of a partitioned queue's shards (empty for any other queue)."""
    if not queue.partitioned or queue.partitions is None:
        return []
    return [shard_name(queue.name, i) for i in range(queue.partitions)]


def expand(queues: Iterable[QueueConfig]) -> tuple[QueueConfig, ...]:
    """The queues a coordinator serves: each partitioned queue as its shards."""
    out: list[QueueConfig] = []
    for q in queues:
        if not q.partitioned or q.partitions is None:
            out.append(q)
            continue
        out.extend(
            replace(
                q,
                name=shard_name(q.name, i),
                shard=i,
                view_topic=None if q.view_topic is None else shard_view_topic(q.view_topic, i),
            )
            for i in range(q.partitions)
        )
    return tuple(out)


def shards_in(queue: str, names: Sequence[str]) -> list[str]:
    """The shards of ``queue`` among ``names`` (a cluster's queue list), in shard order."""
    found = []
    for name in names:
        parsed = parse_shard(name)
        if parsed is not None and parsed[0] == queue:
            found.append(parsed)
    return [shard_name(q, i) for q, i in sorted(found, key=lambda p: p[1])]
