"""Subscriptions and the delivery-fairness strategies that choose which one gets the next message.

A picker only ever looks at subscriptions with free backlog, so a full subscription costs nothing
per message. The engine tells the picker whenever a subscription's outstanding count or backlog
changes (``update``) and when it served one (``served``); every operation is O(log subscriptions).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Sequence
from heapq import heapify, heappop, heappush, heapreplace
from typing import Any

from layer.engine.model import Bookmark, Fairness


class Subscriber:
    """A registered subscription. ``index`` is its place in subscribe order.

    ``match`` is its content filter (None: every message); ``parked`` and ``groups`` belong to
    ``layer.engine.routing``: messages waiting for this subscription's backlog, and the count of
    unacked messages it holds per message group.
    """

    __slots__ = (
        "name",
        "index",
        "backlog",
        "outstanding",
        "leases",
        "handed",
        "ready",
        "stamp",
        "match",
        "parked",
        "groups",
    )

    def __init__(
        self, name: str, index: int, backlog: int, match: Callable[[Bookmark], bool] | None = None
    ) -> None:
        self.name = name
        self.index = index
        self.backlog = backlog
        self.match = match
        self.parked: list[Any] = []
        self.groups: dict[Any, int] = {}
        self.outstanding = 0
        # At-least-once: the leased entries, in lease order. Dicts, not sets: iteration order must
        # not depend on memory addresses, or the engine would stop being deterministic.
        self.leases: dict[Any, None] = {}
        # At-most-once: bookmarks handed out whose backlog slot is not released yet (-> group).
        self.handed: dict[Bookmark, Any] = {}
        self.ready = False  # in the picker's set of subscriptions with room
        self.stamp = 0  # bumped on every change, to invalidate stale heap items

    def has_room(self) -> bool:
        return self.outstanding < self.backlog

    def __repr__(self) -> str:
        return f"Subscriber({self.name!r}, {self.outstanding}/{self.backlog})"


class Picker(ABC):
    """Chooses the subscription for the next message among those with room."""

    @abstractmethod
    def update(self, sub: Subscriber) -> None:
        """``sub`` is new, or its outstanding count or backlog changed."""

    @abstractmethod
    def remove(self, sub: Subscriber) -> None:
        """``sub`` is gone."""

    @abstractmethod
    def pick(self) -> Subscriber | None:
        """The subscription that gets the next message, or None when none has room."""

    def served(self, sub: Subscriber) -> None:
        """``sub`` was just handed a message, or several in a row (its outstanding count
        already went up)."""
        self.update(sub)

    def quota(self, sub: Subscriber) -> int:
        """How many messages in a row ``sub`` (just picked) gets before ``pick`` would choose
        another, if nothing else changes: they may go to it at once, ``served`` told once.
        At least 1; 1 when the picker cannot tell cheaply."""
        return 1

    def share(self, n: int) -> list[tuple[Subscriber, int]] | None:
        """How the next ``n`` messages would be split, as (subscription, count) in the order
        each is first picked, where only the counts are this picker's rule (not which message
        goes to whom): dispatch then hands each its count as one run of consecutive messages
        (a run of leases, and of acks, that the changelog and the wire carry as one). None: the
        picker hands out one at a time (its order is its rule: round-robin), or cannot tell
        cheaply. Changes nothing."""
        return None

    def choose(self, candidates: Sequence[Subscriber]) -> Subscriber:
        """The one of ``candidates`` (non-empty, all with room) that gets the next message when
        only they may take it (content filters, message groups): the same rule as ``pick``."""
        return min(candidates, key=_subscribe_order)


class _OrderedPicker(Picker):
    """Keeps the subscribe-order indexes of the subscriptions with room in a sorted list."""

    def __init__(self) -> None:
        self._ready: list[int] = []
        self._by_index: dict[int, Subscriber] = {}

    def update(self, sub: Subscriber) -> None:
        self._by_index[sub.index] = sub
        room = sub.outstanding < sub.backlog
        if room != sub.ready:
            if room:
                insort(self._ready, sub.index)
            else:
                del self._ready[bisect_left(self._ready, sub.index)]
            sub.ready = room

    def remove(self, sub: Subscriber) -> None:
        if sub.ready:
            del self._ready[bisect_left(self._ready, sub.index)]
            sub.ready = False
        self._by_index.pop(sub.index, None)


class FastPicker(_OrderedPicker):
    """The first subscription, in subscribe order, with room."""

    def pick(self) -> Subscriber | None:
        return self._by_index[self._ready[0]] if self._ready else None

    def quota(self, sub: Subscriber) -> int:
        return max(1, sub.backlog - sub.outstanding)  # the first with room until it is full


class RoundRobinPicker(_OrderedPicker):
    """The next subscription with room after the one served last, in subscribe order."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -1

    def pick(self) -> Subscriber | None:
        ready = self._ready
        if not ready:
            return None
        i = bisect_right(ready, self._last)
        return self._by_index[ready[i if i < len(ready) else 0]]

    def served(self, sub: Subscriber) -> None:
        self._last = sub.index
        self.update(sub)

    def quota(self, sub: Subscriber) -> int:
        # alone with room: everything it has room for; else one, then the next one's turn
        return max(1, sub.backlog - sub.outstanding) if len(self._ready) == 1 else 1

    def choose(self, candidates: Sequence[Subscriber]) -> Subscriber:
        after = [s for s in candidates if s.index > self._last]
        return min(after or candidates, key=_subscribe_order)


class ProportionalPicker(Picker):
    """The subscription with the lowest outstanding/backlog ratio; ties go to subscribe order.

    A heap of ``(ratio, index, stamp, sub)``; an item is live while the subscription's stamp is
    unchanged. Ratios of equal fractions are equal floats (division is correctly rounded), so
    ties are exact.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, Subscriber]] = []
        self._subs: dict[int, Subscriber] = {}

    def update(self, sub: Subscriber) -> None:
        self._subs[sub.index] = sub
        sub.stamp += 1
        if sub.outstanding < sub.backlog:
            heappush(self._heap, (sub.outstanding / sub.backlog, sub.index, sub.stamp, sub))
            if len(self._heap) > 4 * len(self._subs) + 64:
                self._rebuild()

    def remove(self, sub: Subscriber) -> None:
        sub.stamp += 1
        self._subs.pop(sub.index, None)

    def pick(self) -> Subscriber | None:
        heap = self._heap
        while heap:
            item = heap[0]
            if item[3].stamp == item[2]:
                return item[3]
            heappop(heap)
        return None

    def quota(self, sub: Subscriber) -> int:
        room = sub.backlog - sub.outstanding
        subs = self._subs
        if room <= 1 or len(subs) > _QUOTA_SUBS:
            return 1
        # the next in line: the least loaded other subscription with room
        rival: tuple[float, int] | None = None
        for other in subs.values():
            if other is not sub and other.outstanding < other.backlog:
                load = (other.outstanding / other.backlog, other.index)
                if rival is None or load < rival:
                    rival = load
        if rival is None:
            return room
        # sub keeps its turn while its load, as ``update`` computes it, stays below the rival's
        backlog, index, outstanding = sub.backlog, sub.index, sub.outstanding
        n = max(1, min(room, int(rival[0] * backlog) - outstanding))
        while n > 1 and ((outstanding + n - 1) / backlog, index) > rival:
            n -= 1
        while n < room and ((outstanding + n) / backlog, index) < rival:
            n += 1
        return n

    def share(self, n: int) -> list[tuple[Subscriber, int]] | None:
        """What ``n`` picks one by one would give each subscription: each pick goes to the
        least loaded one with room, by ``(outstanding / backlog, index)`` as ``update``
        computes it. Those picks are the ``n`` smallest of the keys ``((outstanding + j) /
        backlog, index)``, j < room, of all the subscriptions, so they are counted in bulk below
        a water level and only the last few are taken one by one (the same counts, exactly, at
        a cost per subscription instead of per message). Returned in the order of their first
        picks; None beyond ``_QUOTA_SUBS`` subscriptions."""
        subs = self._subs
        if len(subs) > _QUOTA_SUBS:
            return None
        open_ = [s for s in subs.values() if s.outstanding < s.backlog]
        if n <= 0 or not open_:
            return []
        counts = {s.index: s.backlog - s.outstanding for s in open_}  # all their room
        if n <= _FEW:
            counts = dict.fromkeys(counts, 0)
            _take_more(open_, counts, n)
        elif n < sum(counts.values()):
            level = _water_level(open_, n)
            for s in open_:
                counts[s.index] = _below(s, level)
            taken = sum(counts.values())
            if taken > n:  # a few too many below the level: give back the largest keys
                _give_back(open_, counts, taken - n)
            elif taken < n:  # the last few picks, one by one
                _take_more(open_, counts, n - taken)
        first = sorted(
            (s for s in open_ if counts[s.index]),
            key=lambda s: (s.outstanding / s.backlog, s.index),
        )
        return [(s, counts[s.index]) for s in first]

    def choose(self, candidates: Sequence[Subscriber]) -> Subscriber:
        return min(candidates, key=_load)

    def _rebuild(self) -> None:
        self._heap = [
            (s.outstanding / s.backlog, s.index, s.stamp, s)
            for s in self._subs.values()
            if s.outstanding < s.backlog
        ]
        heapify(self._heap)


# ProportionalPicker.quota looks at every subscription: beyond this many, it answers 1
_QUOTA_SUBS = 16
# ProportionalPicker.share takes this few picks one by one: cheaper than finding the level
_FEW = 16


def _water_level(subs: Sequence[Subscriber], n: int) -> float:
    """The load that ``n`` picks (fewer than the room of ``subs``) bring the subscriptions to:
    about ``n`` of their keys lie below it. Those already loaded above it get none; the room of
    the others runs out only at load 1, which ``n`` does not reach."""
    active = list(subs)
    while True:
        level = (n + sum(s.outstanding for s in active)) / sum(s.backlog for s in active)
        under = [s for s in active if s.outstanding < level * s.backlog]
        if len(under) == len(active):
            return level
        active = under


def _below(sub: Subscriber, level: float) -> int:
    """How many of ``sub``'s keys ``(outstanding + j) / backlog`` (j < room) are below
    ``level``, compared as the picks compare them (the same float division)."""
    out, backlog = sub.outstanding, sub.backlog
    room = backlog - out
    c = min(room, max(0, int(level * backlog) - out))
    while c > 0 and (out + c - 1) / backlog >= level:
        c -= 1
    while c < room and (out + c) / backlog < level:
        c += 1
    return c


def _give_back(subs: Sequence[Subscriber], counts: dict[int, int], extra: int) -> None:
    """Undo the ``extra`` last picks: those of the largest keys ``(load, index)`` taken."""
    heap = [
        (-((s.outstanding + counts[s.index] - 1) / s.backlog), -s.index, s)
        for s in subs
        if counts[s.index]
    ]
    heapify(heap)
    for _ in range(extra):
        _, _, s = heap[0]
        c = counts[s.index] = counts[s.index] - 1
        if c:
            heapreplace(heap, (-((s.outstanding + c - 1) / s.backlog), -s.index, s))
        else:
            heappop(heap)


def _take_more(subs: Sequence[Subscriber], counts: dict[int, int], more: int) -> None:
    """``more`` picks one by one, each to the smallest next key ``(load, index)``."""
    heap = [
        ((s.outstanding + counts[s.index]) / s.backlog, s.index, s)
        for s in subs
        if s.outstanding + counts[s.index] < s.backlog
    ]
    heapify(heap)
    while more > 0 and heap:
        _, index, s = heap[0]
        c = counts[index] = counts[index] + 1
        if s.outstanding + c < s.backlog:
            heapreplace(heap, ((s.outstanding + c) / s.backlog, index, s))
        else:
            heappop(heap)
        more -= 1


def _subscribe_order(sub: Subscriber) -> int:
    return sub.index


def _load(sub: Subscriber) -> tuple[float, int]:
    return (sub.outstanding / sub.backlog if sub.backlog else float("inf"), sub.index)


def make_picker(fairness: Fairness) -> Picker:
    if fairness is Fairness.FAST:
        return FastPicker()
    if fairness is Fairness.ROUND_ROBIN:
        return RoundRobinPicker()
    return ProportionalPicker()
