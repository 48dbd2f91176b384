"""A queue's counters (ingested, delivered, acked, ...): integers that survive restarts.

They are kept with the queue's state, like its publish route's positions: in the changelog as
the POSITION records of a companion name (``<queue>~counters``, which no queue can have), one
"partition" per counter (``acked``/0, ``dead_lettered.max_deliveries``/0, ...) whose low-water
mark is the count, and in the store as those positions. A round writes the counters that
changed since the last write *with its own records* (so the counts of acks, leases and dead
letters are durable exactly when those are), and a round that has nothing else to commit writes
them at most every ``FLUSH_INTERVAL`` seconds: counters never add a transaction on a busy path.
The companion is snapshotted with its queue (``layer.coordinator.snapshots.COMPANIONS``), so a
restore that starts at a snapshot keeps them too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layer.codec import encode_change
from layer.engine.model import DoneReason, LowWater, ReturnReason, TopicPartition
from layer.state.base import Store, StoreBatch
from layer.state.changelog import ChangelogRecord

__all__ = ["COUNTERS_SUFFIX", "FLUSH_INTERVAL", "Counters"]

COUNTERS_SUFFIX = "~counters"
FLUSH_INTERVAL = 1.0  # seconds: how stale the durable counters may get in an idle changelog

_DEAD = "dead_lettered."  # prefix of the per-reason dead-letter counters
_NAMES = (
    "ingested",
    "delivered",
    "acked",
    "cancelled",
    "lease_timeouts",
    "disconnect_returns",
    "redriven",
    "routed",
    "unparseable",
    "filtered",
    "conflated",
    "discarded",
)
_RETURNED = {
    ReturnReason.CANCEL: "cancelled",
    ReturnReason.TIMEOUT: "lease_timeouts",
    ReturnReason.DISCONNECT: "disconnect_returns",
}


@dataclass(slots=True)
class Counters:
    """Counts since the queue was first created (restored from the store at start)."""

    ingested: int = 0
    delivered: int = 0
    acked: int = 0
    cancelled: int = 0
    lease_timeouts: int = 0
    disconnect_returns: int = 0  # leases returned because the consumer's connection closed
    redriven: int = 0
    routed: int = 0
    unparseable: int = 0
    filtered: int = 0  # read from the underlying topics, not matched by the queue's filter
    conflated: int = 0  # replaced by a newer message (conflate_key, last_value)
    discarded: int = 0  # left without a dead letter: dead_letter_if was not true
    dead_lettered_by: dict[str, int] = field(default_factory=dict)  # DoneReason value -> count
    _written: dict[str, int] = field(default_factory=dict)  # as last written to the changelog
    _written_at: float = 0.0

    @property
    def dead_lettered(self) -> int:
        return sum(self.dead_lettered_by.values())

    def dead_letter(self, reason: DoneReason, count: int = 1) -> None:
        self.dead_lettered_by[reason.value] = self.dead_lettered_by.get(reason.value, 0) + count

    def returned(self, reason: ReturnReason, count: int = 1) -> None:
        name = _RETURNED[reason]
        setattr(self, name, getattr(self, name) + count)

    def values(self) -> dict[str, int]:
        """Every counter by its stored name."""
        out = {name: getattr(self, name) for name in _NAMES}
        out.update({_DEAD + reason: n for reason, n in self.dead_lettered_by.items()})
        return out

    @classmethod
    def load(cls, store: Store, queue: str) -> Counters:
        """The queue's counters as the store holds them (zeros for a new queue)."""
        counters = cls()
        for tp, pos in store.positions(queue + COUNTERS_SUFFIX).items():
            if pos.low_water is None:
                continue
            name = tp.topic
            if name.startswith(_DEAD):
                counters.dead_lettered_by[name[len(_DEAD) :]] = pos.low_water
            elif name in _NAMES:
                setattr(counters, name, pos.low_water)
            counters._written[name] = pos.low_water
        return counters

    def flush(
        self,
        queue: str,
        changelog_topic: str,
        batch: StoreBatch,
        now: float,
        now_ms: int,
        *,
        force: bool,
    ) -> list[ChangelogRecord]:
        """The records of the counters changed since the last write (also put in ``batch``,
        applied once they are durable); none unless ``force`` (the round commits anyway) or
        ``FLUSH_INTERVAL`` has passed since the last write."""
        if not force and now - self._written_at < FLUSH_INTERVAL:
            return []
        changed = {k: v for k, v in self.values().items() if self._written.get(k, 0) != v}
        if not changed:
            return []
        state = queue + COUNTERS_SUFFIX
        records: list[ChangelogRecord] = []
        for name, value in sorted(changed.items()):
            tp = TopicPartition(name, 0)
            key, record = encode_change(state, LowWater(tp, value), now_ms)
            records.append((changelog_topic, key, record))
            batch.put_low_water(state, tp, value)
        self._written.update(changed)
        self._written_at = now
        return records
