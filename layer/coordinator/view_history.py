"""Where a queue's view rounds go, and when a new generation of its view topic begins.

``layer.viewgen`` describes the generations. This object is the coordinator's side: for each view
topic (a *lineage*, which the queues naming it share) it knows the generation being written,
sends each round there (``write``, called by ``layer.coordinator.round``), and once that
generation holds at least as many changes as a snapshot would (and ``view_snapshot_interval``
has passed since it began) starts the next one:

1. in a worker thread, create the next generation's topic and delete the generations older than
   the two before it (``KEPT``; the admin calls never block the rounds);
2. at the first round after that in which nothing was written to the current generation yet,
   write a snapshot of every queue of the lineage to the new topic (``SNAPSHOT_HEADER``
   records), then that round's changes. A queue's snapshot is its live contents at the start of
   the round (the triggering queue's round changes are taken back off what its engine holds
   now), so the snapshot followed by the rounds after it equals what the old generation said
   followed by them. The snapshot travels in the round's changelog transaction, as every view
   record does.

The snapshot is built on the event loop (a list of the live messages: about a second per million
on this machine); it happens at most once per interval.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from connectors.admin import TopicSpec
from connectors.kafka import read_watermarks
from layer.config import QueueConfig
from layer.coordinator.view import view_record
from layer.engine.model import Bookmark, ViewChange, ViewChanges
from layer.viewcodec import encode_round
from layer.viewgen import SNAPSHOT_HEADER, SNAPSHOT_MARK, generation_topic, generations

log = logging.getLogger(__name__)

__all__ = ["VIEW_TOPIC_CONFIG", "ViewHistory", "before_round"]

#: how every generation is created: nothing is removed but by deleting a whole generation
VIEW_TOPIC_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1"}
# Changes per snapshot record: 21 bytes each packed (partition, offset, sign, counts), so ~420 kB
# a record, under the 1 MB that librdkafka and brokers take by default (50,000 was over it:
# the transaction was refused with MSG_SIZE_TOO_LARGE, again and again, at 1.7M live messages)
SNAPSHOT_CHUNK = 20_000
_SNAPSHOT_HEADERS = [(SNAPSHOT_HEADER, SNAPSHOT_MARK)]
# Generations kept before the one being written: a stream that reads the oldest of them has
# (KEPT - 1) generations' time (at least view_snapshot_interval each) to go on to the next
KEPT = 2

ExtraRecord = tuple[str, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]] | None]


class ViewAdmin(Protocol):
    """The topic administration a lineage needs (``connectors.admin.TopicAdmin``)."""

    def list_topics(self, pattern: Any = None) -> dict[str, int]: ...

    def ensure_topics(self, specs: Any) -> list[str]: ...

    def delete_topics(self, names: Any, *, missing_ok: bool = True) -> None: ...


class _Contents(Protocol):
    def view_contents(self) -> list[ViewChange]: ...


class ViewedQueue(Protocol):
    """What a lineage needs of a queue with a view topic (a ``QueueRuntime``): its name and
    options, its live contents and leases for a snapshot, and where it writes its rounds."""

    views: ViewHistory | None

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> QueueConfig: ...

    @property
    def engine(self) -> _Contents: ...

    @property
    def view_leases(self) -> Mapping[Bookmark, ViewChange]: ...


@dataclass
class _Lineage:
    view_topic: str
    generation: int
    topic: str
    interval: float
    began: float  # monotonic: when this generation began (or the coordinator started)
    snapshot_size: int  # changes in the generation's snapshot (or the live count at start)
    tail: int = 0  # changes written to the generation since
    queues: dict[str, ViewedQueue] = field(default_factory=dict)
    pending: Future[None] | None = None  # the next generation's topic being made
    # bytes (keys and values) written to each generation still kept, by this process
    written: dict[int, int] = field(default_factory=dict)


def before_round(
    live: Sequence[ViewChange], changes: ViewChanges | Sequence[ViewChange]
) -> list[ViewChange]:
    """The live contents before a round, from those after it (``live``) and its changes: a
    message the round changed was in them if its first change is -1 (it left); the others are
    as they are now. Only the round's changes are indexed, not the live contents."""
    first: dict[Bookmark, ViewChange] = {}
    for change in changes:
        first.setdefault(change.bookmark, change)
    before = [change for change in live if change.bookmark not in first]
    before.extend(change._replace(sign=1) for change in first.values() if change.sign < 0)
    return before


class ViewHistory:
    """The coordinator's view topics and their generations (see the module docstring).

    ``settings``: consumer settings, to ask which generation holds records.
    """

    def __init__(
        self,
        admin: ViewAdmin,
        settings: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self._settings = settings
        self._clock = clock
        self._lines: dict[str, _Lineage] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="view-generations")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- at a queue's restore ------------------------------------------------------------------

    def current(self, view_topic: str) -> tuple[int, str]:
        """The generation of ``view_topic`` to read and write: the lineage's if a queue already
        writes it, else the newest generation holding records (blocking: broker calls)."""
        line = self._lines.get(view_topic)
        if line is not None:
            return line.generation, line.topic
        return self.newest(view_topic)

    def newest(self, view_topic: str) -> tuple[int, str]:
        """The newest generation of ``view_topic`` that holds records (a generation created
        just before a crash may be empty), or generation 0."""
        topics = self._admin.list_topics()
        for generation, topic in reversed(generations(view_topic, topics)):
            parts = [(topic, p) for p in range(topics[topic])]
            marks = read_watermarks(self._settings, parts, isolation_level="read_committed")
            if any(mark.high > 0 for mark in marks.values()):
                return generation, topic
        return 0, view_topic

    def attach(self, rt: ViewedQueue, generation: int, live: int) -> None:
        """``rt`` writes its rounds to ``generation`` of its view topic from now on (``live``:
        how many messages its view holds)."""
        view_topic = rt.config.view_topic
        assert view_topic is not None
        line = self._lines.get(view_topic)
        if line is None:
            line = self._lines[view_topic] = _Lineage(
                view_topic,
                generation,
                generation_topic(view_topic, generation),
                rt.config.view_snapshot_interval,
                began=self._clock(),
                snapshot_size=0,
            )
        line.queues[rt.name] = rt
        line.snapshot_size += live
        line.interval = min(line.interval, rt.config.view_snapshot_interval)
        rt.views = self

    def detach(self, rt: ViewedQueue) -> None:
        """``rt`` is removed: its contents leave the next snapshots."""
        line = self._lines.get(rt.config.view_topic or "")
        if line is not None:
            line.queues.pop(rt.name, None)
            if not line.queues:
                del self._lines[line.view_topic]
        rt.views = None

    # -- in a round ----------------------------------------------------------------------------

    def write(
        self,
        rt: ViewedQueue,
        changes: ViewChanges,
        now_ms: int,
        out: list[ExtraRecord],
        leases: Sequence[ViewChange] = (),
    ) -> None:
        """Append to ``out`` (the round's view records) ``rt``'s round ``changes`` and lease
        changes, after a new generation's snapshot when one is due and ready."""
        view_topic = rt.config.view_topic
        assert view_topic is not None
        line = self._lines[view_topic]
        if line.pending is not None and line.pending.done():
            error = line.pending.exception()
            if error is not None:
                line.pending = None
                line.began = self._clock()  # try again after another interval
                log.warning(
                    "view topic %s: cannot begin generation %s: %s",
                    view_topic,
                    line.generation + 1,
                    error,
                    extra={"view_topic": view_topic},
                )
            elif not any(record[0] == line.topic for record in out):
                line.pending = None
                self._begin(line, rt, changes, leases, now_ms, out)
        if line.pending is None and self._due(line):
            line.pending = self._pool.submit(self._prepare, view_topic, line.generation + 1)
        record = view_record(line.topic, rt.name, changes, now_ms, leases)
        out.append(record)
        line.tail += len(changes) + len(leases)
        line.written[line.generation] = (
            line.written.get(line.generation, 0) + len(record[1]) + len(record[2])
        )

    def _due(self, line: _Lineage) -> bool:
        return self._clock() - line.began >= line.interval and line.tail >= max(
            line.snapshot_size, 1
        )

    def _prepare(self, view_topic: str, generation: int) -> None:
        """Step 1 (a worker thread): the next generation's topic, the old ones deleted."""
        topic = generation_topic(view_topic, generation)
        self._admin.ensure_topics([TopicSpec(topic, partitions=1, config=VIEW_TOPIC_CONFIG)])
        old = [
            name
            for number, name in generations(view_topic, self._admin.list_topics())
            if number < generation - KEPT
        ]
        if old:
            self._admin.delete_topics(old)
            log.info("view topic %s: deleted generations %s", view_topic, old)

    def _begin(
        self,
        line: _Lineage,
        rt: ViewedQueue,
        changes: ViewChanges,
        leases: Sequence[ViewChange],
        now_ms: int,
        out: list,
    ) -> None:
        """Step 2: the snapshot of every queue of the lineage, to the next generation."""
        generation = line.generation + 1
        topic = generation_topic(line.view_topic, generation)
        size = 0
        for q in line.queues.values():
            live = q.engine.view_contents()
            held = list(q.view_leases.values())
            if q is rt:  # both as they were when the round began
                live = before_round(live, changes)
                held = before_round(held, leases)
            size += len(live) + len(held)
            key = q.name.encode()
            records = [
                encode_round(q.name, ViewChanges.of(live[i : i + SNAPSHOT_CHUNK]), now_ms)
                for i in range(0, max(len(live), 1), SNAPSHOT_CHUNK)
            ]
            records.extend(  # the leases, in records of their own
                encode_round(q.name, ViewChanges(), now_ms, held[i : i + SNAPSHOT_CHUNK])
                for i in range(0, len(held), SNAPSHOT_CHUNK)
            )
            for value in records:
                out.append((topic, key, value, _SNAPSHOT_HEADERS))
                line.written[generation] = line.written.get(generation, 0) + len(key) + len(value)
        for old in [n for n in line.written if n < generation - KEPT]:
            del line.written[old]  # deleted by _prepare
        log.info(
            "view topic %s: generation %s began with a snapshot of %s messages (the last one"
            " held %s changes after its snapshot of %s); generations kept hold %s bytes",
            line.view_topic,
            generation,
            size,
            line.tail,
            line.snapshot_size,
            sum(line.written.values()),
            extra={"view_topic": line.view_topic},
        )
        line.generation, line.topic = generation, topic
        line.snapshot_size, line.tail, line.began = size, 0, self._clock()
