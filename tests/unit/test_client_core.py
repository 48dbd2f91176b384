"""The client's I/O-free subscription core and the wire error table: no sockets, no threads."""

from __future__ import annotations

import random

import grpc
import pytest

from layer.api.errors import (
    CODE_METADATA_KEY,
    TABLE,
    ErrorCode,
    code_of,
    error_from_rpc,
    error_of,
    status_of,
)
from layer.api.frames import (
    Ack,
    AckResult,
    Batch,
    Error,
    Messages,
    Replace,
    Replaced,
    Subscribe,
    Subscribed,
)
from layer.api.service import AckFailure, DeliveredMessage
from layer.client import _common
from layer.client._common import AckBatcher
from layer.client._core import (
    CONNECT_TIMEOUT,
    Addresses,
    Backoff,
    End,
    ReconnectPolicy,
    Retry,
    SubscriptionCore,
    channel_options,
    unary_failure,
)
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import (
    BrokerError,
    ClientError,
    ConnectFailed,
    ConnectionLost,
    ExpressionError,
    InvalidRequest,
    LeaseLost,
    PublishUncertain,
    QLayerError,
    UnknownBookmark,
    UnknownQueue,
)

# --- addresses and backoff ----------------------------------------------------------------------


def test_addresses_parse_and_rotate() -> None:
    ring = Addresses(" a:1, b:2 ,c:3")
    assert ring.all == ("a:1", "b:2", "c:3") and ring.current == "a:1"
    assert ring.failed("a:1") == "b:2"
    assert ring.failed("a:1") == "b:2"  # a stale report does not skip a good address
    assert ring.rotation() == ["b:2", "c:3", "a:1"]
    assert ring.failed("b:2") == "c:3" and ring.failed("c:3") == "a:1"
    assert Addresses(["x:1", "y:2"]).all == ("x:1", "y:2")
    with pytest.raises(InvalidRequest, match="no server address"):
        Addresses(" , ")


def test_backoff_grows_to_the_cap_with_jitter_inside_bounds() -> None:
    policy = ReconnectPolicy(initial_delay=0.1, max_delay=2.0)
    backoff = Backoff(policy, random.Random(7))
    delays = [backoff.next_delay() for _ in range(12)]
    for n, delay in enumerate(delays):
        base = min(2.0, 0.1 * 2**n)
        assert base / 2 <= delay <= base, (n, delay)
    assert len({round(d, 6) for d in delays[6:]}) > 1  # jittered, not lock-step at the cap
    backoff.reset()
    assert backoff.next_delay() <= 0.1


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="initial_delay"):
        ReconnectPolicy(initial_delay=3, max_delay=1)
    with pytest.raises(ValueError, match="give_up_after"):
        ReconnectPolicy(give_up_after=0)
    with pytest.raises(ValueError, match="connect_timeout must be > 0 seconds, got 0"):
        ReconnectPolicy(connect_timeout=0)


def test_channel_options_give_connect_attempts_time_and_keep_the_quick_backoff() -> None:
    # grpc core reads min_reconnect_backoff_ms as the time one connection attempt is given
    def grpc_options(policy: ReconnectPolicy, call_timeout: float | None) -> dict[str, int]:
        return {k: v for k, v in channel_options(policy, call_timeout) if "reconnect" in k}

    assert grpc_options(ReconnectPolicy(max_delay=5.0), 30.0) == {
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": int(CONNECT_TIMEOUT * 1000),
        "grpc.max_reconnect_backoff_ms": 5000,
    }
    assert CONNECT_TIMEOUT >= 5.0  # not the 100 ms that left loaded coordinators unreached
    custom = ReconnectPolicy(connect_timeout=1.5, initial_delay=0.05, max_delay=0.05)
    assert grpc_options(custom, None) == {
        "grpc.initial_reconnect_backoff_ms": 100,
        "grpc.min_reconnect_backoff_ms": 1500,
        "grpc.max_reconnect_backoff_ms": 100,
    }
    # at most half the call timeout: a silent address fails the call as ConnectFailed (not
    # sent) before its deadline; never below grpc's own floor of 100 ms
    assert grpc_options(ReconnectPolicy(), 4.0)["grpc.min_reconnect_backoff_ms"] == 2000
    assert grpc_options(ReconnectPolicy(), 0.05)["grpc.min_reconnect_backoff_ms"] == 100


# --- the subscription core ----------------------------------------------------------------------


def msg(offset: int) -> DeliveredMessage:
    return DeliveredMessage(Bookmark("t", 0, offset), None, b"x", [], 0, 1, 0, None)


def core(policy: ReconnectPolicy | None = None, target: str = "a:1,b:2") -> SubscriptionCore[str]:
    c: SubscriptionCore[str] = SubscriptionCore(
        "q", 5, None, "me", Addresses(target), policy or ReconnectPolicy(), random.Random(1)
    )
    assert c.on_subscribed(Subscribed("s1", 5, 60.0), "a:1", now=0.0) is None
    return c


def test_frames_deliver_messages_and_resolve_acks() -> None:
    c = core()
    assert c.on_frame(Messages([msg(1), msg(2)])).messages == [msg(1), msg(2)]
    c.operate(AckOp.ACK, "t/0/1", 0.0, "w1", c.epoch)
    c.operate(AckOp.ACK, "t/0/2", 0.0, None, c.epoch)
    (frame,) = c.take()
    assert isinstance(frame, Ack) and frame.bookmarks == ["t/0/1", "t/0/2"]
    failure = AckFailure("t/0/2", ErrorCode.UNKNOWN_BOOKMARK, "gone")
    out = c.on_frame(AckResult(frame.request_id, [failure]))
    assert out.done == [("w1", None, None)]
    assert c.ack_failures == [failure] and c.acked_count == 1


def test_a_batch_is_its_frames_in_turn() -> None:
    c = core()
    subscribe = c.subscribe_frame()
    assert isinstance(subscribe, Subscribe) and subscribe.batch_frames  # it takes Batch frames
    for offset in (1, 2, 3):
        c.operate(AckOp.ACK, f"t/0/{offset}", 0.0, f"w{offset}", c.epoch)
        (ack,) = c.take()
        assert isinstance(ack, Ack)
    first, second = ack.request_id - 2, ack.request_id - 1
    failure = AckFailure("t/0/2", ErrorCode.UNKNOWN_BOOKMARK, "gone")
    frame = Batch(
        [
            AckResult(first, []),
            Messages([msg(4)]),
            AckResult(second, [failure]),
            Messages([msg(5), msg(6)]),
        ]
    )
    out = c.on_frame(frame)
    assert out.messages == [msg(4), msg(5), msg(6)]
    assert [w for w, _, _ in out.done] == ["w1", "w2"]
    assert out.done[0][2] is None and out.done[1][2] is not None  # w2's ack was refused
    assert c.acked_count == 1
    assert frame.frames[1] == Messages([msg(4)])  # the frames themselves are left as they came


def test_a_drop_makes_pending_and_in_flight_acks_unconfirmed() -> None:
    c = core()
    c.operate(AckOp.ACK, "t/0/1", 0.0, None, c.epoch)
    c.take()  # in flight
    c.operate(AckOp.ACK, "t/0/2", 0.0, None, c.epoch)  # pending
    c.operate(AckOp.ACK, "t/0/3", 0.0, "waiter", c.epoch)
    mark = c.flush_mark()
    out, decision = c.lost(ConnectionLost("UNAVAILABLE: gone"), now=10.0)
    assert isinstance(decision, Retry) and decision.address == "b:2"
    assert c.unconfirmed_acks == 2
    ((waiter, _, error),) = out.done
    assert waiter == "waiter" and isinstance(error, LeaseLost)
    assert c.flushed(mark) and isinstance(c.flush_error(mark), LeaseLost)
    assert c.take() == []  # nothing is sent without a connection
    # a second failed attempt is the same disconnect: nothing counted twice, next address
    _, again = c.lost(ConnectionLost("refused"), now=10.5)
    assert isinstance(again, Retry) and again.address == "a:1" and c.unconfirmed_acks == 2
    event = c.on_subscribed(Subscribed("s2", 5, 60.0), "a:1", now=12.0)
    assert event is not None and event.downtime_s == pytest.approx(2.0)
    assert event.unconfirmed_acks == 2 and c.reconnects == 1


def test_acks_of_messages_from_an_earlier_connection_are_not_sent() -> None:
    c = core()
    old_epoch = c.epoch
    c.lost(ConnectionLost("gone"), now=1.0)
    c.on_subscribed(Subscribed("s2", 5, 60.0), "b:2", now=2.0)
    size, out = c.operate(AckOp.ACK, "t/0/1", 0.0, "w", old_epoch)
    assert size == 0 and isinstance(out.done[0][2], LeaseLost)
    size, out = c.operate(AckOp.ACK, "t/0/2", 0.0, None, old_epoch)
    assert size == 0 and not out.done and c.unconfirmed_acks == 1
    assert c.take() == []
    # by bookmark (no epoch) and from this connection: sent
    c.operate(AckOp.ACK, "t/0/3", 0.0, None, None)
    c.operate(AckOp.ACK, "t/0/4", 0.0, None, c.epoch)
    assert [f.bookmarks for f in c.take()] == [["t/0/3", "t/0/4"]]


def test_a_message_operation_nobody_waits_for_is_queued_as_operate_queues_it() -> None:
    """``operate_unwaited`` (a consumer's ``msg.ack()``) and ``operate`` without a waiter
    make the same frames and the same counts, through reconnects, mixed ops and stale
    messages; a closed subscription refuses both."""
    rng = random.Random(7)
    fast, slow = core(), core()
    ops = [AckOp.ACK, AckOp.ACK, AckOp.ACK, AckOp.CANCEL, AckOp.EXTEND]
    sent_fast: list[Ack] = []
    sent_slow: list[Ack] = []
    for step in range(600):
        if step % 150 == 149:  # a reconnect: earlier messages' leases are gone
            for c in (fast, slow):
                c.lost(ConnectionLost("gone"), now=float(step))
                c.on_subscribed(Subscribed("s", 5, 60.0), "a:1", now=float(step) + 0.5)
        op = rng.choice(ops)
        seconds = 0.0 if op == AckOp.ACK else float(rng.randint(0, 2))
        bookmark = Bookmark("t", rng.randint(0, 2), rng.randint(0, 50))
        epoch = fast.epoch if rng.random() < 0.9 else fast.epoch - 1
        size = fast.operate_unwaited(op, bookmark, seconds, epoch)
        slow_size, out = slow.operate(op, bookmark, seconds, None, epoch)
        assert size == slow_size and not out.done
        if rng.random() < 0.05:
            sent_fast += fast.take()
            sent_slow += slow.take()
    sent_fast += fast.take()
    sent_slow += slow.take()
    assert sent_fast == sent_slow and sent_fast
    assert fast.unconfirmed_acks == slow.unconfirmed_acks > 0
    fast.end(None)
    with pytest.raises(ClientError):
        fast.operate_unwaited(AckOp.ACK, Bookmark("t", 0, 1), 0.0, fast.epoch)


def test_the_ack_batcher_groups_runs_of_one_op_up_to_the_frame_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against a model: consecutive operations with the same op and seconds share a batch of
    at most ``ACK_FRAME_MAX``, in order; each ``add`` returns its batch's size; ``take``
    sends each batch as one frame and leaves nothing pending; answers resolve the waiters."""
    monkeypatch.setattr(_common, "ACK_FRAME_MAX", 7)
    rng = random.Random(11)
    for _ in range(50):
        batcher: AckBatcher[str] = AckBatcher()
        model: list[tuple[AckOp, float, list[Bookmark], list[str | None]]] = []
        for i in range(rng.randint(1, 60)):
            op = rng.choice([AckOp.ACK, AckOp.ACK, AckOp.ACK, AckOp.CANCEL, AckOp.EXTEND])
            seconds = 0.0 if op == AckOp.ACK else float(rng.randint(0, 1))
            bookmark = Bookmark("t", rng.randint(0, 1), i)
            waiter = f"w{i}" if rng.random() < 0.2 else None
            last = model[-1] if model else None
            if last is None or (last[0], last[1]) != (op, seconds) or len(last[2]) == 7:
                last = (op, seconds, [], [])
                model.append(last)
            last[2].append(bookmark)
            last[3].append(waiter)
            assert batcher.add(op, bookmark, seconds, waiter) == len(last[2])
            assert batcher.pending == sum(len(b[2]) for b in model)
        frames = batcher.take()
        assert batcher.pending == 0 and batcher.in_flight == len(model)
        assert [(f.op, f.seconds, f.count()) for f in frames] == [
            (op, seconds, len(set(bookmarks))) for op, seconds, bookmarks, _ in model
        ]
        for frame, (_, _, bookmarks, waiters) in zip(frames, model, strict=True):
            assert sorted(frame.bookmarks) == sorted({str(b) for b in bookmarks})
            resolution = batcher.resolve(AckResult(frame.request_id, []))
            assert [w for w, _ in resolution.done] == [w for w in waiters if w is not None]
        assert batcher.in_flight == 0


def test_replace_bookkeeping_and_resubscribe_with_the_new_spec() -> None:
    c = core()
    frames = c.replace("w", "q2", "/x > 1", 9)
    (replace,) = frames
    assert isinstance(replace, Replace) and replace.queue == "q2"
    out = c.on_frame(Replaced(replace.request_id, 7))
    assert out.done == [("w", 7, None)]
    assert (c.queue, c.filter, c.max_backlog, c.backlog) == ("q2", "/x > 1", 9, 7)
    refused = c.replace("w2", None, None, None)[0]
    out = c.on_frame(Error(ErrorCode.UNKNOWN_QUEUE, "no such queue", refused.request_id))
    assert isinstance(out.done[0][2], UnknownQueue) and c.queue == "q2"
    # unanswered when the connection drops: fails, and the spec stays the confirmed one
    c.replace("w3", "q3", None, None)
    out, _ = c.lost(ConnectionLost("gone"), now=1.0)
    assert out.done[0][0] == "w3" and isinstance(out.done[0][2], ConnectionLost)
    sub = c.subscribe_frame()
    assert (sub.queue, sub.filter, sub.max_backlog) == ("q2", "/x > 1", 9)
    with pytest.raises(ConnectionLost, match="reconnecting"):
        c.replace("w4", "q4", None, None)


def test_no_reconnect_for_refusals_closing_or_when_disabled() -> None:
    c = core()
    out, decision = c.lost(UnknownQueue("queue q removed"), now=0.0)
    assert isinstance(decision, End) and isinstance(decision.error, UnknownQueue) and c.ended
    off = core(ReconnectPolicy(enabled=False))
    off.operate(AckOp.ACK, "t/0/1", 0.0, "w", off.epoch)
    out, decision = off.lost(ConnectionLost("gone"), now=0.0)
    assert isinstance(decision, End) and isinstance(out.done[0][2], ClientError)
    assert not isinstance(out.done[0][2], LeaseLost)  # the old behaviour, unchanged
    closing = core()
    closing.closing = True
    _, decision = closing.lost(ConnectionLost("CANCELLED"), now=0.0)
    assert decision == End(None) and closing.error is None


def test_give_up_after() -> None:
    c = core(ReconnectPolicy(give_up_after=5.0))
    _, first = c.lost(ConnectionLost("gone"), now=100.0)
    assert isinstance(first, Retry) and first.delay <= 5.0
    _, last = c.lost(ConnectionLost("refused"), now=105.0)
    assert isinstance(last, End) and isinstance(last.error, ConnectionLost)
    assert "give_up_after" in str(last.error)


def test_unary_failover_and_publish() -> None:
    ring, policy = Addresses("a:1,b:2"), ReconnectPolicy()
    lost = ConnectionLost("UNAVAILABLE: refused")
    assert unary_failure(lost, "a:1", ring, policy, idempotent=True) is None
    assert ring.current == "b:2"
    uncertain = unary_failure(lost, "b:2", ring, policy, idempotent=False)
    assert isinstance(uncertain, PublishUncertain) and ring.current == "a:1"
    refused = UnknownQueue("nope")
    assert unary_failure(refused, "a:1", ring, policy, idempotent=True) is refused
    off = ReconnectPolicy(enabled=False)
    assert unary_failure(lost, "a:1", ring, off, idempotent=True) is lost


def test_a_publish_that_never_connected_goes_to_the_next_address() -> None:
    ring, policy = Addresses("a:1,b:2"), ReconnectPolicy()
    never = error_from_rpc(
        FakeRpcError(
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1:"
            " Failed to connect to remote host: Connection refused",
        )
    )
    assert type(never) is ConnectFailed and isinstance(never, ConnectionLost)
    assert unary_failure(never, "a:1", ring, policy, idempotent=False) is None  # nothing sent
    assert ring.current == "b:2"


# --- one table of wire errors ---------------------------------------------------------------------


class FakeRpcError(grpc.RpcError):
    def __init__(self, status: grpc.StatusCode, details: str, code: str | None = None) -> None:
        self._status, self._details = status, details
        self._trailing = ((CODE_METADATA_KEY, code),) if code is not None else ()

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._trailing


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.code.value)
def test_every_code_round_trips_to_its_exception_class(row: object) -> None:
    error_cls, status, code = row.error, row.status, row.code  # type: ignore[attr-defined]
    if error_cls is ExpressionError:
        raised: QLayerError = ExpressionError("/x >", 4, "unexpected end")
    else:
        raised = error_cls("it went wrong")
    assert code_of(raised) is code and status_of(raised) is status
    received = error_from_rpc(FakeRpcError(status, str(raised), code.value))
    expected = InvalidRequest if error_cls is ExpressionError else error_cls
    assert type(received) is expected and str(received) == str(raised)
    assert type(error_of(code, "m")) is expected


def test_every_code_has_a_row() -> None:
    assert {row.code for row in TABLE} == set(ErrorCode)


def test_errors_without_a_code_map_by_status() -> None:
    unavailable = error_from_rpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    assert type(unavailable) is ConnectionLost and "UNAVAILABLE" in str(unavailable)
    broker = error_from_rpc(
        FakeRpcError(grpc.StatusCode.UNAVAILABLE, "kafka down", ErrorCode.UNAVAILABLE.value)
    )
    assert type(broker) is BrokerError
    assert type(error_from_rpc(FakeRpcError(grpc.StatusCode.NOT_FOUND, "q"))) is UnknownQueue
    other = error_from_rpc(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "big"))
    assert type(other) is ClientError and str(other) == "RESOURCE_EXHAUSTED: big"
    newer = error_from_rpc(FakeRpcError(grpc.StatusCode.INTERNAL, "?", "a_code_from_the_future"))
    assert type(newer) is QLayerError


def test_lease_refusals_are_lease_errors() -> None:
    assert type(error_of(ErrorCode.UNKNOWN_BOOKMARK, "t/0/1: gone")) is UnknownBookmark
    assert code_of(ValueError("not ours")) is ErrorCode.INTERNAL


def test_replay_request_takes_bookmarks_times_and_refuses_the_rest() -> None:
    from datetime import UTC, datetime

    from layer.api.frames import Replay
    from layer.client._common import replay_request
    from layer.exceptions import InvalidRequest

    assert replay_request("q", None, None, False, None) == Replay("q")
    assert replay_request("q", "t/0/5", None, False, None) == Replay("q", ("t/0/5",))
    assert replay_request("q", ["t/0/5", "t/1/2"], 12.5, True, "/a = 1") == Replay(
        "q", ("t/0/5", "t/1/2"), None, 12_500, True, "/a = 1"
    )
    when = datetime(2026, 11, 25, 1, 0, tzinfo=UTC)
    assert replay_request("q", when, None, False, None).since_ms == int(when.timestamp()) * 1000
    assert replay_request("q", 1_700_000_000, None, False, None).since_ms == 1_700_000_000_000
    with pytest.raises(InvalidRequest, match="timezone"):
        replay_request("q", datetime(2026, 11, 25), None, False, None)  # noqa: DTZ001
    with pytest.raises(InvalidRequest, match="epoch seconds"):
        replay_request("q", None, float("nan"), False, None)
    with pytest.raises(InvalidRequest, match="strings"):
        replay_request("q", [1, 2], None, False, None)  # type: ignore[list-item]
