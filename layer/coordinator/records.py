"""A round's changes as what it writes: the order of its changelog records
(``changelog_order``), each change mirrored into the store batch (``mirror``, and ``RunMirror``
for a run of them) and the dead letter of a message that left without an ack (``dead_letter``).
Pure over the store batch and the queue's runtime: the round (``layer.coordinator.round``)
encodes and commits what these give."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter

from layer.codec import encode
from layer.coordinator.runtime import QueueRuntime
from layer.engine.model import (
    Bookmark,
    Change,
    Done,
    DoneReason,
    Forget,
    Leased,
    LowWater,
    Returned,
    TopicPartition,
    singles,
)
from layer.state.base import StoreBatch, StoredMessage, message_key, run_keys
from layer.state.changelog import ExtraRecord

__all__ = [
    "DEAD_LETTER_PAYLOAD_MAX",
    "ENTRY_SWEEP",
    "RunMirror",
    "bookmarks_of",
    "changelog_order",
    "covered",
    "dead_letter",
    "follows",
    "forgotten_spans",
    "low_water_marks",
    "mirror",
    "record_fields",
]

# A dead letter's payload is cut beyond this, so its envelope (key, headers and all) stays under
# librdkafka's default message.max.bytes of 1,000,000.
DEAD_LETTER_PAYLOAD_MAX = 900_000

# The entries of the messages a low-water mark passed are deleted in one range delete once the
# mark has moved this many offsets past the last one (``mirror``), not by their keys as each
# round passes them: a point delete per message cost more than its lease's put (RocksDB: a
# write of puts and deletes, ~0.55 us a message, of the puts alone ~0.16), and a range delete
# per round would leave hundreds of range tombstones a second, which slow every seek of a
# read. Until then they stay stored, below the mark that hides them from every reader
# (``KeyValueStore.entries``, ``entry_values`` with ``below``, a restore from the changelog).
ENTRY_SWEEP = 1 << 14


def follows(head: Bookmark, count: int, change: Leased | Returned | Done | Forget) -> bool:
    """Whether ``change`` is of the offset right after the run of ``count`` from ``head``."""
    bm = change.bookmark
    return (
        bm.offset == head.offset + count
        and bm.partition == head.partition
        and bm.topic == head.topic
    )


def forgotten_spans(changes: Sequence[Change]) -> dict[tuple[str, int], list[list[int]]]:
    """The offsets the tombstones of ``changes`` (ordered by ``_ordered``: they come last,
    before the low-water marks) delete, by partition: spans ``[first, end)``, joined where
    they meet."""
    spans: dict[tuple[str, int], list[list[int]]] = {}
    for i in range(len(changes) - 1, -1, -1):
        change = changes[i]
        kind = type(change)
        if kind is LowWater:
            continue
        if kind is not Forget:
            break
        bm = change.bookmark  # type: ignore[union-attr]
        end = bm.offset + change.count  # type: ignore[union-attr]
        found = spans.setdefault((bm.topic, bm.partition), [])
        # walked backwards: each tombstone is before the one seen last in its partition
        if found and found[-1][0] == end:
            found[-1][0] = bm.offset
        else:
            found.append([bm.offset, end])
    return spans


def low_water_marks(changes: Sequence[Change]) -> dict[tuple[str, int], int]:
    """The low-water marks of ``changes`` (ordered by ``_ordered``: they come last), by
    partition."""
    marks: dict[tuple[str, int], int] = {}
    for i in range(len(changes) - 1, -1, -1):
        change = changes[i]
        if type(change) is not LowWater:
            break
        tp = change.partition  # type: ignore[union-attr]
        marks[(tp.topic, tp.partition)] = change.offset  # type: ignore[union-attr]
    return marks


def covered(spans: list[list[int]], first: int, end: int) -> bool:
    """Whether one of ``spans`` holds all of ``[first, end)``."""
    # mostly one span: a loop, not a generator, for a check made per run
    for lo, hi in spans:  # noqa: SIM110
        if lo <= first and end <= hi:
            return True
    return False


def bookmarks_of(change: Leased | Returned | Done) -> list[Bookmark]:
    """The bookmarks of the messages ``change`` is of (a run's: ``count``)."""
    bm = change.bookmark
    if change.count == 1:
        return [bm]
    topic, partition, first = bm
    return [Bookmark(topic, partition, o) for o in range(first, first + change.count)]


def _overlapping(changes: Sequence[Change]) -> bool:
    """Whether, in ``changes`` ordered by ``_ordered``, a change is of a message inside (not at
    the head of) a run of an earlier one: the sort may have moved it across that run's change
    of the same message. Single changes of one message keep their order (the sort is stable)."""
    topic = ""
    partition = head = end = -1
    for change in changes:
        kind = type(change)
        if kind is Forget or kind is LowWater:
            break
        bm = change.bookmark  # type: ignore[union-attr]
        offset = bm.offset
        if bm.partition == partition and bm.topic == topic:
            if offset < end and offset != head:
                return True
            top = offset + change.count  # type: ignore[union-attr]
            if top > end:
                end = top
        else:
            topic, partition = bm.topic, bm.partition
            end = offset + change.count  # type: ignore[union-attr]
        head = offset
    return False


def record_fields(change: Leased | Returned | Done) -> tuple[object, ...]:
    """What a change's changelog value holds besides the round's time: equal fields, equal
    values."""
    if isinstance(change, Leased):
        return (1, change.deliveries, change.cancels, change.holder, change.deadline)
    if isinstance(change, Done):
        return (3, change.deliveries, change.cancels, change.reason)
    return (2, change.deliveries, change.cancels, change.not_before, change.reason)


_ACKED = DoneReason.ACKED
_BOOKMARK = attrgetter("bookmark")
_PARTITION = attrgetter("partition")


def changelog_order(changes: list[Change]) -> list[Change]:
    """``changes`` in the order a round writes them to the changelog (``_ordered``): each
    message's changes keep their order. A run of the engine's (``Leased.count``) that holds a
    message another change of the round is of, inside the run, goes message by message, as the
    sort may have put the two out of order (rare: a lease and its end in one round)."""
    ordered = _ordered(changes)
    if _overlapping(ordered):
        ordered = _ordered(list(singles(changes)))
    return ordered


def _ordered(changes: list[Change]) -> list[Change]:
    """The changes of messages by bookmark (partition, then offset; stable, so the changes of
    one message keep their order), then the tombstones by bookmark, then the low-water marks:
    a partition's tombstones and mark come after its messages' changes. Sorted by the
    bookmarks themselves (tuples compared in C), not by a key made for each change."""
    kept: list[Change] = []
    forgets: list[Change] = []
    marks: list[Change] = []
    for change in changes:
        kind = type(change)
        if kind is Forget:
            forgets.append(change)
        elif kind is LowWater:
            marks.append(change)
        else:
            kept.append(change)
    kept.sort(key=_BOOKMARK)
    if forgets:
        forgets.sort(key=_BOOKMARK)
        kept.extend(forgets)
    if marks:
        marks.sort(key=_PARTITION)
        kept.extend(marks)
    return kept


def mirror(
    rt: QueueRuntime,
    change: Change,
    value: bytes | None,
    batch: StoreBatch,
    payloads: Mapping[Bookmark, StoredMessage | None],
) -> ExtraRecord | None:
    """Mirror one change into the store batch (the entry is its changelog value); a message
    that leaves without an ack comes back as its dead letter, when the queue has a topic for
    them."""
    name = rt.name
    if isinstance(change, Leased | Returned):
        assert value is not None
        batch.put_entry_value(name, change.bookmark, value)
        if isinstance(change, Returned):
            rt.counters.returned(change.reason)
    elif isinstance(change, Done):
        assert value is not None
        batch.put_entry_value(name, change.bookmark, value)
        if not rt.in_blobs(change.bookmark, 1):
            batch.delete_message(name, change.bookmark)
        rt.payload_cache.pop(change.bookmark, None)
        if change.reason is DoneReason.ACKED:
            rt.counters.acked += 1
        elif change.reason is DoneReason.CONFLATED:
            rt.counters.conflated += 1
        if change.reason.dead_letter:
            stored = payloads.get(change.bookmark)
            if not rt.dead_letter_eligible(change, stored):
                return None  # discarded (dead_letter_if): counted and logged
            rt.counters.dead_letter(change.reason)
            topic = rt.config.dead_letter_topic
            if topic:
                return dead_letter(rt.name, topic, change, stored)
    elif isinstance(change, LowWater):
        tp, mark = change.partition, change.offset
        batch.put_low_water(name, tp, mark)
        swept = rt.entries_swept.get(tp)
        if swept is None or mark - swept >= ENTRY_SWEEP or mark < swept:
            # the entries the mark passed, kept by ``Round._forget_run``: one range delete
            # (from the partition's first key: whatever an earlier process left there too)
            batch.delete_entries_below(name, tp, mark)
            rt.entries_swept[tp] = mark
        batch.delete_runs_below(name, change.partition, change.offset)
        rt.blobs_below(batch, change.partition, change.offset)
    elif isinstance(change, Forget):
        bm = change.bookmark
        batch.delete_entry_run(
            name, TopicPartition(bm.topic, bm.partition), bm.offset, change.count
        )
    return None


class RunMirror:
    """``mirror`` of a queue's runs of a round (changes of one kind and one value at
    consecutive offsets of one partition): the entries they put and the local copies they
    delete go to the store batch as one operation each, whatever the number of runs (leases
    to consumers in turn make runs of one message)."""

    __slots__ = ("_keys", "_values", "_gone")

    def __init__(self, batch: StoreBatch) -> None:
        self._keys, self._values = batch.put_entry_values_encoded()
        self._gone = batch.delete_messages_encoded()

    def add(
        self,
        rt: QueueRuntime,
        run: Sequence[Leased | Returned | Done],
        value: bytes,
        payloads: Mapping[Bookmark, StoredMessage | None],
        *,
        entries: bool = True,
        count: int | None = None,
    ) -> list[ExtraRecord]:
        """One run (``count`` messages at consecutive offsets: of its changes' counts, by
        default); its dead letters, if any. ``entries`` False: the run's entries are not
        put (the same batch deletes them afterwards)."""
        head = run[0]
        first = head.bookmark
        if count is None:
            count = sum(change.count for change in run)
        name = rt.name
        if count == 1:
            key = message_key(name, first)
            if entries:
                self._keys.append(key)
                self._values.append(value)
            kind = type(head)
            if kind is not Done:
                if isinstance(head, Returned):
                    rt.counters.returned(head.reason)
                return []
            if not rt.in_blobs(first, 1):
                self._gone.append(key)
        else:
            keys = run_keys(name, first, count)
            if entries:
                self._keys.extend(keys)
                self._values.extend(repeat(value, count))
            if not isinstance(head, Done):
                if isinstance(head, Returned):
                    rt.counters.returned(head.reason, count)  # one value: one reason
                return []
            if not rt.in_blobs(first, count):
                self._gone.extend(keys)
        assert isinstance(head, Done)
        cache = rt.payload_cache
        if cache:
            # keyed by bookmarks, which are tuples: a plain tuple finds one
            tp_topic, tp_partition, offset = first
            for o in range(offset, offset + count):
                cache.pop((tp_topic, tp_partition, o), None)  # type: ignore[call-overload]
        reason = head.reason  # one value: one reason
        if reason is DoneReason.ACKED:
            rt.counters.acked += count
            return []
        if reason is DoneReason.CONFLATED:
            rt.counters.conflated += count
        if not reason.dead_letter:
            return []
        if count > len(run):  # dead letters go message by message
            run = list(singles(run))  # type: ignore[arg-type]
        if rt.exprs.dead_letter_if is not None:  # dead_letter_if decides message by message
            run = [
                change
                for change in run
                if isinstance(change, Done)
                and rt.dead_letter_eligible(change, payloads.get(change.bookmark))
            ]
            count = len(run)
            if not count:
                return []
        rt.counters.dead_letter(reason, count)
        topic = rt.config.dead_letter_topic
        if not topic:
            return []
        return [
            dead_letter(name, topic, change, payloads.get(change.bookmark))
            for change in run
            if isinstance(change, Done)
        ]


def dead_letter(queue: str, topic: str, change: Done, stored: StoredMessage | None) -> ExtraRecord:
    """The dead letter of a message (``avro/dead_letter.avsc``), keyed by its bookmark."""
    bm = change.bookmark
    payload = stored.value if stored else None
    detail = stored.error if stored else None
    if payload is not None and len(payload) > DEAD_LETTER_PAYLOAD_MAX:
        # the envelope must fit the producer's message.max.bytes, or the transaction (and
        # the coordinator) would fail on this message again after every restart
        cut = f"payload cut from {len(payload)} to {DEAD_LETTER_PAYLOAD_MAX} bytes"
        detail = f"{detail}; {cut}" if detail else cut
        payload = payload[:DEAD_LETTER_PAYLOAD_MAX]
    envelope = {
        "queue": queue,
        "topic": bm.topic,
        "partition": bm.partition,
        "offset": bm.offset,
        "bookmark": str(bm),
        "key": stored.key if stored else None,
        "headers": [{"key": k, "value": v} for k, v in (stored.headers if stored else ())],
        "payload": payload,
        "reason": change.reason.value,
        "detail": detail,
        "deliveries": change.deliveries,
        "cancels": change.cancels,
        "message_timestamp_ms": stored.timestamp_ms if stored else 0,
        "dead_lettered_at_ms": int(change.at * 1000),
    }
    headers = [
        ("qlayer.reason", change.reason.value.encode()),
        ("qlayer.bookmark", str(bm).encode()),
    ]
    return (topic, str(bm).encode(), encode("dead_letter", envelope), headers)
