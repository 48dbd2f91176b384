"""The state store: every test runs on both engines (in-memory and RocksDB in tmp_path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from layer.codec import ChangeKind, encode_change
from layer.engine.model import Bookmark, Done, DoneReason, Leased, LowWater, TopicPartition
from layer.exceptions import SerializationError, StateError
from layer.state import (
    EntryState,
    MemoryStore,
    PartitionPosition,
    RocksDBStore,
    Store,
    StoreBatch,
    StoredMessage,
    discard_state_dir,
)
from layer.state.base import KeyValueStore, message_key
from layer.state.recovery import _Restorer

ROOT = Path(__file__).resolve().parents[2]


def _python(script: str, *args: str, stdin: bool = False) -> subprocess.Popen[str]:
    """A Python process running ``script`` with the repository importable, stdout piped."""
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE,
        text=True,
    )


StoreFactory = Callable[[], KeyValueStore]


@pytest.fixture(params=["memory", "rocksdb"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Every test that uses it runs once per engine (the fixture's parameter)."""
    opened: list[KeyValueStore] = []
    memory = MemoryStore()

    def open_store() -> KeyValueStore:
        store: KeyValueStore
        store = memory if request.param == "memory" else RocksDBStore(tmp_path / "state")
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def rocks_factory(tmp_path: Path) -> Iterator[StoreFactory]:
    """RocksDB only: opens (and reopens) ``tmp_path / "state"``."""
    opened: list[KeyValueStore] = []

    def open_store() -> KeyValueStore:
        opened.append(RocksDBStore(tmp_path / "state"))
        return opened[-1]

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def store(store_factory: StoreFactory) -> KeyValueStore:
    return store_factory()


def entry(deliveries: int = 1, kind: ChangeKind = ChangeKind.LEASED) -> EntryState:
    return EntryState(kind, deliveries, 0, "sub", 1_000, None, 500)


def message(n: int = 0) -> StoredMessage:
    return StoredMessage(b"k%d" % n, b"v" * n, (("h", b"1"), ("h", None)), 1_700_000_000_000 + n)


def test_implements_the_store_protocol(store: KeyValueStore) -> None:
    assert isinstance(store, Store)


def test_entries_iterate_one_queue_in_bookmark_order(store: KeyValueStore) -> None:
    batch = StoreBatch()
    bookmarks = [
        Bookmark("b", 0, 3),
        Bookmark("a", 1, 256),
        Bookmark("a", 1, 2),
        Bookmark("a", 0, 2**40),
        Bookmark("a", 1, 10),
        Bookmark("a", 10, 0),
    ]
    for i, bm in enumerate(bookmarks):
        batch.put_entry("q", bm, entry(i))
    batch.put_entry("q2", Bookmark("a", 0, 0), entry())
    batch.put_entry("qq", Bookmark("a", 0, 0), entry())
    store.write(batch)
    got = list(store.entries("q"))
    assert [bm for bm, _ in got] == sorted(bookmarks)
    assert dict(got)[Bookmark("a", 1, 256)] == entry(1)
    assert [bm for bm, _ in store.entries("q2")] == [Bookmark("a", 0, 0)]
    assert list(store.entries("missing")) == []


def test_entry_values_below_a_mark_are_left_out(store: KeyValueStore) -> None:
    batch = StoreBatch()
    for topic, partition in (("a", 0), ("a", 1), ("b", 0)):
        batch.put_entry_values("q", TopicPartition(topic, partition), 0, 5, b"v")
    batch.put_entry_value("qq", Bookmark("a", 0, 0), b"other queue")
    store.write(batch)
    every = [bm for bm, _ in store.entry_values("q")]
    assert len(every) == 15
    below = {TopicPartition("a", 1): 3, TopicPartition("b", 0): 0, TopicPartition("c", 0): 9}
    got = [bm for bm, _ in store.entry_values("q", below=below)]
    assert got == [bm for bm in every if (bm.topic, bm.partition) != ("a", 1) or bm.offset >= 3]
    assert [bm for bm, _ in store.entry_values("q", below={TopicPartition("a", 0): 99})] == [
        bm for bm in every if bm.topic != "a" or bm.partition != 0
    ]


def test_entry_values_from_the_changelog_are_stored_as_is(store: KeyValueStore) -> None:
    bm = Bookmark("t", 0, 5)
    _, leased = encode_change("q", Leased(bm, "sub-1", 12.5, 2, 1), at_ms=9)
    assert leased is not None
    batch = StoreBatch()
    batch.put_entry_value("q", bm, leased)
    store.write(batch)
    assert list(store.entries("q")) == [
        (bm, EntryState(ChangeKind.LEASED, 2, 1, "sub-1", 12_500, None, 9))
    ]
    _, done = encode_change("q", Done(bm, DoneReason.ACKED, 2, 1, 13.0))
    assert done is not None
    batch = StoreBatch()
    batch.put_entry_value("q", bm, done)
    store.write(batch)
    assert list(store.entries("q")) == [
        (bm, EntryState(ChangeKind.DONE, 2, 1, None, None, "acked", 13_000))
    ]


def test_delete_entry_and_entries_below_a_low_water_mark(store: KeyValueStore) -> None:
    batch = StoreBatch()
    for offset in range(10):
        batch.put_entry("q", Bookmark("t", 0, offset), entry())
        batch.put_entry("q", Bookmark("t", 1, offset), entry())
    store.write(batch)
    batch = StoreBatch()
    batch.delete_entry("q", Bookmark("t", 0, 9))
    batch.delete_entries_below("q", TopicPartition("t", 0), 4)
    store.write(batch)
    left = [bm for bm, _ in store.entries("q")]
    assert left == [Bookmark("t", 0, o) for o in range(4, 9)] + [
        Bookmark("t", 1, o) for o in range(10)
    ]


def test_later_operations_in_a_batch_win(store: KeyValueStore) -> None:
    bm = Bookmark("t", 0, 1)
    batch = StoreBatch()
    batch.put_entry("q", bm, entry(1))
    batch.put_entry("q", bm, entry(2))
    batch.put_message("q", bm, message(1))
    batch.delete_message("q", bm)
    store.write(batch)
    assert list(store.entries("q")) == [(bm, entry(2))]
    assert store.get_messages("q", [bm]) == [None]


def test_positions_hold_low_water_and_read_position_apart(store: KeyValueStore) -> None:
    t0, t1, other = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)
    batch = StoreBatch()
    batch.put_low_water("q", t0, 5)
    batch.put_read_position("q", t0, 9)
    batch.put_read_position("q", t1, 2**50)
    batch.put_low_water("q", other, 0)
    batch.put_low_water("q2", t0, 77)
    store.write(batch)
    assert store.positions("q") == {
        t0: PartitionPosition(5, 9),
        t1: PartitionPosition(None, 2**50),
        other: PartitionPosition(0, None),
    }
    batch = StoreBatch()
    batch.put_low_water("q", t0, 6)
    batch.delete_low_water("q", other)
    store.write(batch)
    assert store.positions("q") == {t0: PartitionPosition(6, 9), t1: PartitionPosition(None, 2**50)}
    assert store.positions("q2") == {t0: PartitionPosition(77, None)}
    assert store.positions("none") == {}


def test_messages_iterate_from_a_start_and_multi_get(store: KeyValueStore) -> None:
    batch = StoreBatch()
    bookmarks = [Bookmark("t", p, o) for p in (0, 1) for o in range(5)]
    for i, bm in enumerate(bookmarks):
        batch.put_message("q", bm, message(i))
    store.write(batch)
    assert list(store.messages("q")) == [(bm, message(i)) for i, bm in enumerate(bookmarks)]
    assert [bm for bm, _ in store.messages("q", Bookmark("t", 0, 3))] == bookmarks[3:]
    assert [bm for bm, _ in store.messages("q", Bookmark("t", 0, 99))] == bookmarks[5:]
    wanted = [Bookmark("t", 1, 4), Bookmark("t", 9, 9), Bookmark("t", 0, 0)]
    assert store.get_messages("q", wanted) == [message(9), None, message(0)]
    assert store.get_messages("other", wanted) == [None, None, None]
    assert store.get_messages("q", []) == []


def test_stored_message_round_trip_keeps_every_field(store: KeyValueStore) -> None:
    full = StoredMessage(b"\x00", b"", (("a", b""), ("a", None)), -5, -(2**40), "bad json")
    empty = StoredMessage(None, None)
    batch = StoreBatch()
    batch.put_message("q", Bookmark("t", 0, 0), full)
    batch.put_message("q", Bookmark("t", 0, 1), empty)
    store.write(batch)
    assert store.get_messages("q", [Bookmark("t", 0, 0), Bookmark("t", 0, 1)]) == [full, empty]


def test_messages_put_in_bulk_read_back_and_survive_a_reopen(
    store_factory: StoreFactory,
) -> None:
    """``put_messages_encoded`` within ``bulk_load`` (a restore's backlog read): the records
    read back as the messages, after the bulk (RocksDB flushes then) and after a reopen."""
    store = store_factory()
    wanted = [StoredMessage(None, b'{"n": %d}' % i, (), 1_700_000_000_000 + i) for i in range(50)]
    with store.bulk_load():
        batch = StoreBatch()
        keys, values = batch.put_messages_encoded()
        for i, stored in enumerate(wanted):
            keys.append(message_key("q", Bookmark("t", 0, i)))
            values.append(stored.encode())
        batch.put_read_position("q", TopicPartition("t", 0), 50)
        store.write(batch)
    bookmarks = [Bookmark("t", 0, i) for i in range(50)]
    assert store.get_messages("q", bookmarks) == wanted
    again = store
    if isinstance(store, RocksDBStore):  # (the memory store is its own process's)
        store.close()
        again = store_factory()
    assert again.get_messages("q", bookmarks) == wanted
    assert again.positions("q")[TopicPartition("t", 0)].read_position == 50
    lopsided = StoreBatch()
    keys, values = lopsided.put_messages_encoded()
    keys.append(message_key("q", Bookmark("t", 0, 99)))
    with pytest.raises((StateError, ValueError)):  # never a key without its value
        again.write(lopsided)
    assert again.get_messages("q", [Bookmark("t", 0, 99)]) == [None]


def test_changelog_offsets(store: KeyValueStore) -> None:
    assert store.changelog_offset("cl", 0) is None
    batch = StoreBatch()
    batch.set_changelog_offset("cl", 0, 10)
    batch.set_changelog_offset("cl", 1, 0)
    batch.set_changelog_offset("cl2", 0, 3)
    store.write(batch)
    assert store.changelog_offset("cl", 0) == 10
    assert store.changelog_offset("cl", 1) == 0
    assert store.changelog_offset("cl2", 0) == 3
    assert store.changelog_offset("cl", 2) is None


def test_changelog_offsets_lists_every_partition_and_nothing_else(store: KeyValueStore) -> None:
    assert store.changelog_offsets() == {}
    batch = StoreBatch()
    batch.set_changelog_offset("cl", 1, 7)
    batch.set_changelog_offset("cl", 0, 10)
    batch.set_changelog_offset("cl.b", 300, 0)
    batch.set_cluster_id("c1")
    batch.put_entry("q", Bookmark("t", 0, 0), entry())
    batch.put_low_water("q", TopicPartition("t", 0), 3)
    store.write(batch)
    assert store.changelog_offsets() == {("cl", 0): 10, ("cl", 1): 7, ("cl.b", 300): 0}


def test_cluster_id_is_recorded_kept_apart_and_replaced(store: KeyValueStore) -> None:
    assert store.cluster_id() is None
    batch = StoreBatch()
    batch.set_cluster_id("MkU3OEVBNTcwNTJENDM2Qk")
    batch.set_changelog_offset("cl", 0, 4)
    store.write(batch)
    assert store.cluster_id() == "MkU3OEVBNTcwNTJENDM2Qk"
    assert store.changelog_offsets() == {("cl", 0): 4}  # not mistaken for an offset
    store.wipe_queue("q")  # per-queue wipes leave the store's identity alone
    assert store.cluster_id() == "MkU3OEVBNTcwNTJENDM2Qk"
    replace = StoreBatch()
    replace.set_cluster_id("tansu_cluster")
    store.write(replace)
    assert store.cluster_id() == "tansu_cluster"
    with pytest.raises(StateError, match="empty"):
        StoreBatch().set_cluster_id("")


def test_queues_and_wipe_queue(store: KeyValueStore) -> None:
    batch = StoreBatch()
    batch.put_entry("a", Bookmark("t", 0, 0), entry())
    batch.put_entry("ab", Bookmark("t", 0, 0), entry())
    batch.put_low_water("b", TopicPartition("t", 0), 3)
    batch.put_message("c", Bookmark("t", 0, 0), message())
    batch.put_message("a", Bookmark("t", 0, 0), message())
    batch.put_read_position("a", TopicPartition("t", 0), 1)
    batch.set_changelog_offset("cl", 0, 5)
    store.write(batch)
    assert store.queues() == {"a", "ab", "b", "c"}
    store.wipe_queue("a")
    assert store.queues() == {"ab", "b", "c"}
    assert list(store.entries("a")) == [] and store.positions("a") == {}
    assert list(store.messages("a")) == []
    assert [bm for bm, _ in store.entries("ab")] == [Bookmark("t", 0, 0)]
    assert store.changelog_offset("cl", 0) == 5


def test_a_batch_that_cannot_be_built_writes_nothing(store: KeyValueStore) -> None:
    batch = StoreBatch()
    batch.put_entry("q", Bookmark("t", 0, 0), entry())
    batch.set_changelog_offset("cl", 0, 1)
    with pytest.raises(SerializationError):
        batch.put_message("q", Bookmark("t", 0, 1), StoredMessage("not bytes", None))  # type: ignore[arg-type]
    with pytest.raises(StateError):
        batch.put_entry("bad\x00queue", Bookmark("t", 0, 0), entry())
    with pytest.raises(StateError):
        batch.put_entry("q", Bookmark("t", 0, -1), entry())
    assert list(store.entries("q")) == []
    assert store.changelog_offset("cl", 0) is None
    store.write(batch)  # what was added before the failures is still one consistent batch
    assert len(list(store.entries("q"))) == 1 and store.changelog_offset("cl", 0) == 1


def test_an_empty_batch_is_a_no_op(store: KeyValueStore) -> None:
    empty = StoreBatch()
    assert not empty and len(empty) == 0
    store.write(empty)
    assert store.queues() == set()


def test_iteration_pages_through_many_keys_and_sees_later_writes(
    store: KeyValueStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(KeyValueStore, "_PAGE", 7)
    batch = StoreBatch()
    for offset in range(100):
        batch.put_entry("q", Bookmark("t", 0, offset), entry(offset))
    store.write(batch)
    seen = []
    for bm, state in store.entries("q"):
        seen.append(bm.offset)
        assert state.deliveries == bm.offset
        if bm.offset == 50:
            # Writing while an iteration is open must not block (no iterator is kept open).
            more = StoreBatch()
            more.put_entry("q", Bookmark("t", 0, 1000), entry(1000))
            store.write(more)
    assert seen == [*range(100), 1000]


def test_a_closed_store_refuses_to_work(store: KeyValueStore) -> None:
    store.close()
    store.close()  # idempotent
    with pytest.raises(StateError, match="closed"):
        store.write(StoreBatch())
    with pytest.raises(StateError, match="closed"):
        list(store.entries("q"))
    with pytest.raises(StateError, match="closed"):
        store.get_messages("q", [Bookmark("t", 0, 0)])


# -- RocksDB only --------------------------------------------------------------------------------


def test_reopen_keeps_everything(rocks_factory: StoreFactory) -> None:
    store = rocks_factory()
    batch = StoreBatch()
    batch.put_entry("q", Bookmark("t", 0, 1), entry(3))
    batch.put_low_water("q", TopicPartition("t", 0), 1)
    batch.put_read_position("q", TopicPartition("t", 0), 2)
    batch.put_message("q", Bookmark("t", 0, 1), message(1))
    batch.set_changelog_offset("cl", 0, 42)
    store.write(batch)
    half_read = store.messages("q")
    next(half_read)  # an abandoned iteration must not keep the database (and its lock) open
    store.close()
    again = rocks_factory()
    assert list(again.entries("q")) == [(Bookmark("t", 0, 1), entry(3))]
    assert again.positions("q") == {TopicPartition("t", 0): PartitionPosition(1, 2)}
    assert again.get_messages("q", [Bookmark("t", 0, 1)]) == [message(1)]
    assert again.changelog_offset("cl", 0) == 42


def test_reopen_keeps_the_cluster_id(rocks_factory: StoreFactory) -> None:
    store = rocks_factory()
    batch = StoreBatch()
    batch.set_cluster_id("cluster-a")
    store.write(batch)
    store.close()
    assert rocks_factory().cluster_id() == "cluster-a"


def test_discard_removes_the_rocksdb_files_and_nothing_else(
    rocks_factory: StoreFactory, tmp_path: Path
) -> None:
    store = rocks_factory()
    batch = StoreBatch()
    batch.put_entry("q", Bookmark("t", 0, 1), entry(3))
    batch.set_changelog_offset("cl", 0, 42)
    batch.set_cluster_id("cluster-a")
    store.write(batch)
    store.close()
    path = tmp_path / "state"
    (path / "notes.txt").write_text("the operator's")
    (path / "backup").mkdir()
    (path / "backup" / "000001.sst").write_bytes(b"not ours to judge")
    removed = discard_state_dir(path)
    assert "CURRENT" in removed and any(
        name.endswith(".sst") or name.endswith(".log") for name in removed
    )
    assert sorted(p.name for p in path.iterdir()) == ["LOCK", "backup", "notes.txt"]
    assert (path / "backup" / "000001.sst").exists()
    again = rocks_factory()
    assert again.cluster_id() is None and again.changelog_offsets() == {}
    assert list(again.entries("q")) == []


def test_discard_of_a_missing_dir_does_nothing_and_a_file_is_refused(tmp_path: Path) -> None:
    assert discard_state_dir(tmp_path / "never") == []
    assert not (tmp_path / "never").exists()
    (tmp_path / "file").write_text("x")
    with pytest.raises(StateError, match="not a directory"):
        discard_state_dir(tmp_path / "file")


def test_discard_refuses_a_state_dir_another_process_has_open(tmp_path: Path) -> None:
    path = tmp_path / "state"
    RocksDBStore(path).close()
    holder = _python(
        "import sys\n"
        "from layer.state import RocksDBStore\n"
        "store = RocksDBStore(sys.argv[1])\n"
        "print('open', flush=True)\n"
        "sys.stdin.read()\n",
        str(path),
        stdin=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "open"
        with pytest.raises(StateError, match="in use by another process") as info:
            discard_state_dir(path)
        assert str(path) in str(info.value)
        assert (path / "CURRENT").exists()
    finally:
        assert holder.stdin is not None and holder.stdout is not None
        holder.stdin.close()  # the holder reads to EOF, then exits and closes the store
        holder.wait(30)
        holder.stdout.close()
    assert "CURRENT" in discard_state_dir(path)  # once the holder is gone


def test_a_state_dir_in_use_raises_state_error_with_its_path(
    rocks_factory: StoreFactory, tmp_path: Path
) -> None:
    rocks_factory()
    path = tmp_path / "state"
    with pytest.raises(StateError, match="in use") as info:
        RocksDBStore(path)
    assert str(path) in str(info.value)
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from layer.state import RocksDBStore\n"
            "from layer.exceptions import StateError\n"
            "try:\n"
            "    RocksDBStore(sys.argv[1])\n"
            "except StateError as exc:\n"
            "    print(exc)\n",
            str(path),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == 0, child.stderr
    assert "in use" in child.stdout and str(path) in child.stdout


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from layer.codec import ChangeKind
    from layer.engine.model import Bookmark, TopicPartition
    from layer.state import EntryState, RocksDBStore, StoreBatch, StoredMessage

    # no flush by time: only the explicit one below, and the ones RocksDB makes when full
    store = RocksDBStore(sys.argv[1], flush_interval=3600)
    store._checkpoint_flush = None  # the flush is RocksDB's own, never the checkpoint fallback
    per_batch, flush_at = int(sys.argv[2]), int(sys.argv[3])
    # small enough that no memtable fills (8 MiB) before the kill: no flush but the explicit one
    payload = b"x" * 200
    i = 0
    while True:
        batch = StoreBatch()
        for j in range(per_batch):
            bm = Bookmark("t", j % 3, i * per_batch + j)
            batch.put_entry("q", bm, EntryState(ChangeKind.LEASED, i, 0, "s", None, None, i))
            batch.put_message("q", bm, StoredMessage(None, payload, (), i))
        batch.put_read_position("q", TopicPartition("t", 0), i + 1)
        batch.set_changelog_offset("cl", 0, i + 1)
        store.write(batch)
        if i == flush_at:
            store.flush()
        print(i, flush=True)
        i += 1
    """
)


def _reopened_at_one_whole_write(path: Path, per_batch: int) -> int:
    """The number of batches the killed writer's store holds, after checking that it holds
    exactly those: every column family at the same write, none in part."""
    store = RocksDBStore(path)
    try:
        written = store.changelog_offset("cl", 0)
        assert written is not None
        assert store.positions("q")[TopicPartition("t", 0)].read_position == written
        entries = list(store.entries("q"))
        assert len(entries) == written * per_batch
        for bm, state in entries:
            assert state.deliveries == bm.offset // per_batch < written
        messages = list(store.messages("q"))
        assert len(messages) == written * per_batch
        assert all(m.timestamp_ms == bm.offset // per_batch for bm, m in messages)
        store.wipe_queue("q")
        empty = StoreBatch()
        empty.set_changelog_offset("cl", 0, 0)
        store.write(empty)
        return written
    finally:
        store.close()


def test_sigkill_while_writing_reopens_at_the_last_flush_every_column_family_alike(
    rocks_factory: StoreFactory, tmp_path: Path
) -> None:
    """Writes skip the WAL: a killed store reopens at its last flush, every column family at
    the same write, none in part."""
    path = tmp_path / "state"
    per_batch = 100
    for round_ in range(3):
        flush_at = 20 + 11 * round_
        child = _python(_KILLED_WRITER, str(path), str(per_batch), str(flush_at))
        assert child.stdout is not None
        reported = -1
        deadline = time.monotonic() + 60
        # Kill at a different moment each round, always while batches are being written.
        while reported < 40 + 37 * round_ and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            reported = int(line)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        assert reported >= 40

        written = _reopened_at_one_whole_write(path, per_batch)
        # exactly what the explicit flush held: nothing later (no WAL), nothing in part
        assert written == flush_at + 1


_IDLE_WRITER = textwrap.dedent(
    """
    import logging
    import sys
    from layer.engine.model import Bookmark
    from layer.state import RocksDBStore, StoreBatch, StoredMessage

    logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(message)s")
    store = RocksDBStore(sys.argv[1], flush_interval=0.2)
    store._checkpoint_flush = None  # the flush is RocksDB's own, never the checkpoint fallback
    for i in range(5):
        batch = StoreBatch()
        batch.put_message("q", Bookmark("t", 0, i), StoredMessage(None, b"m%d" % i, (), i))
        batch.set_changelog_offset("cl", 0, i + 1)
        store.write(batch)
    print("written", flush=True)
    sys.stdin.read()
    """
)


def test_writes_are_flushed_within_the_interval_and_survive_a_sigkill(tmp_path: Path) -> None:
    """The flusher thread flushes within ``flush_interval`` of a write: a store killed after
    it had that long (here: once it logged its flush) reopens with everything."""
    path = tmp_path / "state"
    child = _python(_IDLE_WRITER, str(path), stdin=True)
    try:
        assert child.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (
            "written" in seen and any(line.startswith("flushed state store") for line in seen)
        ):
            line = child.stdout.readline()  # the child logs each write's flush and stays
            if not line:
                break
            if line.startswith("flushed state store") and "written" not in seen:
                continue  # a flush before the last write: not the one waited for
            seen.append(line.strip())
        assert any(line.startswith("flushed state store") for line in seen), seen
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.close()
        child.stdout.close()
    assert not (path / "flush.tmp").exists()
    with RocksDBStore(path) as store:
        assert store.changelog_offset("cl", 0) == 5
        got = dict(store.messages("q"))
        assert [got[Bookmark("t", 0, i)].value for i in range(5)] == [b"m%d" % i for i in range(5)]


def test_a_state_dir_written_before_the_flush_column_family_opens_with_its_data(
    tmp_path: Path,
) -> None:
    """A state directory of the six column families alone (as every coordinator wrote before
    ``flush`` had a column family of its own) opens, keeps what it held and flushes."""
    import rocksdict

    from layer.state.base import COLUMN_FAMILIES

    path = tmp_path / "state"
    with RocksDBStore(path) as store:
        batch = StoreBatch()
        batch.put_message("q", Bookmark("t", 0, 0), StoredMessage(None, b"m0", (), 0))
        batch.set_changelog_offset("cl", 0, 1)
        store.write(batch)
    # the same directory as the earlier format had it: without the flush column family
    opts = rocksdict.Options(raw_mode=True)
    families = (*COLUMN_FAMILIES, "flush")
    old = rocksdict.Rdict(
        str(path),
        options=opts,
        column_families={cf: rocksdict.Options(raw_mode=True) for cf in families},
    )
    old.drop_column_family("flush")
    old.close()
    assert "flush" not in rocksdict.Rdict.list_cf(str(path), opts)
    reopened = RocksDBStore(path, flush_interval=3600)
    try:
        assert reopened.changelog_offset("cl", 0) == 1
        assert dict(reopened.messages("q"))[Bookmark("t", 0, 0)].value == b"m0"
        batch = StoreBatch()
        batch.put_message("q", Bookmark("t", 0, 1), StoredMessage(None, b"m1", (), 1))
        batch.set_changelog_offset("cl", 0, 2)
        reopened.write(batch)
        reopened.flush()
    finally:
        reopened.close()
    with RocksDBStore(path) as store:
        assert store.changelog_offset("cl", 0) == 2
        assert len(list(store.messages("q"))) == 2


def test_writes_skip_the_write_ahead_log(tmp_path: Path) -> None:
    path = tmp_path / "state"
    with RocksDBStore(path, flush_interval=3600) as store:
        batch = StoreBatch()
        batch.put_message("q", Bookmark("t", 0, 0), StoredMessage(None, b"x" * 100_000, (), 0))
        store.write(batch)
        logs = list(path.glob("*.log"))
        assert logs and all(log.stat().st_size == 0 for log in logs)
        assert store.get_messages("q", [Bookmark("t", 0, 0)])[0] is not None


def test_a_closed_store_reopens_with_every_write(tmp_path: Path) -> None:
    """No WAL, no flush by time (an hour): close flushes what the memtables hold."""
    path = tmp_path / "state"
    store = RocksDBStore(path, flush_interval=3600)
    for i in range(3):
        batch = StoreBatch()
        batch.put_message("q", Bookmark("t", 0, i), StoredMessage(None, b"m%d" % i, (), i))
        batch.set_changelog_offset("cl", 0, i + 1)
        store.write(batch)
    store.close()
    with RocksDBStore(path) as again:
        assert again.changelog_offset("cl", 0) == 3
        assert len(list(again.messages("q"))) == 3


def test_message_meta_reads_order_fields_without_payloads(store: KeyValueStore) -> None:
    batch = StoreBatch()
    batch.put_message(
        "q", Bookmark("t", 1, 7), StoredMessage(b"k", b"v" * 100, (("h", b"x"),), 5, 9)
    )
    batch.put_message("q", Bookmark("t", 0, 3), StoredMessage(None, b"w", (), 6, None, "bad json"))
    batch.put_message(
        "q", Bookmark("t", 2, 0), StoredMessage(None, b"d", (("deliver_after", b"9.5"),), 7)
    )
    batch.put_message("other", Bookmark("t", 0, 1), StoredMessage(None, b"z", (), 1))
    store.write(batch)
    assert list(store.message_meta("q")) == [
        (Bookmark("t", 0, 3), 6, None, False),
        (Bookmark("t", 1, 7), 5, 9, False),
        (Bookmark("t", 2, 0), 7, None, True),
    ]


def test_messages_put_in_bulk_are_the_messages_put_one_by_one(store: KeyValueStore) -> None:
    """``put_messages_encoded`` (the bulk backlog read's): the same stored messages as
    ``put_message``, applied where the operation stands in the batch (a later delete wins)."""
    messages = {
        Bookmark("t", p, o): StoredMessage(
            None if o % 2 else b"k%d" % o, b'{"o": %d}' % o, (), 1_700_000_000_000 + o
        )
        for p in (0, 1)
        for o in range(5)
    }
    batch = StoreBatch()
    keys, values = batch.put_messages_encoded()
    for bm, message in messages.items():
        keys.append(message_key("q", bm))
        values.append(message.encode())
    batch.delete_message("q", Bookmark("t", 1, 4))
    store.write(batch)
    del messages[Bookmark("t", 1, 4)]
    assert dict(store.messages("q")) == messages
    assert store.get_messages("q", [Bookmark("t", 1, 4)]) == [None]


def test_writes_of_a_bulk_load_are_written(store: KeyValueStore) -> None:
    """``bulk_load`` (RocksDB: level-0 compaction put off, then its settings back) changes how
    the engine keeps its files, never what it stores."""
    with store.bulk_load():
        batch = StoreBatch()
        batch.put_message("q", Bookmark("t", 0, 1), message(1))
        store.write(batch)
    batch = StoreBatch()
    batch.put_message("q", Bookmark("t", 0, 2), message(2))
    store.write(batch)
    assert dict(store.messages("q")) == {
        Bookmark("t", 0, 1): message(1),
        Bookmark("t", 0, 2): message(2),
    }


def test_runs_of_one_value_put_and_delete_each_key_and_later_operations_win(
    store: KeyValueStore,
) -> None:
    tp = TopicPartition("t", 0)
    batch = StoreBatch()
    for offset in range(6):
        batch.put_message("q", Bookmark("t", 0, offset), StoredMessage(None, b"%d" % offset))
    batch.put_entry_values("q", tp, 0, 6, b"leased")
    batch.put_entry_value("q", Bookmark("t", 0, 2), b"returned")  # after the run: it wins
    batch.delete_messages("q", tp, 1, 3)
    store.write(batch)
    entries = dict(store.entry_values("q"))
    assert [entries[Bookmark("t", 0, o)] for o in range(6)] == [b"leased"] * 2 + [b"returned"] + [
        b"leased"
    ] * 3
    found = store.get_messages("q", [Bookmark("t", 0, o) for o in range(6)])
    assert [m.value if m else None for m in found] == [b"0", None, None, None, b"4", b"5"]
    batch = StoreBatch()
    batch.delete_entry_run("q", tp, 0, 4)
    batch.put_entry_value("q", Bookmark("t", 0, 3), b"again")  # after the deletes: it wins
    store.write(batch)
    assert dict(store.entry_values("q")) == {
        Bookmark("t", 0, 3): b"again",
        Bookmark("t", 0, 4): b"leased",
        Bookmark("t", 0, 5): b"leased",
    }


def test_entries_below_the_low_water_mark_are_not_read(store: KeyValueStore) -> None:
    # the live path leaves the entries a mark passed in the store until one range delete
    # (layer.coordinator.records.ENTRY_SWEEP): a reader never takes them
    tp, other = TopicPartition("a", 0), TopicPartition("a", 1)
    batch = StoreBatch()
    batch.put_entry_values("q", tp, 0, 6, entry(1).encode())
    batch.put_entry_values("q", other, 0, 2, entry(1).encode())
    batch.put_low_water("q", tp, 4)
    store.write(batch)
    assert [bm for bm, _ in store.entries("q")] == [
        Bookmark("a", 0, 4),
        Bookmark("a", 0, 5),
        Bookmark("a", 1, 0),
        Bookmark("a", 1, 1),
    ]


def test_a_position_tombstone_deletes_the_entries_its_mark_hid(store: KeyValueStore) -> None:
    # as the live path leaves them: entries below the mark, not deleted yet
    tp = TopicPartition("a", 0)
    batch = StoreBatch()
    batch.put_entry_values("q", tp, 0, 6, entry(1).encode())
    batch.put_low_water("q", tp, 4)
    store.write(batch)
    assert [bm.offset for bm, _ in store.entries("q")] == [4, 5]
    key, _value = encode_change("q", LowWater(tp, 4))
    batch = StoreBatch()
    # replayed from the changelog, the mark goes: what it hid must not come back
    _Restorer(store, "changelog", None).apply(batch, key, None, 0, 1)
    store.write(batch)
    assert tp not in store.positions("q")
    assert [bm.offset for bm, _ in store.entries("q")] == [4, 5]
