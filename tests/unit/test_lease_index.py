"""The lease deadlines index (``layer.engine.index.LeaseIndex``): batches of one deadline and a
heap for earlier ones, against a plain model (every live lease, by deadline)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from layer.engine.index import LEASED, Entry, LeaseIndex
from layer.engine.model import Bookmark

RETURNED = LEASED + 1  # any other state: the reference is stale


def _entries(n: int) -> list[Entry]:
    return [Entry(Bookmark("t", 0, i), i, 0.0, 0, 0) for i in range(n)]


def test_due_leases_come_by_deadline_and_stale_references_are_passed_over() -> None:
    index = LeaseIndex()
    a, b, c, d = _entries(4)
    for entry, deadline in ((a, 10.0), (b, 10.0), (c, 20.0)):
        entry.state, entry.deadline = LEASED, deadline
    index.push_many([a, b], 10.0)
    index.push(c, 20.0)
    d.state, d.deadline = LEASED, 5.0  # earlier than the last batch: the heap
    index.push(d, 5.0)
    b.deadline = 30.0  # extended: its reference at 10 is stale
    index.push(b, 30.0)
    assert len(index) == 5
    assert index.pop_due(4.0) is None
    assert index.pop_due(10.0) is d
    assert index.pop_due(10.0) is a
    a.state = RETURNED  # as the engine does with a lease that ended
    assert index.pop_due(10.0) is None
    assert index.pop_due(30.0) is c
    assert index.pop_due(30.0) is b
    assert index.pop_due(99.0) is None
    assert len(index) == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["lease", "extend", "end", "pop", "compact"]),
            st.integers(0, 15),
            st.integers(0, 6),
        ),
        max_size=80,
    )
)
def test_the_index_pops_what_a_model_of_live_leases_says(
    steps: list[tuple[str, int, int]],
) -> None:
    entries = _entries(16)
    index = LeaseIndex()
    now = 0.0
    for op, i, delta in steps:
        entry = entries[i]
        if op == "lease" and entry.state != LEASED:
            entry.state, entry.deadline = LEASED, now + 3
            index.push_many([entry], now + 3)
        elif op == "extend" and entry.state == LEASED:
            entry.deadline = now + delta
            index.push(entry, now + delta)
        elif op == "end":
            entry.state = RETURNED
        elif op == "compact":
            index.compact(sum(e.state == LEASED for e in entries))
        elif op == "pop":
            now += delta
            due = []
            while (popped := index.pop_due(now)) is not None:
                assert popped.state == LEASED and popped.deadline <= now
                popped.state = RETURNED  # the engine ends the lease
                due.append(popped)
            expected = [e for e in entries if e in due or (e.state == LEASED and e.deadline <= now)]
            assert sorted(e.key for e in due) == sorted(e.key for e in expected)
            deadlines = [e.deadline for e in due]
            assert deadlines == sorted(deadlines)
        assert len(index) >= sum(e.state == LEASED for e in entries)
