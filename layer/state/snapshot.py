"""Per-partition snapshots in the changelog: what they hold, how they are written and read.

A snapshot of a (queue, topic, partition) is its whole changelog state (low-water mark and every
entry at or above it) as of the snapshot's place in the changelog, as runs of consecutive offsets
that share one ``ChangelogValue``. It is keyed by its partition (``SNAPSHOT_OFFSET - part``), so
one partition's state can move alone. The partitions of a queue (and its ``~redrive`` companion)
are snapshotted together, under one id, and part 0 of each lists them all (``siblings``).

A snapshot is usable only once a CONFIRM record with its id follows it. The confirmation is
written in a later transaction, begun after the snapshot's had committed: so a confirmation in
the log proves the snapshot committed, even on a broker whose read_committed readers see aborted
records (Tansu), and a coordinator killed mid-snapshot leaves an unconfirmed one that restore
passes over (it uses the previous one, and the tail after it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from layer.codec import (
    CHANGELOG_CONFIRM,
    CHANGELOG_SNAPSHOT,
    CONFIRM_OFFSET,
    SNAPSHOT_OFFSET,
    ChangelogKey,
    decode,
    encode,
    encode_key,
)
from layer.engine.model import TopicPartition
from layer.exceptions import SerializationError
from layer.state.base import Store
from layer.state.changelog import ChangelogRecord

__all__ = [
    "PART_RUNS",
    "Run",
    "SnapshotPart",
    "Subject",
    "build_snapshot",
    "confirm_records",
    "decode_confirm",
    "decode_part",
    "expand",
    "runs_of",
]

#: runs per snapshot record (a run is ~40 B: parts stay well under a MB)
PART_RUNS = 5_000

#: (queue, partition): what one snapshot is of
Subject = tuple[str, TopicPartition]
#: (first offset, count, ChangelogValue bytes)
Run = tuple[int, int, bytes]


@dataclass(frozen=True, slots=True)
class SnapshotPart:
    id: str
    part: int
    parts: int
    low_water: int | None
    at_ms: int
    siblings: tuple[Subject, ...]
    runs: list[Run] = field(default_factory=list)


def runs_of(entries: Iterable[tuple[int, bytes]]) -> list[Run]:
    """Entries (offset, value) in offset order as runs of consecutive offsets with equal values."""
    runs: list[Run] = []
    first = count = -1
    value = b""
    for offset, v in entries:
        if count > 0 and offset == first + count and v == value:
            count += 1
            continue
        if count > 0:
            runs.append((first, count, value))
        first, count, value = offset, 1, v
    if count > 0:
        runs.append((first, count, value))
    return runs


def _state(store: Store, queue: str) -> dict[TopicPartition, tuple[int | None, list[Run]]]:
    """Each partition's (low-water mark, runs of entries at or above it) in the store."""
    lows = {tp: pos.low_water for tp, pos in store.positions(queue).items()}
    marks = {tp: low for tp, low in lows.items() if low is not None}
    by_tp: dict[TopicPartition, list[tuple[int, bytes]]] = {}
    # read from each low-water mark on: below it are the deleted entries of every message it
    # passed since the store last compacted, which a scan from the start would step over
    # entries come in key order, a partition's together: its mark and list looked up once
    at_topic: str | None = None
    at_partition = -1
    low: int | None = None
    entries: list[tuple[int, bytes]] = []
    for (topic, partition, offset), value in store.entry_values(queue, below=marks):
        if partition != at_partition or topic != at_topic:
            at_topic, at_partition = topic, partition
            tp = TopicPartition(topic, partition)
            low = lows.get(tp)
            entries = by_tp.setdefault(tp, [])
        if low is not None and offset < low:
            continue  # below the mark: a restore drops it too
        entries.append((offset, value))
    out: dict[TopicPartition, tuple[int | None, list[Run]]] = {}
    for tp in set(lows) | set(by_tp):
        low = lows.get(tp)
        runs = runs_of(by_tp.get(tp, ()))
        if low is None and not runs:
            continue
        out[tp] = (low, runs)
    return out


def build_snapshot(
    store: Store, topic: str, queues: Sequence[str], snapshot_id: str, at_ms: int
) -> tuple[list[ChangelogRecord], dict[Subject, int], int]:
    """The snapshot records (to ``topic``) of every partition of ``queues`` that has state in
    the store; the parts per subject (for ``confirm_records``); and the runs written."""
    states: dict[Subject, tuple[int | None, list[Run]]] = {}
    for queue in queues:
        for tp, state in _state(store, queue).items():
            states[(queue, tp)] = state
    siblings = [
        {"queue": q, "topic": tp.topic, "partition": tp.partition} for q, tp in sorted(states)
    ]
    records: list[ChangelogRecord] = []
    parts_of: dict[Subject, int] = {}
    total = 0
    for (queue, tp), (low, runs) in sorted(states.items()):
        total += len(runs)
        chunks = [runs[i : i + PART_RUNS] for i in range(0, len(runs), PART_RUNS)] or [[]]
        parts_of[(queue, tp)] = len(chunks)
        for part, chunk in enumerate(chunks):
            value = encode(
                CHANGELOG_SNAPSHOT,
                {
                    "id": snapshot_id,
                    "part": part,
                    "parts": len(chunks),
                    "low_water": low,
                    "at_ms": at_ms,
                    "siblings": siblings if part == 0 else [],
                    "firsts": [r[0] for r in chunk],
                    "counts": [r[1] for r in chunk],
                    "values": [r[2] for r in chunk],
                },
            )
            key = encode_key(ChangelogKey(queue, tp.topic, tp.partition, SNAPSHOT_OFFSET - part))
            records.append((topic, key, value))
    return records, parts_of, total


def confirm_records(
    topic: str, snapshot_id: str, parts_of: Mapping[Subject, int], at_ms: int
) -> list[ChangelogRecord]:
    """The confirmations of a committed snapshot: one per subject, keyed by its partition."""
    return [
        (
            topic,
            encode_key(ChangelogKey(queue, tp.topic, tp.partition, CONFIRM_OFFSET)),
            encode(CHANGELOG_CONFIRM, {"id": snapshot_id, "parts": parts, "at_ms": at_ms}),
        )
        for (queue, tp), parts in sorted(parts_of.items())
    ]


def decode_part(value: bytes) -> SnapshotPart:
    obj: Any = decode(CHANGELOG_SNAPSHOT, value)
    firsts, counts, values = obj["firsts"], obj["counts"], obj["values"]
    if not len(firsts) == len(counts) == len(values):
        raise SerializationError("a snapshot part whose run columns differ in length")
    return SnapshotPart(
        obj["id"],
        obj["part"],
        obj["parts"],
        obj["low_water"],
        obj["at_ms"],
        tuple((s["queue"], TopicPartition(s["topic"], s["partition"])) for s in obj["siblings"]),
        list(zip(firsts, counts, values, strict=True)),
    )


def decode_confirm(value: bytes) -> tuple[str, int]:
    """(snapshot id, parts) of a CONFIRM record."""
    obj: Any = decode(CHANGELOG_CONFIRM, value)
    return obj["id"], obj["parts"]


def expand(runs: Iterable[Run]) -> Iterator[tuple[int, bytes]]:
    for first, count, value in runs:
        for offset in range(first, first + count):
            yield offset, value
