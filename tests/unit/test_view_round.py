"""The view topic's records (``ViewRound``): what the coordinator writes is what fastavro writes
for ``avro/view_round.avsc``, and it decodes back to the same changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.codec import decode, default_codec, encode
from layer.coordinator.view import reconcile
from layer.engine.model import Bookmark, ViewChange, ViewChanges
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
    ),
    min_size=1,
    max_size=40,
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
