"""What the parts of the queue engine share: its fields and the steps each part calls.

``QueueEngine`` (``layer.engine.queue``) is assembled from mixins, one concern each:
``Queries`` (read-only answers), ``Leases`` (acks, cancels, lease ends) and ``Holding`` (what
waits: barriers, delays, last-value conflation, the view journal, routed dispatch). They work on
the fields declared here, which ``QueueEngine.__init__`` sets.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable
from typing import Any

from layer.engine.fairness import Subscriber
from layer.engine.index import (
    AgeIndex,
    DelayIndex,
    Entry,
    ExpiryIndex,
    FifoOrder,
    LeaseIndex,
    PriorityOrder,
)
from layer.engine.model import (
    Arrival,
    Bookmark,
    Change,
    Delivery,
    DoneReason,
    EngineSettings,
    ReturnReason,
    TopicPartition,
    ViewChange,
)
from layer.engine.partition import PartitionState
from layer.engine.routing import Router
from layer.engine.runs import Run


class EngineBase:
    name: str
    settings: EngineSettings
    _alo: bool
    _strict: bool
    _lease_period: float
    _max_deliveries: int
    _max_cancels: int
    _expiration: float | None
    _depth: int
    _priority: bool
    _sort: bool
    _ttl: bool
    _expiries: ExpiryIndex
    _order: FifoOrder | PriorityOrder
    _ages: AgeIndex
    _leases: LeaseIndex
    _picker: Any
    # while an ack batch runs: the subscriptions whose picker update waits for its end
    _deferred: dict[int, Subscriber] | None
    _subs: dict[str, Subscriber]
    _router: Router
    _delays: DelayIndex
    _delayed: int
    _barriers: deque[Entry]
    _held: deque[Entry]
    _held_count: int
    _conflate: bool
    _latest: dict[object, Entry]
    _restored: dict[Bookmark, tuple[int, int]]
    # offsets of the restored counts per (topic, partition), sorted; None: to be built
    _restored_index: dict[tuple[str, int], list[int]] | None
    _topics: dict[str, dict[int, PartitionState]]
    _parts: list[PartitionState]
    _available: int
    _leased: int
    _done_total: int
    _dead_total: int
    _delivered_total: int
    _changes: list[Change]
    _deliveries: list[Delivery]
    _view: dict[Bookmark, list[Any]] | None
    _seq: int

    # steps of the core (QueueEngine) that the mixins call
    def _deliver(self, entry: Entry, sub: Subscriber, now: float) -> None:
        raise NotImplementedError

    def _finish(
        self, entry: Entry, reason: DoneReason, now: float, part: PartitionState | None = None
    ) -> None:
        raise NotImplementedError

    def _emit_done(
        self, bm: Bookmark, reason: DoneReason, deliveries: int, cancels: int, now: float
    ) -> None:
        raise NotImplementedError

    def _view_change(self, entry: Entry, sign: int) -> ViewChange:
        raise NotImplementedError

    def _limit_reason(self, deliveries: int, cancels: int) -> DoneReason | None:
        raise NotImplementedError

    def add(self, arrivals: Iterable[Arrival], now: float) -> None:
        raise NotImplementedError

    def _close_run(self, run: Run, times: array[float]) -> None:
        raise NotImplementedError

    def _partition(self, partition: TopicPartition) -> PartitionState:
        raise NotImplementedError

    # steps of one mixin that another calls
    def _lookup(self, bm: Bookmark) -> PartitionState | None:
        raise NotImplementedError

    def _subscriber(self, subscription: str) -> Subscriber:
        raise NotImplementedError

    def _make_available(self, entry: Entry) -> None:
        raise NotImplementedError

    def _delay(self, entry: Entry, until: float) -> None:
        raise NotImplementedError

    def _viewed(self, entry: Entry, sign: int) -> None:
        raise NotImplementedError

    def _release_held(self, now: float) -> None:
        raise NotImplementedError

    def _release(self, entry: Entry) -> None:
        raise NotImplementedError

    def _touch(self, part: PartitionState) -> None:
        raise NotImplementedError

    def _requeue(self, entry: Entry) -> None:
        raise NotImplementedError

    def _end_lease(
        self, entry: Entry, reason: ReturnReason, now: float, delay: float = 0.0
    ) -> None:
        raise NotImplementedError
