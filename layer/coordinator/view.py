"""The view topic: every change of a queue's live contents, for Spark views.

A queue with ``view_topic`` publishes, for every round that changed the set a browse shows, one
``ViewRound`` record (``avro/view_round.avsc``; Kafka key: the queue name): for each message that
entered (+1) or left (-1) that set, its bookmark, counts and priority (``layer.viewcodec``
encodes it). The records go into the round's changelog transaction, so the view never runs ahead
of, nor lags behind, the state it describes. The messages are not copied: the underlying topics
already hold them, and a reader (``connectors.spark_kafka.view``) fetches them by bookmark, on
the Spark executors. So a change costs the coordinator a few packed numbers, not a record
carrying the message (which cost 10 to 20% of the coordinator's CPU per message:
bench/view_cost.py). A reader keeps an aggregate of any field by summing ``sign * f(message)``;
the last change of a bookmark says whether it is in the view now.

A restart may rebuild a queue differently from what the view topic last said (a wiped state
directory re-reads the topics; a lease that timed out while the coordinator was down): at start
the coordinator reads the view topic back and publishes the corrections (``reconcile``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Message

from layer.coordinator.scan import scan_topic
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.viewcodec import decode_round, encode_round

log = logging.getLogger(__name__)

#: (topic, key, value, headers), as the changelog writer takes extra records
ViewRecord = tuple[str, bytes, bytes, None]


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
