"""The view topic: every change of a queue's live contents, for Spark views.

A queue with ``view_topic`` publishes, for every round that changed the set a browse shows, one
``ViewRound`` record (``avro/view_round.avsc``; Kafka key: the queue name): for each message that
entered (+1) or left (-1) that set, its bookmark, counts and priority. The records go into the
round's changelog transaction, so the view never runs ahead of, nor lags behind, the state it
describes. The messages are not copied: the underlying topics already hold them, and a reader
(``connectors.spark_kafka.view``) fetches them by bookmark, on the Spark executors. So a change
costs the coordinator a few packed numbers, not a record carrying the message (which cost 10 to
20% of the coordinator's CPU per message: bench/view_cost.py). A reader keeps an aggregate of
any field by summing ``sign * f(message)``; the last change of a bookmark says whether it is in
the view now.

A restart may rebuild a queue differently from what the view topic last said (a wiped state
directory re-reads the topics; a lease that timed out while the coordinator was down): at start
the coordinator reads the view topic back and publishes the corrections (``reconcile``).
"""

from __future__ import annotations

import logging
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Message

from layer.avro_fast import long
from layer.codec import default_codec
from layer.coordinator.scan import scan_topic
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.exceptions import SerializationError

log = logging.getLogger(__name__)

VIEW_ROUND = "view_round"
VIEW_ROUND_VERSION = 1  # the format byte of avro/view_round.avsc (no history versions yet)

#: (topic, key, value, headers), as the changelog writer takes extra records
ViewRecord = tuple[str, bytes, bytes, None]

_LITTLE = sys.byteorder == "little"


def _packed(typecode: str, values: Sequence[int]) -> bytes:
    column = array(typecode, values)
    if not _LITTLE:
        column.byteswap()
    return column.tobytes()


def _bytes(data: bytes) -> bytes:
    return long(len(data)) + data


def encode_round(queue: str, changes: ViewChanges, at_ms: int) -> bytes:
    """One round's changes as a ``ViewRound`` (format byte first, as ``layer.codec`` writes)."""
    bookmarks = changes.bookmarks
    first = bookmarks[0].topic
    if all(bm.topic == first for bm in bookmarks):
        topics, topic_index = [first], b""
    else:
        index: dict[str, int] = {}
        for bm in bookmarks:
            index.setdefault(bm.topic, len(index))
        topics = list(index)
        topic_index = _packed("H", [index[bm.topic] for bm in bookmarks])
    priorities = changes.priorities
    if priorities is not None and any(p is not None for p in priorities):
        priority = _packed("Q", [0 if p is None else p for p in priorities])
        has_priority = bytes(p is not None for p in priorities)
    else:
        priority = has_priority = b""
    q = queue.encode()
    parts = [bytes((VIEW_ROUND_VERSION,)), long(len(q)), q, long(at_ms), long(len(changes))]
    parts.append(long(len(topics)))
    for topic in topics:
        t = topic.encode()
        parts += (long(len(t)), t)
    parts.append(b"\x00")  # the end of the topics array
    parts += (
        _bytes(topic_index),
        _bytes(_packed("i", [bm.partition for bm in bookmarks])),
        _bytes(_packed("q", [bm.offset for bm in bookmarks])),
        _bytes(_packed("b", changes.signs)),
        _bytes(_packed("i", changes.deliveries)),
        _bytes(_packed("i", changes.cancels)),
        _bytes(priority),
        _bytes(has_priority),
    )
    return b"".join(parts)


@dataclass(frozen=True, slots=True)
class ViewRound:
    """A decoded ``ViewRound``: the queue, the time, and the changes in order."""

    queue: str
    at_ms: int
    changes: list[ViewChange]


def _unpacked(typecode: str, data: bytes, count: int, field: str) -> array[int]:
    column = array(typecode)
    if len(data) != count * column.itemsize:
        raise SerializationError(
            f"view round: {field} holds {len(data)} bytes, not {count} x {column.itemsize}"
        )
    column.frombytes(data)
    if not _LITTLE:
        column.byteswap()
    return column


def decode_round(data: bytes) -> ViewRound:
    """A view topic record's value; ``SerializationError`` if it is not a ``ViewRound``."""
    record: dict[str, Any] = default_codec().decode(VIEW_ROUND, data)
    n = record["count"]
    topics: list[str] = record["topics"]
    if record["topic_index"] or len(topics) != 1:
        index = _unpacked("H", record["topic_index"], n, "topic_index")
        try:
            names = [topics[i] for i in index]
        except IndexError:
            raise SerializationError("view round: a topic index past its topics") from None
    else:
        names = topics * n
    partitions = _unpacked("i", record["partition"], n, "partition")
    offsets = _unpacked("q", record["offset"], n, "offset")
    signs = _unpacked("b", record["sign"], n, "sign")
    deliveries = _unpacked("i", record["deliveries"], n, "deliveries")
    cancels = _unpacked("i", record["cancels"], n, "cancels")
    priorities: list[int | None] = [None] * n
    if record["priority"]:
        values = _unpacked("Q", record["priority"], n, "priority")
        present = _unpacked("B", record["has_priority"], n, "has_priority")
        priorities = [v if h else None for v, h in zip(values, present, strict=True)]
    changes = [
        ViewChange(Bookmark(t, p, o), s, d, c, pr)
        for t, p, o, s, d, c, pr in zip(
            names, partitions, offsets, signs, deliveries, cancels, priorities, strict=True
        )
    ]
    return ViewRound(record["queue"], record["at_ms"], changes)


def view_record(topic: str, queue: str, changes: ViewChanges, at_ms: int) -> ViewRecord:
    return (topic, queue.encode(), encode_round(queue, changes, at_ms), None)


def read_view(
    settings: Mapping[str, Any], topic: str, queue: str, idle_timeout: float = 30.0
) -> dict[Bookmark, ViewChange]:
    """What the view topic says ``queue`` holds now: each bookmark whose last change is +1,
    with that change (rounds of other queues sharing the topic are passed over)."""
    contents: dict[Bookmark, ViewChange] = {}
    name = queue.encode()

    def apply(msg: Message) -> None:
        value = msg.value()
        if msg.key() != name or not value:
            return  # another queue's, or not ours: a reader skips it too
        for change in decode_round(value).changes:
            if change.sign > 0:
                contents[change.bookmark] = change
            else:
                contents.pop(change.bookmark, None)

    scan_topic(settings, topic, "view topic", apply, idle_timeout)
    return contents


def reconcile(
    published: Mapping[Bookmark, ViewChange], live: Sequence[ViewChange]
) -> list[ViewChange]:
    """The changes that bring the view topic (``published``) to the queue's live contents
    (``live``, +1 changes): a +1 for each live message not published, a -1 for each published
    one that is not live."""
    now = {change.bookmark for change in live}
    corrections = [change for change in live if change.bookmark not in published]
    corrections.extend(
        change._replace(sign=-1) for bm, change in published.items() if bm not in now
    )
    return corrections
