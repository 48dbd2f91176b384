"""The pure queue engine: events in, effects out, no I/O.

The contract of ``QueueEngine`` (the coordinator is written against exactly this; keep it).

Events in (each takes ``now``, the caller's clock, seconds):
- ``add(arrivals, now)``: messages read from the underlying topics enter the queue, in read order
  per partition (offsets strictly increasing per partition). Arrivals whose bookmark was already
  acked while not yet read (a *remembered ack*, see ``ack``) are skipped and counted done.
  A message whose restored ``deliveries``/``cancels`` already reach the limits is done at once
  (dead-lettered with MAX_DELIVERIES / MAX_CANCELS).
- ``add_run(partition, start, timestamps, now, priority=None)``: the same as ``add`` of one
  plain ``Arrival`` (no group, conflation key, barrier or delay) per timestamp, at the offsets
  ``start, start + 1, ...`` of ``partition``: how the coordinator hands over a fetched batch.
  The engine keeps such messages as a run (``layer.engine.runs``) until one is singled out.
- ``room()``: how many more arrivals ``add`` may take now. Unlimited (a large int) without
  target_queue_depth; with it, ``target_queue_depth -`` the messages in the queue (never < 0). The
  coordinator does not read further than ``room()`` allows ("not read into state").
- ``start_partition(partition, low_water)``: the queue tracks this partition from ``low_water``
  (restored from the changelog, or where the coordinator starts reading a new partition); its read
  position starts there too.
- ``restore_done(bookmarks)``: done records restored from the changelog at or above the low-water
  mark. They count as done for the low-water mark, and are forgotten (Forget) once it passes them.
  They emit no Done.
- ``restore_counts(counts)``: delivery and cancel counts (bookmark -> (deliveries, cancels))
  restored from the changelog for messages not read yet. A message read later starts with them
  (they win over the arrival's own counts), and a remembered ack of one carries them in its Done,
  so a restart never turns a delivery count back. ``restored_pending()``: how many still wait.
- ``mark_read(partition, next_offset)``: the coordinator read up to ``next_offset`` (exclusive) on
  this partition, including offsets that never became arrivals (filtered, control records, gaps).
  Needed for the low-water mark.
- ``set_high_watermark(partition, offset)``: the broker's high watermark; acks for offsets in
  ``[read position, high watermark)`` are remembered (see ``ack``), beyond it they are unknown.
- ``subscribe(subscription, max_backlog, now, match=None) -> int``: register a subscription, or
  replace it (same name: new backlog and filter, leases kept even above the new backlog); returns
  the effective backlog ``min(max_backlog, max_per_subscription_backlog)`` (0: the subscription
  takes no messages, only barrier messages, as AMPS's ``max_backlog=0``). ``match`` is
  its content filter, a predicate on bookmarks (the coordinator evaluates the expression).
- ``set_backlog(subscription, n)``: the backlog without a replace; 0 pauses the subscription.
- ``disconnect(subscription, now)``: the subscription is gone; every lease it holds is returned at
  once (Returned DISCONNECT; delivery count kept; a message whose deliveries reached max_deliveries
  is done with MAX_DELIVERIES instead). At-most-once: simply forgotten.
- ``ack(subscription, bookmarks, op, now, seconds=0.0) -> list[AckOutcome]``: one outcome per
  bookmark, in order; a refused bookmark changes nothing.
    * ACK: done (ACKED). Leasing strict: only the lease holder may ack a leased message; an
      available (unleased) message may not be acked under strict (NOT_LEASE_HOLDER). Lenient: any
      subscription may ack any message in the queue (available or leased by anyone). A bookmark at
      or beyond the partition's read position and below its high watermark is a remembered ack:
      a Done(ACKED) is emitted now (with the restored counts, else 0) and the message is
      skipped when it arrives. Anything else
      (other topic, below the low-water mark, already done, beyond the high watermark) is
      UNKNOWN_BOOKMARK.
    * ``subscription`` None acts for nobody (ack by filter): under strict leasing it may finish
      only messages nobody holds.
    * CANCEL (at-least-once): the lease ends, cancels += 1, Returned(CANCEL) (``seconds`` > 0:
      available again only after that delay, Returned.not_before); if cancels reaches
      max_cancels the message is done with MAX_CANCELS instead ("expires on the 3rd cancel when
      max_cancels = 3"). Cancel of an unleased message: NOT_LEASED.
    * EXPIRE: done with CONSUMER_EXPIRE (dead-lettered), leased or (lenient) available.
    * EXTEND: the lease deadline becomes ``now + seconds``; no durable change; NOT_LEASED if not
      leased.
    * At-most-once: every op only releases the subscription's backlog slot for a bookmark it was
      handed and has not released yet; anything else is UNKNOWN_BOOKMARK. No state changes.
- ``ack_runs(subscription, partition, runs, op, now, seconds=0.0) -> [(offset, error)]``: the same
  as ``ack`` for the offsets of one partition given as inclusive runs ``[first, last, ...]`` (what
  the wire carries), with no object per message: only the refused offsets are returned.
- ``tick(now)``: lease timeouts (deadline <= now) return messages (Returned TIMEOUT), or finish
  them with MAX_DELIVERIES when deliveries >= max_deliveries ("not delivered again after its 10th
  unsuccessful delivery when max_deliveries = 10") or EXPIRATION when the message is older than
  ``expiration``. Available (unleased) messages older than ``expiration`` (now - timestamp >=
  expiration) are done with EXPIRATION. Leased messages never expire while leased.
- ``tick`` also makes delayed messages available when their time comes: arrivals with
  ``not_before`` in the future, cancels with a delay, and lease timeouts under
  ``redelivery_backoff`` (delay ``min(max, initial * multiplier ** (deliveries - 1))``).
- ``dispatch(now)``: hand available messages to subscriptions with free backlog, in queue order
  (arrival order; with ``priority``, highest priority first and oldest first within a priority,
  None lowest), choosing the subscription by fairness:
    fast: the first subscription (in subscribe order) with room;
    round-robin: the next subscription with room after the one served last;
    proportional: the one with the lowest outstanding/max_backlog ratio (ties: subscribe order).
  At-least-once: Leased + Delivery (deliveries += 1, deadline = now + lease_period). At-most-once:
  Done(DELIVERED) + Delivery (deadline None); the subscription's slot stays used until it acks.

  Content filters, message groups and exclusive queues (``layer.engine.routing``): a message goes
  only to a subscription whose filter matches it; a message of a group bound to a subscription
  only to that one (bound at first delivery; sticky: until it disconnects; shared: until it holds
  no unacked message of the group); exclusive: only to the oldest subscription. Each subscription
  gets the best (oldest / highest-priority) message it may take; a message nobody may take waits.
- Barriers (``Arrival.barrier``): from a barrier on, arrivals are held. Once every earlier message
  is done and at least one subscription exists, dispatch sends the barrier to every subscription
  whose filter matches (Delivery.barrier, no lease, no backlog used), finishes it with
  Done(BARRIER), and releases what it held up to the next barrier.
- Last-value queues (``conflate``): an arrival with a conflate key finishes the older message with
  that key (Done CONFLATED) unless it is leased; a leased one that is returned after a newer one
  arrived is finished CONFLATED instead. (Solace's last value queue is this with one key per
  partition, set by the coordinator.)
- Sorted queues (``sort``, Qpid): delivery order is ascending ``Arrival.sort_key`` (a string;
  None after every string), then enqueue time, then arrival (``queue.sort_rank``); a returned
  message keeps its place. Not with ``priority`` or ``conflate``.
- Per-message TTL (``message_ttl``): an arrival's ``expires_at`` is its own expiry time, checked
  wherever ``expiration`` is (arrival, tick, dispatch, lease end; never while leased), with the
  same outcome (Done EXPIRATION); ``expiration`` still applies, so the earlier one wins.

Effects out, via ``drain() -> Effects``: ``changes`` (Leased / Returned / Done / LowWater / Forget)
in the order decided, and ``deliveries``. A Leased, Returned or Done with a ``count`` > 1 is
the same change of each of ``count`` consecutive offsets from its bookmark (a run leased to one
subscription by one dispatch, a span of one subscription's leases acked at once;
``model.singles`` gives them one a message); each offset's changes keep their order whichever
way they are counted. After any change that advances a partition's low-water
mark (the smallest offset not done, or the read position when every read offset is done), a
LowWater is emitted, followed by Forget for each done bookmark now below it (each done bookmark is
forgotten exactly once). At most one LowWater per partition per drain (the latest).

Queries: ``stats(now)``, ``available(limit=None)`` (bookmarks in delivery order, then those held
behind a barrier; neither leased nor delayed ones: browse), ``group_owner(group)``,
``lease_of(bookmark)``, ``low_water(partition)``, ``partitions()``, ``outstanding(subscription)``.

Precisions (decided while implementing; the contract above still holds):
- A lease that ends without ack (cancel, timeout, disconnect) checks the limits in this order:
  cancels >= max_cancels -> MAX_CANCELS, deliveries >= max_deliveries -> MAX_DELIVERIES, older than
  ``expiration`` -> EXPIRATION; otherwise Returned. So a cancel at max_deliveries, or a disconnect
  of an expired message, is done at once rather than returned and finished on the next tick.
- ``dispatch`` and ``add`` also apply expiration (an expired message is done, never handed out).
- Every partition must be started before ``add``/``mark_read``/``set_high_watermark``/
  ``restore_done`` name it (QueueError otherwise). ``add`` needs offsets at or beyond the read
  position (call it before ``mark_read`` for the same batch); ``restore_done`` must come before
  reading. A restored done record below the low-water mark is stale: a Forget is emitted for it.
- A remembered ack is accepted under strict leasing too (nobody can hold an unread message);
  CANCEL/EXPIRE/EXTEND of an unread message are UNKNOWN_BOOKMARK. Leasing lenient also lets any
  subscription cancel or extend another's lease.
- ``ack`` from an unregistered subscription raises QueueError; ``disconnect`` of one is a no-op.
  Re-subscribing keeps the subscription's place in subscribe order and its leases.
- ``stats().inactive`` = offsets in [read position, high watermark) not already done (only with
  target_queue_depth; 0 otherwise). ``lease_of`` returns a ``Lease`` or None (always None for
  at-most-once). ``low_water`` is the current mark (may be ahead of the last LowWater emitted).
- LowWater/Forget are appended at the end of ``drain()``'s changes, after the Done that caused them.
"""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from layer.engine.queries import Lease
    from layer.engine.queue import UNLIMITED, QueueEngine
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.engine.queries": ("Lease",),
            "layer.engine.queue": ("UNLIMITED", "QueueEngine"),
        },
    )

__all__ = ["UNLIMITED", "Lease", "QueueEngine"]
