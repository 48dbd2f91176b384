"""``ProportionalPicker.share`` counts in bulk what ``n`` picks one by one would give each
subscription: it must give exactly the same counts, in the same order, for any loads."""

from __future__ import annotations

from heapq import heapify, heappop, heapreplace

from hypothesis import given, settings
from hypothesis import strategies as st

from layer.engine.fairness import ProportionalPicker, Subscriber


def one_by_one(subs: list[Subscriber], n: int) -> list[tuple[str, int]]:
    """The rule itself: each of ``n`` picks to the subscription with room whose
    ``(outstanding / backlog, index)`` is least, counting the picks already given."""
    heap = [(s.outstanding / s.backlog, s.index, s) for s in subs if s.outstanding < s.backlog]
    heapify(heap)
    counts: dict[int, int] = {}
    order: list[Subscriber] = []
    while n > 0 and heap:
        _, index, sub = heap[0]
        count = counts.get(index, 0) + 1
        if count == 1:
            order.append(sub)
        counts[index] = count
        if sub.outstanding + count < sub.backlog:
            heapreplace(heap, ((sub.outstanding + count) / sub.backlog, index, sub))
        else:
            heappop(heap)
        n -= 1
    return [(sub.name, counts[sub.index]) for sub in order]


def picker_of(loads: list[tuple[int, int]]) -> tuple[ProportionalPicker, list[Subscriber]]:
    picker = ProportionalPicker()
    subs = []
    for i, (backlog, outstanding) in enumerate(loads):
        sub = Subscriber(f"s{i}", i, backlog)
        sub.outstanding = min(outstanding, backlog)
        picker.update(sub)
        subs.append(sub)
    return picker, subs


def shared(picker: ProportionalPicker, n: int) -> list[tuple[str, int]]:
    shares = picker.share(n)
    assert shares is not None
    return [(sub.name, count) for sub, count in shares]


loads = st.lists(
    st.integers(1, 1000).flatmap(lambda b: st.tuples(st.just(b), st.integers(0, b))),
    min_size=1,
    max_size=16,
)


@settings(max_examples=600, deadline=None)
@given(loads, st.integers(0, 20_000))
def test_share_gives_what_the_picks_one_by_one_give(loads: list[tuple[int, int]], n: int) -> None:
    picker, subs = picker_of(loads)
    assert shared(picker, n) == one_by_one(subs, n)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(1, 500), st.integers(0, 5_000))
def test_share_with_equal_backlogs_and_ties(subs: int, backlog: int, n: int) -> None:
    """Equal loads tie everywhere: the index breaks them, as in the picks."""
    picker, made = picker_of([(backlog, (i * 7) % (backlog + 1)) for i in range(subs)])
    assert shared(picker, n) == one_by_one(made, n)


def test_share_of_the_throughput_shape() -> None:
    """Four consumers of 100, some acks back: the counts fill them level, lowest first."""
    picker, subs = picker_of([(100, 0), (100, 7), (100, 14), (100, 21)])
    assert shared(picker, 300) == [("s0", 86), ("s1", 79), ("s2", 71), ("s3", 64)]
    assert shared(picker, 300) == one_by_one(subs, 300)
    assert shared(picker, 10_000) == [("s0", 100), ("s1", 93), ("s2", 86), ("s3", 79)]
    assert shared(picker, 0) == []


def test_share_leaves_more_than_sixteen_subscriptions_to_the_picks() -> None:
    picker, _ = picker_of([(10, 0)] * 17)
    assert picker.share(5) is None
