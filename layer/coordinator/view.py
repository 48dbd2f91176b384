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

Beside the live contents, a round carries the changes of the set of leased messages (lease
changes, ``ViewChange.holder``): +1 when a lease begins, with its holder (the subscription) and
the time, -1 when it ends (acked, returned, timed out, dead-lettered). The coordinator derives
them from the round's durable changes (``lease_changes``), so a Spark view can show who holds
what (``spark.views.queue_leases``).

A restart may rebuild a queue differently from what the view topic last said (a wiped state
directory re-reads the topics; a lease that timed out while the coordinator was down): at start
the coordinator reads the view topic back and publishes the corrections (``reconcile``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import Message

from layer.coordinator.scan import scan_topic
from layer.engine.model import (
    Bookmark,
    Change,
    Done,
    Leased,
    Returned,
    ViewChange,
    ViewChanges,
    lease_change,
    singles,
)
from layer.viewcodec import decode_round, encode_round

log = logging.getLogger(__name__)

#: (topic, key, value, headers), as the changelog writer takes extra records
ViewRecord = tuple[str, bytes, bytes, None]


def view_record(
    topic: str, queue: str, changes: ViewChanges, at_ms: int, leases: Sequence[ViewChange] = ()
) -> ViewRecord:
    return (topic, queue.encode(), encode_round(queue, changes, at_ms, leases), None)


class PublishedView(dict[Bookmark, ViewChange]):
    """What a view topic says a queue holds (bookmark -> its +1 change), and in ``leases``
    which messages it says are leased, to whom (bookmark -> its +1 lease change)."""

    def __init__(self) -> None:
        super().__init__()
        self.leases: dict[Bookmark, ViewChange] = {}


def read_view(
    settings: Mapping[str, Any], topic: str, queue: str, idle_timeout: float = 30.0
) -> PublishedView:
    """What the view topic says ``queue`` holds now: each bookmark whose last change is +1,
    with that change (rounds of other queues sharing the topic are passed over); the same of
    its lease changes in ``leases``."""
    contents = PublishedView()
    name = queue.encode()

    def apply(msg: Message) -> None:
        value = msg.value()
        if msg.key() != name or not value:
            return  # another queue's, or not ours: a reader skips it too
        round_ = decode_round(value)
        for changes, into in ((round_.changes, contents), (round_.leases, contents.leases)):
            for change in changes:
                if change.sign > 0:
                    into[change.bookmark] = change
                else:
                    into.pop(change.bookmark, None)

    scan_topic(settings, topic, "view topic", apply, idle_timeout)
    return contents


def lease_changes(
    leases: dict[Bookmark, ViewChange], changes: Iterable[Change], now_ms: int
) -> list[ViewChange]:
    """The lease changes of a round's engine ``changes``: +1 for each lease begun (``Leased``),
    -1 for each one ended (``Returned``, ``Done`` of a leased message), and ``leases`` (the
    queue's leases as the view topic says, bookmark -> +1 change) updated to match."""
    out: list[ViewChange] = []
    for change in singles(changes):
        if isinstance(change, Leased):
            held = leases.get(change.bookmark)
            if held is not None:
                out.append(held._replace(sign=-1))
            lease = lease_change(
                change.bookmark, 1, change.holder, now_ms, change.deliveries, change.cancels
            )
            leases[change.bookmark] = lease
            out.append(lease)
        elif isinstance(change, Returned | Done):
            held = leases.pop(change.bookmark, None)
            if held is not None:
                out.append(held._replace(sign=-1))
    return out


def reconcile_leases(
    published: Mapping[Bookmark, ViewChange],
    held: Sequence[tuple[Bookmark, str, int, int]],
    now_ms: int,
) -> tuple[dict[Bookmark, ViewChange], list[ViewChange]]:
    """The queue's leases (``held``: bookmark, holder, deliveries, cancels) as lease changes
    (keeping the time a lease began from ``published`` where it names the same holder), and the
    corrections that bring the view topic's leases (``published``) to them."""
    leases: dict[Bookmark, ViewChange] = {}
    corrections: list[ViewChange] = []
    for bm, holder, deliveries, cancels in held:
        old = published.get(bm)
        if old is not None and old.holder == holder:
            leases[bm] = old
            continue
        if old is not None:
            corrections.append(old._replace(sign=-1))
        leases[bm] = lease_change(bm, 1, holder, now_ms, deliveries, cancels)
        corrections.append(leases[bm])
    corrections.extend(
        change._replace(sign=-1) for bm, change in published.items() if bm not in leases
    )
    return leases, corrections


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
