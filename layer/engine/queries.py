"""Read-only answers of a queue engine: stats, browse, leases. A part of ``QueueEngine`` over
its ``Core``; nothing here changes the queue."""

from __future__ import annotations

from typing import Any, NamedTuple

from layer.engine.core import Core
from layer.engine.index import AVAILABLE, HELD, LEASED, Entry
from layer.engine.model import Bookmark, EngineStats, TopicPartition, ViewChange


class Lease(NamedTuple):
    """A current lease, as answered by ``QueueEngine.lease_of``."""

    subscription: str
    deadline: float
    deliveries: int
    cancels: int


class Queries:
    def __init__(self, core: Core) -> None:
        self._core = core

    def stats(self, now: float) -> EngineStats:
        core = self._core
        oldest = core.ages.oldest_time()
        unread = sum(p.inactive() for p in core.partitions.all)
        return EngineStats(
            available=core.available,
            leased=core.leased,
            inactive=unread if core.depth else 0,
            subscriptions=len(core.subs),
            oldest_available_at=oldest,
            done_total=core.done_total,
            dead_lettered_total=core.dead_total,
            delivered_total=core.delivered_total,
            delayed=core.holding.delayed,
            held=core.holding.held_count,
            unread=unread,
        )

    def available(self, limit: int | None = None) -> list[Bookmark]:
        """The messages in the queue that nobody holds and that are not delayed, in delivery
        order (messages held behind a barrier, the barrier included, come last): a browse."""
        core = self._core
        if not core.router.active() and not core.holding.held_count:
            return [entry.bookmark for entry in core.order.browse(limit)]
        ready = sorted(core.partitions.entries(AVAILABLE), key=_by_key)
        ready.extend(self._held())
        return [entry.bookmark for entry in ready[:limit]]

    def view_contents(self) -> list[ViewChange]:
        """What a view topic must hold now: a +1 change for every message a browse lists."""
        core = self._core
        return [
            core.view_change(entry, 1)
            for entry in (*core.partitions.entries(AVAILABLE), *self._held())
        ]

    def lease_contents(self) -> list[tuple[Bookmark, str, int, int]]:
        """Every leased message as (bookmark, holder, deliveries, cancels): the leases a view
        topic must show."""
        return [
            (entry.bookmark, entry.holder.name, entry.deliveries, entry.cancels)
            for entry in self._core.partitions.entries(LEASED)
            if entry.holder is not None
        ]

    def lease_of(self, bookmark: Bookmark) -> Lease | None:
        part = self._core.partitions.lookup(bookmark)
        entry = None if part is None else part.entry(bookmark.offset)
        if entry is None or entry.state != LEASED or entry.deadline is None:
            return None
        return Lease(entry.holder.name, entry.deadline, entry.deliveries, entry.cancels)

    def partitions(self) -> list[TopicPartition]:
        return [part.tp for part in self._core.partitions.all]

    def outstanding(self, subscription: str) -> list[Bookmark]:
        core = self._core
        sub = core.subscriber(subscription)
        if core.alo:
            return [entry.bookmark for entry in sub.leases]
        return list(sub.handed)

    def held_by(self, subscription: str) -> int:
        """How many messages ``subscription`` holds against its backlog (0 when unknown)."""
        sub = self._core.subs.get(subscription)
        return 0 if sub is None else sub.outstanding

    def barriers(self) -> set[Bookmark]:
        """The barrier messages not sent yet."""
        return {entry.bookmark for entry in self._core.holding.barriers}

    def leased(self) -> list[Bookmark]:
        """Every leased message (ack by filter looks at these too)."""
        return [entry.bookmark for entry in self._core.partitions.entries(LEASED)]

    def counts(self, bookmark: Bookmark) -> tuple[int, int]:
        """``(deliveries, cancels)`` of a message in the queue; (0, 0) when it is not."""
        part = self._core.partitions.lookup(bookmark)
        entry = None if part is None else part.entry(bookmark.offset)
        return (0, 0) if entry is None else (entry.deliveries, entry.cancels)

    def group_owner(self, group: object) -> str | None:
        """The subscription a message group is bound to now, if any."""
        owner = self._core.router.owners.get(group)
        return None if owner is None else owner.name

    def leases_of(
        self, subscription: str, limit: int = 100
    ) -> list[tuple[Bookmark, float | None, int]]:
        """Up to ``limit`` messages the subscription holds, in lease order, as (bookmark, lease
        deadline or None, deliveries); at-most-once: those handed out whose backlog slot is not
        released yet."""
        sub = self._core.subs.get(subscription)
        if sub is None:
            return []
        out: list[tuple[Bookmark, float | None, int]] = []
        for entry in sub.leases:
            if len(out) >= limit:
                return out
            out.append((entry.bookmark, entry.deadline, entry.deliveries))
        for bookmark in sub.handed:
            if len(out) >= limit:
                break
            out.append((bookmark, None, 1))
        return out

    def _held(self) -> list[Entry]:
        return [e for e in self._core.holding.held if e.state == HELD]


def _by_key(entry: Entry) -> Any:
    return entry.key
