"""The view topic's record, ``ViewRound`` (``avro/view_round.avsc``): its one codec.

The coordinator writes a ``ViewRound`` for every round that changed a queue's live contents
(``layer.coordinator.view``); the Spark connector (``connectors.spark_kafka.view``) reads them.
Both import this module, so neither depends on the other. The changes travel as packed columns
(little-endian arrays in Avro ``bytes``), written here without a generic Avro encoder and read
with ``layer.codec``'s.
"""

from __future__ import annotations

import dataclasses
import sys
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from layer.avro_fast import long
from layer.codec import default_codec
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.exceptions import SerializationError

__all__ = ["VIEW_ROUND", "VIEW_ROUND_VERSION", "ViewRound", "decode_round", "encode_round"]

VIEW_ROUND = "view_round"
VIEW_ROUND_VERSION = 2  # the format byte of avro/view_round.avsc (1: without lease changes)

_LITTLE = sys.byteorder == "little"


def _packed(typecode: str, values: Sequence[int]) -> bytes:
    column = array(typecode, values)
    if not _LITTLE:
        column.byteswap()
    return column.tobytes()


def _bytes(data: bytes) -> bytes:
    return long(len(data)) + data


def encode_round(
    queue: str, changes: ViewChanges, at_ms: int, leases: Sequence[ViewChange] = ()
) -> bytes:
    """One round's changes as a ``ViewRound`` (format byte first, as ``layer.codec`` writes):
    ``changes`` of the live contents, then ``leases``, changes of the set of leased messages
    (``ViewChange.holder`` set)."""
    if leases:
        changes = _with_leases(changes, leases)
    bookmarks = changes.bookmarks
    if not bookmarks:  # a snapshot of an empty queue (layer.viewgen)
        topics, topic_index = [], b""
    elif all(bm.topic == bookmarks[0].topic for bm in bookmarks):
        topics, topic_index = [bookmarks[0].topic], b""
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
    if leases:
        holders: dict[str, int] = {}
        for lease in leases:
            holders.setdefault(lease.holder or "", len(holders) + 1)
        parts.append(long(len(holders)))
        for holder in holders:
            h = holder.encode()
            parts += (long(len(h)), h)
        parts.append(b"\x00")
        none = [0] * (len(changes) - len(leases))
        holder_index = none + [holders[lease.holder or ""] for lease in leases]
        parts += (
            _bytes(_packed("H", holder_index)),
            _bytes(_packed("q", none + [lease.leased_at for lease in leases])),
        )
    else:
        parts.append(b"\x00\x00\x00")  # no holders, empty holder_index and leased_at
    return b"".join(parts)


def _with_leases(changes: ViewChanges, leases: Sequence[ViewChange]) -> ViewChanges:
    """``changes`` followed by ``leases`` (a new ViewChanges: ``changes`` is left as it is)."""
    both = ViewChanges(
        list(changes.bookmarks),
        list(changes.signs),
        list(changes.deliveries),
        list(changes.cancels),
        None if changes.priorities is None else list(changes.priorities),
    )
    for lease in leases:
        both.append(lease)
    return both


@dataclass(frozen=True, slots=True)
class ViewRound:
    """A decoded ``ViewRound``: the queue, the time, the changes of the live contents in
    order, and the lease changes in order (none before version 2)."""

    queue: str
    at_ms: int
    changes: list[ViewChange]
    leases: list[ViewChange] = dataclasses.field(default_factory=list)


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
    if not record["holder_index"]:
        return ViewRound(record["queue"], record["at_ms"], changes)
    holders: list[str] = record["holders"]
    index = _unpacked("H", record["holder_index"], n, "holder_index")
    leased_at = _unpacked("q", record["leased_at"], n, "leased_at")
    contents: list[ViewChange] = []
    leases: list[ViewChange] = []
    try:
        for change, i, at in zip(changes, index, leased_at, strict=True):
            if i:
                leases.append(change._replace(holder=holders[i - 1], leased_at=at))
            else:
                contents.append(change)
    except IndexError:
        raise SerializationError("view round: a holder index past its holders") from None
    return ViewRound(record["queue"], record["at_ms"], contents, leases)
