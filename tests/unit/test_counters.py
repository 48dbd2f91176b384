"""A queue's counters: integers, written with the rounds, rebuilt from the store and from the
changelog alone (a lost disk), a snapshot included."""

from __future__ import annotations

from layer.coordinator.counters import COUNTERS_SUFFIX, FLUSH_INTERVAL, Counters
from layer.engine.model import DoneReason, ReturnReason
from layer.state import snapshot as snap
from layer.state.base import StoreBatch
from layer.state.memory import MemoryStore
from layer.state.recovery import replay

CL = "q-changelog"


def _busy() -> Counters:
    c = Counters()
    c.ingested, c.delivered, c.acked = 10, 7, 5
    c.returned(ReturnReason.CANCEL)
    c.returned(ReturnReason.TIMEOUT)
    c.returned(ReturnReason.TIMEOUT)
    c.dead_letter(DoneReason.MAX_DELIVERIES)
    c.dead_letter(DoneReason.CONSUMER_EXPIRE)
    c.dead_letter(DoneReason.CONSUMER_EXPIRE)
    return c


def test_counters_are_integers_and_dead_letters_count_by_reason() -> None:
    c = _busy()
    values = c.values()
    assert all(type(v) is int for v in values.values())
    assert values["lease_timeouts"] == 2 and values["cancelled"] == 1
    assert values["dead_lettered.consumer_expire"] == 2
    assert c.dead_lettered == 3


def test_a_flush_writes_only_what_changed_and_comes_back_from_the_store_and_the_changelog() -> None:
    c = _busy()
    store = MemoryStore()
    batch = StoreBatch()
    records = c.flush("q", CL, batch, 200.0, 200_000, force=True)
    store.write(batch)
    assert Counters.load(store, "q").values() == c.values()
    # nothing changed: nothing to write, even when forced
    assert c.flush("q", CL, StoreBatch(), 200.0, 200_000, force=True) == []
    c.acked += 1
    # a quiet round writes them only once FLUSH_INTERVAL has passed
    assert c.flush("q", CL, StoreBatch(), 200.0 + FLUSH_INTERVAL / 2, 0, force=False) == []
    more = c.flush("q", CL, StoreBatch(), 201.0 + FLUSH_INTERVAL, 0, force=False)
    assert len(more) == 1  # acked alone
    lost_disk = MemoryStore()
    replay(lost_disk, CL, [(k, v) for _t, k, v in records + more], from_snapshot=False)
    assert Counters.load(lost_disk, "q").values() == c.values()


def test_a_restore_from_a_snapshot_keeps_the_counters() -> None:
    c = _busy()
    store = MemoryStore()
    batch = StoreBatch()
    c.flush("q", CL, batch, 1.0, 1000, force=True)
    store.write(batch)
    built, parts_of, _runs = snap.build_snapshot(store, CL, ["q" + COUNTERS_SUFFIX], "s1", 2000)
    confirm = snap.confirm_records(CL, "s1", parts_of, 3000)
    older = [(b"junk-before-the-snapshot", None)]  # never read: the restore starts later
    records = older + [(k, v) for _t, k, v in built + confirm]
    fresh = MemoryStore()
    replay(fresh, CL, records, from_snapshot=True)
    assert Counters.load(fresh, "q").values() == c.values()
