"""DeliveryBatch against the path it replaces: the engine's deliveries with their stored
payloads built into DeliveredMessage objects one by one (the former ``round.materialize``),
then written to frames from those. Both must give the same messages and the same bytes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from layer.api.deliveries import DeliveryBatch
from layer.api.frames import SERVER_FRAME_CODEC, Batch, Checked, Messages
from layer.api.server import _joined, _message_frames
from layer.api.service import DeliveredMessage
from layer.coordinator.deliveries import by_subscription
from layer.engine.model import Bookmark, Delivery
from layer.state.base import StoredMessage


def reference(
    queue: str,
    deliveries: Sequence[Delivery],
    payloads: Mapping[Bookmark, StoredMessage | None],
) -> list[tuple[str, list[DeliveredMessage]]]:
    """The deliveries as messages by subscription, a message at a time (the former path)."""
    by_sub: dict[str, list[DeliveredMessage]] = defaultdict(list)
    for d in deliveries:
        stored = payloads.get(d.bookmark)
        if stored is None:
            continue
        deadline_ms = None if d.deadline is None else int(d.deadline * 1000)
        by_sub[d.subscription].append(
            DeliveredMessage(
                d.bookmark,
                stored.key,
                stored.value,
                list(stored.headers) if stored.headers else [],
                stored.timestamp_ms,
                d.deliveries,
                d.cancels,
                deadline_ms,
                d.barrier,
                queue,
                stored.error,
            )
        )
    return list(by_sub.items())


def _stored_of(
    deliveries: list[Delivery], payloads: dict[Bookmark, StoredMessage | None]
) -> list[StoredMessage | None]:
    return [payloads.get(d.bookmark) for d in deliveries]


_bytes = st.binary(max_size=12)
_header = st.tuples(st.sampled_from(["a", "b", "trace"]), st.none() | _bytes)
_stored = st.builds(
    StoredMessage,
    key=st.none() | _bytes,
    value=st.none() | _bytes,  # None: a tombstone
    headers=st.one_of(st.just(()), st.lists(_header, max_size=3).map(tuple)),
    timestamp_ms=st.integers(0, 2**41),
    error=st.none() | st.none() | st.text(max_size=8),
)
_deadline = st.sampled_from([None, 1_700_000_030.0, 1_700_000_030.0, 1_700_000_031.5])


@st.composite
def rounds(draw: Any) -> tuple[list[Delivery], dict[Bookmark, StoredMessage | None]]:
    """A round's deliveries (runs of consecutive offsets over a few partitions, to one or
    more subscriptions, leased and not, barriers) and the payloads found for them (a few
    missing)."""
    deliveries: list[Delivery] = []
    payloads: dict[Bookmark, StoredMessage | None] = {}
    common = draw(_deadline)
    mixed = draw(st.booleans())
    for _ in range(draw(st.integers(0, 4))):
        partition = draw(st.integers(0, 2))
        start = draw(st.integers(0, 10_000))
        for offset in range(start, start + draw(st.integers(1, 12))):
            bm = Bookmark("orders", partition, offset)
            if bm in payloads:
                continue
            barrier = draw(st.booleans()) and draw(st.booleans()) and draw(st.booleans())
            deadline = None if barrier else (draw(_deadline) if mixed else common)
            deliveries.append(
                Delivery(
                    draw(st.sampled_from(["s1", "s1", "s2"])),
                    bm,
                    draw(st.integers(1, 3)),
                    draw(st.integers(0, 2)),
                    deadline,
                    barrier,
                )
            )
            payloads[bm] = None if draw(st.integers(0, 30)) == 0 else draw(_stored)
    return deliveries, payloads


def _encode(messages: Sequence[DeliveredMessage], columns: bool) -> bytes:
    return SERVER_FRAME_CODEC.encode(Messages(messages, columns, made_at=3.5))


@settings(max_examples=300, deadline=None)
@given(rounds())
def test_a_batch_gives_the_messages_and_frames_of_the_former_path(
    round_: tuple[list[Delivery], dict[Bookmark, StoredMessage | None]],
) -> None:
    deliveries, payloads = round_
    expected = reference("q", deliveries, payloads)
    got = by_subscription("q", deliveries, _stored_of(deliveries, payloads))
    assert [sub for sub, _ in got] == [sub for sub, _ in expected]
    for (_sub, batch), (_, messages) in zip(got, expected, strict=True):
        assert len(batch) == len(messages)
        assert batch.messages() == messages
        assert [batch[i] for i in range(len(batch))] == messages
        assert batch[-1] == messages[-1]
        assert batch.leased() == [m.bookmark for m in messages if m.lease_deadline_ms is not None]
        for columns in (True, False):
            assert _encode(batch, columns) == _encode(messages, columns)
        # the frames decode to the same messages
        assert SERVER_FRAME_CODEC.decode(_encode(batch, True)).messages == messages  # type: ignore[union-attr]
        in_batch = Batch([Checked(1, True, 2.0), Messages(batch, True)])
        assert SERVER_FRAME_CODEC.encode(in_batch) == SERVER_FRAME_CODEC.encode(
            Batch([Checked(1, True, 2.0), Messages(messages, True)])
        )


@settings(max_examples=200, deadline=None)
@given(rounds(), st.integers(0, 40), st.integers(0, 40))
def test_slices_joins_and_cuts_keep_the_messages(
    round_: tuple[list[Delivery], dict[Bookmark, StoredMessage | None]], i: int, j: int
) -> None:
    deliveries, payloads = round_
    batches = [
        batch for _sub, batch in by_subscription("q", deliveries, _stored_of(deliveries, payloads))
    ]
    messages = [m for batch in batches for m in batch.messages()]
    for batch in batches:
        assert batch[i:j].messages() == batch.messages()[i:j]
    if batches:
        joined = DeliveryBatch.join(batches)
        assert joined.messages() == messages
        assert _encode(joined, True) == _encode(messages, True)
        assert _joined(list(batches)).messages() == messages  # type: ignore[attr-defined]
        # cut to frames as a list of messages would be
        for most in (1, 100, 10_000):
            pieces = joined.cut(most)
            assert [m for p in pieces for m in p.messages()] == messages
            assert [len(p) for p in pieces] == [
                len(f.messages) for f in _cut_reference(messages, most)
            ]


def _cut_reference(messages: list[DeliveredMessage], most: int) -> list[Messages]:
    frames: list[Messages] = []
    batch: list[DeliveredMessage] = []
    size = 0
    for m in messages:
        batch.append(m)
        size += 64 + len(m.key or b"") + len(m.value or b"")
        size += sum(len(k) + len(v or b"") for k, v in m.headers)
        if size >= most:
            frames.append(Messages(batch))
            batch, size = [], 0
    if batch:
        frames.append(Messages(batch))
    return frames


def test_a_restart_moves_every_lease_and_no_barrier() -> None:
    bm = [Bookmark("t", 0, o) for o in range(4)]
    deliveries = [
        Delivery("s", bm[0], 1, 0, 10.0),
        Delivery("s", bm[1], 1, 0, None, True),
        Delivery("s", bm[2], 2, 0, 11.0),
        Delivery("s", bm[3], 1, 0, 10.0),
    ]
    stored = StoredMessage(key=None, value=b"{}")
    [(_sub, batch)] = by_subscription("q", deliveries, [stored] * 4)
    before = batch.messages()
    assert batch.leased() == [bm[0], bm[2], bm[3]]
    batch.restart(99_000)
    assert [m.lease_deadline_ms for m in batch.messages()] == [99_000, None, 99_000, 99_000]
    assert batch.messages() is before  # the messages built already follow it
    fresh = DeliveryBatch.join([batch])
    assert [fresh.deadline(i) for i in range(4)] == [99_000, None, 99_000, 99_000]


def test_batches_of_several_queues_go_as_messages() -> None:
    stored = StoredMessage(key=b"k", value=b"v")
    one = by_subscription("a", [Delivery("s", Bookmark("t", 0, 0), 1, 0, 5.0)], [stored])
    two = by_subscription("b", [Delivery("s", Bookmark("u", 0, 0), 1, 0, 5.0)], [stored])
    joined = _joined([one[0][1], two[0][1]])
    assert isinstance(joined, list)
    assert [m.queue for m in joined] == ["a", "b"]
    [frame] = _message_frames(joined, True)
    assert SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(frame)) == Messages(joined, True)


@settings(max_examples=100, deadline=None)
@given(st.lists(rounds(), min_size=1, max_size=4))
def test_batches_of_several_rounds_join_into_the_frame_of_their_messages(
    rounds_: list[tuple[list[Delivery], dict[Bookmark, StoredMessage | None]]],
) -> None:
    batches: list[DeliveryBatch] = []
    for n, (deliveries, payloads) in enumerate(rounds_):
        # each round leases to its own deadline
        moved = [
            Delivery(
                d.subscription,
                d.bookmark,
                d.deliveries,
                d.cancels,
                d.deadline and d.deadline + n,
                d.barrier,
            )
            for d in deliveries
        ]
        batches += [b for _sub, b in by_subscription("q", moved, _stored_of(moved, payloads))]
    if not batches:
        return
    messages = [m for b in batches for m in b.messages()]
    joined = _joined(list(batches))
    assert isinstance(joined, DeliveryBatch)
    assert joined.messages() == messages
    for columns in (True, False):
        assert _encode(joined, columns) == _encode(messages, columns)
