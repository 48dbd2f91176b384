"""A changelog written in format 2 (issue 11's run records and snapshots), kept as its bytes.

``data/changelog-format2-20261126.json`` is one changelog partition as the rounds wrote it on
2026-11-26 (``generate``: random fetches, leases, acks and cancels with a snapshot due every 12
records, then a low-water mark moved past a run and that run's tombstone): run records, single
records, low-water positions, snapshots and their confirmations, the counters companion. Later
formats must still restore these bytes to the same state, from the last snapshot and from the
start; never regenerate the file to make this test pass (add a file for a new format instead).
"""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

from layer.codec import decode_key, encode_change, encode_run
from layer.engine.model import Bookmark, LowWater, TopicPartition
from layer.state.memory import MemoryStore
from layer.state.recovery import Tail, replay
from tests.unit.test_snapshot import CL, Bench, _traffic, state

GOLDEN = Path(__file__).parent / "data" / "changelog-format2-20261126.json"


def _records(golden: dict[str, Any]) -> list[tuple[bytes, bytes | None]]:
    return [
        (bytes.fromhex(k), None if v is None else bytes.fromhex(v)) for k, v in golden["records"]
    ]


def _expected(golden: dict[str, Any]) -> tuple[dict[Bookmark, bytes], dict[TopicPartition, int]]:
    entries = {}
    for where, value in golden["entries"].items():
        topic, partition, offset = where.rsplit("/", 2)
        entries[Bookmark(topic, int(partition), int(offset))] = bytes.fromhex(value)
    lows = {}
    for where, low in golden["low_water"].items():
        topic, partition = where.rsplit("/", 1)
        lows[TopicPartition(topic, int(partition))] = low
    return entries, lows


def test_a_format_2_changelog_restores_from_its_last_snapshot_and_from_the_start() -> None:
    golden = json.loads(GOLDEN.read_text())
    records = _records(golden)
    keys = [decode_key(k) for k, _v in records]
    # what the file holds: snapshots with confirmations, runs, a run's tombstone, positions
    assert sum(k.offset <= -3 for k in keys) >= 2 and any(k.offset == -2 for k in keys)
    assert any(k.length > 1 and v is not None for k, (_, v) in zip(keys, records, strict=True))
    assert any(k.length > 1 and v is None for k, (_, v) in zip(keys, records, strict=True))
    assert any(k.offset == -1 for k in keys)
    expected = _expected(golden)

    from_snapshot = MemoryStore()
    applied = replay(from_snapshot, CL, records, from_snapshot=True)
    assert applied == golden["applied_from_snapshot"] < len(records)
    assert state(from_snapshot) == expected

    whole = MemoryStore()
    assert replay(whole, CL, records, from_snapshot=False) == len(records)
    assert state(whole) == expected
    assert state(whole, "q~counters") == state(from_snapshot, "q~counters")


def generate() -> dict[str, Any]:
    """How the file was made (with the code of 2026-11-26): kept to read, not to rerun."""

    async def traffic() -> tuple[Bench, Any]:
        b = Bench(every=12)
        states = await _traffic(b, random.Random(11), 24)
        return b, states

    b, states = asyncio.run(traffic())
    records = b.records()
    tp = TopicPartition("orders", 0)
    # the tail: the low-water mark moved past offsets 1..4, and their run's tombstone
    records.append(encode_change("q", LowWater(tp, 5), at_ms=1_795_700_000_000))
    records.append((encode_run("q", Bookmark("orders", 0, 1), 4), None))
    whole = MemoryStore()
    replay(whole, CL, records, from_snapshot=False)
    fresh = MemoryStore()
    applied = replay(fresh, CL, records, from_snapshot=True)
    assert state(fresh) == state(whole)
    entries, lows = state(whole)
    assert states  # the rounds ran
    return {
        "about": __doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else "",
        "records": [[k.hex(), None if v is None else v.hex()] for k, v in records],
        "applied_from_snapshot": applied,
        "low_water": {f"{t.topic}/{t.partition}": low for t, low in lows.items()},
        "entries": {
            f"{bm.topic}/{bm.partition}/{bm.offset}": v.hex() for bm, v in sorted(entries.items())
        },
    }


if __name__ == "__main__":
    print(json.dumps(generate(), indent=1))


class _Record:
    """What a consumer hands ``Tail``: a changelog record of partition 0 at an offset."""

    def __init__(self, offset: int, key: bytes, value: bytes | None) -> None:
        self._offset, self._key, self._value = offset, key, value

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value


def test_a_standby_tail_after_a_restore_ends_where_a_whole_restore_does() -> None:
    """A standby's copy (``layer.coordinator.standby``): restored up to some offset, then the
    rest applied a few records at a time by a ``Tail``; the store holds what a restore of the
    whole changelog gives, and the offset a later restore resumes from."""
    golden = json.loads(GOLDEN.read_text())
    records = _records(golden)
    for cut in (0, 1, len(records) // 3, len(records) - 1):
        store = MemoryStore()
        replay(store, CL, records[:cut], from_snapshot=True)
        tail = Tail(store, CL)
        rest = [_Record(cut + i, k, v) for i, (k, v) in enumerate(records[cut:])]
        for start in range(0, len(rest), 7):
            assert tail.apply(rest[start : start + 7]) == len(rest[start : start + 7])  # type: ignore[arg-type]
        assert state(store) == _expected(golden), cut
        assert store.changelog_offset(CL, 0) == len(records)
