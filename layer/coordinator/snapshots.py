"""When a queue's partitions are snapshotted in its changelog, and their confirmations.

A queue is due for a snapshot after ``every`` changelog records since its last one (or as many
as that snapshot had runs, when more: its cost stays in proportion to the updates it saves a
restore), or after ``interval`` seconds with any record since. The snapshot is built from the
store, which holds every round committed before this one, and goes *first* among the queue's
records of the round, so it is the state as of its place in the changelog
(``layer.state.snapshot``). Once the round has committed, the next round writes its
confirmations (that round commits for them alone if it has nothing else).

A queue's companion states (its redrive marks, ``~redrive``, its publish route's positions,
``~route``, and its counters, ``~counters``) are in its changelog too: they are snapshotted with
it, so a restore that starts at the snapshot loses none of them.

A redrive commits outside the rounds and writes the store after: while one is under way
(``hold``), the queue is not snapshotted, so no snapshot can miss a record that precedes it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from layer.coordinator.counters import COUNTERS_SUFFIX
from layer.coordinator.publish_route import ROUTE_SUFFIX
from layer.coordinator.redrive import REDRIVE_SUFFIX
from layer.state.base import Store
from layer.state.changelog import ChangelogRecord
from layer.state.snapshot import Subject, build_snapshot, confirm_records

__all__ = ["COMPANIONS", "Snapshots"]

#: the states a queue keeps in its changelog under other names: snapshotted with it
COMPANIONS = (REDRIVE_SUFFIX, ROUTE_SUFFIX, COUNTERS_SUFFIX)

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Queue:
    updates: int = 0  # changelog records since the last snapshot
    last_at: float = 0.0  # when the last snapshot was taken (monotonic)
    last_runs: int = 0  # runs in the last snapshot
    sent: tuple[str, dict[Subject, int]] | None = None  # in the round being committed
    confirm: list[tuple[str, dict[Subject, int]]] = field(default_factory=list)  # committed


class Snapshots:
    def __init__(
        self,
        store: Store,
        *,
        every: int,
        interval: float,
        clock: Callable[[], float],
        ids: Callable[[], str] = lambda: os.urandom(8).hex(),
    ) -> None:
        self._store = store
        self._every = every
        self._interval = interval
        self._clock = clock  # monotonic seconds
        self._ids = ids
        self._queues: dict[str, _Queue] = {}
        self._held: dict[str, int] = {}
        self.taken = 0  # snapshots written (each of all a queue's partitions)

    @contextlib.contextmanager
    def hold(self, queue: str) -> Iterator[None]:
        """No snapshot of ``queue`` while in this block (a redrive is under way)."""
        self._held[queue] = self._held.get(queue, 0) + 1
        try:
            yield
        finally:
            self._held[queue] -= 1
            if not self._held[queue]:
                del self._held[queue]

    def _state(self, queue: str) -> _Queue:
        state = self._queues.get(queue)
        if state is None:
            state = self._queues[queue] = _Queue(last_at=self._clock())
        return state

    def forget(self, queue: str) -> None:
        self._queues.pop(queue, None)

    def add(
        self,
        queue: str,
        topic: str,
        records: list[ChangelogRecord],
        start: int,
        at_ms: int,
    ) -> None:
        """The queue's records of this round are ``records[start:]``: count them, put the
        confirmations of its last committed snapshot after them and, when it is due, a new
        snapshot before them."""
        state = self._state(queue)
        state.updates += len(records) - start
        for snapshot_id, parts_of in state.confirm:
            records.extend(confirm_records(topic, snapshot_id, parts_of, at_ms))
        state.confirm = []
        if not self._due(queue, state):
            return
        snapshot_id = self._ids()
        built, parts_of, runs = build_snapshot(
            self._store, topic, [queue, *(queue + c for c in COMPANIONS)], snapshot_id, at_ms
        )
        state.updates = 0
        state.last_at = self._clock()
        state.last_runs = runs
        if not built:
            return
        records[start:start] = built
        state.sent = (snapshot_id, parts_of)
        self.taken += 1
        log.info(
            "snapshot queue=%s id=%s partitions=%d runs=%d records=%d",
            queue,
            snapshot_id,
            len(parts_of),
            runs,
            len(built),
        )

    def _due(self, queue: str, state: _Queue) -> bool:
        if not state.updates or queue in self._held or state.sent is not None:
            return False
        if self._every and state.updates >= max(self._every, state.last_runs):
            return True
        return bool(self._interval) and self._clock() - state.last_at >= self._interval

    def committed(self) -> None:
        """The round that carried the snapshots sent has committed: confirm them next round."""
        for state in self._queues.values():
            if state.sent is not None:
                state.confirm.append(state.sent)
                state.sent = None

    def failed(self) -> None:
        """The round did not commit: its snapshots are never confirmed."""
        for state in self._queues.values():
            state.sent = None

    def pending(self) -> bool:
        """Confirmations wait for the next round."""
        return any(state.confirm for state in self._queues.values())
