"""What waits in a queue engine: barriers, delays, last-value conflation, the view journal, and
dispatch when filters, groups or an exclusive consumer restrict who may take what (a
``QueueEngine`` mixin)."""

from __future__ import annotations

from layer.engine.base import EngineBase
from layer.engine.index import AVAILABLE, DELAYED, HELD, Entry
from layer.engine.model import Delivery, DoneReason


class Holding(EngineBase):
    def _make_available(self, entry: Entry) -> None:
        entry.state = AVAILABLE
        entry.gen += 1
        self._available += 1
        self._order.push_returned(entry)
        self._ages.push(entry)
        if entry.expires is not None:
            self._expiries.push(entry)
        if self._view is not None:
            self._viewed(entry, 1)

    def view_synced(self) -> None:
        """The caller published the whole live contents (a restart's reconciliation): the
        view changes recorded until now are part of that and must not be reported again."""
        if self._view is not None:
            self._view.clear()

    def _viewed(self, entry: Entry, sign: int) -> None:
        found = self._view.get(entry.bookmark)  # type: ignore[union-attr]
        if found is None:
            self._view[entry.bookmark] = [sign, sign, entry]  # type: ignore[index]
        else:
            found[1] = sign
            found[2] = entry  # a run's message: the entry it became replaces the one made for it

    def _delay(self, entry: Entry, until: float) -> None:
        entry.state = DELAYED
        self._delayed += 1
        self._delays.push(entry, until)

    def _send_barriers(self, now: float) -> None:
        """Send the first pending barrier once everything before it is done, to every current
        subscription whose filter matches, then release what it held (up to the next one).
        With no subscription at all it waits: a barrier sent to nobody would be lost."""
        barriers = self._barriers
        while barriers and self._subs and not (self._available + self._leased + self._delayed):
            barrier = barriers.popleft()
            bm = barrier.bookmark
            for sub in self._subs.values():
                if sub.match is None or sub.match(bm):
                    self._deliveries.append(
                        Delivery(sub.name, bm, barrier.deliveries + 1, barrier.cancels, None, True)
                    )
            barrier.deliveries += 1
            self._finish(barrier, DoneReason.BARRIER, now)
            self._release_held(now)

    def _release_held(self, now: float) -> None:
        held, barriers = self._held, self._barriers
        stop = barriers[0] if barriers else None
        while held:
            entry = held[0]
            if entry is stop:
                return
            held.popleft()
            if entry.state != HELD:  # acked or conflated while held
                continue
            self._held_count -= 1
            entry.state = AVAILABLE
            self._available += 1
            self._order.push_returned(entry)
            self._ages.push(entry)
            if entry.expires is not None:
                self._expiries.push(entry)

    def _conflate_older(self, entry: Entry, key: object, now: float) -> None:
        """Last-value queues: ``entry`` replaces the older message with its key unless that one
        is leased (then both stay; the older is conflated if it comes back)."""
        entry.ckey = key
        older = self._latest.get(key)
        self._latest[key] = entry
        if older is not None and older.state in _REPLACEABLE:
            self._finish(older, DoneReason.CONFLATED, now)

    def _dispatch_routed(self, now: float) -> None:
        """Dispatch when filters, groups or an exclusive consumer restrict who may take what:
        always the best message some subscription with room may take (see ``routing``)."""
        order, router, picker = self._order, self._router, self._picker
        expiration = self._expiration
        subs = self._subs
        while self._available:
            ready = [s for s in subs.values() if s.outstanding < s.backlog]
            if not ready:
                return
            best = None
            best_sub = None
            for sub in ready:
                item = router.head(sub)
                if item is not None and (best is None or item[0] < best[0]):
                    best, best_sub = item, sub
            key = order.peek_key()
            if key is not None and (best is None or key < best[0]):
                head = order.pop()
                assert head is not None
                if (expiration is not None and now - head.timestamp >= expiration) or (
                    head.expires is not None and now >= head.expires
                ):
                    self._finish(head, DoneReason.EXPIRATION, now)
                    continue
                eligible, narrowed = router.eligible(head)
                if not eligible:
                    router.unmatched(head, narrowed)
                    continue
                with_room = [s for s in eligible if s.outstanding < s.backlog]
                if with_room:
                    self._deliver(head, picker.choose(with_room), now)
                else:
                    router.park(head, eligible, narrowed)
                continue
            if best is None or best_sub is None:
                return
            router.pop(best_sub)
            entry = best[2]
            if (expiration is not None and now - entry.timestamp >= expiration) or (
                entry.expires is not None and now >= entry.expires
            ):
                self._finish(entry, DoneReason.EXPIRATION, now)
                continue
            takers = [s for s in best[3] if s.outstanding < s.backlog and router.allowed(s, entry)]
            if takers:
                self._deliver(entry, picker.choose(takers), now)
            else:  # its group found an owner meanwhile: match it again
                entry.gen += 1
                self._requeue(entry)


_REPLACEABLE = frozenset({AVAILABLE, DELAYED, HELD})
