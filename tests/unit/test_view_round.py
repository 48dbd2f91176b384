"""The view topic's records (``ViewRound``): what the coordinator writes is what fastavro writes
for ``avro/view_round.avsc``, and it decodes back to the same changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.codec import decode, default_codec, encode
from layer.coordinator.view import lease_changes, reconcile, reconcile_leases
from layer.engine.model import (
    Bookmark,
    Done,
    DoneReason,
    Leased,
    Returned,
    ReturnReason,
    ViewChange,
    ViewChanges,
    lease_change,
)
from layer.exceptions import SerializationError
from layer.viewcodec import VIEW_ROUND, VIEW_ROUND_VERSION, decode_round, encode_round

int32 = st.integers(-(2**31), 2**31 - 1)
changes = st.lists(
    st.builds(
        ViewChange,
        st.builds(
            Bookmark,
            st.sampled_from(["orders", "ORDERS_RISK", "é"]),
            int32,
            st.integers(0, 2**63 - 1),
        ),
        st.sampled_from([1, -1]),
        int32,
        int32,
        st.none() | st.integers(0, 2**64 - 1),
        holder=st.none(),
        leased_at=st.just(0),
    ),
    min_size=1,
    max_size=40,
)
leases = st.lists(
    st.builds(
        lease_change,
        st.builds(Bookmark, st.sampled_from(["orders", "é"]), int32, st.integers(0, 2**63 - 1)),
        st.sampled_from([1, -1]),
        st.sampled_from(["alice", "bob", "ü"]),
        st.integers(0, 2**62),
        int32,
        int32,
    ),
    max_size=10,
)


def test_the_version_is_the_schemas() -> None:
    assert default_codec().version(VIEW_ROUND) == VIEW_ROUND_VERSION


@given(st.text(max_size=20), changes, st.integers(0, 2**62))
def test_a_round_is_what_fastavro_writes_and_decodes_to_its_changes(queue, round_, at_ms) -> None:
    data = encode_round(queue, ViewChanges.of(round_), at_ms)
    record = decode(VIEW_ROUND, data)
    assert encode(VIEW_ROUND, record) == data
    assert record["count"] == len(round_)
    decoded = decode_round(data)
    assert (decoded.queue, decoded.at_ms, decoded.changes) == (queue, at_ms, round_)


@given(changes, leases)
def test_lease_changes_travel_beside_the_contents_changes(round_, held) -> None:
    data = encode_round("q", ViewChanges.of(round_), 7, held)
    assert encode(VIEW_ROUND, decode(VIEW_ROUND, data)) == data
    decoded = decode_round(data)
    assert (decoded.changes, decoded.leases) == (round_, held)


def test_a_version_1_round_still_reads_with_no_leases() -> None:
    round_ = [ViewChange(Bookmark("t", 0, o), 1, 2, 0) for o in range(3)]
    record = decode(VIEW_ROUND, encode_round("q", ViewChanges.of(round_), 5))
    old = {k: v for k, v in record.items() if k not in ("holders", "holder_index", "leased_at")}
    data = default_codec().encode_version(VIEW_ROUND, 1, old)
    assert data[0] == 1
    decoded = decode_round(data)
    assert (decoded.changes, decoded.leases) == (round_, [])


def test_one_topic_and_no_priority_leave_their_columns_empty() -> None:
    round_ = [ViewChange(Bookmark("t", 0, o), 1, 0, 0) for o in range(3)]
    record = decode(VIEW_ROUND, encode_round("q", ViewChanges.of(round_), 5))
    assert record["topics"] == ["t"]
    assert (record["topic_index"], record["priority"], record["has_priority"]) == (b"", b"", b"")
    assert len(record["offset"]) == 3 * 8


def test_a_damaged_round_is_a_serialization_error() -> None:
    data = decode(
        VIEW_ROUND, encode_round("q", ViewChanges.of([ViewChange(Bookmark("t", 0, 1), 1, 0, 0)]), 5)
    )
    data["offset"] = data["offset"][:-1]
    with pytest.raises(SerializationError, match="offset holds 7 bytes"):
        decode_round(encode(VIEW_ROUND, data))
    data = decode(
        VIEW_ROUND, encode_round("q", ViewChanges.of([ViewChange(Bookmark("t", 0, 1), 1, 0, 0)]), 5)
    )
    data["topics"], data["topic_index"] = ["a", "b"], b"\x07\x00"
    with pytest.raises(SerializationError, match="topic index"):
        decode_round(encode(VIEW_ROUND, data))
    with pytest.raises(SerializationError):
        decode_round(b"\x01garbage")


def test_reconcile_adds_what_is_live_and_takes_out_what_is_not() -> None:
    a, b, c = (Bookmark("t", 0, o) for o in range(3))
    published = {a: ViewChange(a, 1, 1, 0), b: ViewChange(b, 1, 2, 1, 7)}
    live = [ViewChange(b, 1, 2, 1, 7), ViewChange(c, 1, 0, 0)]
    assert reconcile(published, live) == [ViewChange(c, 1, 0, 0), ViewChange(a, -1, 1, 0)]
    assert reconcile({}, []) == []


def test_lease_changes_follow_the_leases_and_their_ends() -> None:
    a, b, c = (Bookmark("t", 0, o) for o in range(3))
    leases: dict[Bookmark, ViewChange] = {}
    begun = lease_changes(leases, [Leased(a, "alice", 9.0, 1, 0), Leased(b, "bob", 9.0, 1, 0)], 100)
    assert begun == [lease_change(a, 1, "alice", 100, 1, 0), lease_change(b, 1, "bob", 100, 1, 0)]
    ended = lease_changes(
        leases,
        [
            Done(a, DoneReason.ACKED, 1, 0, 1.0),
            Returned(b, ReturnReason.CANCEL, 1, 1),
            Done(c, DoneReason.EXPIRATION, 0, 0, 1.0),  # never leased: no lease change
        ],
        200,
    )
    assert ended == [lease_change(a, -1, "alice", 100, 1, 0), lease_change(b, -1, "bob", 100, 1, 0)]
    assert leases == {}


def test_a_restart_reconciles_the_leases_keeping_when_they_began() -> None:
    a, b, c = (Bookmark("t", 0, o) for o in range(3))
    published = {
        a: lease_change(a, 1, "alice", 100, 1, 0),
        b: lease_change(b, 1, "bob", 100, 1, 0),
        c: lease_change(c, 1, "bob", 100, 1, 0),
    }
    held = [(a, "alice", 1, 0), (b, "carol", 2, 0)]  # c ended while it was down
    leases, fixes = reconcile_leases(published, held, 500)
    assert leases == {a: published[a], b: lease_change(b, 1, "carol", 500, 2, 0)}
    assert fixes == [
        lease_change(b, -1, "bob", 100, 1, 0),
        lease_change(b, 1, "carol", 500, 2, 0),
        lease_change(c, -1, "bob", 100, 1, 0),
    ]
