"""The API's protobuf frames: every frame type round-trips, acks travel as offset runs, garbage
fails cleanly with what was wrong, unknown fields are skipped."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.api.deliveries import DeliveryBatch
from layer.api.errors import ErrorCode
from layer.api.frames import (
    ACK_WHERE_CODEC,
    ACK_WHERE_REPLY_CODEC,
    BROWSE_CODEC,
    BROWSE_REPLY_CODEC,
    CLIENT_FRAME_CODEC,
    CLUSTER_CODEC,
    CLUSTER_REPLY_CODEC,
    LIST_QUEUES_CODEC,
    MAX_ACK_OFFSETS,
    PUBLISH_CODEC,
    PUBLISHED_CODEC,
    QUEUE_LIST_CODEC,
    REDRIVE_CODEC,
    REDRIVE_REPLY_CODEC,
    RELOAD_CODEC,
    RELOAD_REPLY_CODEC,
    REPLAY_CODEC,
    REPLAY_REPLY_CODEC,
    SERVER_FRAME_CODEC,
    STATS_CODEC,
    STATS_REPLY_CODEC,
    Ack,
    AckResult,
    AckWhere,
    AckWhereReply,
    Batch,
    Browse,
    BrowseReply,
    Check,
    Checked,
    Close,
    ClusterRequest,
    Error,
    FrameCodec,
    ListQueues,
    Messages,
    OffsetRuns,
    Publish,
    Published,
    QueueList,
    Redrive,
    RedriveReply,
    Reload,
    ReloadReply,
    Replace,
    Replaced,
    Replay,
    ReplayReply,
    Stats,
    StatsReply,
    Subscribe,
    Subscribed,
)
from layer.api.proto.qlayer.v1 import queue_pb2 as pb
from layer.api.service import (
    AckFailure,
    ClusterInfo,
    ClusterMember,
    DeliveredMessage,
    QueueInfo,
    QueueOwner,
    QueueStats,
    ReloadChange,
    ReloadRefusal,
    ReloadResult,
)
from layer.engine.model import AckError, AckOp, Bookmark
from layer.exceptions import SerializationError

ALL_CODECS = [
    CLUSTER_CODEC,
    CLUSTER_REPLY_CODEC,
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
    REDRIVE_CODEC,
    REDRIVE_REPLY_CODEC,
    RELOAD_CODEC,
    RELOAD_REPLY_CODEC,
    REPLAY_CODEC,
    REPLAY_REPLY_CODEC,
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
UNPARSED = DeliveredMessage(
    Bookmark("orders", 0, 8), None, b"{x", [], 6, 0, 0, None, False, "orders", "unparseable json: x"
)

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
    (CLIENT_FRAME_CODEC, Subscribe("orders", 5, filter="")),  # an empty filter is not None
    (CLIENT_FRAME_CODEC, Subscribe("orders", 5, batch_frames=True)),
    (CLIENT_FRAME_CODEC, Subscribe("orders", 5, message_columns=True)),
    (CLIENT_FRAME_CODEC, Ack(7, AckOp.ACK, [OffsetRuns("orders", 0, [1, 2])])),
    (CLIENT_FRAME_CODEC, Ack(2**40, AckOp.EXTEND, [OffsetRuns("orders", 0, [1, 1])], 30.5)),
    (CLIENT_FRAME_CODEC, Ack(1, AckOp.CANCEL, [])),
    (
        CLIENT_FRAME_CODEC,
        Ack(1, AckOp.EXPIRE, [OffsetRuns("a", 3, [0, 9, 2**40, 2**40]), OffsetRuns("b", 0, [])]),
    ),
    (CLIENT_FRAME_CODEC, Ack(3, AckOp.CANCEL, [OffsetRuns("orders", 0, [1, 1])], 2.5)),
    (CLIENT_FRAME_CODEC, Close()),
    (CLIENT_FRAME_CODEC, Replace(1, "orders", 10, FILTER)),
    (CLIENT_FRAME_CODEC, Replace(2**40, "other", 1)),
    (CLIENT_FRAME_CODEC, Check(4, 12345.678)),
    (SERVER_FRAME_CODEC, Checked(4, True, 12346.0, 1_700_000_000_123)),
    (SERVER_FRAME_CODEC, Subscribed("sub-2", 10, 60.0, 812.5, 0.5)),
    (SERVER_FRAME_CODEC, Messages([MESSAGE], columns=True, made_at=812.75)),
    (SERVER_FRAME_CODEC, Batch([Checked(4, False, 813.0), Messages([MESSAGE], True, 812.9)])),
    (SERVER_FRAME_CODEC, Subscribed("sub-1", 10, 60.0)),
    (SERVER_FRAME_CODEC, Messages([MESSAGE])),
    (
        SERVER_FRAME_CODEC,
        Messages([DeliveredMessage(Bookmark("t", 0, 0), None, None, [], 0, 1, 0, None)]),
    ),
    (
        SERVER_FRAME_CODEC,  # empty key and value are not null ones
        Messages([DeliveredMessage(Bookmark("t", 0, 0), b"", b"", [("h", b"")], 0, 1, 0, 0)]),
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
    (SERVER_FRAME_CODEC, Error("unknown_queue", "no such queue", 0)),  # request id 0 is not None
    (SERVER_FRAME_CODEC, Replaced(3, 10)),
    (SERVER_FRAME_CODEC, Replaced(2**40, 1)),
    (
        SERVER_FRAME_CODEC,
        Batch(
            [AckResult(7, []), Replaced(3, 10), Error("malformed_frame", "x"), Messages([MESSAGE])]
        ),
    ),
    (SERVER_FRAME_CODEC, Batch([Messages([])])),
    (SERVER_FRAME_CODEC, Messages([MESSAGE, BARRIER], columns=True)),
    (SERVER_FRAME_CODEC, Messages([], columns=True)),
    (
        SERVER_FRAME_CODEC,  # every optional unset, then set to its empty or zero value
        Messages(
            [
                DeliveredMessage(Bookmark("t", 0, 0), None, None, [], 0, 1, 0, None),
                DeliveredMessage(
                    Bookmark("u", 1, 1), b"", b"", [("h", b"")], 0, 0, 0, 0, False, "q", ""
                ),
                MESSAGE,
                DeliveredMessage(
                    Bookmark("t", 0, 2), None, b"x", [("a", None), ("b", b"1")], 5, 1, 0, 7
                ),
            ],
            columns=True,
        ),
    ),
    (SERVER_FRAME_CODEC, Batch([AckResult(1, []), Messages([MESSAGE], columns=True)])),
    (SERVER_FRAME_CODEC, Batch([])),
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
    (REDRIVE_CODEC, Redrive("orders")),
    (REDRIVE_CODEC, Redrive("orders", FILTER, 0)),
    (REDRIVE_REPLY_CODEC, RedriveReply(3, 2, 1)),
    (REPLAY_CODEC, Replay("orders")),
    (REPLAY_CODEC, Replay("orders", ("orders/0/5", "orders/1/9"), None, 1_700_000_000_000)),
    (REPLAY_CODEC, Replay("orders", (), 1_700_000_000_000, None, True, FILTER)),
    (REPLAY_REPLY_CODEC, ReplayReply([BROWSED, UNPARSED])),
    (REPLAY_REPLY_CODEC, ReplayReply([])),
    (RELOAD_CODEC, Reload()),
    (CLUSTER_CODEC, ClusterRequest()),
    (
        CLUSTER_REPLY_CODEC,
        ClusterInfo(
            "prod",
            "a",
            [ClusterMember("a", "10.0.0.1:7070", [0, 2]), ClusterMember("b", "10.0.0.2:7070")],
            [QueueOwner("orders", 2, "a", "10.0.0.1:7070"), QueueOwner("moving", 5)],
        ),
    ),
    (RELOAD_REPLY_CODEC, ReloadReply(ReloadResult("a.toml", True))),
    (
        RELOAD_REPLY_CODEC,
        ReloadReply(
            ReloadResult(
                "b.toml",
                False,
                ["new"],
                ["old"],
                [ReloadChange("q", "lease_period", '"1s"', '"2s"')],
                [ReloadRefusal("[coordinator]", "listen", '"a"', '"b"', "needs a restart")],
            )
        ),
    ),
]


@pytest.mark.parametrize(("codec", "frame"), CASES, ids=lambda v: type(v).__name__)
def test_round_trip(codec: FrameCodec[Any], frame: object) -> None:
    assert codec.decode(codec.encode(frame)) == frame


def test_every_frame_type_is_covered() -> None:
    covered = {type(frame) for _, frame in CASES}
    expected = {Subscribe, Ack, Close, Replace, Subscribed, Messages, AckResult, Error, Replaced}
    expected |= {Batch, Check, Checked}
    expected |= {Publish, Published, Stats, StatsReply, ListQueues, QueueList}
    expected |= {Browse, BrowseReply, AckWhere, AckWhereReply, Redrive, RedriveReply}
    expected |= {Reload, ReloadReply, Replay, ReplayReply, ClusterRequest, ClusterInfo}
    assert covered == expected
    assert {codec for codec, _ in CASES} == set(ALL_CODECS)


def test_ack_error_decodes_to_the_wire_code() -> None:
    frame = AckResult(1, [AckFailure("t/0/1", ErrorCode.NOT_LEASE_HOLDER, "held elsewhere")])
    decoded = SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(frame))
    assert isinstance(decoded, AckResult)
    assert decoded.failures[0].error is ErrorCode.NOT_LEASE_HOLDER
    # every refusal the engine can make has a wire code of the same name
    assert {ErrorCode(e) for e in AckError} <= set(ErrorCode)
    # a code this build does not know (a newer server) reads as internal
    unknown = pb.ServerFrame(error=pb.Error(code="brand_new", message="m")).SerializeToString()
    assert SERVER_FRAME_CODEC.decode(unknown) == Error(ErrorCode.INTERNAL, "m")


def test_barrier_flag_survives_and_defaults_to_false() -> None:
    decoded = SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(Messages([MESSAGE, BARRIER])))
    assert isinstance(decoded, Messages)
    assert [m.barrier for m in decoded.messages] == [False, True]


def test_browse_reply_and_messages_share_the_message_record() -> None:
    # Both are `repeated Message messages = 1`: the stream's frame is the reply's bytes wrapped
    # in ServerFrame.messages (tag 0x12, then the length).
    messages = [MESSAGE, BARRIER, BROWSED]
    stream = SERVER_FRAME_CODEC.encode(Messages(messages))
    browse = BROWSE_REPLY_CODEC.encode(BrowseReply(messages))
    assert stream[0] == 0x12 and stream.endswith(browse)


# --- acks as offset runs ----------------------------------------------------------------------


def test_an_ack_of_consecutive_offsets_is_a_few_bytes_per_partition() -> None:
    bookmarks = [Bookmark("orders", p, 10**9 + i) for i in range(500) for p in (0, 1)]
    frame = Ack.of(42, AckOp.ACK, bookmarks)
    assert frame.offsets == [
        OffsetRuns("orders", 0, [10**9, 10**9 + 499]),
        OffsetRuns("orders", 1, [10**9, 10**9 + 499]),
    ]
    data = CLIENT_FRAME_CODEC.encode(frame)
    assert len(data) < 60, len(data)  # 1,000 acks; the old wire took ~20 bytes each
    decoded = CLIENT_FRAME_CODEC.decode(data)
    assert isinstance(decoded, Ack) and decoded.count() == 1000
    assert sorted(decoded.bookmarks) == sorted(map(str, bookmarks))


def test_ack_of_groups_sorts_and_joins_runs() -> None:
    marks = [Bookmark("t", 0, o) for o in (11, 7, 9, 10, 7, 3)] + [Bookmark("u", 2, 5)]
    frame = Ack.of(1, AckOp.CANCEL, marks, 2.5)
    assert frame.offsets == [OffsetRuns("t", 0, [3, 3, 7, 7, 9, 11]), OffsetRuns("u", 2, [5, 5])]
    assert frame.bookmarks == ["t/0/3", "t/0/7", "t/0/9", "t/0/10", "t/0/11", "u/2/5"]
    assert (frame.op, frame.seconds) == (AckOp.CANCEL, 2.5)


_topics = st.sampled_from(["a", "b", "orders.v1"])


@given(st.lists(st.builds(Bookmark, _topics, st.integers(0, 3), st.integers(0, 60)), max_size=80))
def test_ack_of_names_each_bookmark_once_in_ascending_disjoint_runs(marks: list[Any]) -> None:
    frame = Ack.of(5, AckOp.ACK, marks)
    assert sorted(frame.bookmarks) == sorted({str(b) for b in marks})
    for runs in frame.offsets:
        r = runs.runs
        assert all(r[i] <= r[i + 1] for i in range(len(r) - 1))  # ascending, first <= last
        assert all(r[i + 1] > r[i] + 1 for i in range(1, len(r) - 1, 2))  # runs do not touch
    assert CLIENT_FRAME_CODEC.decode(CLIENT_FRAME_CODEC.encode(frame)) == frame


def _ack(op: int = pb.ACK_OP_ACK, *offsets: Any) -> bytes:
    return pb.ClientFrame(ack=pb.Ack(request_id=1, op=op, offsets=offsets)).SerializeToString()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (_ack(pb.ACK_OP_UNSPECIFIED), "Ack op 0 is not one of"),
        (_ack(99), "Ack op 99 is not one of"),  # an enum value this build does not know
        (_ack(1, pb.OffsetRuns(topic="t", partition=0, runs=[5, 4])), "run 5..4 ends before"),
        (_ack(1, pb.OffsetRuns(topic="t", partition=0, runs=[1, 2, 3])), "3 runs values"),
        (_ack(1, pb.OffsetRuns(topic="t", partition=0, runs=[-1, 2])), "negative offset -1"),
        (_ack(1, pb.OffsetRuns(topic="t", partition=-1, runs=[1, 2])), "negative partition"),
        (_ack(1, pb.OffsetRuns(topic="", partition=0, runs=[1, 2])), "empty topic"),
        (
            _ack(1, pb.OffsetRuns(topic="t", partition=0, runs=[0, 2**62])),
            f"more than {MAX_ACK_OFFSETS:,} offsets",
        ),
        (
            _ack(
                1,
                pb.OffsetRuns(topic="t", partition=0, runs=[0, MAX_ACK_OFFSETS - 1]),
                pb.OffsetRuns(topic="t", partition=1, runs=[0, 0]),
            ),
            f"more than {MAX_ACK_OFFSETS:,} offsets",
        ),
    ],
)
def test_invalid_acks_are_refused_whole_naming_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(SerializationError, match="malformed ClientFrame frame") as info:
        CLIENT_FRAME_CODEC.decode(data)
    assert reason in str(info.value)


def test_an_ack_of_exactly_the_most_offsets_is_taken() -> None:
    data = _ack(1, pb.OffsetRuns(topic="t", partition=0, runs=[0, MAX_ACK_OFFSETS - 1]))
    decoded = CLIENT_FRAME_CODEC.decode(data)
    assert isinstance(decoded, Ack) and decoded.count() == MAX_ACK_OFFSETS


# --- malformed and unknown --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "without a body"),
        (b"\x01\xff\xff", "not a valid ClientFrame message"),  # field number 0
        (b"garbage", "not a valid ClientFrame message"),
        (b"\x0a\x05\x0a\x03q", "not a valid ClientFrame message"),  # Subscribe, cut short
        (b"\x0a\x04\x0a\x02\xff\xfe", "not a valid ClientFrame message"),  # bad UTF-8
        (b"\x0a", "not a valid ClientFrame message"),  # a tag without its value
        (b"\x12\x02\x10", "not a valid ClientFrame message"),  # Ack, op cut short
    ],
)
def test_malformed_client_frames_name_the_problem(data: bytes, reason: str) -> None:
    with pytest.raises(SerializationError, match="malformed ClientFrame frame") as info:
        CLIENT_FRAME_CODEC.decode(data)
    assert reason in str(info.value)


@pytest.mark.parametrize(
    ("codec", "data", "reason"),
    [
        (SERVER_FRAME_CODEC, b"", "without a body this client knows"),
        (SERVER_FRAME_CODEC, b"\x42\x00", "without a body this client knows"),  # field 8: newer
        # a Batch holding a Subscribed (field 1 of the inner frame), or another Batch
        (SERVER_FRAME_CODEC, b"\x32\x04\x0a\x02\x0a\x00", "a Batch frame holds a Subscribed"),
        (SERVER_FRAME_CODEC, b"\x32\x04\x0a\x02\x32\x00", "a Batch frame holds a Batch"),
        (SERVER_FRAME_CODEC, b"\x12\x03\x0a\x05", "not a valid ServerFrame"),
        (BROWSE_CODEC, b"\x0a\x01", "not a valid BrowseRequest"),
        (ACK_WHERE_CODEC, b"\x12\x01\xff", "not a valid AckWhereRequest"),  # filter, bad UTF-8
        (ACK_WHERE_REPLY_CODEC, b"\x08", "not a valid AckWhereReply"),
    ],
    ids=lambda v: v.name if isinstance(v, FrameCodec) else None,
)
def test_malformed_frames_name_the_problem(
    codec: FrameCodec[Any], data: bytes, reason: str
) -> None:
    with pytest.raises(SerializationError, match=f"malformed {codec.name} frame") as info:
        codec.decode(data)
    assert reason in str(info.value)


def test_unknown_fields_are_skipped() -> None:
    # A newer peer's fields (here 15: a varint, 16: bytes) are ignored, wherever they are.
    extra = b"\x78\x01" + b"\x82\x01\x03new"
    subscribe = Subscribe("orders", 5, "me", FILTER)
    data = CLIENT_FRAME_CODEC.encode(subscribe)
    assert CLIENT_FRAME_CODEC.decode(data + extra) == subscribe
    inner = pb.Subscribe.FromString(pb.ClientFrame.FromString(data).subscribe.SerializeToString())
    nested = pb.ClientFrame(subscribe=inner).SerializeToString()[:2]  # tag, length
    body = inner.SerializeToString() + extra
    assert CLIENT_FRAME_CODEC.decode(nested[:1] + bytes([len(body)]) + body) == subscribe
    messages = SERVER_FRAME_CODEC.encode(Messages([MESSAGE]))
    assert SERVER_FRAME_CODEC.decode(messages + extra) == Messages([MESSAGE])


def test_truncated_frames_fail_cleanly() -> None:
    for codec, frame in CASES:
        data = codec.encode(frame)
        for cut in range(len(data)):
            try:
                codec.decode(data[:cut])
            except SerializationError:
                continue
            # A prefix cut at a field boundary is itself a valid (smaller) frame; then it must
            # at least re-encode to exactly those bytes.
            assert codec.encode(codec.decode(data[:cut])) == data[:cut]


def test_encoding_a_bad_frame_raises_serialization_error() -> None:
    with pytest.raises(SerializationError, match="cannot encode"):
        PUBLISH_CODEC.encode(Publish("q", "text"))  # type: ignore[arg-type]  # str, not bytes
    with pytest.raises(SerializationError, match="cannot encode"):
        CLIENT_FRAME_CODEC.encode(Subscribed("s", 1, 1.0))  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="cannot encode"):
        CLIENT_FRAME_CODEC.encode(Subscribe("q", 2**31))  # max_backlog is an int32


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
    if not data:
        return
    for position, value in flips:
        data[position % len(data)] = value
    with contextlib.suppress(SerializationError):
        codec.decode(bytes(data))


_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)  # UTF-8 encodable
_opt_bytes = st.none() | st.binary(max_size=30)
_delivered = st.builds(
    DeliveredMessage,
    bookmark=st.builds(
        Bookmark,
        _text.filter(bool),
        st.integers(0, 2**31 - 1),
        st.integers(0, 2**63 - 1),
    ),
    key=_opt_bytes,
    value=_opt_bytes,
    headers=st.lists(st.tuples(_text, _opt_bytes), max_size=3),
    timestamp_ms=st.integers(-(2**63), 2**63 - 1),
    deliveries=st.integers(0, 2**31 - 1),
    cancels=st.integers(0, 2**31 - 1),
    lease_deadline_ms=st.none() | st.integers(-(2**63), 2**63 - 1),
    barrier=st.booleans(),
    queue=_text,
)


@given(st.lists(_delivered, max_size=4))
def test_messages_frames_round_trip(messages: list[Any]) -> None:
    frame = Messages(messages)
    assert SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(frame)) == frame


# what a plain batch holds: no key, headers or parse error, a value and a lease deadline (the
# codec's fast path when all are alike), with an odd one among them now and then
_plain = st.builds(
    DeliveredMessage,
    bookmark=st.builds(
        Bookmark, st.sampled_from(["t", "u"]), st.integers(0, 3), st.integers(0, 99)
    ),
    key=st.none(),
    value=st.binary(max_size=8),
    headers=st.just([]),
    timestamp_ms=st.integers(0, 2**41),
    deliveries=st.integers(1, 5),
    cancels=st.integers(0, 2),
    lease_deadline_ms=st.integers(0, 2**41),
    barrier=st.just(False),
    queue=st.sampled_from(["q", "r"]),
)


@given(st.lists(_plain, max_size=8) | st.lists(_plain | _delivered, max_size=6))
def test_message_columns_round_trip(messages: list[Any]) -> None:
    frame = Messages(messages, columns=True, made_at=1.5)
    decoded = SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(frame))
    assert decoded == frame
    assert all(type(m.bookmark) is Bookmark for m in decoded.messages)


def test_message_columns_are_checked_against_their_flags() -> None:
    def frame(**columns: Any) -> bytes:
        return pb.ServerFrame(
            messages=pb.Messages(columns=pb.MessageColumns(**columns))
        ).SerializeToString()

    one = {
        "topic": ["t"], "partition": [0], "offset": [1], "key": [b""], "value": [b"v"],
        "timestamp_ms": [0], "deliveries": [1], "cancels": [0], "lease_deadline_ms": [0],
        "queue": ["q"], "flags": [2],
    }  # fmt: skip
    decoded = SERVER_FRAME_CODEC.decode(frame(**one))
    assert decoded == Messages(
        [DeliveredMessage(Bookmark("t", 0, 1), None, b"v", [], 0, 1, 0, None, False, "q")],
        columns=True,
    )
    for broken, reason in [
        ({**one, "offset": [1, 2]}, "flags has 1 entries, offset 2"),
        ({**one, "value": [b"v", b"w"]}, "value has 2 entries"),
        ({**one, "key": [b"", b""]}, "key has 2 entries"),
        ({**one, "queue": []}, "queue has 0 entries"),  # empty, and no common_queue
        ({**one, "flags": [], "common_topic": "t"}, "flags has 0 entries"),
        ({**one, "key": [], "flags": [3]}, "key is empty, the flags say some have one"),
        ({**one, "flags": [2 + 16]}, "parse_error does not match"),
        ({**one, "parse_error": ["x"]}, "parse_error does not match"),
        ({**one, "flags": [2 + 32]}, "header_count or headers do not match"),
        (
            {**one, "flags": [2 + 32], "header_count": [2], "headers": [pb.Header(key="a")]},
            "headers",
        ),
    ]:
        with pytest.raises(SerializationError, match="malformed ServerFrame frame") as info:
            SERVER_FRAME_CODEC.decode(frame(**broken))
        assert reason in str(info.value)


def _batch_of(messages: list[Any]) -> DeliveryBatch:
    """``messages`` (of one queue) as the round's DeliveryBatch that would hand them out."""
    deadlines = [m.lease_deadline_ms for m in messages]
    common = deadlines[0] if deadlines and deadlines.count(deadlines[0]) == len(deadlines) else None
    return DeliveryBatch(
        messages[0].queue if messages else "q",
        [m.bookmark for m in messages],
        [m.key for m in messages],
        [m.value for m in messages],
        [m.timestamp_ms for m in messages],
        [m.deliveries for m in messages],
        [m.cancels for m in messages],
        common,
        None if common is not None or not messages else deadlines,
        [i for i, m in enumerate(messages) if m.barrier],
        {i: m.headers for i, m in enumerate(messages) if m.headers},
        {i: m.parse_error for i, m in enumerate(messages) if m.parse_error is not None},
    )


@given(
    st.lists(_plain, max_size=8) | st.lists(_plain | _delivered, max_size=6),
    st.booleans(),
)
def test_a_delivery_batch_round_trips_with_common_columns_or_without(
    messages: list[Any], common: bool
) -> None:
    """A round's batch as MessageColumns, each column in full or (to a client that reads
    them) sent once where it is alike for all: the client reads the same messages."""
    messages = [replace(m, queue="q") for m in messages]  # one queue: a round's batch
    frame = Messages(_batch_of(messages), columns=True, made_at=1.5, common=common)
    decoded = SERVER_FRAME_CODEC.decode(SERVER_FRAME_CODEC.encode(frame))
    assert isinstance(decoded, Messages)
    assert list(decoded.messages) == messages
    assert all(type(m.bookmark) is Bookmark for m in decoded.messages)


def test_common_columns_leave_out_what_is_alike() -> None:
    """A plain batch of one topic and one deadline: per message only its partition, offset,
    value and timestamp go on the wire; an old client (no common_columns) gets every column."""
    plain = [
        DeliveredMessage(Bookmark("t", i % 2, 10 + i), None, b"v", [], 7, 1, 0, 99, False, "q")
        for i in range(5)
    ]
    compact = SERVER_FRAME_CODEC.encode(Messages(_batch_of(plain), columns=True, common=True))
    full = SERVER_FRAME_CODEC.encode(Messages(_batch_of(plain), columns=True))
    columns = pb.ServerFrame.FromString(compact).messages.columns
    sent = {f.name for f, v in columns.ListFields()}
    assert sent == {
        "partition", "offset", "value", "timestamp_ms", "common_topic", "common_queue",
        "common_flags", "common_deliveries", "common_cancels", "common_lease_deadline_ms",
    }  # fmt: skip
    every = {f.name for f, _ in pb.ServerFrame.FromString(full).messages.columns.ListFields()}
    assert not any(name.startswith("common_") for name in every) and "topic" in every
    assert len(compact) < len(full)
    assert SERVER_FRAME_CODEC.decode(compact).messages == plain  # type: ignore[union-attr]
    # a column that differs goes in full beside the common ones
    mixed = [replace(m, deliveries=1 + i % 2) for i, m in enumerate(plain)]
    columns = pb.ServerFrame.FromString(
        SERVER_FRAME_CODEC.encode(Messages(_batch_of(mixed), columns=True, common=True))
    ).messages.columns
    assert list(columns.deliveries) == [1, 2, 1, 2, 1] and not columns.HasField("common_deliveries")


def test_subscribe_carries_common_columns() -> None:
    frame = Subscribe("q", 10, "me", None, True, True, True)
    assert CLIENT_FRAME_CODEC.decode(CLIENT_FRAME_CODEC.encode(frame)) == frame
    old = pb.ClientFrame(subscribe=pb.Subscribe(queue="q", max_backlog=1)).SerializeToString()
    assert CLIENT_FRAME_CODEC.decode(old) == Subscribe("q", 1)  # unset: full columns


def test_stats_extra_comes_back_by_name() -> None:
    """A protobuf map keeps no order: the figures come back sorted by name, so ``qlayer
    stats`` prints them in the same order every time."""
    names = ["stage_push_p50_ms", "acked_total", "unread", "fetch_wait_ms", "delayed"]
    stats = replace(STATS, extra={name: float(i) for i, name in enumerate(names)})
    reply = STATS_REPLY_CODEC.decode(STATS_REPLY_CODEC.encode(StatsReply([stats])))
    assert list(reply.queues[0].extra) == sorted(names)


def test_a_batch_cannot_hold_a_subscribed_or_a_batch() -> None:
    for inner in (Subscribed("s", 1, 1.0), Batch([])):
        with pytest.raises(
            SerializationError, match=f"a Batch cannot hold a {type(inner).__name__}"
        ):
            SERVER_FRAME_CODEC.encode(Batch([inner]))  # type: ignore[list-item]
