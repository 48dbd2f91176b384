"""The coordinator's durable state: what it holds, how it is keyed, and the ``Store`` interface.

A store holds, for every queue of one coordinator:

- **entries**: per message (bookmark), the latest changelog value (the changelog reduced
  last-value-wins; a Forget deletes it); none below its partition's low-water mark is read
  (the live path deletes those in one range now and then, not each as the mark passes it);
- **positions**: per underlying partition, the low-water mark (from changelog POSITION records)
  and, separately, the local read position (next offset to read; never in the changelog);
- **messages**: per message, the local copy of the underlying message while it is in the queue;
- **blobs**: the local copies of a run of plain messages as one value, keyed by the run's last
  offset (``layer.state.blobs``: written by the short way of the live admission, read with one
  get per blob; a message is kept in one of the two forms, and a reader looks in both);
- **runs**: per queue whose messages are kept as runs (``layer.engine.runs``), the offsets,
  timestamps and priority of every batch of messages admitted (a run record, keyed by its last
  offset), so a restart rebuilds the runs without reading every message; and a marker saying
  the records cover every stored message of the queue (without it, a restart scans them);
- **meta**: per changelog topic-partition, the next changelog offset to replay from, and the id of
  the Kafka cluster the state was built from (so a state directory that meets another cluster, or
  a broker that lost its changelog, is recognised: ``layer.state.ownership``).

Engines keep these as six column families of binary keys that sort like the data:
``queue utf8, 0x00, topic utf8, 0x00, partition u32 BE, offset u64 BE``, so one queue, and one
partition of it, iterate in offset order. Values are the codec's bytes (entries are changelog
values exactly as produced, messages are ``StoredMessage`` records, blobs are
``layer.state.blobs`` values keyed by their last offset).

Everything one coordinator step changes goes into one ``StoreBatch`` and is applied by one
``Store.write`` atomically, together with the changelog offset it corresponds to.
"""

from __future__ import annotations

import contextlib
import heapq
import struct
import threading
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from typing import Any, NamedTuple, Protocol, runtime_checkable

from layer import avro_fast, codec
from layer.codec import CHANGELOG_VALUE, STORED_MESSAGE, ChangeKind
from layer.engine.model import Bookmark, TopicPartition
from layer.exceptions import SerializationError, StateError
from layer.state.blobs import Blob, encode_blob

__all__ = [
    "BLOBS",
    "ENTRIES",
    "MESSAGES",
    "META",
    "POSITIONS",
    "RUNS",
    "RunRecord",
    "EntryState",
    "PartitionPosition",
    "Store",
    "StoreBatch",
    "StoredMessage",
    "message_key",
    "run_keys",
]

# Column families.
ENTRIES = "entries"
POSITIONS = "positions"
MESSAGES = "messages"
META = "meta"
RUNS = "runs"
BLOBS = "blobs"
COLUMN_FAMILIES = (ENTRIES, POSITIONS, MESSAGES, META, RUNS, BLOBS)

# Suffix of a positions key: which of the two positions of a partition it holds.
_LOW_WATER = b"L"
_READ_POSITION = b"R"
_CHANGELOG_OFFSET = b"changelog\x00"
_CLUSTER_ID = b"cluster_id"  # never a prefix of a changelog offset key, nor the other way round

_DELAY_HINT = b"deliver_after"  # the header a delayed message carries (message_meta)
# the parse error an unparseable message carries ("unparseable json: ...", layer.documents)
_ERROR_HINT = b"unparseable "
_PARTITION = struct.Struct(">I")
_OFFSET = struct.Struct(">Q")
_SIGNED = struct.Struct(">q")
_PARTITION_OFFSET = struct.Struct(">IQ")
_RUN_HEAD = struct.Struct(">QBBq")  # start offset, whole, has priority, priority


class RunRecord(NamedTuple):
    """Messages admitted together at consecutive offsets of one partition: their timestamps
    (engine clock seconds) and priority. ``whole``: they are not plain (delayed, keyed): a
    restart reads them whole."""

    partition: TopicPartition
    start: int
    times: array[float]
    priority: int | None
    whole: bool


def encode_run(start: int, times: array[float], priority: int | None, whole: bool) -> bytes:
    head = _RUN_HEAD.pack(start, whole, priority is not None, priority or 0)
    return head + times.tobytes()


def decode_run(partition: TopicPartition, value: bytes) -> RunRecord:
    start, whole, has_priority, priority = _RUN_HEAD.unpack_from(value)
    times = array("d")
    times.frombytes(value[_RUN_HEAD.size :])
    return RunRecord(partition, start, times, priority if has_priority else None, bool(whole))


@dataclass(frozen=True, slots=True)
class EntryState:
    """The latest durable state of one message in a queue (a decoded changelog value)."""

    kind: ChangeKind
    deliveries: int
    cancels: int
    holder: str | None = None
    lease_deadline_ms: int | None = None
    reason: str | None = None
    at_ms: int = 0

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> EntryState:
        return cls(
            ChangeKind(value["kind"]),
            value["deliveries"],
            value["cancels"],
            value["holder"],
            value["lease_deadline_ms"],
            value["reason"],
            value["at_ms"],
        )

    def encode(self) -> bytes:
        return codec.encode_value(
            self.kind,
            deliveries=self.deliveries,
            cancels=self.cancels,
            holder=self.holder,
            lease_deadline_ms=self.lease_deadline_ms,
            reason=self.reason,
            at_ms=self.at_ms,
        )


class PartitionPosition(NamedTuple):
    """Where a queue stands in one underlying partition (None: not known yet)."""

    low_water: int | None
    read_position: int | None


# Built per message: not frozen (a frozen __init__ costs ~6x), and never mutated.
@dataclass(slots=True, unsafe_hash=True)
class StoredMessage:
    """The local copy of an underlying message while it is in the queue."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int = 0
    priority: int | None = None
    error: str | None = None  # why the message could not be parsed, if it could not

    def encode(self) -> bytes:
        # the hot path: hand-written, byte-identical to codec.encode(STORED_MESSAGE, ...)
        try:
            return avro_fast.stored_message(
                self.key, self.value, self.headers, self.timestamp_ms, self.priority, self.error
            )
        except (TypeError, ValueError, AttributeError) as exc:
            raise SerializationError(f"schema {STORED_MESSAGE!r}: cannot encode: {exc!r}") from exc

    @classmethod
    def decode(cls, data: bytes) -> StoredMessage:
        if data[:1] == b"\x01" and avro_fast.STORED_MESSAGE_VERSION == 1:
            return cls(*avro_fast.read_stored_message(data))
        obj = codec.decode(STORED_MESSAGE, data)  # an older version, or bad data: full check
        return cls(
            obj["key"],
            obj["value"],
            tuple((h["key"], h["value"]) for h in obj["headers"]),
            obj["timestamp_ms"],
            obj["priority"],
            obj["error"],
        )


def _first(item: tuple[Any, ...]) -> Bookmark:
    bookmark: Bookmark = item[0]
    return bookmark


def decode_entry(data: bytes) -> EntryState:
    return EntryState.from_value(codec.decode(CHANGELOG_VALUE, data))


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def queue_prefix(queue: str) -> bytes:
    if not queue or "\x00" in queue:
        raise StateError(f"queue name {queue!r} is empty or contains NUL")
    return queue.encode() + b"\x00"


@lru_cache(maxsize=65536)
def partition_prefix(queue: str, topic: str, partition: int) -> bytes:
    if not topic or "\x00" in topic:
        raise StateError(f"topic name {topic!r} is empty or contains NUL")
    return queue_prefix(queue) + topic.encode() + b"\x00" + _PARTITION.pack(partition)


def message_key(queue: str, bookmark: Bookmark) -> bytes:
    if bookmark.offset < 0 or bookmark.partition < 0:
        raise StateError(f"bookmark {bookmark} has a negative partition or offset")
    # Cached: a coordinator writes keys of few (queue, topic, partition) triples, many times.
    return partition_prefix(queue, bookmark.topic, bookmark.partition) + _OFFSET.pack(
        bookmark.offset
    )


def _run_prefix(queue: str, partition: TopicPartition, first: int) -> bytes:
    if first < 0 or partition.partition < 0:
        raise StateError(f"run {partition.topic}/{partition.partition}/{first} is negative")
    return partition_prefix(queue, partition.topic, partition.partition)


def _run_keys(queue: str, partition: TopicPartition, first: int, count: int) -> list[bytes]:
    """The keys of ``count`` messages of one partition from offset ``first``."""
    prefix = _run_prefix(queue, partition, first)
    return [prefix + key for key in map(_OFFSET.pack, range(first, first + count))]


def run_keys(queue: str, bookmark: Bookmark, count: int) -> list[bytes]:
    """The keys (``message_key``) of ``count`` messages from ``bookmark`` on."""
    if bookmark.offset < 0 or bookmark.partition < 0:
        raise StateError(f"bookmark {bookmark} has a negative partition or offset")
    prefix = partition_prefix(queue, bookmark.topic, bookmark.partition)
    first = bookmark.offset
    return [prefix + key for key in map(_OFFSET.pack, range(first, first + count))]


def parse_message_key(key: bytes, prefix_len: int) -> Bookmark:
    """The bookmark of a key whose first ``prefix_len`` bytes are the queue prefix."""
    end = key.index(b"\x00", prefix_len)
    partition, offset = _PARTITION_OFFSET.unpack_from(key, end + 1)
    return Bookmark(key[prefix_len:end].decode(), partition, offset)


def changelog_offset_key(topic: str, partition: int) -> bytes:
    return _CHANGELOG_OFFSET + topic.encode() + b"\x00" + _PARTITION.pack(partition)


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key that starts with ``prefix``."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        raise ValueError("a prefix of only 0xff bytes has no upper bound")
    return trimmed[:-1] + bytes((trimmed[-1] + 1,))


#: ``pack_offset(offset)``: the 8-byte big-endian suffix of a message key (offsets are never
#: negative); the struct's own method, as it is called once per message on the bulk paths
pack_offset: Callable[[int], bytes] = _OFFSET.pack


def pack_int(value: int) -> bytes:
    return _SIGNED.pack(value)


def unpack_int(data: bytes) -> int:
    value: int = _SIGNED.unpack(data)[0]
    return value


# ---------------------------------------------------------------------------------------------
# Batch and interface
# ---------------------------------------------------------------------------------------------

#: One write operation: (column family, key, value); value None deletes the key, an
#: operation whose value is a ``_Range`` deletes every key from ``key`` (inclusive) to its end,
#: one whose value is a ``_Many`` puts its keys, and one whose value is an ``_Each`` puts its
#: value under (or deletes) each of its keys (``key`` is unused for both).
Op = tuple[str, bytes, "bytes | _Range | _Many | _Each | None"]


class _Range(NamedTuple):
    end: bytes


class _Many(NamedTuple):
    """Puts of many keys of one column family as two lists: a bulk reader's, with no object
    per key (``StoreBatch.put_messages_encoded``)."""

    keys: list[bytes]
    values: list[bytes]


class _Each(NamedTuple):
    """One value put under each of many keys of one column family, or (None) each deleted: a
    run of changes with one changelog value (``put_entry_values``, ``delete_messages``,
    ``delete_entry_run``) is one operation, not one per message. Keys, not a range delete:
    point deletes keep the column family free of range tombstones, which slow its reads."""

    keys: list[bytes]
    value: bytes | None


class StoreBatch:
    """The changes of one step, applied atomically by ``Store.write``.

    Values are encoded when added, so a batch that cannot be encoded fails while it is built and
    never half-applies. Later operations on the same key win, as in RocksDB.
    """

    __slots__ = ("ops",)

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def __len__(self) -> int:
        return len(self.ops)

    def __bool__(self) -> bool:
        return bool(self.ops)

    def put_entry(self, queue: str, bookmark: Bookmark, state: EntryState) -> None:
        self.ops.append((ENTRIES, message_key(queue, bookmark), state.encode()))

    def put_entry_value(self, queue: str, bookmark: Bookmark, value: bytes) -> None:
        """Put an entry as changelog value bytes (as ``codec.encode_change`` made them)."""
        self.ops.append((ENTRIES, message_key(queue, bookmark), bytes(value)))

    def put_entry_values(
        self, queue: str, partition: TopicPartition, first: int, count: int, value: bytes
    ) -> None:
        """``put_entry_value`` of one value for the offsets ``first .. first + count - 1`` (a
        run of changes with one changelog record): the key prefix is made once."""
        self.ops.append((ENTRIES, b"", _Each(_run_keys(queue, partition, first, count), value)))

    def put_entry_values_encoded(self) -> tuple[list[bytes], list[bytes]]:
        """Two lists to fill with entry keys (``message_key``, ``run_keys``) and their values
        (changelog value bytes) in step: they are put where this operation stands in the
        batch. For a round's changes (``layer.coordinator.round``): one operation for all of
        them, not one per run."""
        many = _Many([], [])
        self.ops.append((ENTRIES, b"", many))
        return many

    def delete_messages_encoded(self) -> list[bytes]:
        """A list to fill with message keys (``message_key``, ``run_keys``): each deleted where
        this operation stands in the batch."""
        each = _Each([], None)
        self.ops.append((MESSAGES, b"", each))
        return each.keys

    def delete_messages(
        self, queue: str, partition: TopicPartition, first: int, count: int
    ) -> None:
        """``delete_message`` of the offsets ``first .. first + count - 1``."""
        self.ops.append((MESSAGES, b"", _Each(_run_keys(queue, partition, first, count), None)))

    def delete_entry_run(
        self, queue: str, partition: TopicPartition, first: int, count: int
    ) -> None:
        """``delete_entry`` of the offsets ``first .. first + count - 1`` (the tombstones of a
        run the low-water mark passed)."""
        self.ops.append((ENTRIES, b"", _Each(_run_keys(queue, partition, first, count), None)))

    def delete_entry(self, queue: str, bookmark: Bookmark) -> None:
        self.ops.append((ENTRIES, message_key(queue, bookmark), None))

    def delete_entries(self, queue: str, partition: TopicPartition, start: int, end: int) -> None:
        """Delete the entries of one partition with offsets ``start <= offset < end``."""
        prefix = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((ENTRIES, prefix + _OFFSET.pack(start), _Range(prefix + _OFFSET.pack(end))))

    def delete_entries_below(self, queue: str, partition: TopicPartition, offset: int) -> None:
        """Delete the entries of one partition with offsets below ``offset`` (a low-water mark)."""
        prefix = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((ENTRIES, prefix, _Range(prefix + _OFFSET.pack(max(offset, 0)))))

    def put_low_water(self, queue: str, partition: TopicPartition, offset: int) -> None:
        key = partition_prefix(queue, partition.topic, partition.partition) + _LOW_WATER
        self.ops.append((POSITIONS, key, pack_int(offset)))

    def delete_low_water(self, queue: str, partition: TopicPartition) -> None:
        key = partition_prefix(queue, partition.topic, partition.partition) + _LOW_WATER
        self.ops.append((POSITIONS, key, None))

    def put_read_position(self, queue: str, partition: TopicPartition, offset: int) -> None:
        key = partition_prefix(queue, partition.topic, partition.partition) + _READ_POSITION
        self.ops.append((POSITIONS, key, pack_int(offset)))

    def put_message(self, queue: str, bookmark: Bookmark, message: StoredMessage) -> None:
        self.ops.append((MESSAGES, message_key(queue, bookmark), message.encode()))

    def put_messages_encoded(self) -> tuple[list[bytes], list[bytes]]:
        """Two lists to fill with message keys (``message_key``) and their stored records
        (``StoredMessage.encode`` or ``avro_fast``) in step: they are put where this operation
        stands in the batch. For a bulk reader (``layer.coordinator.backlog``): no operation,
        nor tuple, per message."""
        many = _Many([], [])
        self.ops.append((MESSAGES, b"", many))
        return many

    def delete_message(self, queue: str, bookmark: Bookmark) -> None:
        self.ops.append((MESSAGES, message_key(queue, bookmark), None))

    def delete_messages_below(self, queue: str, partition: TopicPartition, offset: int) -> None:
        """Delete the local copies of one partition's messages below ``offset``."""
        prefix = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((MESSAGES, prefix, _Range(prefix + _OFFSET.pack(max(offset, 0)))))

    def put_run(
        self,
        queue: str,
        partition: TopicPartition,
        start: int,
        times: array[float],
        priority: int | None,
        whole: bool = False,
    ) -> None:
        """A run record (see ``RunRecord``) for the offsets ``start .. start + len(times) - 1``."""
        last = message_key(queue, Bookmark(partition.topic, partition.partition, start))
        last = last[: -_OFFSET.size] + _OFFSET.pack(start + len(times) - 1)
        self.ops.append((RUNS, last, encode_run(start, times, priority, whole)))

    def put_blob(
        self,
        queue: str,
        partition: TopicPartition,
        offsets: list[int],
        keys: list[bytes | None],
        values: list[bytes | None],
        times_ms: list[int],
    ) -> None:
        """The local copies of plain messages (no headers, priority nor error) of one
        partition at ``offsets`` (ascending), as one blob (``layer.state.blobs``)."""
        value = encode_blob(offsets, keys, values, times_ms)
        key = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((BLOBS, key + _OFFSET.pack(offsets[-1]), value))

    def delete_blob(self, queue: str, partition: TopicPartition, last: int) -> None:
        """Delete the blob of one partition whose last offset is ``last``."""
        key = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((BLOBS, key + _OFFSET.pack(last), None))

    def delete_blobs_below(self, queue: str, partition: TopicPartition, offset: int) -> None:
        """Delete the blobs of one partition whose offsets are all below ``offset`` (a range
        delete: for a restore, not for every low-water mark, as range tombstones slow the
        seeks of reads in a column family until it compacts: ``QueueRuntime.blobs_below``)."""
        prefix = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((BLOBS, prefix, _Range(prefix + _OFFSET.pack(max(offset, 0)))))

    def delete_runs_below(self, queue: str, partition: TopicPartition, offset: int) -> None:
        """Delete the run records of one partition whose offsets are all below ``offset``."""
        prefix = partition_prefix(queue, partition.topic, partition.partition)
        self.ops.append((RUNS, prefix, _Range(prefix + _OFFSET.pack(max(offset, 0)))))

    def put_runs_complete(self, queue: str) -> None:
        """The run records of ``queue`` cover every message stored for it."""
        self.ops.append((RUNS, queue_prefix(queue) + b"\x00", b""))

    def delete_runs(self, queue: str) -> None:
        """Drop every run record of ``queue`` (and the marker)."""
        prefix = queue_prefix(queue)
        self.ops.append((RUNS, prefix, _Range(prefix_end(prefix))))

    def set_changelog_offset(self, topic: str, partition: int, offset: int) -> None:
        """Record that the changelog partition is applied up to ``offset`` (the next to read)."""
        self.ops.append((META, changelog_offset_key(topic, partition), pack_int(offset)))

    def set_cluster_id(self, cluster_id: str) -> None:
        """Record the id of the Kafka cluster whose changelog the state reflects."""
        if not cluster_id:
            raise StateError("a cluster id cannot be empty")
        self.ops.append((META, _CLUSTER_ID, cluster_id.encode()))


@runtime_checkable
class Store(Protocol):
    """One coordinator's state. Reads see every completed ``write``; writes are atomic."""

    def write(self, batch: StoreBatch) -> None: ...

    def entries(self, queue: str) -> Iterator[tuple[Bookmark, EntryState]]:
        """The queue's entries at or above their partition's low-water mark, in key order."""
        ...

    def entry_values(
        self, queue: str, below: Mapping[TopicPartition, int] | None = None
    ) -> Iterator[tuple[Bookmark, bytes]]:
        """The queue's entries as stored (changelog value bytes), in key order; a partition's
        entries below its offset in ``below`` are left out without being read."""
        ...

    def positions(self, queue: str) -> dict[TopicPartition, PartitionPosition]: ...

    def messages(
        self, queue: str, start: Bookmark | None = None
    ) -> Iterator[tuple[Bookmark, StoredMessage]]: ...

    def message_meta(self, queue: str) -> Iterator[tuple[Bookmark, int, int | None, bool]]:
        """``(bookmark, timestamp_ms, priority, maybe_delayed)`` of every stored message, in
        bookmark order, without decoding payloads (a restart rebuilds the queue from these).
        ``maybe_delayed``: the raw record mentions a ``deliver_after`` header or a parse error
        (``unparseable ...``), so the caller should read that message whole."""
        ...

    def get_messages(
        self, queue: str, bookmarks: Sequence[Bookmark]
    ) -> list[StoredMessage | None]: ...

    def runs(self, queue: str) -> list[RunRecord] | None:
        """The run records of ``queue`` in offset order per partition; None when they do not
        cover every stored message (no marker: see ``StoreBatch.put_runs_complete``)."""
        ...

    def changelog_offset(self, topic: str, partition: int) -> int | None: ...

    def changelog_offsets(self) -> dict[tuple[str, int], int]:
        """Every stored changelog offset, by (changelog topic, partition)."""
        ...

    def cluster_id(self) -> str | None:
        """The Kafka cluster id the state was built from (None: not recorded yet)."""
        ...

    def queues(self) -> set[str]: ...

    def wipe_queue(self, queue: str) -> None: ...

    def bulk_load(self) -> contextlib.AbstractContextManager[None]:
        """Within it, writes are a bulk load (a restore's backlog read): the engine may put
        its upkeep off until the end (RocksDB: compactions of the messages)."""
        ...

    def close(self) -> None: ...


#: the shortest run of a dense blob read in one pass (shorter ones: message by message)
_RUN_MIN = 4


def _run_length(items: list[Any], at: int, most: int) -> int:
    """How many of ``items[at : at + most]`` follow ``items[at]`` one by one: bookmarks of
    its partition at its offset + 1, + 2, ... (or offsets: + 1, + 2, ...). At least 1; it
    gallops (1, 4, 16, ...: fewer probes than doubling, 0.06 against 0.08 µs a message of a
    run of 100), so it may stop short of the longest such run (the rest is looked at again),
    and costs no more than four times what it finds: never quadratic."""
    first = items[at]
    if isinstance(first, tuple):
        topic, partition, offset = first
        good = 1
        while good < most:
            size = min(good * 4, most)
            probe = [(topic, partition, o) for o in range(offset + good, offset + size)]
            if items[at + good : at + size] != probe:
                break
            good = size
        return good
    good = 1
    while good < most:
        size = min(good * 4, most)
        if items[at + good : at + size] != list(range(first + good, first + size)):
            break
        good = size
    return good


def _stored_run(blob: Blob, i: int, k: int) -> list[StoredMessage]:
    """The messages at the positions ``i .. i + k - 1`` of ``blob``."""
    keys, values, times = blob.run(i, i + k)
    return list(map(StoredMessage, keys, values, repeat((), k), times))


class KeyValueStore:
    """The ``Store`` reads and writes over a small byte-level key-value engine.

    Engines implement ``_apply`` (one atomic list of operations), ``_get``, ``_multi_get`` and
    ``_scan`` (keys in order within [start, end)), ``_first_key_at_or_after`` and ``_close``.
    """

    _PAGE = 1024
    #: decoded blobs kept (the last read or written): a delivery takes a few messages of a
    #: blob at a time, and must not read and decode the whole blob again for each
    _BLOB_CACHE = 32

    def __init__(self) -> None:
        self._closed = False
        # blob key -> decoded blob, least recently used first
        self._blobs: dict[bytes, Blob] = {}
        # per queue: whether it may have blobs (a queue with none is read in one multi_get)
        self._has_blobs: dict[str, bool] = {}
        # both are shared by the event loop and a restore's thread (``asyncio.to_thread``)
        self._blob_lock = threading.Lock()

    # -- engine primitives ----------------------------------------------------------------

    def _apply(self, ops: Sequence[Op]) -> None:
        raise NotImplementedError

    def _get(self, cf: str, key: bytes) -> bytes | None:
        raise NotImplementedError

    def _multi_get(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        raise NotImplementedError

    def _scan(self, cf: str, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        raise NotImplementedError

    def _first_key_at_or_after(self, cf: str, key: bytes) -> bytes | None:
        raise NotImplementedError

    def _close(self) -> None:
        raise NotImplementedError

    # -- Store ----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(f"{self} is closed")

    def write(self, batch: StoreBatch) -> None:
        self._check_open()
        if batch.ops:
            for cf, key, value in batch.ops:
                if cf == BLOBS:
                    self._blobs_changed(key, value)
            self._apply(batch.ops)

    def _blobs_changed(self, key: bytes, value: object) -> None:
        """Keep the blob cache and the queues' flags true to a write of BLOBS."""
        with self._blob_lock:
            if isinstance(value, _Range):
                for cached in [k for k in self._blobs if key <= k < value.end]:
                    del self._blobs[cached]
            elif isinstance(value, bytes | type(None)):
                self._blobs.pop(key, None)
                if value is not None:
                    self._has_blobs[key[: key.index(b"\x00")].decode()] = True

    def _queue_has_blobs(self, queue: str) -> bool:
        has = self._has_blobs.get(queue)
        if has is None:
            prefix = queue_prefix(queue)
            first = self._first_key_at_or_after(BLOBS, prefix)
            has = self._has_blobs[queue] = first is not None and first.startswith(prefix)
        return has

    def _blob(self, key: bytes, value: bytes) -> Blob:
        """The decoded blob of this key and value, cached."""
        cache = self._blobs
        with self._blob_lock:
            blob = cache.pop(key, None)
        if blob is None:
            blob = Blob(value)
        with self._blob_lock:
            while len(cache) >= self._BLOB_CACHE:
                del cache[next(iter(cache))]
            cache[key] = blob
        return blob

    def _from_blobs(
        self, queue: str, bookmarks: Sequence[Bookmark], out: list[StoredMessage | None]
    ) -> list[int]:
        """Fill ``out`` with the messages of ``bookmarks`` found in blobs: first the cached
        blobs, then one seek per blob not cached; returns the positions not found."""
        cache = self._blobs
        # per partition prefix: its cached blobs
        cached: dict[bytes, list[tuple[bytes, Blob]]] = {}
        with self._blob_lock:
            items = list(cache.items())
        for key, one in items:
            cached.setdefault(key[: -_OFFSET.size], []).append((key, one))
        rest: dict[bytes, list[tuple[int, int]]] = {}  # prefix -> [(offset, position)]
        # per partition (deliveries interleave them): [topic, prefix, the blob last used]
        at: dict[int, list[Any]] = {}
        if not isinstance(bookmarks, list):
            bookmarks = list(bookmarks)
        count = len(bookmarks)
        n = -1
        while n + 1 < count:
            n += 1
            topic, partition, offset = bookmarks[n]
            state = at.get(partition)
            if state is None or state[0] != topic:
                state = at[partition] = [topic, partition_prefix(queue, topic, partition), None]
            blob: Blob | None = state[2]
            i = -1
            if blob is not None and blob.first <= offset <= blob.last:
                i = blob.index(offset)
            if i < 0:
                prefix = state[1]
                for key, candidate in cached.get(prefix, ()):
                    if candidate.first <= offset <= candidate.last:
                        i = candidate.index(offset)
                        if i >= 0:
                            blob = state[2] = candidate
                            with self._blob_lock:
                                cache.pop(key, None)
                                cache[key] = candidate  # used: the last to go
                            break
                if i < 0:
                    rest.setdefault(prefix, []).append((offset, n))
                    continue
            assert blob is not None
            if blob.dense:
                k = _run_length(bookmarks, n, min(count - n, len(blob) - i))
                if k >= _RUN_MIN:  # a run of the blob: its messages in one pass
                    out[n : n + k] = _stored_run(blob, i, k)
                    n += k - 1
                    continue
            out[n] = StoredMessage(blob.key(i), blob.value(i), (), blob.times[i])
        missing: list[int] = []
        for prefix, wanted in rest.items():
            wanted.sort()
            end = prefix_end(prefix)
            seen: Blob | None = None
            exhausted = False
            offsets: list[int] | None = None  # of wanted, once a run is looked for
            w = -1
            while w + 1 < len(wanted):
                w += 1
                offset, n = wanted[w]
                if seen is None or offset > seen.last:
                    if exhausted:
                        missing.append(n)
                        continue
                    start = prefix + _OFFSET.pack(offset)
                    page = self._scan(BLOBS, start, end, 1)
                    if not page:
                        exhausted = True  # no blob of the partition from here on
                        missing.append(n)
                        continue
                    seen = self._blob(*page[0])
                i = seen.index(offset)
                if i < 0:  # before the blob, or in a gap of it: not in a blob
                    missing.append(n)
                    continue
                if seen.dense:
                    if offsets is None:
                        offsets = [o for o, _n in wanted]
                    k = _run_length(offsets, w, min(len(wanted) - w, len(seen) - i))
                    if k >= _RUN_MIN:
                        run = zip(wanted[w : w + k], _stored_run(seen, i, k), strict=True)
                        for (_o, at_n), stored in run:
                            out[at_n] = stored
                        w += k - 1
                        continue
                out[n] = StoredMessage(seen.key(i), seen.value(i), (), seen.times[i])
        return missing

    def _blob_items(self, queue: str, first: bytes) -> Iterator[tuple[Bookmark, Blob, int]]:
        """Every message of the queue's blobs from the key ``first`` on: (bookmark, its blob,
        its position there), in bookmark order."""
        prefix = queue_prefix(queue)
        n = len(prefix)
        start = first if len(first) > n else prefix
        for key, value in self._iterate(BLOBS, start, prefix_end(prefix)):
            last = parse_message_key(key, n)
            blob = Blob(value)
            low = 0
            if len(first) > n and key[: -_OFFSET.size] == first[: -_OFFSET.size]:
                low = bisect_left(blob.offsets, _OFFSET.unpack(first[-_OFFSET.size :])[0])
            for i in range(low, len(blob)):
                yield Bookmark(last.topic, last.partition, blob.offsets[i]), blob, i

    def _iterate(self, cf: str, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        # Pages, so that no engine iterator outlives one call: a reader that stops half-way
        # never pins the engine (RocksDB keeps its lock while an iterator is alive).
        while True:
            self._check_open()
            page = self._scan(cf, start, end, self._PAGE)
            yield from page
            if len(page) < self._PAGE:
                return
            start = page[-1][0] + b"\x00"

    def entry_values(
        self, queue: str, below: Mapping[TopicPartition, int] | None = None
    ) -> Iterator[tuple[Bookmark, bytes]]:
        """The queue's entries as stored: their changelog value bytes, in key order (by topic,
        partition and offset). A partition's entries below its offset in ``below`` (its
        low-water mark) are skipped by seeking past them: the keys deleted there (one per
        message the mark passed) are never stepped over."""
        self._check_open()
        prefix = queue_prefix(queue)
        n = len(prefix)
        ranges: list[tuple[bytes, bytes]] = []
        start = prefix
        skips = sorted(
            (partition_prefix(queue, tp.topic, tp.partition), offset)
            for tp, offset in (below or {}).items()
        )
        for part, offset in skips:
            ranges.append((start, part))
            start = part + _OFFSET.pack(max(offset, 0))
        ranges.append((start, prefix_end(prefix)))
        for lo, hi in ranges:
            if lo < hi:
                for key, value in self._iterate(ENTRIES, lo, hi):
                    yield parse_message_key(key, n), value

    def entries(self, queue: str) -> Iterator[tuple[Bookmark, EntryState]]:
        """The queue's entries at or above their partition's low-water mark: those below it
        are of messages the mark passed, deleted or (the live path deletes them in one range
        now and then: ``layer.coordinator.records.ENTRY_SWEEP``) about to be."""
        self._check_open()
        marks = {
            tp: pos.low_water
            for tp, pos in self.positions(queue).items()
            if pos.low_water is not None
        }
        for bookmark, value in self.entry_values(queue, below=marks):
            yield bookmark, decode_entry(value)

    def positions(self, queue: str) -> dict[TopicPartition, PartitionPosition]:
        self._check_open()
        prefix = queue_prefix(queue)
        n = len(prefix)
        found: dict[TopicPartition, dict[bytes, int]] = {}
        for key, value in self._iterate(POSITIONS, prefix, prefix_end(prefix)):
            end = key.index(b"\x00", n)
            tp = TopicPartition(key[n:end].decode(), _PARTITION.unpack_from(key, end + 1)[0])
            found.setdefault(tp, {})[key[-1:]] = unpack_int(value)
        return {
            tp: PartitionPosition(kinds.get(_LOW_WATER), kinds.get(_READ_POSITION))
            for tp, kinds in found.items()
        }

    def messages(
        self, queue: str, start: Bookmark | None = None
    ) -> Iterator[tuple[Bookmark, StoredMessage]]:
        self._check_open()
        prefix = queue_prefix(queue)
        n = len(prefix)
        first = prefix if start is None else message_key(queue, start)
        singles = (
            (parse_message_key(key, n), StoredMessage.decode(value))
            for key, value in self._iterate(MESSAGES, first, prefix_end(prefix))
        )
        if not self._queue_has_blobs(queue):
            yield from singles
            return
        in_blobs = (
            (bm, StoredMessage(blob.key(i), blob.value(i), (), blob.times[i]))
            for bm, blob, i in self._blob_items(queue, first)
        )
        yield from heapq.merge(singles, in_blobs, key=_first)

    def message_meta(self, queue: str) -> Iterator[tuple[Bookmark, int, int | None, bool]]:
        self._check_open()
        if not self._queue_has_blobs(queue):
            yield from self._single_meta(queue)
            return
        in_blobs = (
            (bm, blob.times[i], None, False) for bm, blob, i in self._blob_items(queue, b"")
        )
        yield from heapq.merge(self._single_meta(queue), in_blobs, key=_first)

    def _single_meta(self, queue: str) -> Iterator[tuple[Bookmark, int, int | None, bool]]:
        prefix = queue_prefix(queue)
        n = len(prefix)
        for key, value in self._iterate(MESSAGES, prefix, prefix_end(prefix)):
            if value[:1] == b"\x01" and avro_fast.STORED_MESSAGE_VERSION == 1:
                timestamp_ms, priority = avro_fast.read_stored_meta(value)
            else:
                stored = StoredMessage.decode(value)
                timestamp_ms, priority = stored.timestamp_ms, stored.priority
            whole = _DELAY_HINT in value or _ERROR_HINT in value
            yield parse_message_key(key, n), timestamp_ms, priority, whole

    def get_messages(self, queue: str, bookmarks: Sequence[Bookmark]) -> list[StoredMessage | None]:
        self._check_open()
        if not bookmarks:
            return []
        if not self._queue_has_blobs(queue):
            found = self._multi_get(MESSAGES, [message_key(queue, bm) for bm in bookmarks])
            return [None if data is None else StoredMessage.decode(data) for data in found]
        out: list[StoredMessage | None] = [None] * len(bookmarks)
        rest = self._from_blobs(queue, bookmarks, out)
        if rest:
            found = self._multi_get(MESSAGES, [message_key(queue, bookmarks[n]) for n in rest])
            for n, data in zip(rest, found, strict=True):
                if data is not None:
                    out[n] = StoredMessage.decode(data)
        return out

    def runs(self, queue: str) -> list[RunRecord] | None:
        self._check_open()
        prefix = queue_prefix(queue)
        marker = prefix + b"\x00"
        if self._get(RUNS, marker) is None:
            return None
        n = len(prefix)
        found = []
        tps: dict[bytes, TopicPartition] = {}
        for key, value in self._iterate(RUNS, marker + b"\x00", prefix_end(prefix)):
            head = key[: -_OFFSET.size]
            tp = tps.get(head)
            if tp is None:
                end = key.index(b"\x00", n)
                tp = TopicPartition(key[n:end].decode(), _PARTITION.unpack_from(key, end + 1)[0])
                tps[head] = tp
            found.append(decode_run(tp, value))
        return found

    def changelog_offset(self, topic: str, partition: int) -> int | None:
        self._check_open()
        data = self._get(META, changelog_offset_key(topic, partition))
        return None if data is None else unpack_int(data)

    def changelog_offsets(self) -> dict[tuple[str, int], int]:
        self._check_open()
        n = len(_CHANGELOG_OFFSET)
        found: dict[tuple[str, int], int] = {}
        end = prefix_end(_CHANGELOG_OFFSET)
        for key, value in self._iterate(META, _CHANGELOG_OFFSET, end):
            cut = key.index(b"\x00", n)
            partition: int = _PARTITION.unpack_from(key, cut + 1)[0]
            found[(key[n:cut].decode(), partition)] = unpack_int(value)
        return found

    def cluster_id(self) -> str | None:
        self._check_open()
        data = self._get(META, _CLUSTER_ID)
        return None if data is None else data.decode()

    def queues(self) -> set[str]:
        self._check_open()
        found: set[str] = set()
        for cf in (ENTRIES, POSITIONS, MESSAGES, BLOBS):
            key = self._first_key_at_or_after(cf, b"")
            while key is not None:
                name = key[: key.index(b"\x00")]
                found.add(name.decode())
                key = self._first_key_at_or_after(cf, name + b"\x01")
        return found

    @contextlib.contextmanager
    def bulk_load(self) -> Iterator[None]:
        yield  # nothing to put off

    def wipe_queue(self, queue: str) -> None:
        """Delete everything the store holds for a queue (changelog offsets are not per queue)."""
        self._check_open()
        prefix = queue_prefix(queue)
        end = _Range(prefix_end(prefix))
        self._apply([(cf, prefix, end) for cf in (ENTRIES, POSITIONS, MESSAGES, RUNS, BLOBS)])
        with self._blob_lock:
            self._blobs.clear()
            self._has_blobs.pop(queue, None)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> KeyValueStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
