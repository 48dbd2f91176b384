"""The view topic: every change of a queue's live contents, for Spark views.

A queue with ``view_topic`` publishes a ``ViewChange`` record (``avro/view_change.avsc``; Kafka
key: the bookmark) whenever a message enters (+1) or leaves (-1) the set a browse shows. The
records go into the round's changelog transaction, so the view never runs ahead of, nor lags
behind, the state it describes. Both signs carry the message, so a reader can keep an aggregate
of any field by summing ``sign * f(message)``; the last record of a bookmark says whether it is
in the view now.

A restart may rebuild a queue differently from what the view topic last said (a wiped state
directory re-reads the topics; a lease that timed out while the coordinator was down): at start
the coordinator reads the view topic back and publishes the corrections (``reconcile``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Message

from layer import avro_fast
from layer.codec import decode
from layer.coordinator.scan import scan_topic
from layer.engine.model import Bookmark, ViewChange
from layer.state.base import StoredMessage

log = logging.getLogger(__name__)

VIEW_CHANGE = "view_change"

#: (topic, key, value, headers), as the changelog writer takes extra records
ViewRecord = tuple[str, bytes, bytes, None]


def view_record(
    topic: str,
    queue: str,
    bookmark: Bookmark,
    sign: int,
    deliveries: int,
    cancels: int,
    stored: StoredMessage | None,
    at_ms: int | bytes,
) -> ViewRecord:
    if stored is None:  # never while the store is intact: the change still says what happened
        stored = StoredMessage(None, None)
    value = avro_fast.view_change(
        sign,
        queue,
        bookmark.topic,
        bookmark.partition,
        bookmark.offset,
        stored.key,
        stored.value,
        stored.headers,
        stored.timestamp_ms,
        stored.priority,
        deliveries,
        cancels,
        at_ms,
    )
    return (topic, str(bookmark).encode(), value, None)


def view_records(
    topic: str,
    queue: str,
    changes: Sequence[ViewChange],
    payloads: Mapping[Bookmark, StoredMessage | None],
    at_ms: int,
) -> list[ViewRecord]:
    return [
        view_record(
            topic,
            queue,
            c.bookmark,
            c.sign,
            c.deliveries,
            c.cancels,
            payloads.get(c.bookmark),
            at_ms,
        )
        for c in changes
    ]


def read_view(
    settings: Mapping[str, Any], topic: str, idle_timeout: float = 30.0
) -> dict[Bookmark, bytes]:
    """The view topic's current contents: for every bookmark whose last record is +1, that
    record's value (a broker that never compacts makes this read the whole history)."""
    contents: dict[Bookmark, bytes] = {}

    def apply(msg: Message) -> None:
        key, value = msg.key(), msg.value()
        if key is None or not value or len(value) < 2:
            return  # not ours: a reader skips it too
        bookmark = Bookmark.parse(key.decode())
        if value[1] == 0x02:  # the zig-zag varint of sign +1
            contents[bookmark] = value
        else:
            contents.pop(bookmark, None)

    scan_topic(settings, topic, "view topic", apply, idle_timeout)
    return contents


def reconcile(
    topic: str,
    queue: str,
    published: Mapping[Bookmark, bytes],
    live: Iterable[tuple[Bookmark, int, int]],
    payloads: Mapping[Bookmark, StoredMessage | None],
    at_ms: int,
) -> list[ViewRecord]:
    """The records that bring the view topic (``published``) to the queue's live contents
    (``live``: bookmark, deliveries, cancels). ``payloads`` holds the messages of ``live``
    that are not published yet."""
    records: list[ViewRecord] = []
    live_now = set()
    for bookmark, deliveries, cancels in live:
        live_now.add(bookmark)
        if bookmark not in published:
            stored = payloads.get(bookmark)
            records.append(
                view_record(topic, queue, bookmark, 1, deliveries, cancels, stored, at_ms)
            )
    for bookmark, value in published.items():
        if bookmark in live_now:
            continue
        old = decode(VIEW_CHANGE, value)
        stored = StoredMessage(
            old["key"],
            old["value"],
            tuple((h["key"], h["value"]) for h in old["headers"]),
            old["timestamp_ms"],
            old["priority"],
        )
        records.append(
            view_record(
                topic, queue, bookmark, -1, old["deliveries"], old["cancels"], stored, at_ms
            )
        )
    if records:
        log.info("view topic=%s queue=%s: %d corrections after restart", topic, queue, len(records))
    return records
