"""The API's Avro frames: every frame type round-trips; garbage fails cleanly."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.api.frames import (
    ACK_WHERE_CODEC,
    ACK_WHERE_REPLY_CODEC,
    BROWSE_CODEC,
    BROWSE_REPLY_CODEC,
    CLIENT_FRAME_CODEC,
    FRAME_VERSION,
    LIST_QUEUES_CODEC,
    PUBLISH_CODEC,
    PUBLISHED_CODEC,
    QUEUE_LIST_CODEC,
    SERVER_FRAME_CODEC,
    STATS_CODEC,
    STATS_REPLY_CODEC,
    Ack,
    AckResult,
    AckWhere,
    AckWhereReply,
    Browse,
    BrowseReply,
    Close,
    Error,
    FrameCodec,
    ListQueues,
    Messages,
    Publish,
    Published,
    QueueList,
    Replace,
    Replaced,
    Stats,
    StatsReply,
    Subscribe,
    Subscribed,
)
from layer.api.service import AckFailure, DeliveredMessage, QueueInfo, QueueStats
from layer.engine.model import AckError, AckOp, Bookmark
from layer.exceptions import SerializationError

ALL_CODECS = [
    CLIENT_FRAME_CODEC,
    SERVER_FRAME_CODEC,
    PUBLISH_CODEC,
    PUBLISHED_CODEC,
    STATS_CODEC,
    STATS_REPLY_CODEC,
    LIST_QUEUES_CODEC,
    QUEUE_LIST_CODEC,
    BROWSE_CODEC,
    BROWSE_REPLY_CODEC,
    ACK_WHERE_CODEC,
    ACK_WHERE_REPLY_CODEC,
]

MESSAGE = DeliveredMessage(
    bookmark=Bookmark("orders", 3, 2**40),
    key=b"k",
    value=b'{"id": 1}',
    headers=[("trace", b"\x00\xff"), ("flag", None)],
    timestamp_ms=1_700_000_000_123,
    deliveries=2,
    cancels=1,
    lease_deadline_ms=1_700_000_060_000,
)

BARRIER = DeliveredMessage(
    bookmark=Bookmark("orders", 0, 5),
    key=None,
    value=b'{"eod": true}',
    headers=[],
    timestamp_ms=1_700_000_000_999,
    deliveries=1,
    cancels=0,
    lease_deadline_ms=None,
    barrier=True,
)

BROWSED = DeliveredMessage(Bookmark("orders", 1, 7), b"k", b"v", [("h", b"1")], 5, 3, 2, None)

FILTER = "/symbol = 'IBM' AND /qty > 100"

STATS = QueueStats(
    queue="orders",
    available=10,
    leased=2,
    inactive=0,
    subscriptions=1,
    oldest_available_age_s=1.5,
    delivered_total=100,
    acked_total=90,
    dead_lettered_total=3,
    extra={"lag": 4.0},
)

INFO = QueueInfo(
    name="orders",
    underlying_topic="orders-in",
    semantics="at-least-once",
    message_type="json",
    lease_period_s=60.0,
    max_per_subscription_backlog=100,
    dead_letter_topic="orders-dlq",
    default_publish_target=None,
)

CASES: list[tuple[FrameCodec[Any], object]] = [
    (CLIENT_FRAME_CODEC, Subscribe("orders", 10, "host:1")),
    (CLIENT_FRAME_CODEC, Subscribe("q", 1)),
    (CLIENT_FRAME_CODEC, Subscribe("orders", 5, "host:2", FILTER)),
    (CLIENT_FRAME_CODEC, Subscribe("orders", 5, filter="")),
    (CLIENT_FRAME_CODEC, Ack(7, AckOp.ACK, ["orders/0/1", "orders/0/2"])),
    (CLIENT_FRAME_CODEC, Ack(2**40, AckOp.EXTEND, ["orders/0/1"], 30.5)),
    (CLIENT_FRAME_CODEC, Ack(1, AckOp.CANCEL, [])),
    (CLIENT_FRAME_CODEC, Ack(1, AckOp.EXPIRE, ["x"])),
    (CLIENT_FRAME_CODEC, Ack(3, AckOp.CANCEL, ["orders/0/1"], 2.5)),  # a delayed cancel
    (CLIENT_FRAME_CODEC, Close()),
    (CLIENT_FRAME_CODEC, Replace(1, "orders", 10, FILTER)),
    (CLIENT_FRAME_CODEC, Replace(2**40, "other", 1)),
    (SERVER_FRAME_CODEC, Subscribed("sub-1", 10, 60.0)),
    (SERVER_FRAME_CODEC, Messages([MESSAGE])),
    (
        SERVER_FRAME_CODEC,
        Messages([DeliveredMessage(Bookmark("t", 0, 0), None, None, [], 0, 1, 0, None)]),
    ),
    (SERVER_FRAME_CODEC, Messages([])),
    (SERVER_FRAME_CODEC, Messages([MESSAGE, BARRIER])),
    (SERVER_FRAME_CODEC, AckResult(7, [])),
    (
        SERVER_FRAME_CODEC,
        AckResult(
            8,
            [
                AckFailure("t/0/1", AckError.UNKNOWN_BOOKMARK, "not in queue"),
                AckFailure("garbage", "malformed_bookmark", "not topic/partition/offset"),
            ],
        ),
    ),
    (SERVER_FRAME_CODEC, Error("malformed_frame", "truncated")),
    (SERVER_FRAME_CODEC, Error("invalid_expression", 'expression "/a =" : ... at column 5', 3)),
    (SERVER_FRAME_CODEC, Replaced(3, 10)),
    (SERVER_FRAME_CODEC, Replaced(2**40, 1)),
    (PUBLISH_CODEC, Publish("orders", b"data")),
    (PUBLISH_CODEC, Publish("orders", b"", b"key", [("a", b"1"), ("b", None)])),
    (PUBLISHED_CODEC, Published(Bookmark("orders-in", 2, 99))),
    (STATS_CODEC, Stats()),
    (STATS_CODEC, Stats("orders")),
    (STATS_REPLY_CODEC, StatsReply([STATS])),
    (STATS_REPLY_CODEC, StatsReply([])),
    (LIST_QUEUES_CODEC, ListQueues()),
    (QUEUE_LIST_CODEC, QueueList([INFO])),
    (BROWSE_CODEC, Browse("orders")),
    (BROWSE_CODEC, Browse("orders", FILTER, 100)),
    (BROWSE_CODEC, Browse("orders", None, 0)),
    (BROWSE_REPLY_CODEC, BrowseReply([BROWSED, BARRIER])),
    (BROWSE_REPLY_CODEC, BrowseReply([])),
    (ACK_WHERE_CODEC, AckWhere("orders", FILTER)),
    (ACK_WHERE_CODEC, AckWhere("orders", "/done", expire=True)),
    (ACK_WHERE_REPLY_CODEC, AckWhereReply(12, 3)),
    (ACK_WHERE_REPLY_CODEC, AckWhereReply(0, 2**40)),
]


@pytest.mark.parametrize(("codec", "frame"), CASES, ids=lambda v: type(v).__name__)
def test_round_trip(codec: FrameCodec[Any], frame: object) -> None:
    data = codec.encode(frame)
    assert data[0] == FRAME_VERSION
    assert codec.decode(data) == frame


def test_every_frame_type_is_covered() -> None:
    covered = {type(frame) for _, frame in CASES}
    expected = {Subscribe, Ack, Close, Replace, Subscribed, Messages, AckResult, Error, Replaced}
    expected |= {Publish, Published, Stats, StatsReply, ListQueues, QueueList}
    expected |= {Browse, BrowseReply, AckWhere, AckWhereReply}
    assert covered == expected
    assert {codec for codec, _ in CASES} == set(ALL_CODECS)


def test_ack_error_decodes_to_the_enum_when_known() -> None:
    frame = AckResult(1, [AckFailure("t/0/1", AckError.NOT_LEASE_HOLDER, "held elsewhere")])
    decoded = SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(frame))
    assert isinstance(decoded, AckResult)
    assert decoded.failures[0].error is AckError.NOT_LEASE_HOLDER


def test_barrier_flag_survives_and_defaults_to_false() -> None:
    decoded = SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(Messages([MESSAGE, BARRIER])))
    assert isinstance(decoded, Messages)
    assert [m.barrier for m in decoded.messages] == [False, True]


def test_browse_reply_and_messages_share_the_message_record() -> None:
    # Message is one named type (avro/api_message.avsc), so both frames carry the same bytes.
    messages = [MESSAGE, BARRIER, BROWSED]
    stream = SERVER_FRAME_CODEC.encode(Messages(messages))
    browse = BROWSE_REPLY_CODEC.encode(BrowseReply(messages))
    assert stream[2:] == browse[1:]  # after the version byte (and the stream's union index)


V = bytes([FRAME_VERSION])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "empty"),
        (bytes([FRAME_VERSION + 1]) + b"\x04", f"version {FRAME_VERSION + 1}"),
        (b"\x02\x04", "version 2 (this build speaks 3)"),  # an older peer: refused, not misread
        (V, "EOFError"),
        (V + b"\x08", "IndexError"),  # union branch 4 of 0-3
        (V + b"\x04\x00", "trailing bytes"),  # Close, then junk
        (V + b"\x00\x04\xff\xfe\x02\x00\x00", "UnicodeDecodeError"),  # Subscribe, bad UTF-8
        (V + b"\x02\x02\x08", "IndexError"),  # Ack with enum symbol 4 of 0-3
        (V + b"\x00\x02q\x02\x00\x04", "IndexError"),  # Subscribe, filter union branch 2
        (V + b"\x06\x02\x02q\x02\x02\x0a/a", "EOFError"),  # Replace, filter cut short
    ],
)
def test_malformed_client_frames_name_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(SerializationError, match="malformed client_frame frame") as info:
        CLIENT_FRAME_CODEC.decode(data)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("codec", "data", "reason"),
    [
        (SERVER_FRAME_CODEC, V + b"\x0a", "IndexError"),  # union branch 5 of 0-4
        (SERVER_FRAME_CODEC, V + b"\x08\x02", "EOFError"),  # Replaced without its backlog
        (SERVER_FRAME_CODEC, V + b"\x06\x00\x00\x04", "IndexError"),  # Error, request_id branch
        (BROWSE_CODEC, V + b"\x02q\x00\x04", "IndexError"),  # limit union branch 2
        (BROWSE_CODEC, V + b"\x02q\x00\x00\x00", "trailing bytes"),
        (BROWSE_REPLY_CODEC, V + b"\x02", "EOFError"),  # one message announced, none there
        (ACK_WHERE_CODEC, V + b"\x02q", "EOFError"),  # no filter
        (ACK_WHERE_CODEC, V + b"\x02q\x02\xff\x00", "UnicodeDecodeError"),
        (ACK_WHERE_REPLY_CODEC, V + b"\x02", "EOFError"),  # no skipped count
        (ACK_WHERE_REPLY_CODEC, b"\x01\x02\x04", "version 1"),
    ],
    ids=lambda v: v.name if isinstance(v, FrameCodec) else None,
)
def test_malformed_new_frames_name_the_problem(
    codec: FrameCodec[Any], data: bytes, reason: str
) -> None:
    with pytest.raises(SerializationError, match=f"malformed {codec.name} frame") as info:
        codec.decode(data)
    assert reason in str(info.value)


def test_truncated_frames_fail_cleanly() -> None:
    for codec, frame in CASES:
        data = codec.encode(frame)
        for cut in range(len(data)):
            try:
                codec.decode(data[:cut])
            except SerializationError:
                continue
            # A prefix may itself be a valid (shorter) frame, e.g. an array cut at a block end;
            # then it must at least re-encode to exactly those bytes.
            assert codec.encode(codec.decode(data[:cut])) == data[:cut]


def test_encoding_a_bad_frame_raises_serialization_error() -> None:
    with pytest.raises(SerializationError, match="cannot encode"):
        PUBLISH_CODEC.encode(Publish("q", "text"))  # type: ignore[arg-type]  # str, not bytes
    with pytest.raises(SerializationError, match="cannot encode"):
        CLIENT_FRAME_CODEC.encode(Subscribed("s", 1, 1.0))  # type: ignore[arg-type]


@given(data=st.binary(max_size=200), codec=st.sampled_from(ALL_CODECS))
def test_arbitrary_bytes_decode_or_raise_serialization_error(
    data: bytes, codec: FrameCodec[Any]
) -> None:
    with contextlib.suppress(SerializationError):
        codec.decode(data)


@given(
    case=st.sampled_from(CASES),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
)
def test_corrupted_frames_decode_or_raise_serialization_error(
    case: tuple[FrameCodec[Any], object], flips: list[tuple[int, int]]
) -> None:
    codec, frame = case
    data = bytearray(codec.encode(frame))
    for position, value in flips:
        data[position % len(data)] = value
    with contextlib.suppress(SerializationError):
        codec.decode(bytes(data))


_opt_bytes = st.none() | st.binary(max_size=30)
_delivered = st.builds(
    DeliveredMessage,
    bookmark=st.builds(
        Bookmark,
        st.text(min_size=1, max_size=12),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**63 - 1),
    ),
    key=_opt_bytes,
    value=_opt_bytes,
    headers=st.lists(st.tuples(st.text(max_size=8), _opt_bytes), max_size=3),
    timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    deliveries=st.integers(0, 2**31 - 1),
    cancels=st.integers(0, 2**31 - 1),
    lease_deadline_ms=st.none() | st.integers(-(2**63), 2**63 - 1),
    barrier=st.booleans(),
    queue=st.text(max_size=12),
)


@given(st.lists(_delivered, max_size=4))
def test_the_hand_written_messages_frame_is_fastavros_bytes(messages: list[Any]) -> None:
    frame = Messages(messages)
    fast = SERVER_FRAME_CODEC.encode(frame)
    assert fast == FrameCodec.encode(SERVER_FRAME_CODEC, frame)  # the generic fastavro path
    assert SERVER_FRAME_CODEC.decode(fast) == frame
