"""Who may take a message when not every subscription may take every message.

Content filters, message groups and exclusive queues restrict a message to some subscriptions.
The queue engine then dispatches through a ``Router`` instead of its plain "next message to the
next subscription" loop. Each message leaves the main delivery order once, when it is the oldest
(or highest-priority) one, and the router computes the subscriptions *eligible* for it:

- some eligible subscription has room: it is delivered at once (fairness chooses among them);
- all eligible ones are full: it is *parked* on each of them, in a heap per subscription, and
  delivered when one of them has room and it is the best message that subscription may take;
- none is eligible: it waits in the *unmatched* pool until the set of subscriptions changes.

A parked reference is live while the message is available and its ``gen`` is the one recorded;
``requeue`` bumps ``gen``, so every other reference goes stale at once. Messages whose eligibility
was narrowed by a group owner are remembered per group and requeued when the group is released.

Costs: a message is matched against every subscription once per requeue; a new or replaced
subscription requeues every parked and unmatched message (it may be the one they wait for).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from heapq import heapify, heappop, heappush
from typing import Any

from layer.engine.fairness import Subscriber
from layer.engine.index import AVAILABLE, Entry
from layer.engine.model import GroupMode

# (key, gen, entry, eligible subscriptions)
Parked = tuple[Any, int, Entry, tuple[Subscriber, ...]]

_SLACK = 1024


def _current(gen: int, entry: Entry) -> bool:
    return entry.state == AVAILABLE and entry.gen == gen


def _live(item: Parked) -> bool:
    return _current(item[1], item[2])


class Router:
    __slots__ = (
        "_subs",
        "_requeue",
        "exclusive",
        "groups",
        "owners",
        "_waiting",
        "_unmatched",
        "_parked_refs",
    )

    def __init__(
        self,
        subs: dict[str, Subscriber],
        requeue: Callable[[Entry], None],
        exclusive: bool,
        groups: GroupMode | None,
    ) -> None:
        self._subs = subs  # the engine's registry, in subscribe order
        self._requeue = requeue  # puts an entry back into the engine's main order
        self.exclusive = exclusive
        self.groups = groups
        self.owners: dict[Any, Subscriber] = {}  # group -> the subscription it is bound to
        self._waiting: dict[Any, list[tuple[int, Entry]]] = {}  # group -> entries it narrowed
        self._unmatched: list[tuple[int, Entry]] = []
        self._parked_refs = 0  # parked references, live or stale (for compaction)

    # -- when the engine needs the router ----------------------------------------------------

    def active(self) -> bool:
        """True while dispatch must go through the router."""
        if self.exclusive or self.groups is not None or self._parked_refs or self._unmatched:
            return True
        return any(s.match is not None for s in self._subs.values())

    # -- eligibility -------------------------------------------------------------------------

    def active_subscriber(self) -> Subscriber | None:
        """Exclusive queues: the oldest subscription gets everything; the others stand by."""
        return next(iter(self._subs.values()), None)

    def eligible(self, entry: Entry) -> tuple[tuple[Subscriber, ...], bool]:
        """The subscriptions that may take ``entry`` now, and whether a group owner narrowed
        them."""
        if self.exclusive:
            first = self.active_subscriber()
            candidates: Iterable[Subscriber] = () if first is None else (first,)
        else:
            candidates = self._subs.values()
        narrowed = False
        group = entry.group
        if group is not None and self.groups is not None:
            owner = self.owners.get(group)
            if owner is not None:
                narrowed = True
                candidates = [s for s in candidates if s is owner]
        bm = entry.bookmark
        return tuple(s for s in candidates if s.match is None or s.match(bm)), narrowed

    def allowed(self, sub: Subscriber, entry: Entry) -> bool:
        """Whether ``sub`` (already matched by filter) may still take ``entry``: group owner and
        exclusive rules can change after a message was parked."""
        if self._subs.get(sub.name) is not sub:
            return False
        if self.exclusive and self.active_subscriber() is not sub:
            return False
        if entry.group is not None and self.groups is not None:
            owner = self.owners.get(entry.group)
            if owner is not None and owner is not sub:
                return False
        return True

    # -- parking -----------------------------------------------------------------------------

    def park(self, entry: Entry, eligible: tuple[Subscriber, ...], narrowed: bool) -> None:
        item: Parked = (entry.key, entry.gen, entry, eligible)
        for sub in eligible:
            heappush(sub.parked, item)
        self._parked_refs += len(eligible)
        if narrowed:
            self._wait_for_group(entry)

    def unmatched(self, entry: Entry, narrowed: bool) -> None:
        self._unmatched.append((entry.gen, entry))
        if narrowed:
            self._wait_for_group(entry)

    def head(self, sub: Subscriber) -> Parked | None:
        """The best live message parked on ``sub``, left in place."""
        heap = sub.parked
        while heap and not _live(heap[0]):
            heappop(heap)
            self._parked_refs -= 1
        return heap[0] if heap else None

    def pop(self, sub: Subscriber) -> None:
        heappop(sub.parked)
        self._parked_refs -= 1

    def requeue_all(self) -> None:
        """The set of subscriptions changed: every waiting message is matched again."""
        for sub in self._subs.values():
            self._flush(sub)
        unmatched, self._unmatched = self._unmatched, []
        for gen, entry in unmatched:
            self._requeue_if_live(gen, entry)

    def forget(self, sub: Subscriber) -> None:
        """``sub`` is gone: its parked messages and (both modes) its groups go back."""
        self._flush(sub)
        for group in [g for g, owner in self.owners.items() if owner is sub]:
            self.release(group)
        sub.groups.clear()

    def compact(self, live: int) -> None:
        if self._parked_refs <= 2 * live + _SLACK:
            return
        total = 0
        for sub in self._subs.values():
            sub.parked = [item for item in sub.parked if _live(item)]
            heapify(sub.parked)
            total += len(sub.parked)
        self._parked_refs = total
        self._unmatched = [(g, e) for g, e in self._unmatched if _current(g, e)]

    # -- message groups ----------------------------------------------------------------------

    def taken(self, sub: Subscriber, entry: Entry) -> None:
        """``sub`` was handed ``entry``: a group without owner is now bound to it."""
        group = entry.group
        if group is None or self.groups is None:
            return
        self.owners.setdefault(group, sub)
        sub.groups[group] = sub.groups.get(group, 0) + 1

    def returned(self, sub: Subscriber, group: Any) -> None:
        """``sub`` no longer holds one message of ``group`` (acked, returned, done)."""
        if group is None or self.groups is None:
            return
        left = sub.groups.get(group, 0) - 1
        if left > 0:
            sub.groups[group] = left
            return
        sub.groups.pop(group, None)
        if self.groups is GroupMode.SHARED and self.owners.get(group) is sub:
            self.release(group)

    def release(self, group: Any) -> None:
        """``group`` has no owner any more: what waited for its owner is matched again."""
        self.owners.pop(group, None)
        for gen, entry in self._waiting.pop(group, ()):
            self._requeue_if_live(gen, entry)

    # -- internals ---------------------------------------------------------------------------

    def _flush(self, sub: Subscriber) -> None:
        parked, sub.parked = sub.parked, []
        self._parked_refs -= len(parked)
        for _, gen, entry, _ in parked:
            self._requeue_if_live(gen, entry)

    def _requeue_if_live(self, gen: int, entry: Entry) -> None:
        if _current(gen, entry):
            entry.gen = gen + 1
            self._requeue(entry)

    def _wait_for_group(self, entry: Entry) -> None:
        waiting = self._waiting.setdefault(entry.group, [])
        waiting.append((entry.gen, entry))
        if len(waiting) >= 64 and len(waiting) & (len(waiting) - 1) == 0:  # at powers of two
            waiting[:] = [(g, e) for g, e in waiting if _current(g, e)]
