"""Blobs (``layer.state.blobs``): the payloads of a run of plain messages stored as one value,
over a real RocksDB and the in-memory store, beside the per-message MESSAGES values of older
state directories (read as before)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from layer.coordinator.ingest import Fetched, PartitionStarted
from layer.coordinator.records import RunMirror
from layer.coordinator.runtime import BLOB_MESSAGES, QueueRuntime
from layer.engine.model import Bookmark, Done, DoneReason, TopicPartition
from layer.engine.queue import QueueEngine
from layer.exceptions import StateError
from layer.state import base
from layer.state.base import BLOBS, MESSAGES, KeyValueStore, StoreBatch, StoredMessage
from layer.state.blobs import Blob, encode_blob
from layer.state.memory import MemoryStore
from layer.state.rocksdb import RocksDBStore
from tests.unit.ports import TOPIC, TP, queue_config

NOW = 1_700_000_000.0


@pytest.fixture(params=["rocksdb", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueStore]:
    s: KeyValueStore = (
        RocksDBStore(tmp_path / "state") if request.param == "rocksdb" else MemoryStore()
    )
    yield s
    s.close()


def bm(offset: int, partition: int = 0) -> Bookmark:
    return Bookmark(TOPIC, partition, offset)


def plain(offset: int) -> StoredMessage:
    return StoredMessage(None, b'{"n": %d}' % offset, (), 1000 + offset)


def hand(rt: QueueRuntime, messages: Iterable[Message]) -> None:
    """As a reader hands a fetch over (partitions read for the first time start with it)."""
    fetched = list(messages)
    tps = {TopicPartition(m.topic(), m.partition()) for m in fetched}  # type: ignore[arg-type]
    first = {tp: min(m.offset() for m in fetched if m.partition() == tp.partition) for tp in tps}
    started = [PartitionStarted(tp, first[tp]) for tp in tps if tp not in rt.known_partitions]
    high = {tp: 1 << 40 for tp in tps}
    rt.take_fetched(Fetched(fetched, high, started))


def put_blob(store: KeyValueStore, offsets: list[int], partition: int = 0) -> None:
    batch = StoreBatch()
    batch.put_blob(
        "q",
        TopicPartition(TOPIC, partition),
        offsets,
        [None] * len(offsets),
        [plain(o).value for o in offsets],
        [plain(o).timestamp_ms for o in offsets],
    )
    store.write(batch)


def test_a_blob_round_trips_keys_values_gaps_and_absent_ones() -> None:
    offsets = [5, 6, 9, 10]
    keys: list[bytes | None] = [b"k5", None, b"", b"k10"]
    values: list[bytes | None] = [b"v5", b"", None, b"v" * 70_000]
    blob = Blob(encode_blob(offsets, keys, values, [1, 2, 3, 4]))
    assert (blob.first, blob.last, len(blob)) == (5, 10, 4)
    assert [blob.index(o) for o in (4, 5, 6, 7, 8, 9, 10, 11)] == [-1, 0, 1, -1, -1, 2, 3, -1]
    assert [blob.key(i) for i in range(4)] == keys
    assert [blob.value(i) for i in range(4)] == values
    assert list(blob.times) == [1, 2, 3, 4]
    dense = Blob(encode_blob([7, 8], [None, None], [b"a", b"bc"], [0, 0]))
    assert [dense.index(o) for o in (6, 7, 8, 9)] == [-1, 0, 1, -1]
    assert [dense.key(0), dense.value(1)] == [None, b"bc"]


def test_a_bad_blob_is_an_error() -> None:
    with pytest.raises(StateError, match="version"):
        Blob(b"\x07" + encode_blob([1], [None], [b"x"], [0])[1:])
    with pytest.raises(StateError, match="truncated"):
        Blob(encode_blob([1], [None], [b"xyz"], [0])[:-1])
    with pytest.raises(StateError, match="a blob of 2 offsets"):
        encode_blob([1, 2], [None], [b"x"], [0])


def test_messages_in_blobs_and_alone_are_read_alike(store: KeyValueStore) -> None:
    put_blob(store, [0, 1, 2, 4])  # 3: a message with headers, kept alone
    put_blob(store, [5, 6])
    put_blob(store, [0, 1], partition=1)
    batch = StoreBatch()
    alone = StoredMessage(b"k", b'{"n": 3}', (("h", b"1"),), 1003, 7)
    batch.put_message("q", bm(3), alone)
    batch.put_message("q", bm(8), plain(8))  # after the blobs
    store.write(batch)
    wanted = [bm(6), bm(0, 1), bm(3), bm(1), bm(7), bm(8), bm(4), bm(2, 1), bm(0)]
    want = [plain(6), plain(0), alone, plain(1), None, plain(8), plain(4), None, plain(0)]
    assert store.get_messages("q", wanted) == want
    assert store.get_messages("q", wanted) == want  # again, from the blobs kept
    order = [bm(o) for o in (0, 1, 2, 3, 4, 5, 6, 8)] + [bm(0, 1), bm(1, 1)]
    assert [b for b, _m in store.messages("q")] == order
    assert dict(store.messages("q"))[bm(3)] == alone
    assert [b for b, _m in store.messages("q", bm(2))] == order[2:]
    assert [b for b, _m in store.messages("q", bm(5, 0))] == order[5:]
    meta = list(store.message_meta("q"))
    assert [m[0] for m in meta] == order
    assert meta[0] == (bm(0), 1000, None, False)
    assert meta[3] == (bm(3), 1003, 7, False)
    assert store.queues() == {"q"}


def test_blobs_go_below_the_low_water_mark_and_with_their_queue(store: KeyValueStore) -> None:
    put_blob(store, [0, 1, 2])
    put_blob(store, [3, 4])
    assert store.get_messages("q", [bm(2), bm(4)]) == [plain(2), plain(4)]  # now cached
    batch = StoreBatch()
    batch.delete_blobs_below("q", TP, 3)  # the mark passed 0..2, not 3..4
    store.write(batch)
    assert store.get_messages("q", [bm(2), bm(3)]) == [None, plain(3)]
    batch = StoreBatch()
    batch.delete_blobs_below("q", TP, 4)  # 3 is below, 4 not: the blob stays
    store.write(batch)
    assert store.get_messages("q", [bm(3), bm(4)]) == [plain(3), plain(4)]
    store.wipe_queue("q")
    assert store.get_messages("q", [bm(3), bm(4)]) == [None, None]
    assert store.queues() == set()


def test_an_old_state_dir_of_single_messages_serves_them(tmp_path: Path) -> None:
    """A state directory written before blobs (one StoredMessage per message, no BLOBS
    column family) is read as before, and new messages go to blobs beside its ones."""
    state = tmp_path / "state"
    old = RocksDBStore(state)
    batch = StoreBatch()
    for offset in range(3):
        batch.put_message("q", bm(offset), plain(offset))  # the old API and format
    batch.put_read_position("q", TP, 3)
    old.write(batch)
    old.close()
    store = RocksDBStore(state)
    try:
        q = queue_config()
        rt = QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), "q-changelog")
        hand(
            rt,
            [
                Message(TOPIC, 0, o, None, b'{"n": %d}' % o, timestamp=(1, 1000 + o))
                for o in range(3, 6)
            ],
        )
        batch = StoreBatch()
        assert rt.admit(NOW, batch) == 3
        store.write(batch)
        assert [op[0] for op in batch.ops if op[0] in (MESSAGES, BLOBS)] == [BLOBS]
        rt.payload_cache.clear()
        got = rt.payloads(store, [bm(o) for o in range(7)])
        assert got == {**{bm(o): plain(o) for o in range(6)}, bm(6): None}
        assert [m[0].offset for m in store.message_meta("q")] == list(range(6))
    finally:
        store.close()


def test_admission_writes_blobs_and_their_done_messages_delete_nothing() -> None:
    store = MemoryStore()
    q = queue_config()
    rt = QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), "q-changelog")
    n = BLOB_MESSAGES + 10
    hand(
        rt,
        [
            Message(TOPIC, o % 2, o // 2, None, b'{"n": %d}' % o, timestamp=(1, 1000))
            for o in range(2 * n)
        ],
    )
    batch = StoreBatch()
    assert rt.admit(NOW, batch, limit=2 * n) == 2 * n
    store.write(batch)
    blobs = [op for op in batch.ops if op[0] == BLOBS]
    # the messages of two partitions interleaved: a blob per partition at a time, at most
    # BLOB_MESSAGES each
    assert len(blobs) == len(store._scan(BLOBS, b"", b"\xff", 1000)) > 2
    assert not [op for op in batch.ops if op[0] == MESSAGES]
    rt.payload_cache.clear()
    assert store.get_messages("q", [bm(n - 1, 1), bm(0, 0)]) == [
        StoredMessage(None, b'{"n": %d}' % (2 * n - 1), (), 1000),
        StoredMessage(None, b'{"n": 0}', (), 1000),
    ]
    assert rt.in_blobs(bm(0, 1), n) and not rt.in_blobs(bm(0, 1), n + 1)
    done = [Done(bm(o), DoneReason.ACKED, 1, 0, NOW) for o in range(3)]
    batch = StoreBatch()
    RunMirror(batch).add(rt, done, b"v", {})
    assert [op for op in batch.ops if op[0] == MESSAGES and op[2].keys] == []  # type: ignore[union-attr]


def test_a_blob_after_a_message_alone_starts_a_new_span() -> None:
    q = queue_config()
    rt = QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), "q-changelog")
    hand(rt, [Message(TOPIC, 0, o, None, b"{}", timestamp=(1, 1000)) for o in range(3)])
    hand(rt, [Message(TOPIC, 0, 3, None, b"{}", [("h", b"1")], timestamp=(1, 1000))])
    hand(rt, [Message(TOPIC, 0, o, None, b"{}", timestamp=(1, 1000)) for o in range(4, 6)])
    batch = StoreBatch()
    assert rt.admit(NOW, batch) == 6
    # one blob with a gap at 3 (kept alone): no span, so done messages delete as before
    assert not rt.in_blobs(bm(0), 1)
    hand(rt, [Message(TOPIC, 0, o, None, b"{}", timestamp=(1, 1000)) for o in range(6, 8)])
    assert rt.admit(NOW, batch) == 2
    assert rt.in_blobs(bm(6), 2) and not rt.in_blobs(bm(5), 1)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 1),  # partition
            st.integers(1, 6),  # messages
            st.integers(0, 2),  # offsets skipped before them
            st.booleans(),  # in a blob (else each alone, as an older build kept them)
            st.booleans(),  # with a gap inside
        ),
        max_size=12,
    ),
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60)), max_size=40),
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60)), max_size=3),
)
def test_blobs_and_single_messages_read_as_one_store(
    writes: list[tuple[int, int, int, bool, bool]],
    reads: list[tuple[int, int]],
    marks: list[tuple[int, int]],
) -> None:
    """Any mix of blobs (with gaps) and single records, read in any order, after any low-water
    marks, gives what a plain dict of the messages written says (a blob stays until the mark
    passes its last offset, a single record until it is deleted alone)."""
    store = MemoryStore()
    model: dict[Bookmark, StoredMessage] = {}
    blob_last: dict[Bookmark, int] = {}  # message in a blob -> the blob's last offset
    next_offset = [0, 0]
    for partition, count, skip, in_blob, gap in writes:
        first = next_offset[partition] + skip
        offsets = [first + i + (1 if gap and i >= count // 2 else 0) for i in range(count)]
        next_offset[partition] = offsets[-1] + 1
        if in_blob:
            put_blob(store, offsets, partition)
        else:
            batch = StoreBatch()
            for o in offsets:
                batch.put_message("q", bm(o, partition), plain(o))
            store.write(batch)
        for o in offsets:
            model[bm(o, partition)] = plain(o)
            if in_blob:
                blob_last[bm(o, partition)] = offsets[-1]
    for partition, mark in marks:
        batch = StoreBatch()
        batch.delete_blobs_below("q", TopicPartition(TOPIC, partition), mark)
        batch.delete_messages_below("q", TopicPartition(TOPIC, partition), mark)
        store.write(batch)
        for b in list(model):
            if b.partition == partition and blob_last.get(b, b.offset) < mark:
                del model[b]
    wanted = [bm(o, p) for p, o in reads]
    assert store.get_messages("q", wanted) == [model.get(b) for b in wanted]
    assert list(store.messages("q")) == sorted(model.items())
    assert [m[0] for m in store.message_meta("q")] == sorted(model)


def test_the_low_water_mark_deletes_blobs_by_key_and_older_ones_at_once() -> None:
    store = MemoryStore()
    q = queue_config()
    rt = QueueRuntime(q, QueueEngine(q.name, q.engine_settings()), "q-changelog")
    for first in (10, 13, 16):  # three rounds: three blobs of three, ending at 12, 15 and 18
        hand(
            rt,
            [
                Message(TOPIC, 0, o, None, b"{}", timestamp=(1, 1000))
                for o in range(first, first + 3)
            ],
        )
        batch = StoreBatch()
        assert rt.admit(NOW, batch) == 3
        store.write(batch)
    rt.blobs_before[TP] = 10  # as a restore at read position 10 sets it
    batch = StoreBatch()
    rt.blobs_below(batch, TP, 9)
    assert not batch
    rt.blobs_below(batch, TP, 16)  # passed 12 and 15, and the restore's read position
    ops = [(cf, value) for cf, _key, value in batch.ops]
    assert ops[:2] == [(BLOBS, None), (BLOBS, None)]  # point deletes
    assert ops[2][0] == BLOBS and ops[2][1] is not None  # one range delete below 10
    assert rt.blobs_before == {}
    store.write(batch)
    rt.payload_cache.clear()
    got = store.get_messages("q", [bm(o) for o in (12, 13, 15, 16, 18)])
    assert [m is not None for m in got] == [False, False, False, True, True]
    batch = StoreBatch()
    rt.blobs_below(batch, TP, 17)  # 18 is not passed
    assert not batch


def _payload(partition: int, offset: int, keys: str, absent: bool) -> StoredMessage:
    key = {
        "none": None,
        "some": None if offset % 2 else b"k%d" % offset,
        "all": b"k" * (offset % 3),
    }
    value = None if absent and offset % 3 == 0 else b"v%d-%d" % (partition, offset)
    return StoredMessage(key[keys], value, (), 1000 + offset)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),  # partition
            st.integers(1, 40),  # messages
            st.integers(0, 3),  # offsets skipped before them
            st.booleans(),  # with a gap inside (a sparse blob)
            st.sampled_from(["none", "some", "all"]),  # keys
            st.booleans(),  # some values absent
            st.booleans(),  # each alone in MESSAGES (as an older build kept them)
        ),
        max_size=8,
    ),
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 150), st.integers(1, 60)), max_size=6
    ),  # runs read: partition, first offset, length
    st.booleans(),  # the runs interleaved (else one after another)
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 200)), max_size=6),  # strays
    st.booleans(),  # bookmarks as a tuple (else a list)
)
def test_runs_of_a_blob_read_in_one_pass_as_one_by_one(
    writes: list[tuple[int, int, int, bool, str, bool, bool]],
    runs: list[tuple[int, int, int]],
    interleave: bool,
    strays: list[tuple[int, int]],
    as_tuple: bool,
) -> None:
    """Runs of consecutive offsets read from a dense blob in one pass give what reading them
    one by one gives, and what was written: blobs dense and sparse, with and without keys,
    values absent, messages alone, partitions interleaved, offsets never written, read twice
    (the second time from the blobs kept)."""
    model: dict[Bookmark, StoredMessage] = {}
    store = MemoryStore()
    next_offset = [0, 0, 0]
    for partition, count, skip, gap, keys, absent, alone in writes:
        first = next_offset[partition] + skip
        offsets = [first + i + (1 if gap and i >= count // 2 else 0) for i in range(count)]
        next_offset[partition] = offsets[-1] + 1
        messages = [_payload(partition, o, keys, absent) for o in offsets]
        batch = StoreBatch()
        if alone:
            for o, m in zip(offsets, messages, strict=True):
                batch.put_message("q", bm(o, partition), m)
        else:
            batch.put_blob(
                "q",
                TopicPartition(TOPIC, partition),
                offsets,
                [m.key for m in messages],
                [m.value for m in messages],
                [m.timestamp_ms for m in messages],
            )
        store.write(batch)
        model.update((bm(o, partition), m) for o, m in zip(offsets, messages, strict=True))
    each = [[bm(o, p) for o in range(first, first + n)] for p, first, n in runs]
    if interleave:
        wanted = [b for group in itertools.zip_longest(*each) for b in group if b is not None]
    else:
        wanted = [b for run in each for b in run]
    for i, (p, o) in enumerate(strays):
        wanted.insert(i * 7 % (len(wanted) + 1), bm(o, p))
    asked: Sequence[Bookmark] = tuple(wanted) if as_tuple else wanted
    want = [model.get(b) for b in wanted]
    one_pass = base._RUN_MIN
    base._RUN_MIN = 1 << 30  # every message one by one
    try:
        assert store.get_messages("q", asked) == want
        assert store.get_messages("q", asked) == want  # from the blobs kept
    finally:
        base._RUN_MIN = one_pass
    store._blobs.clear()
    assert store.get_messages("q", asked) == want
    assert store.get_messages("q", asked) == want
