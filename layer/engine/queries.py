"""Read-only answers of the queue engine: stats, browse, leases (a ``QueueEngine`` mixin)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from layer.engine.base import EngineBase
from layer.engine.fairness import Subscriber
from layer.engine.index import AVAILABLE, HELD, LEASED, Entry
from layer.engine.model import Bookmark, EngineStats, TopicPartition, ViewChange
from layer.engine.partition import PartitionState
from layer.engine.runs import Run
from layer.exceptions import QueueError


class Lease(NamedTuple):
    """A current lease, as answered by ``QueueEngine.lease_of``."""

    subscription: str
    deadline: float
    deliveries: int
    cancels: int


class Queries(EngineBase):
    def stats(self, now: float) -> EngineStats:
        oldest = self._ages.oldest_time()
        unread = sum(p.inactive() for p in self._parts)
        return EngineStats(
            available=self._available,
            leased=self._leased,
            inactive=unread if self._depth else 0,
            subscriptions=len(self._subs),
            oldest_available_at=oldest,
            done_total=self._done_total,
            dead_lettered_total=self._dead_total,
            delivered_total=self._delivered_total,
            delayed=self._delayed,
            held=self._held_count,
            unread=unread,
        )

    def available(self, limit: int | None = None) -> list[Bookmark]:
        """The messages in the queue that nobody holds and that are not delayed, in delivery
        order (messages held behind a barrier, the barrier included, come last): a browse."""
        if not self._router.active() and not self._held_count:
            return [entry.bookmark for entry in self._order.browse(limit)]
        ready = sorted(self._entries(AVAILABLE), key=_by_key)
        ready.extend(e for e in self._held if e.state == HELD)
        return [entry.bookmark for entry in ready[:limit]]

    def view_contents(self) -> list[ViewChange]:
        """What a view topic must hold now: a +1 change for every message a browse lists."""
        return [
            self._view_change(entry, 1)
            for entry in (*self._entries(AVAILABLE), *(e for e in self._held if e.state == HELD))
        ]

    def lease_contents(self) -> list[tuple[Bookmark, str, int, int]]:
        """Every leased message as (bookmark, holder, deliveries, cancels): the leases a view
        topic must show."""
        return [
            (entry.bookmark, entry.holder.name, entry.deliveries, entry.cancels)
            for entry in self._entries(LEASED)
            if entry.holder is not None
        ]

    def lease_of(self, bookmark: Bookmark) -> Lease | None:
        part = self._lookup(bookmark)
        entry = None if part is None else part.entry(bookmark.offset)
        if entry is None or entry.state != LEASED or entry.deadline is None:
            return None
        return Lease(entry.holder.name, entry.deadline, entry.deliveries, entry.cancels)

    def partitions(self) -> list[TopicPartition]:
        return [part.tp for part in self._parts]

    def outstanding(self, subscription: str) -> list[Bookmark]:
        sub = self._subscriber(subscription)
        if self._alo:
            return [entry.bookmark for entry in sub.leases]
        return list(sub.handed)

    def held_by(self, subscription: str) -> int:
        """How many messages ``subscription`` holds against its backlog (0 when unknown)."""
        sub = self._subs.get(subscription)
        return 0 if sub is None else sub.outstanding

    def barriers(self) -> set[Bookmark]:
        """The barrier messages not sent yet."""
        return {entry.bookmark for entry in self._barriers}

    def leased(self) -> list[Bookmark]:
        """Every leased message (ack by filter looks at these too)."""
        return [entry.bookmark for entry in self._entries(LEASED)]

    def counts(self, bookmark: Bookmark) -> tuple[int, int]:
        """``(deliveries, cancels)`` of a message in the queue; (0, 0) when it is not."""
        part = self._lookup(bookmark)
        entry = None if part is None else part.entry(bookmark.offset)
        return (0, 0) if entry is None else (entry.deliveries, entry.cancels)

    def group_owner(self, group: object) -> str | None:
        """The subscription a message group is bound to now, if any."""
        owner = self._router.owners.get(group)
        return None if owner is None else owner.name

    def _entries(self, state: int) -> Iterable[Entry]:
        """The messages in ``state``, in offset order per partition (a run's plain messages
        as entries made for the answer)."""
        for part in self._parts:
            items = part.items
            for i in range(part.head, len(items)):
                item = items[i]
                if type(item) is Entry:
                    if item.state == state:
                        yield item
                elif type(item) is Run:
                    yield from item.entries(state)

    def _lookup(self, bm: Bookmark) -> PartitionState | None:
        by_partition = self._topics.get(bm.topic)
        return None if by_partition is None else by_partition.get(bm.partition)

    def _subscriber(self, subscription: str) -> Subscriber:
        sub = self._subs.get(subscription)
        if sub is None:
            raise QueueError(
                f"queue {self.name!r}: subscription {subscription!r} is not registered"
            )
        return sub


def _by_key(entry: Entry) -> Any:
    return entry.key
