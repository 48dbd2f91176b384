"""How the subscription stream's writer groups frames into gRPC messages (``_batched``) and
cuts deliveries into Messages frames (``_message_frames``)."""

from __future__ import annotations

from layer.api.errors import ErrorCode
from layer.api.frames import AckResult, Batch, Error, Messages, Replaced
from layer.api.server import _FRAME_PAYLOAD_BYTES, _batched, _message_frames, _payload_size
from layer.api.service import AckFailure, DeliveredMessage
from layer.engine.model import Bookmark


def _messages(*offsets: int) -> Messages:
    return Messages(
        [DeliveredMessage(Bookmark("t", 0, o), None, b"v", [], 0, 1, 0, None) for o in offsets]
    )


def test_control_frames_and_the_messages_go_as_one_batch_in_order() -> None:
    control = [AckResult(1, []), Replaced(2, 5), Error(ErrorCode.MALFORMED_FRAME, "x")]
    assert _batched(list(control), [_messages(1, 2)]) == [Batch([*control, _messages(1, 2)])]


def test_a_lone_frame_is_written_as_it_is() -> None:
    assert _batched([AckResult(1, [])], []) == [AckResult(1, [])]
    assert _batched([], [_messages(1)]) == [_messages(1)]
    assert _batched([], []) == []


def test_an_ack_result_with_failures_goes_alone_in_its_place() -> None:
    refused = AckResult(2, [AckFailure("t/0/1", ErrorCode.NOT_LEASED, "not leased")])
    writes = _batched([AckResult(1, []), AckResult(3, []), refused, AckResult(4, [])], [])
    assert writes == [Batch([AckResult(1, []), AckResult(3, [])]), refused, AckResult(4, [])]


def _sized(offset: int, value: int, key: int = 0, header: int = 0) -> DeliveredMessage:
    headers: list[tuple[str, bytes | None]] = [("h", b"x" * header), ("n", None)] if header else []
    return DeliveredMessage(
        Bookmark("t", 0, offset), b"k" * key if key else None, b"v" * value, headers, 0, 1, 0, 9
    )


def test_a_batch_under_the_frame_size_is_one_frame_and_a_larger_one_is_cut_where_it_passes() -> (
    None
):
    small = [_sized(o, 100, key=o % 3, header=o % 2) for o in range(50)]
    assert [f.messages for f in _message_frames(small, True)] == [small]
    assert _message_frames([], True) == []
    third = _FRAME_PAYLOAD_BYTES // 3
    big = [_sized(0, third), _sized(1, 10, key=4), _sized(2, third, header=7), _sized(3, third)]
    big += [_sized(4, 5), _sized(5, third)]
    frames = _message_frames(big)
    # cut after the message that takes the frame's payload to the limit or past it
    sizes = [sum(_payload_size(m) for m in f.messages) for f in frames]
    assert [f.messages for f in frames] == [big[:4], big[4:]]
    assert sizes[0] >= _FRAME_PAYLOAD_BYTES > sizes[0] - _payload_size(big[3])
