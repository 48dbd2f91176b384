"""How the subscription stream's writer groups frames into gRPC messages (``_batched``)."""

from __future__ import annotations

from layer.api.errors import ErrorCode
from layer.api.frames import AckResult, Batch, Error, Messages, Replaced
from layer.api.server import _batched
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
