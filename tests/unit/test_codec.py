"""The Avro codec: round trips, changelog records of every change, schema evolution, bad input."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from layer import codec
from layer.codec import (
    CHANGELOG_KEY,
    CHANGELOG_VALUE,
    DEAD_LETTER,
    POSITION_OFFSET,
    STORED_MESSAGE,
    ChangeKind,
    ChangelogKey,
    Codec,
    decode,
    decode_change,
    decode_key,
    encode,
    encode_change,
    encode_key,
)
from layer.engine.model import (
    Bookmark,
    Done,
    DoneReason,
    Forget,
    Leased,
    LowWater,
    Returned,
    ReturnReason,
    TopicPartition,
)
from layer.exceptions import SerializationError

SCHEMAS = (CHANGELOG_KEY, CHANGELOG_VALUE, DEAD_LETTER, STORED_MESSAGE)

SAMPLES: dict[str, list[dict[str, Any]]] = {
    CHANGELOG_KEY: [
        {"queue": "orders", "topic": "orders-in", "partition": 0, "offset": 0, "count": 1},
        {"queue": "q", "topic": "t", "partition": 7, "offset": 2**62, "count": 300},
        {"queue": "ünï", "topic": "t.x_y", "partition": 1, "offset": POSITION_OFFSET, "count": 1},
    ],
    CHANGELOG_VALUE: [
        {
            "kind": "LEASED",
            "deliveries": 1,
            "cancels": 0,
            "holder": "sub-1",
            "lease_deadline_ms": 1_700_000_060_000,
            "reason": None,
            "at_ms": 1_700_000_000_000,
            "low_water": None,
        },
        {
            "kind": "POSITION",
            "deliveries": 0,
            "cancels": 0,
            "holder": None,
            "lease_deadline_ms": None,
            "reason": None,
            "at_ms": 5,
            "low_water": 42,
        },
    ],
    DEAD_LETTER: [
        {
            "queue": "orders",
            "topic": "orders-in",
            "partition": 2,
            "offset": 99,
            "bookmark": "orders-in/2/99",
            "key": b"k",
            "headers": [{"key": "a", "value": b"1"}, {"key": "a", "value": None}],
            "payload": b"\x00\xff payload",
            "reason": "max_deliveries",
            "detail": None,
            "deliveries": 5,
            "cancels": 1,
            "message_timestamp_ms": 1,
            "dead_lettered_at_ms": 2,
        },
        {
            "queue": "orders",
            "topic": "orders-in",
            "partition": 0,
            "offset": 0,
            "bookmark": "orders-in/0/0",
            "key": None,
            "headers": [],
            "payload": None,
            "reason": "unparseable",
            "detail": "Expecting value: line 1 column 1 (char 0)",
            "deliveries": 0,
            "cancels": 0,
            "message_timestamp_ms": 0,
            "dead_lettered_at_ms": 0,
        },
    ],
    STORED_MESSAGE: [
        {
            "key": None,
            "value": b'{"a": 1}',
            "headers": [{"key": "h", "value": b""}],
            "timestamp_ms": 1_700_000_000_000,
            "priority": 7,
            "error": None,
        },
        {
            "key": b"k",
            "value": None,
            "headers": [],
            "timestamp_ms": -1,
            "priority": None,
            "error": "not json",
        },
    ],
}


@pytest.mark.parametrize("name", SCHEMAS)
def test_round_trip_every_schema(name: str) -> None:
    for sample in SAMPLES[name]:
        data = encode(name, sample)
        assert data[0] == codec.default_codec().version(name) == (2 if name == CHANGELOG_KEY else 1)
        assert decode(name, data) == sample


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_files_are_valid_avro_in_the_qlayer_namespace(name: str) -> None:
    raw = json.loads((codec.DEFAULT_SCHEMA_DIR / f"{name}.avsc").read_text())
    assert raw["namespace"] == "qlayer"
    parse_schema(raw)


BOOKMARK = Bookmark("orders-in", 3, 123_456)


@pytest.mark.parametrize(
    ("change", "kind"),
    [
        (Leased(BOOKMARK, "sub-1", 1_700_000_060.25, 2, 1), ChangeKind.LEASED),
        (Returned(BOOKMARK, ReturnReason.TIMEOUT, 2, 0), ChangeKind.RETURNED),
        (Returned(BOOKMARK, ReturnReason.CANCEL, 1, 1), ChangeKind.RETURNED),
        (Done(BOOKMARK, DoneReason.ACKED, 1, 0, 1_700_000_001.5), ChangeKind.DONE),
        (Done(BOOKMARK, DoneReason.MAX_DELIVERIES, 5, 0, 12.0), ChangeKind.DONE),
    ],
)
def test_encode_change_of_a_message(change: Any, kind: ChangeKind) -> None:
    key, value = encode_change("orders", change, at_ms=77)
    ck, cv = decode_change(key, value)
    assert ck == ChangelogKey("orders", "orders-in", 3, 123_456)
    assert ck.bookmark == BOOKMARK and not ck.is_position
    assert cv is not None
    assert cv["kind"] == kind
    assert (cv["deliveries"], cv["cancels"]) == (change.deliveries, change.cancels)
    assert cv["at_ms"] == 77
    assert cv["low_water"] is None
    if isinstance(change, Leased):
        assert cv["holder"] == "sub-1"
        assert cv["lease_deadline_ms"] == 1_700_000_060_250
        assert cv["reason"] is None
    else:
        assert cv["holder"] is None and cv["lease_deadline_ms"] is None
        assert cv["reason"] == change.reason.value


def test_done_is_stamped_with_its_own_time_by_default() -> None:
    _, value = encode_change("q", Done(BOOKMARK, DoneReason.EXPIRATION, 0, 0, 1234.5678))
    assert value is not None
    assert decode(CHANGELOG_VALUE, value)["at_ms"] == 1_234_568


def test_low_water_is_a_position_record() -> None:
    key, value = encode_change("q", LowWater(TopicPartition("t", 4), 1000), at_ms=1)
    ck, cv = decode_change(key, value)
    assert ck == ChangelogKey("q", "t", 4, POSITION_OFFSET) and ck.is_position
    assert ck.topic_partition == TopicPartition("t", 4)
    with pytest.raises(ValueError, match="position key"):
        _ = ck.bookmark
    assert cv is not None and cv["kind"] == ChangeKind.POSITION and cv["low_water"] == 1000


def test_forget_is_a_tombstone_on_the_message_key() -> None:
    key, value = encode_change("q", Forget(BOOKMARK))
    assert value is None
    leased_key, _ = encode_change("q", Leased(BOOKMARK, "s", 1.0, 1, 0))
    assert key == leased_key
    assert decode_change(key, None) == (ChangelogKey("q", *BOOKMARK), None)


def test_encode_change_refuses_what_is_not_a_change() -> None:
    with pytest.raises(SerializationError):
        encode_change("q", "not a change")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(
    queue=st.text(min_size=1, max_size=20),
    topic=st.text(min_size=1, max_size=20),
    partition=st.integers(0, 2**31 - 1),
    offset=st.integers(-1000, 2**63 - 1),
    count=st.integers(1, 2**40),
)
def test_fast_key_encoding_matches_fastavro(
    queue: str, topic: str, partition: int, offset: int, count: int
) -> None:
    # encode_key assembles keys from a cached prefix; it must equal fastavro's own encoding.
    if offset < 0:
        count = 1  # only a run of messages has a count
    schema = codec.default_codec().schema(CHANGELOG_KEY).current
    buf = io.BytesIO()
    buf.write(b"\x02")
    obj = {"queue": queue, "topic": topic, "partition": partition, "offset": offset}
    schemaless_writer(buf, schema, {**obj, "count": count})
    key = ChangelogKey(queue, topic, partition, offset, count)
    assert encode_key(key) == buf.getvalue()
    assert decode_key(buf.getvalue()) == key
    # format 1 (no count): the same key of one message
    v1 = codec.default_codec().versions(CHANGELOG_KEY)[1]
    buf = io.BytesIO()
    buf.write(b"\x01")
    schemaless_writer(buf, v1, obj)
    assert decode_key(buf.getvalue()) == ChangelogKey(queue, topic, partition, offset, 1)


def test_encode_key_refuses_runs_that_are_not_runs_of_messages() -> None:
    with pytest.raises(SerializationError):
        encode_key(ChangelogKey("q", "t", 0, -2, 3))  # a run at a marker's offset
    with pytest.raises(SerializationError):
        encode_key(ChangelogKey("q", "t", 0, 5, 0))  # a run of nothing


@pytest.mark.parametrize("name", SCHEMAS)
def test_encoding_errors_name_the_schema(name: str) -> None:
    with pytest.raises(SerializationError, match=name):
        encode(name, {"nonsense": object()})


@pytest.mark.parametrize("name", SCHEMAS)
@pytest.mark.parametrize(
    "data",
    [b"", b"\x09rest", b"\x01", b"\x01\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"],
    ids=["empty", "unknown-version", "truncated", "bad-varint"],
)
def test_malformed_bytes_raise_serialization_error(name: str, data: bytes) -> None:
    with pytest.raises(SerializationError, match=name):
        decode(name, data)


@pytest.mark.parametrize("name", SCHEMAS)
def test_trailing_bytes_are_malformed(name: str) -> None:
    with pytest.raises(SerializationError, match="trailing"):
        decode(name, encode(name, SAMPLES[name][0]) + b"\x00")


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(SCHEMAS), data=st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_serialization_error(name: str, data: bytes) -> None:
    with contextlib.suppress(SerializationError):
        decode(name, data)


def test_unknown_schema_is_a_serialization_error(tmp_path: Path) -> None:
    with pytest.raises(SerializationError, match="nope"):
        Codec(tmp_path).encode("nope", {})


# -- schema evolution ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEMAS)
def test_every_version_is_read_by_the_current_schema(name: str) -> None:
    """Data written with every version in avro/history (and the current one) reads as current."""
    c = codec.default_codec()
    current = c.version(name)
    versions = c.versions(name)
    assert current in versions and sorted(versions)[-1] == current
    for version in sorted(versions):
        for sample in SAMPLES[name]:
            data = c.encode_version(name, version, _fit(versions[version], sample))
            assert data[0] == version
            decoded = c.decode(name, data)
            written = _fit(versions[version], sample)
            for field, value in decoded.items():
                if field in written:  # the others read as their defaults
                    assert value == sample[field], (name, version, field)


def _fit(schema: Any, sample: dict[str, Any]) -> dict[str, Any]:
    """The sample restricted to the fields an older schema has."""
    return {f["name"]: sample[f["name"]] for f in schema["fields"] if f["name"] in sample}


def test_evolution_machinery_with_a_synthetic_history(tmp_path: Path) -> None:
    """A history file makes the current schema version 2 and v1 data still reads (with defaults)."""
    shutil.copy(codec.DEFAULT_SCHEMA_DIR / "stored_message.avsc", tmp_path / "stored_message.avsc")
    old = json.loads((tmp_path / "stored_message.avsc").read_text())
    old["fields"] = [f for f in old["fields"] if f["name"] not in ("priority", "error")]
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "stored_message.v1.avsc").write_text(json.dumps(old))

    c = Codec(tmp_path)
    assert c.version(STORED_MESSAGE) == 2
    v1 = c.encode_version(
        STORED_MESSAGE, 1, {"key": b"k", "value": b"v", "headers": [], "timestamp_ms": 3}
    )
    assert v1[0] == 1
    assert c.decode(STORED_MESSAGE, v1) == {
        "key": b"k",
        "value": b"v",
        "headers": [],
        "timestamp_ms": 3,
        "priority": None,
        "error": None,
    }
    v2 = c.encode(STORED_MESSAGE, SAMPLES[STORED_MESSAGE][0])
    assert v2[0] == 2 and c.decode(STORED_MESSAGE, v2) == SAMPLES[STORED_MESSAGE][0]
    with pytest.raises(SerializationError, match="no version 9"):
        c.encode_version(STORED_MESSAGE, 9, {})


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=40))
@pytest.mark.parametrize("version", [1, 2])
def test_key_decoding_agrees_with_fastavro_on_arbitrary_bytes(data: bytes, version: int) -> None:
    """The hand-written fast path of decode_key accepts exactly what fastavro accepts (and
    a key whose count is not that of a run of messages is an error either way)."""
    data = bytes((version,)) + data
    try:
        expected = codec.default_codec().decode(CHANGELOG_KEY, data)
        count = expected.pop("count")
        if count < 1 or (expected["offset"] < 0 and count != 1):
            raise SerializationError("not a key")
    except SerializationError:
        with pytest.raises(SerializationError):
            decode_key(data)
        return
    assert decode_key(data) == ChangelogKey(**expected, length=count)


def test_key_decoding_of_non_ascii_names() -> None:
    key = ChangelogKey("quéue-é", "tôpic-é", 2**31 - 1, 2**63 - 1)
    assert decode_key(encode_key(key)) == key
