"""Who gets what: a queue engine's available messages handed to the subscriptions with room,
as its fairness picker says, or (when filters, groups or an exclusive consumer restrict who may
take what) through its router. A part of ``QueueEngine`` over its ``Core``."""

from __future__ import annotations

from layer.engine.core import Core
from layer.engine.fairness import Subscriber
from layer.engine.model import DoneReason


class Dispatcher:
    def __init__(self, core: Core) -> None:
        self._core = core

    def dispatch(self, now: float) -> None:
        """See ``QueueEngine.dispatch``."""
        core = self._core
        if core.holding.barriers:
            core.send_barriers(now)
        if core.router.active():
            self._routed(now)
            return
        picker, order = core.picker, core.order
        expiration = core.expiration
        ttl = core.ttl
        alo = core.alo
        # A picker that rules only how many each gets (proportional) splits what is available
        # at once, and each subscription gets its share as a run of consecutive messages: to
        # consumers whose acks came in the same round, one at a time in turn would make runs of
        # one (a changelog record, an ack run, a dispatch step per message).
        while alo and core.available > 1:
            shares = picker.share(core.available)
            if shares is None:
                break
            if not shares:
                return
            for sub, n in shares:
                entries = order.pop_many(n)
                if not entries:  # unreachable while the available count is right
                    return
                core.lease_many(sub, entries, now)  # expired ones leave room: asked again
        # the picker is asked for a quota only when it picks the one it picked last: with
        # subscriptions taking turns, quota would answer 1 each time, at a cost
        last: Subscriber | None = None
        while core.available:
            sub = picker.pick()
            if sub is None:
                return
            if alo and last is not None and last is sub:
                n = picker.quota(sub)
                if n > 1:
                    entries = order.pop_many(min(n, core.available))
                    if not entries:  # unreachable while the available count is right
                        return
                    core.lease_many(last, entries, now)
                    continue
            last = sub
            entry = order.pop()
            if entry is None:  # unreachable while the available count is right
                return
            if (expiration is not None and now - entry.timestamp >= expiration) or (
                ttl and entry.expires is not None and now >= entry.expires
            ):
                core.finish(entry, DoneReason.EXPIRATION, now)
                continue
            core.deliver(entry, sub, now)

    def _routed(self, now: float) -> None:
        """Dispatch when filters, groups or an exclusive consumer restrict who may take what:
        always the best message some subscription with room may take (see ``routing``)."""
        core = self._core
        order, router, picker = core.order, core.router, core.picker
        subs = core.subs
        while core.available:
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
                if core.expired(head, now):
                    core.finish(head, DoneReason.EXPIRATION, now)
                    continue
                eligible, narrowed = router.eligible(head)
                if not eligible:
                    router.unmatched(head, narrowed)
                    continue
                with_room = [s for s in eligible if s.outstanding < s.backlog]
                if with_room:
                    core.deliver(head, picker.choose(with_room), now)
                else:
                    router.park(head, eligible, narrowed)
                continue
            if best is None or best_sub is None:
                return
            router.pop(best_sub)
            entry = best[2]
            if core.expired(entry, now):
                core.finish(entry, DoneReason.EXPIRATION, now)
                continue
            takers = [s for s in best[3] if s.outstanding < s.backlog and router.allowed(s, entry)]
            if takers:
                core.deliver(entry, picker.choose(takers), now)
            else:  # its group found an owner meanwhile: match it again
                entry.gen += 1
                core.requeue(entry)
