"""Queue definitions in Kafka: the records of a cluster's definitions topic and their reduce.

A cluster's queues live in one compacted topic, ``qlayer.queues.<cluster>`` (one partition: one
order of changes for every member). Each queue is a record keyed by its name whose value is its
``[[queue]]`` table (Avro ``queue_definition``, every option's value as TOML writes it); a
tombstone deletes it. A coordinator reads the topic from the start when it starts and tails it
while it runs. The embedded broker never compacts, so the reduce is done here, last value wins,
whatever compaction did or did not do.

Each coordinator's config file writes to the topic only what it *changed* since it was last read:
under the key ``file:<coordinator id>`` (no queue name has a ``:``) the topic keeps a manifest of
the tables the file declared. A table that is new or edited in the file is written; one removed
from the file is deleted; an unchanged table writes nothing, so a queue altered or deleted with
``qlayer queue`` stays as the operator left it across restarts (``file_changes``).

A record that does not decode or whose table does not validate is reported (one line naming it)
and skipped: the queue keeps its previous definition, the others are not affected.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from layer.codec import decode, encode
from layer.config import QueueConfig, queue_table
from layer.config.model import shared_view_topic
from layer.exceptions import ConfigError, SerializationError
from layer.toml_values import parse_literal, toml_literal

__all__ = [
    "API_ORIGIN",
    "DEFINITION_SCHEMA",
    "MANIFEST_SCHEMA",
    "Definition",
    "Definitions",
    "Manifest",
    "Write",
    "file_changes",
    "file_origin",
    "parse_literal",
    "toml_literal",
]

DEFINITION_SCHEMA = "queue_definition"
MANIFEST_SCHEMA = "file_manifest"
API_ORIGIN = "api"
_MANIFEST_PREFIX = "file:"


def file_origin(coordinator_id: str) -> str:
    return f"{_MANIFEST_PREFIX}{coordinator_id}"


def _encode_table(table: Mapping[str, object]) -> dict[str, str]:
    return {option: toml_literal(value) for option, value in table.items()}


def _decode_table(options: Mapping[str, str]) -> dict[str, object]:
    return {option: parse_literal(text) for option, text in options.items()}


@dataclass(frozen=True, slots=True)
class Definition:
    """One queue's record: its ``[[queue]]`` table and who wrote it."""

    name: str
    table: Mapping[str, object]
    origin: str = API_ORIGIN  # "api", or file_origin(coordinator id)
    changed_by: str = ""
    changed_at_ms: int = 0
    temporary: bool = False  # deleted with its state once no client has used it for a while

    def encode(self) -> tuple[bytes, bytes]:
        value = encode(
            DEFINITION_SCHEMA,
            {
                "name": self.name,
                "options": _encode_table(self.table),
                "origin": self.origin,
                "changed_by": self.changed_by,
                "changed_at_ms": self.changed_at_ms,
                "temporary": self.temporary,
            },
        )
        return self.name.encode(), value


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a coordinator's config file declared when it was last read."""

    coordinator: str
    source: str
    tables: Mapping[str, Mapping[str, object]]
    changed_at_ms: int = 0

    def encode(self) -> tuple[bytes, bytes]:
        value = encode(
            MANIFEST_SCHEMA,
            {
                "coordinator": self.coordinator,
                "source": self.source,
                "queues": {name: _encode_table(t) for name, t in self.tables.items()},
                "changed_at_ms": self.changed_at_ms,
            },
        )
        return file_origin(self.coordinator).encode(), value


@dataclass(frozen=True, slots=True)
class Write:
    """One record to write: a definition, a queue's tombstone (``definition`` None) or a
    manifest."""

    key: bytes
    value: bytes | None

    @staticmethod
    def of(item: Definition | Manifest) -> Write:
        key, value = item.encode()
        return Write(key, value)

    @staticmethod
    def delete(name: str) -> Write:
        return Write(name.encode(), None)


def decode_record(
    key: bytes | None, value: bytes | None
) -> tuple[str, Definition | Manifest | None]:
    """A record of the topic: (its key, the definition or manifest, None for a tombstone).
    ``SerializationError`` for one that does not decode."""
    if key is None:
        raise SerializationError("a record without a key")
    try:
        name = key.decode()
    except UnicodeDecodeError:
        raise SerializationError(f"a key that is not UTF-8: {key!r}") from None
    if value is None:
        return name, None
    if name.startswith(_MANIFEST_PREFIX):
        raw = decode(MANIFEST_SCHEMA, value)
        try:
            tables = {q: _decode_table(t) for q, t in raw["queues"].items()}
        except ValueError as exc:
            raise SerializationError(f"manifest {name!r}: {exc}") from None
        return name, Manifest(raw["coordinator"], raw["source"], tables, raw["changed_at_ms"])
    raw = decode(DEFINITION_SCHEMA, value)
    if raw["name"] != name:
        raise SerializationError(f"the record names queue {raw['name']!r}, its key {name!r}")
    try:
        table = _decode_table(raw["options"])
    except ValueError as exc:
        raise SerializationError(f"queue {name!r}: {exc}") from None
    return name, Definition(
        name, table, raw["origin"], raw["changed_by"], raw["changed_at_ms"], raw["temporary"]
    )


@dataclass
class Definitions:
    """The definitions topic reduced, last value wins (no I/O): apply its records in order.

    ``validate`` turns a definition into a ``QueueConfig`` (``layer.config.queue_from_table``)
    or raises ``ConfigError``; a record that does not decode or validate is skipped (the queue
    keeps its last good definition) and ``apply`` returns the one line that says why.

    ``exclusive_views`` (a cluster): a definition whose view topic is another defined queue's
    is skipped too (``shared_view_topic``). The API and the files are refused such a change
    before it is written; this catches two written at once through two members. Every member
    reduces the same records in the same order, so all of them keep the first and skip the
    second.
    """

    validate: Callable[[Definition, str], QueueConfig]
    topic: str = ""
    # queue name -> its last record (None: deleted); the order queues were first defined in
    latest: dict[str, Definition | None] = field(default_factory=dict)
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    manifests: dict[str, Manifest] = field(default_factory=dict)
    next_offset: int = 0  # the offset after the last record applied
    # temporary queues deleted since the coordinator last took them (their state is to go)
    ended_temporary: set[str] = field(default_factory=set)
    exclusive_views: bool = False
    # offset -> why the record there was skipped (a writer reading its own record back)
    rejected: dict[int, str] = field(default_factory=dict)

    def apply(self, key: bytes | None, value: bytes | None, offset: int) -> str | None:
        self.next_offset = max(self.next_offset, offset + 1)
        where = f"{self.topic}/0/{offset}"
        try:
            name, item = decode_record(key, value)
        except SerializationError as exc:
            return self._reject(offset, f"definitions record {where} skipped: {exc}")
        if isinstance(item, Manifest) or name.startswith(_MANIFEST_PREFIX):
            if item is None:
                self.manifests.pop(name, None)
            else:
                assert isinstance(item, Manifest)
                self.manifests[name] = item
            return None
        if item is None:
            if name in self.latest:
                before = self.latest[name]
                if before is not None and before.temporary:
                    self.ended_temporary.add(name)
                self.latest[name] = None
            self.queues.pop(name, None)
            return None
        skipped = f"definitions record {where} skipped, queue {name!r} keeps its last definition"
        try:
            queue = self.validate(item, where)
        except ConfigError as exc:
            return self._reject(offset, f"{skipped}: {exc}")
        if self.exclusive_views:
            shared = shared_view_topic(queue, self.queues.values())
            if shared is not None:
                return self._reject(offset, f"{skipped}: option 'view_topic': {shared}")
        self.latest[name] = item
        self.queues[name] = queue
        return None

    def _reject(self, offset: int, problem: str) -> str:
        self.rejected[offset] = problem
        return problem

    def defined(self) -> tuple[QueueConfig, ...]:
        """The live queues, in the order they were first defined."""
        return tuple(self.queues[n] for n in self.latest if n in self.queues)


def file_changes(
    definitions: Definitions,
    coordinator_id: str,
    source: str,
    file_queues: Sequence[QueueConfig],
    now_ms: int,
) -> list[Definition | str]:
    """What a read of a coordinator's config file writes: a ``Definition`` for each table that
    is new or edited since the file was last read (and differs from the topic), the name of each
    queue whose table left the file (to delete, if still defined), nothing for an unchanged
    table. The caller writes the new manifest after these (``Manifest``)."""
    origin = file_origin(coordinator_id)
    manifest = definitions.manifests.get(origin)
    before: Mapping[str, Mapping[str, object]] = manifest.tables if manifest else {}
    out: list[Definition | str] = []
    names = set()
    for queue in file_queues:
        names.add(queue.name)
        table = queue_table(queue)
        if before.get(queue.name) == table:
            continue  # unchanged in the file: the topic's definition stands
        if definitions.queues.get(queue.name) == queue:
            continue  # the topic has it already
        out.append(Definition(queue.name, table, origin, source, now_ms))
    for name in before:
        if name not in names and definitions.latest.get(name) is not None:
            out.append(name)
    return out
