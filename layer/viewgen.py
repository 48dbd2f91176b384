"""A view topic's generations: how the history of a queue's view stays bounded.

A view topic (``view_topic = "orders.view"``) would otherwise keep every change forever: a topic
with ``retention.ms=-1`` grows by ~12 bytes a change, and time-based retention would delete the
old changes a reader still needs. Compaction cannot help either (a queue's rounds share one key,
and Tansu never compacts), nor can DeleteRecords (Tansu does not implement it: the request kills
the broker's connection task). Deleting a whole topic works on every broker. So the history is a
series of *generations*, topics named after the view topic:

    orders.view         generation 0 (the view topic itself)
    orders.view.g1      generation 1
    orders.view.g2      ...

Each generation after the first begins with a *snapshot*: the live contents of every queue
writing to it, as ``ViewRound`` records (+1 changes) marked with the ``SNAPSHOT_HEADER``; the
rounds that follow it are the changes since. A generation is complete by itself: read from its
start and reduced (per bookmark its last change, kept if +1), it is the live contents. The
coordinator (``layer.coordinator.view_history``) starts a new generation once the one it writes
holds more changes than a snapshot would, at most every ``view_snapshot_interval``, and deletes
every generation older than the two before the new one. A reader
(``connectors.spark_kafka.view``) starts at the newest generation that holds records and, in a
stream, goes on into each newer one past its snapshot (which only repeats what the older
generation already said), and stops asking about the older ones once it has read records of a
newer one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "SNAPSHOT_HEADER",
    "SNAPSHOT_MARK",
    "generation_of",
    "generation_topic",
    "generations",
    "is_snapshot",
]

#: header key of a snapshot record (value ``SNAPSHOT_MARK``)
SNAPSHOT_HEADER = "qlayer.view"
SNAPSHOT_MARK = b"snapshot"


def generation_topic(view_topic: str, generation: int) -> str:
    """The topic of a generation of ``view_topic`` (0 is the view topic itself)."""
    return view_topic if generation == 0 else f"{view_topic}.g{generation}"


def generation_of(view_topic: str, topic: str) -> int | None:
    """Which generation of ``view_topic`` ``topic`` is, or None if it is none."""
    if topic == view_topic:
        return 0
    found = re.fullmatch(re.escape(view_topic) + r"\.g([1-9][0-9]{0,9})", topic)
    return None if found is None else int(found.group(1))


def generations(view_topic: str, topics: Iterable[str]) -> list[tuple[int, str]]:
    """The generations of ``view_topic`` among ``topics``, oldest first."""
    found = []
    for topic in topics:
        generation = generation_of(view_topic, topic)
        if generation is not None:
            found.append((generation, topic))
    return sorted(found)


def is_snapshot(headers: Iterable[tuple[str, bytes | None]] | None) -> bool:
    """Whether a view record with these headers belongs to a generation's snapshot."""
    return any(key == SNAPSHOT_HEADER and value == SNAPSHOT_MARK for key, value in headers or ())
