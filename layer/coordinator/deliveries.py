"""The engine's deliveries of a round as the batches the API writes (``DeliveryBatch``), one
per subscription: a column at a time (C loops over the round's lists), Python per message
only for the rare ones (headers, parse errors, barriers, a deadline of their own)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_
from typing import cast

from layer.api.deliveries import DeliveryBatch
from layer.engine.model import Delivery
from layer.state.base import StoredMessage

log = logging.getLogger(__name__)

_SUBSCRIPTION = attrgetter("subscription")
_BOOKMARK = attrgetter("bookmark")
_DELIVERIES = attrgetter("deliveries")
_CANCELS = attrgetter("cancels")
_DEADLINE = attrgetter("deadline")
_BARRIER = attrgetter("barrier")
_KEY = attrgetter("key")
_VALUE = attrgetter("value")
_TIMESTAMP = attrgetter("timestamp_ms")
_HEADERS = attrgetter("headers")
_ERROR = attrgetter("error")


def _ms(deadline: float | None) -> int | None:
    return None if deadline is None else int(deadline * 1000)


def by_subscription(
    queue: str, deliveries: Sequence[Delivery], stored: Sequence[StoredMessage | None]
) -> list[tuple[str, DeliveryBatch]]:
    """``deliveries`` of ``queue`` with their stored payloads (``stored``, in their order), a
    batch per subscription in the order of their first delivery; a delivery without a stored
    payload (which cannot happen while the store is intact) is logged and left out: never hand
    out a hole."""
    found = cast("list[StoredMessage]", list(stored))
    # by identity: ``None in stored`` would call StoredMessage.__eq__ (Python) per message
    if any(map(is_, stored, repeat(None))):
        for d, s in zip(deliveries, stored, strict=True):
            if s is None:
                log.error("queue=%s bookmark=%s has no stored payload", queue, d.bookmark)
        kept = [(d, s) for d, s in zip(deliveries, stored, strict=True) if s is not None]
        deliveries = [d for d, _s in kept]
        found = [s for _d, s in kept]
    if not deliveries:
        return []
    subs = list(map(_SUBSCRIPTION, deliveries))
    first = subs[0]
    if subs.count(first) == len(subs):
        return [(first, _batch(queue, list(deliveries), found))]
    groups: dict[str, list[int]] = {}
    for i, sub in enumerate(subs):
        group = groups.get(sub)
        if group is None:
            groups[sub] = [i]
        else:
            group.append(i)
    return [
        (sub, _batch(queue, [deliveries[i] for i in positions], [found[i] for i in positions]))
        for sub, positions in groups.items()
    ]


def _batch(queue: str, group: list[Delivery], stored: list[StoredMessage]) -> DeliveryBatch:
    bookmarks = list(map(_BOOKMARK, group))
    n = len(group)
    times = list(map(_DEADLINE, group))
    common = times[0]
    deadlines = None  # one for all: the common case
    if times.count(common) != n:
        deadlines = [_ms(t) for t in times]
    barriers: list[int] = []
    if any(map(_BARRIER, group)):
        barriers = [i for i, d in enumerate(group) if d.barrier]
    headers = {}
    all_headers = list(map(_HEADERS, stored))
    if any(all_headers):
        headers = {i: list(h) for i, h in enumerate(all_headers) if h}
    errors = {}
    all_errors = list(map(_ERROR, stored))
    if all_errors.count(None) != n:
        errors = {i: e for i, e in enumerate(all_errors) if e is not None}
    return DeliveryBatch(
        queue,
        bookmarks,
        list(map(_KEY, stored)),
        list(map(_VALUE, stored)),
        list(map(_TIMESTAMP, stored)),
        list(map(_DELIVERIES, group)),
        list(map(_CANCELS, group)),
        _ms(common),
        deadlines,
        barriers,
        headers,
        errors,
    )
