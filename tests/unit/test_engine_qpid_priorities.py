"""Qpid priority queues (``priorities = N``): JMS priorities 0-9, default 4, mapped onto N levels
as the Qpid book's chapter "Other Queue Types" describes; the engine orders by level, oldest first
within one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.engine import QueueEngine
from layer.engine.model import Arrival, Bookmark, EngineSettings, TopicPartition
from layer.engine.priorities import JMS_DEFAULT_PRIORITY, qpid_level

TP = TopicPartition("orders", 0)


def levels_of(levels: int) -> list[int]:
    return [qpid_level(p, levels) for p in range(10)]


def test_ten_levels_by_default_each_priority_its_own() -> None:
    # "By default the queue will have 10 distinct priorities", 0 lowest, 9 highest
    assert levels_of(10) == list(range(10))


def test_two_levels_split_0_to_4_and_5_to_9() -> None:
    # the chapter's worked example: "messages with priority 0-4 are treated the same as 'lower
    # priority' and messages with priority 5-9 are treated equivalently as 'higher priority'"
    assert levels_of(2) == [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        (3, [0, 0, 0, 0, 1, 2, 2, 2, 2, 2]),
        (4, [0, 0, 0, 0, 1, 2, 3, 3, 3, 3]),  # the chapter's <priorities>4</priorities>
        (5, [0, 0, 0, 1, 2, 3, 4, 4, 4, 4]),
        (6, [0, 0, 0, 1, 2, 3, 4, 5, 5, 5]),
        (9, [0, 1, 2, 3, 4, 5, 6, 7, 8, 8]),
    ],
)
def test_fewer_levels_partition_the_0_to_9_space(levels: int, expected: list[int]) -> None:
    assert levels_of(levels) == expected


def test_absent_priority_is_jms_default_4_and_above_9_is_9() -> None:
    assert JMS_DEFAULT_PRIORITY == 4
    for levels in range(2, 11):
        assert qpid_level(None, levels) == qpid_level(4, levels)
        assert qpid_level(200, levels) == qpid_level(9, levels) == levels - 1


@pytest.mark.parametrize("levels", [0, 1, 11])
def test_levels_out_of_range_are_refused(levels: int) -> None:
    with pytest.raises(ValueError, match="priorities must be 2 to 10"):
        qpid_level(5, levels)


@given(st.integers(2, 10), st.integers(0, 9), st.integers(0, 9))
def test_levels_keep_the_order_of_priorities_and_use_every_level(
    levels: int, a: int, b: int
) -> None:
    if a <= b:
        assert qpid_level(a, levels) <= qpid_level(b, levels)
    assert sorted({qpid_level(p, levels) for p in range(10)}) == list(range(levels))
    # 0 is always the lowest level, 9 the highest, 4 and 5 never share one (JMS's normal and
    # expedited priorities stay apart)
    assert qpid_level(0, levels) == 0
    assert qpid_level(9, levels) == levels - 1
    assert qpid_level(4, levels) < qpid_level(5, levels)


def deliveries(jms: list[int | None], levels: int) -> list[int]:
    """The order a queue with ``levels`` delivers messages of these JMS priorities, at
    offsets 0, 1, 2, ... (one consumer acking each)."""
    engine = QueueEngine("jobs", EngineSettings(priority=True))
    engine.start_partition(TP, 0)
    arrivals = [
        Arrival(Bookmark("orders", 0, offset), float(offset), qpid_level(p, levels))
        for offset, p in enumerate(jms)
    ]
    engine.add(arrivals, 0.0)
    return [b.offset for b in engine.available()]


def test_two_levels_deliver_higher_first_and_oldest_first_within_a_level() -> None:
    # priorities 3, 9, 0, 5, absent (4), 7: the higher ones (9, 5, 7) in arrival order, then
    # the lower ones (3, 0, 4) in arrival order
    assert deliveries([3, 9, 0, 5, None, 7], 2) == [1, 3, 5, 0, 2, 4]


def test_ten_levels_deliver_by_jms_priority() -> None:
    assert deliveries([3, 9, 0, 5, None, 7], 10) == [1, 5, 3, 4, 0, 2]


def test_a_message_without_priority_goes_with_priority_4() -> None:
    # four levels: 0-3 | 4 | 5 | 6-9; the absent one (offset 1) ranks with the 4 (offset 3)
    assert deliveries([2, None, 6, 4, 5], 4) == [2, 4, 1, 3, 0]
