"""Avro encoding of what qlayer keeps or sends: changelog records, dead letters, stored messages.

The schemas live in ``avro/<name>.avsc`` and are parsed once, here. Every encoded value starts with
one *format byte*: the version of the schema it was written with. The current schema is the file in
``avro/``; superseded versions are kept as ``avro/history/<name>.v<N>.avsc``, so the current version
of a schema is one more than its newest history file (1 when there is none). Data written with an
old version is read with Avro schema resolution into the current schema, so a new coordinator reads
an old changelog or state store.

``encode_change`` / ``decode_change`` map the engine's durable changes (``Leased``, ``Returned``,
``Done``, ``LowWater``, ``Forget``) to changelog key and value bytes. They are on the coordinator's
hot path, so the key is assembled from a cached prefix (queue, topic, partition) and the offset.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Mapping
from enum import StrEnum
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from layer import avro_fast
from layer.engine.model import (
    Bookmark,
    Change,
    Done,
    Forget,
    Leased,
    LowWater,
    Returned,
    TopicPartition,
)
from layer.exceptions import SerializationError

__all__ = [
    "CHANGELOG_KEY",
    "CHANGELOG_VALUE",
    "DEAD_LETTER",
    "DEFAULT_SCHEMA_DIR",
    "CHANGELOG_CONFIRM",
    "CHANGELOG_SNAPSHOT",
    "CONFIRM_OFFSET",
    "POSITION_OFFSET",
    "SNAPSHOT_OFFSET",
    "STORED_MESSAGE",
    "ChangeKind",
    "ChangelogKey",
    "Codec",
    "decode",
    "decode_change",
    "decode_key",
    "default_codec",
    "encode",
    "encode_change",
    "encode_key",
    "encode_run",
    "encode_value",
]

DEFAULT_SCHEMA_DIR = Path(__file__).resolve().parent.parent / "avro"

CHANGELOG_KEY = "changelog_key"
CHANGELOG_VALUE = "changelog_value"
DEAD_LETTER = "dead_letter"
STORED_MESSAGE = "stored_message"

#: ``ChangelogKey.offset`` of a partition's position (low-water) record.
POSITION_OFFSET = -1
#: ``ChangelogKey.offset`` of a partition's snapshot confirmation.
CONFIRM_OFFSET = -2
#: ``ChangelogKey.offset`` of part 0 of a partition's snapshot (part N: ``SNAPSHOT_OFFSET - N``).
SNAPSHOT_OFFSET = -3
CHANGELOG_SNAPSHOT = "changelog_snapshot"
CHANGELOG_CONFIRM = "changelog_confirm"

_HISTORY_NAME = re.compile(r"^(?P<name>[A-Za-z0-9_]+)\.v(?P<version>[0-9]+)\.avsc$")


class ChangeKind(StrEnum):
    """``ChangelogValue.kind``: the symbols of the Avro enum ``qlayer.ChangeKind``."""

    LEASED = "LEASED"
    RETURNED = "RETURNED"
    DONE = "DONE"
    POSITION = "POSITION"


class ChangelogKey(NamedTuple):
    """A decoded changelog key: the run of ``length`` messages from ``offset`` of one queue, or
    (offset -1) a partition's position, (-2) its snapshot confirmation, (-3 - N) part N of its
    snapshot. Format-1 keys have no ``count``: they read as 1."""

    queue: str
    topic: str
    partition: int
    offset: int
    length: int = 1  # the key's ``count``: messages in the run

    @property
    def is_snapshot(self) -> bool:
        return self.offset <= SNAPSHOT_OFFSET

    @property
    def snapshot_part(self) -> int:
        return SNAPSHOT_OFFSET - self.offset

    @property
    def is_position(self) -> bool:
        return self.offset == POSITION_OFFSET

    @property
    def bookmark(self) -> Bookmark:
        """The message this key names (raises ValueError for a position key)."""
        if self.offset == POSITION_OFFSET:
            raise ValueError(f"changelog key {self} is a position key, not a message")
        return Bookmark(self.topic, self.partition, self.offset)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class _Schema:
    """One schema: its current version and every version it can read."""

    __slots__ = ("name", "version", "current", "readers", "_header")

    def __init__(self, name: str, current: Any, history: Mapping[int, Any]) -> None:
        self.name = name
        self.version = max(history, default=0) + 1
        if self.version > 0xFF:
            raise SerializationError(f"schema {name!r}: more than 255 versions")
        self.current = current
        # version -> (writer schema, reader schema or None when no resolution is needed)
        self.readers: dict[int, tuple[Any, Any]] = {self.version: (current, None)}
        for version, old in history.items():
            self.readers[version] = (old, current)
        self._header = bytes((self.version,))


class Codec:
    """Reads ``avro/*.avsc`` (and ``avro/history``) once; encodes and decodes by schema name.

    Schemas are parsed on first use, each on its own (the same named type, e.g. ``Header``, may be
    defined in several files). A ``Codec`` is immutable after parsing and safe to share.
    """

    def __init__(self, schema_dir: Path | str = DEFAULT_SCHEMA_DIR) -> None:
        self._dir = Path(schema_dir)
        self._schemas: dict[str, _Schema] = {}

    @property
    def schema_dir(self) -> Path:
        return self._dir

    def schema(self, name: str) -> _Schema:
        found = self._schemas.get(name)
        if found is None:
            found = self._schemas[name] = self._load(name)
        return found

    def version(self, name: str) -> int:
        """The version new data of this schema is written with (its leading format byte)."""
        return self.schema(name).version

    def versions(self, name: str) -> dict[int, Any]:
        """Every version this codec reads, mapped to its parsed (writer) schema."""
        return {version: pair[0] for version, pair in self.schema(name).readers.items()}

    def encode(self, name: str, obj: Mapping[str, Any]) -> bytes:
        schema = self.schema(name)
        return self._write(schema, schema.version, schema.current, obj)

    def encode_version(self, name: str, version: int, obj: Mapping[str, Any]) -> bytes:
        """Encode with an older version of a schema (for schema-evolution tests and tools)."""
        schema = self.schema(name)
        try:
            writer = schema.readers[version][0]
        except KeyError:
            raise SerializationError(f"schema {name!r} has no version {version}") from None
        return self._write(schema, version, writer, obj)

    def decode(self, name: str, data: bytes) -> Any:
        schema = self.schema(name)
        if not data:
            raise SerializationError(f"schema {name!r}: empty data")
        pair = schema.readers.get(data[0])
        if pair is None:
            raise SerializationError(
                f"schema {name!r}: unknown format version {data[0]} "
                f"(this codec reads {sorted(schema.readers)})"
            )
        buf = io.BytesIO(data)
        buf.seek(1)
        try:
            obj = schemaless_reader(buf, pair[0], pair[1])
        except Exception as exc:
            raise SerializationError(
                f"schema {name!r}: cannot decode {len(data)} bytes: {exc!r}"
            ) from exc
        if buf.tell() != len(data):
            raise SerializationError(
                f"schema {name!r}: {len(data) - buf.tell()} trailing bytes after the record"
            )
        return obj

    @staticmethod
    def _write(schema: _Schema, version: int, writer: Any, obj: Mapping[str, Any]) -> bytes:
        buf = io.BytesIO()
        buf.write(bytes((version,)))
        try:
            schemaless_writer(buf, writer, obj, strict=True, strict_allow_default=True)
        except Exception as exc:
            raise SerializationError(f"schema {schema.name!r}: cannot encode: {exc!r}") from exc
        return buf.getvalue()

    def _load(self, name: str) -> _Schema:
        current = self._parse(self._dir / f"{name}.avsc", name)
        history: dict[int, Any] = {}
        history_dir = self._dir / "history"
        if history_dir.is_dir():
            for path in history_dir.glob(f"{name}.v*.avsc"):
                match = _HISTORY_NAME.match(path.name)
                if match is None or match["name"] != name:
                    continue
                history[int(match["version"])] = self._parse(path, name)
        return _Schema(name, current, history)

    @staticmethod
    def _parse(path: Path, name: str) -> Any:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return parse_schema(raw)
        except FileNotFoundError:
            raise SerializationError(f"schema {name!r}: no file {path}") from None
        except Exception as exc:
            raise SerializationError(f"schema {name!r}: cannot parse {path}: {exc}") from exc


@cache
def default_codec() -> Codec:
    """The codec over the repository's ``avro/`` directory (built once, immutable)."""
    return Codec()


def encode(name: str, obj: Mapping[str, Any]) -> bytes:
    return default_codec().encode(name, obj)


def decode(name: str, data: bytes) -> Any:
    return default_codec().decode(name, data)


# ---------------------------------------------------------------------------------------------
# Changelog records
# ---------------------------------------------------------------------------------------------


@lru_cache(maxsize=65536)
def _key_prefix(queue: str, topic: str, partition: int) -> bytes:
    # An Avro record is the concatenation of its fields; offset 0 encodes as the single byte 0x00
    # and count 1 as 0x02: the key of offset 0 without its last two bytes is the prefix shared by
    # every key of this partition (format byte included). Cached: a coordinator has few
    # (queue, partition) pairs.
    full = encode(
        CHANGELOG_KEY,
        {"queue": queue, "topic": topic, "partition": partition, "offset": 0, "count": 1},
    )
    return full[:-2]


#: the last bytes of a key whose count is 1 (the zig-zag varint of 1)
_ONE = b"\x02"


def encode_key(key: ChangelogKey) -> bytes:
    if key.offset < 0 and key.length != 1:
        raise SerializationError(f"schema {CHANGELOG_KEY!r}: a run at a negative offset: {key}")
    if key.length < 1:
        raise SerializationError(f"schema {CHANGELOG_KEY!r}: a run of no message: {key}")
    return (
        _key_prefix(key.queue, key.topic, key.partition)
        + avro_fast.long(key.offset)
        + avro_fast.long(key.length)
    )


def encode_run(queue: str, bookmark: Bookmark, count: int) -> bytes:
    """The key of the run of ``count`` messages from ``bookmark`` (count 1: one message)."""
    return (
        _key_prefix(queue, bookmark.topic, bookmark.partition)
        + avro_fast.long(bookmark.offset)
        + avro_fast.long(count)
    )


def decode_key(data: bytes) -> ChangelogKey:
    fast = _decode_key_fast(data)
    if fast is not None:
        return fast
    obj = decode(CHANGELOG_KEY, data)
    key = ChangelogKey(obj["queue"], obj["topic"], obj["partition"], obj["offset"], obj["count"])
    if key.length < 1 or (key.offset < 0 and key.length != 1):
        raise SerializationError(f"schema {CHANGELOG_KEY!r}: not a key: {key}")
    return key


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint at ``pos``: (value, next position). IndexError when truncated."""
    shift = z = 0
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            return (z >> 1) ^ -(z & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


@lru_cache(maxsize=65536)
def _parse_key_prefix(prefix: bytes) -> tuple[str, str, int, int] | None:
    """(queue, topic, partition, length of the prefix) of the current version's key prefix."""
    try:
        n, pos = _read_varint(prefix, 1)
        if n < 0:
            return None
        queue = prefix[pos : pos + n].decode()
        pos += n
        n, pos = _read_varint(prefix, pos)
        if n < 0:
            return None
        topic = prefix[pos : pos + n].decode()
        pos += n
        partition, pos = _read_varint(prefix, pos)
    except (IndexError, ValueError):
        return None
    return queue, topic, partition, pos


def _varint_start(data: bytes, end: int) -> int:
    """Where the varint that ends at ``end`` (exclusive) begins: after the last byte before its
    final one with the high bit clear."""
    start = end - 1
    while start > 1 and data[start - 1] & 0x80:
        start -= 1
    return start


def _decode_key_fast(data: bytes) -> ChangelogKey | None:
    # Restore decodes one key per record: parse the current version (two strings and three
    # varints) and format 1 (no count) by hand and cache the (queue, topic, partition) prefix.
    # Anything unusual (another version, malformed, trailing bytes) falls back to fastavro and
    # its errors.
    if not data:
        return None
    version = data[0]
    if version == _key_version():
        count_start = _varint_start(data, len(data))
        start = _varint_start(data, count_start)
    elif version == 1:
        count_start = len(data)
        start = _varint_start(data, count_start)
    else:
        return None
    parsed = _parse_key_prefix(data[:start])
    if parsed is None or parsed[3] != start:
        return None
    try:
        offset, pos = _read_varint(data, start)
        count = 1
        if pos != count_start:
            return None
        if count_start != len(data):
            count, pos = _read_varint(data, count_start)
    except (IndexError, ValueError):
        return None
    if pos != len(data) or count < 1 or (offset < 0 and count != 1):
        return None
    return ChangelogKey(parsed[0], parsed[1], parsed[2], offset, count)


@cache
def _key_version() -> int:
    return default_codec().version(CHANGELOG_KEY)


def encode_value(
    kind: ChangeKind,
    *,
    deliveries: int = 0,
    cancels: int = 0,
    holder: str | None = None,
    lease_deadline_ms: int | None = None,
    reason: str | None = None,
    at_ms: int,
    low_water: int | None = None,
) -> bytes:
    # the hot path: hand-written, byte-identical to encode(CHANGELOG_VALUE, ...)
    try:
        return avro_fast.changelog_value(
            kind.value, deliveries, cancels, holder, lease_deadline_ms, reason, at_ms, low_water
        )
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        raise SerializationError(f"schema {CHANGELOG_VALUE!r}: cannot encode: {exc!r}") from exc


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def encode_change(
    queue: str, change: Change, at_ms: int | None = None
) -> tuple[bytes, bytes | None]:
    """The changelog record (key bytes, value bytes or None for a tombstone) of one change.

    ``at_ms`` stamps the record; it defaults to ``Done.at`` for a Done and to the wall clock
    otherwise. Deadlines and times of the engine (float seconds) become integer milliseconds.
    """
    if at_ms is None:
        at_ms = _ms(change.at) if isinstance(change, Done) else time.time_ns() // 1_000_000
    if isinstance(change, Leased):
        bm = change.bookmark
        key = _key_prefix(queue, bm.topic, bm.partition) + avro_fast.long(bm.offset)
        key += _ONE if change.count == 1 else avro_fast.long(change.count)
        return key, encode_value(
            ChangeKind.LEASED,
            deliveries=change.deliveries,
            cancels=change.cancels,
            holder=change.holder,
            lease_deadline_ms=_ms(change.deadline),
            at_ms=at_ms,
        )
    if isinstance(change, Returned | Done):
        bm = change.bookmark
        key = _key_prefix(queue, bm.topic, bm.partition) + avro_fast.long(bm.offset)
        key += _ONE if change.count == 1 else avro_fast.long(change.count)
        if isinstance(change, Returned):
            # a RETURNED record's lease_deadline_ms is when a delayed message is available again
            not_before = None if change.not_before is None else _ms(change.not_before)
            return key, encode_value(
                ChangeKind.RETURNED,
                deliveries=change.deliveries,
                cancels=change.cancels,
                lease_deadline_ms=not_before,
                reason=change.reason.value,
                at_ms=at_ms,
            )
        return key, encode_value(
            ChangeKind.DONE,
            deliveries=change.deliveries,
            cancels=change.cancels,
            reason=change.reason.value,
            at_ms=at_ms,
        )
    if isinstance(change, LowWater):
        tp = change.partition
        key = _key_prefix(queue, tp.topic, tp.partition) + avro_fast.long(POSITION_OFFSET) + _ONE
        return key, encode_value(ChangeKind.POSITION, at_ms=at_ms, low_water=change.offset)
    if isinstance(change, Forget):
        bm = change.bookmark
        if change.count != 1:
            return encode_run(queue, bm, change.count), None
        key = _key_prefix(queue, bm.topic, bm.partition) + avro_fast.long(bm.offset) + _ONE
        return key, None
    raise SerializationError(f"schema {CHANGELOG_VALUE!r}: not a change: {change!r}")


def decode_change(key: bytes, value: bytes | None) -> tuple[ChangelogKey, dict[str, Any] | None]:
    """Decode a changelog record; the value is None for a tombstone."""
    return decode_key(key), None if value is None else decode(CHANGELOG_VALUE, value)
