"""View topic generations (``layer.viewgen``) and the snapshot's contents before a round."""

from __future__ import annotations

from layer.coordinator.view_history import before_round
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.viewgen import (
    SNAPSHOT_HEADER,
    SNAPSHOT_MARK,
    generation_of,
    generation_topic,
    generations,
    is_snapshot,
)


def test_generation_names_round_trip_and_others_are_not_generations() -> None:
    assert generation_topic("orders.view", 0) == "orders.view"
    assert generation_topic("orders.view", 12) == "orders.view.g12"
    assert generation_of("orders.view", "orders.view.g12") == 12
    assert generation_of("orders.view", "orders.view") == 0
    for other in ("orders.view.g0", "orders.view.g", "orders.view.g1x", "orders.viewx", "x.view"):
        assert generation_of("orders.view", other) is None, other
    topics = ["orders.view.g10", "orders", "orders.view.g2", "orders.view", "orders.view2.g3"]
    assert generations("orders.view", topics) == [
        (0, "orders.view"),
        (2, "orders.view.g2"),
        (10, "orders.view.g10"),
    ]


def test_snapshot_records_are_told_by_their_header() -> None:
    assert is_snapshot([(SNAPSHOT_HEADER, SNAPSHOT_MARK)])
    assert not is_snapshot(None)
    assert not is_snapshot([(SNAPSHOT_HEADER, b"other"), ("x", SNAPSHOT_MARK)])


def _change(offset: int, sign: int, deliveries: int = 0) -> ViewChange:
    return ViewChange(Bookmark("t", 0, offset), sign, deliveries, 0, None)


def test_before_round_takes_a_rounds_changes_back_off_the_live_contents() -> None:
    # after the round: 1 (untouched), 2 (left and came back), 5 (entered)
    live = [_change(1, 1), _change(2, 1, 1), _change(5, 1)]
    # the round: 3 left, 2 left and came back (its deliveries went up), 5 entered
    round_changes = ViewChanges.of(
        [_change(3, -1, 1), _change(2, -1, 1), _change(2, 1, 1), _change(5, 1)]
    )
    before = before_round(live, round_changes)
    assert sorted(c.bookmark.offset for c in before) == [1, 2, 3]
    assert all(c.sign == 1 for c in before)
