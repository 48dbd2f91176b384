"""The cluster's queue definitions as one coordinator keeps them (``layer.definitions``).

``ClusterQueues`` reads the definitions topic to its end at start and writes what the config
file changed (``open``), follows the topic while the coordinator runs (``tail``), and turns the
API's create / alter / delete and a reload's file into records, which ``write`` sends and waits
to read back. It never touches a running queue: the coordinator applies the reduced topic
(``defined``) through the reload's plan, its one apply path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial

from layer.api.service import QueueDefinitionInfo
from layer.config import Config, CoordinatorConfig, QueueConfig, queue_from_table, queue_table
from layer.config.model import shared_view_topic
from layer.coordinator.definitions import DefinitionsLog, ReadBack, Record
from layer.coordinator.reload import plan
from layer.coordinator.restore import Patience
from layer.definitions import (
    API_ORIGIN,
    Definition,
    Definitions,
    Manifest,
    Write,
    file_changes,
    file_origin,
    parse_literal,
    toml_literal,
)
from layer.exceptions import BrokerError, ConfigError, QueueExists, UnknownQueue
from layer.shards import expand, queue_of, shard_names

__all__ = ["READ_BACK_TIMEOUT", "ClusterQueues", "info_of"]

log = logging.getLogger(__name__)

READ_BACK_TIMEOUT = 60.0  # seconds a change waits to read its own record back from the topic


class ClusterQueues:
    def __init__(
        self,
        coordinator: CoordinatorConfig,
        definitions_log: DefinitionsLog,
        clock: Callable[[], float],
    ) -> None:
        self._coordinator = coordinator
        self._log = definitions_log
        self._clock = clock
        self.definitions = Definitions(
            self._validate,
            coordinator.definitions_topic,
            # a cluster's members each roll the generations of the view topics they write
            exclusive_views=coordinator.cluster is not None,
        )
        self._read_back = ReadBack()

    # --- reading ----------------------------------------------------------------------------

    async def open(self, config: Config, patience: Patience) -> tuple[QueueConfig, ...]:
        """At start: read the topic to its end, write what the config file changed since it
        was last read (waiting for Kafka as ``patience`` does), and return the topic's queues."""
        defs_log = self._log
        await patience("create the definitions topic", defs_log.ensure)
        self._reduce(await patience("read the definitions topic", defs_log.catch_up))
        writes = self.file_writes(config)
        if writes:
            await patience("write the config file's queues", partial(defs_log.write, writes))
            self._reduce(await patience("read the definitions topic", defs_log.catch_up))
        return self.defined()

    def tail(self, loop: asyncio.AbstractEventLoop, on_change: Callable[[], None]) -> None:
        """Follow the topic; each batch is reduced on ``loop``, the writers waiting for their
        own record are woken, and ``on_change`` is called."""

        def on_records(records: list[Record]) -> None:
            loop.call_soon_threadsafe(self._take, records, on_change)

        self._log.tail(on_records)

    def _take(self, records: list[Record], on_change: Callable[[], None]) -> None:
        self._reduce(records)
        self._read_back.reached(self.definitions.next_offset)
        on_change()

    def _reduce(self, records: Sequence[Record]) -> None:
        for key, value, offset in records:
            problem = self.definitions.apply(key, value, offset)
            if problem is not None:
                log.error("%s", problem, extra={"topic": self.definitions.topic})

    def _validate(self, definition: Definition, where: str) -> QueueConfig:
        return queue_from_table(definition.table, f"definitions topic {where}", self._coordinator)

    def defined(self) -> tuple[QueueConfig, ...]:
        return self.definitions.defined()

    def served(self) -> tuple[QueueConfig, ...]:
        """The queues the cluster's members serve: the defined ones, each partitioned queue
        as its shards (``layer.shards``)."""
        return expand(self.defined())

    def is_served(self, name: str) -> bool:
        """Whether ``name`` is a queue or a shard some member of the cluster is to serve."""
        queue = self.definitions.queues.get(queue_of(name))
        if queue is None:
            return False
        return name in shard_names(queue) if queue.partitioned else name == queue.name

    def shards(self, name: str) -> list[str]:
        """The shards of ``name`` when it is a partitioned queue (else empty)."""
        queue = self.definitions.queues.get(name)
        return [] if queue is None else shard_names(queue)

    def infos(self) -> list[QueueDefinitionInfo]:
        return [info_of(d) for d in self.definitions.latest.values() if d is not None]

    def queue(self, name: str) -> QueueConfig:
        """A defined queue (``UnknownQueue`` naming the others)."""
        queue = self.definitions.queues.get(name)
        if queue is None:
            known = ", ".join(repr(n) for n in self.definitions.queues) or "none"
            raise UnknownQueue(f"queue {name!r} is not defined (queues: {known})")
        return queue

    # --- what a change writes -------------------------------------------------------------

    def file_writes(self, config: Config) -> list[Write]:
        """The records a read of the config file writes (``file_changes``) and its manifest
        (``ConfigError`` if a table it writes shares a view topic in a cluster)."""
        self.check_file(config)
        c = config.coordinator
        now_ms = self._now_ms()
        changes = self._file_changes(config, now_ms)
        writes = [Write.delete(x) if isinstance(x, str) else Write.of(x) for x in changes]
        tables = {q.name: queue_table(q) for q in config.queues}
        manifest = self.definitions.manifests.get(file_origin(c.id))
        if manifest is None or manifest.tables != tables or writes:
            writes.append(Write.of(Manifest(c.id, config.source, tables, now_ms)))
        written = {x.name for x in changes if isinstance(x, Definition)}
        for q in config.queues:
            if q.name not in written and self.definitions.latest.get(q.name, q) is None:
                log.warning(
                    "queue %r of %s was deleted with `qlayer queue delete`: not re-created"
                    " (create it again with `qlayer queue create`, or edit its table)",
                    q.name,
                    config.source,
                )
        return writes

    def check_file(self, config: Config) -> None:
        """In a cluster, ``ConfigError`` if a table the file would write (new or edited) has
        a view topic another queue of the cluster has, wherever that one was defined (the
        file's own tables are checked against one another as the file loads)."""
        if not self.definitions.exclusive_views:
            return
        # as the topic's reduce will apply them, one after the other
        queues = dict(self.definitions.queues)
        for change in self._file_changes(config, 0):
            if isinstance(change, str):
                queues.pop(change, None)
            else:
                queue = config.queue(change.name)
                self._check_view_topic(queue, config.source, queues.values())
                queues[queue.name] = queue

    def _file_changes(self, config: Config, now_ms: int) -> list[Definition | str]:
        """``file_changes`` in the order they are written: the deletions first, so a table
        may take over the view topic of a queue the same edit removes."""
        c = config.coordinator
        changes = file_changes(self.definitions, c.id, config.source, config.queues, now_ms)
        return sorted(changes, key=lambda change: not isinstance(change, str))

    def _check_view_topic(
        self, queue: QueueConfig, where: str, others: Iterable[QueueConfig] | None = None
    ) -> None:
        if not self.definitions.exclusive_views:
            return  # one coordinator keeps one series of generations for the queues sharing it
        others = self.definitions.queues.values() if others is None else others
        shared = shared_view_topic(queue, others)
        if shared is not None:
            raise ConfigError(f"{where}: queue {queue.name!r}: option 'view_topic': {shared}")

    def after_file(self, config: Config) -> tuple[QueueConfig, ...]:
        """The queues the topic would define once ``config``'s file changes are written."""
        changes = self._file_changes(config, 0)
        desired = dict(self.definitions.queues)
        for change in changes:
            if isinstance(change, str):
                desired.pop(change, None)
            else:
                desired[change.name] = config.queue(change.name)
        return tuple(desired.values())

    def create(self, options: Mapping[str, str], by: str, temporary: bool = False) -> Definition:
        """The record of a new queue (``ConfigError`` as the file's, ``QueueExists``). A
        temporary one's origin names the coordinator it was created through (the member that
        serves it watches it: ``temporary``)."""
        table = _table("queue create", options)
        queue = queue_from_table(table, "queue create", self._coordinator)
        if queue.name in self.definitions.queues:
            raise QueueExists(f"queue {queue.name!r} exists: change it with `qlayer queue alter`")
        self._check_view_topic(queue, "queue create")
        if temporary and queue.partitioned:
            # its use is watched on the queue's own subscriptions, which a partitioned one has
            # only per shard
            raise ConfigError(
                f"queue create: queue {queue.name!r}: option 'distribution': a temporary queue"
                ' cannot be "partitioned"'
            )
        origin = temporary_origin(self._coordinator.id) if temporary else API_ORIGIN
        return Definition(
            queue.name, queue_table(queue), origin, by, self._now_ms(), temporary=temporary
        )

    def temporary(self) -> list[str]:
        """The temporary queues of the cluster. Each is watched by the member serving it,
        whichever member it was created through: the one its client's subscriptions open on,
        so the one that can tell the client went away (and after a move, the next owner)."""
        return [
            name for name, d in self.definitions.latest.items() if d is not None and d.temporary
        ]

    def take_ended_temporary(self) -> set[str]:
        """The temporary queues deleted since the last call: their state is to go."""
        ended = set(self.definitions.ended_temporary)
        self.definitions.ended_temporary.clear()
        return ended

    def alter(self, name: str, options: Mapping[str, str], by: str) -> Definition:
        """The record of new values of a queue's options; ``ConfigError`` for an invalid one
        or one that cannot change while the queue serves (the reload's rule)."""
        current = self.queue(name)
        changed = _table(f"queue alter: queue {name!r}", options)
        if changed.get("name", name) != name:
            raise ConfigError(f"queue alter: queue {name!r}: a queue cannot be renamed")
        table = {**queue_table(current), **changed}
        queue = queue_from_table(table, "queue alter", self._coordinator)
        self._check_view_topic(queue, "queue alter")
        before = Config("queue alter", coordinator=self._coordinator, queues=(current,))
        for r in plan(before, replace(before, queues=(queue,))).refused:
            raise ConfigError(
                f"queue alter: {r.where}: option {r.option!r} cannot change while the queue"
                f" serves ({r.old} -> {r.new}): {r.reason}"
            )
        return Definition(name, queue_table(queue), API_ORIGIN, by, self._now_ms())

    async def write(self, writes: Sequence[Write]) -> None:
        """Write records and wait until the tail has read them back (``BrokerError`` if the
        broker does not take them, or they do not come back in time)."""
        last = await asyncio.to_thread(self._log.write, writes)
        if not await self._read_back.wait(last, self.definitions.next_offset, READ_BACK_TIMEOUT):
            raise BrokerError(
                f"the change was written to {self.definitions.topic} at offset {last} but not"
                f" read back within {READ_BACK_TIMEOUT:.0f}s: it applies once it is"
            ) from None
        # checked before it was written, but another member may have written a clashing
        # change just before it: every member skips the second (``Definitions``)
        problem = self.definitions.rejected.get(last)
        if problem is not None:
            raise ConfigError(problem)

    def close(self) -> None:
        self._log.close()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _table(where: str, options: Mapping[str, str]) -> dict[str, object]:
    """A table from its options' TOML literals (``ConfigError`` naming a bad one)."""
    table: dict[str, object] = {}
    for option, text in options.items():
        try:
            table[option] = parse_literal(text)
        except ValueError as exc:
            raise ConfigError(f"{where}: option {option!r}: {exc}") from None
    return table


def info_of(d: Definition) -> QueueDefinitionInfo:
    options = {option: toml_literal(value) for option, value in d.table.items()}
    return QueueDefinitionInfo(
        d.name, options, d.origin, d.changed_by, d.changed_at_ms, d.temporary
    )


def temporary_origin(coordinator_id: str) -> str:
    """The origin of a temporary queue: the coordinator it was created through."""
    return f"temporary:{coordinator_id}"
