"""The hand-written hot-path encoders write exactly what fastavro writes for the same schemas."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from layer import avro_fast
from layer.codec import CHANGELOG_VALUE, STORED_MESSAGE, decode, default_codec, encode

longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)
opt_str = st.none() | st.text(max_size=20)
opt_bytes = st.none() | st.binary(max_size=40)


def test_versions_match_the_schemas() -> None:
    assert default_codec().version(CHANGELOG_VALUE) == avro_fast.CHANGELOG_VALUE_VERSION
    assert default_codec().version(STORED_MESSAGE) == avro_fast.STORED_MESSAGE_VERSION


@given(
    st.sampled_from(["LEASED", "RETURNED", "DONE", "POSITION"]),
    ints,
    ints,
    opt_str,
    st.none() | longs,
    opt_str,
    longs,
    st.none() | longs,
)
def test_changelog_value_matches_fastavro(
    kind, deliveries, cancels, holder, deadline, reason, at, low
) -> None:
    record = {
        "kind": kind,
        "deliveries": deliveries,
        "cancels": cancels,
        "holder": holder,
        "lease_deadline_ms": deadline,
        "reason": reason,
        "at_ms": at,
        "low_water": low,
    }
    fast = avro_fast.changelog_value(kind, deliveries, cancels, holder, deadline, reason, at, low)
    assert fast == encode(CHANGELOG_VALUE, record)


@given(
    opt_bytes,
    opt_bytes,
    st.lists(st.tuples(st.text(max_size=10), opt_bytes), max_size=5),
    longs,
    st.none() | longs,
    opt_str,
)
def test_stored_message_round_trips_like_fastavro(key, value, headers, ts, priority, error) -> None:
    fast = avro_fast.stored_message(key, value, tuple(headers), ts, priority, error)
    record = {
        "key": key,
        "value": value,
        "headers": [{"key": k, "value": v} for k, v in headers],
        "timestamp_ms": ts,
        "priority": priority,
        "error": error,
    }
    assert fast == encode(STORED_MESSAGE, record)
    assert avro_fast.read_stored_message(fast) == (key, value, tuple(headers), ts, priority, error)
    assert decode(STORED_MESSAGE, fast) == record


@given(st.binary(max_size=60))
def test_garbage_is_a_serialization_error(data: bytes) -> None:
    from layer.exceptions import SerializationError

    with contextlib.suppress(SerializationError):
        avro_fast.read_stored_message(b"\x01" + data)


@given(
    opt_bytes,
    opt_bytes,
    st.lists(st.tuples(st.text(max_size=10), opt_bytes), max_size=5),
    longs,
    st.none() | longs,
    opt_str,
)
def test_stored_meta_reads_timestamp_and_priority(key, value, headers, ts, priority, error) -> None:
    data = avro_fast.stored_message(key, value, tuple(headers), ts, priority, error)
    assert avro_fast.read_stored_meta(data) == (ts, priority)


@given(st.none() | st.binary(max_size=9000), st.none() | st.binary(max_size=9000), longs)
def test_stored_plain_is_stored_message_without_the_rest(key, value, ts) -> None:
    plain = avro_fast.stored_plain(key, value, ts)
    assert plain == avro_fast.stored_message(key, value, (), ts, None, None)


@given(st.none() | st.binary(max_size=9000), st.binary(max_size=9000), longs)
def test_plain_head_and_tail_around_the_value_are_stored_plain(key, value, ts) -> None:
    parts = avro_fast.plain_head(key, len(value)) + value + avro_fast.plain_tail(ts)
    assert parts == avro_fast.stored_plain(key, value, ts)


plain_messages = st.tuples(
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=300),
    st.sampled_from([0, 1, 1_764_000_000_000, 1_764_000_000_001]),
)


@given(st.lists(plain_messages, max_size=30))
def test_plain_records_of_a_read_are_stored_plain(messages) -> None:
    # one encoder across the read, as the live round and the backlog use it: the heads and
    # the tail it keeps never leak from one message into the next
    encode = avro_fast.PlainRecords().encode
    for key, value, ts in messages:
        assert encode(key, value, ts) == avro_fast.stored_plain(key, value, ts)


def test_long_matches_the_varint_for_every_small_length() -> None:
    assert all(avro_fast.long(n) == avro_fast._varint(n) for n in range(-300, 20_000))


@given(st.binary(max_size=9000), longs)
def test_a_plain_record_is_read_in_one_pass_as_field_by_field(value, ts) -> None:
    data = avro_fast.plain_head(None, len(value)) + value + avro_fast.plain_tail(ts)
    assert avro_fast._read_plain(data) == (value, ts)
    assert avro_fast.read_stored_message(data) == (None, value, (), ts, None, None)
    record = decode(STORED_MESSAGE, data)
    assert (record["value"], record["timestamp_ms"]) == (value, ts)


@given(st.binary(max_size=60))
def test_the_one_pass_read_takes_only_what_is_a_plain_record(data: bytes) -> None:
    from layer.exceptions import SerializationError

    data = b"\x01" + data
    plain = avro_fast._read_plain(data)
    if plain is None:
        return
    r = avro_fast._Reader(data, 1)
    assert not r.branch() and r.branch()  # no key, a value
    assert r.raw() == plain[0]
    assert r.long() == 0  # no headers
    assert r.long() == plain[1]
    assert not r.branch() and not r.branch() and r.pos == len(data)
    with contextlib.suppress(SerializationError):
        avro_fast.read_stored_message(data)


def test_the_one_pass_read_leaves_other_records_to_the_reader() -> None:
    for args in [
        (b"k", b"v", (), 5, None, None),
        (None, b"v", (("h", b"x"),), 5, None, None),
        (None, b"v", (), 5, 3, None),
        (None, b"v", (), 5, None, "bad"),
        (None, None, (), 5, None, None),
    ]:
        data = avro_fast.stored_message(*args)
        assert avro_fast._read_plain(data) is None
        assert avro_fast.read_stored_message(data) == args
