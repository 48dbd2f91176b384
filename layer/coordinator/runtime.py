"""One queue inside the coordinator: its engine, its inbox of fetched messages, its subscriptions.

Runs on the coordinator's event loop only (the ingest thread hands batches over with
``call_soon_threadsafe``), so nothing here needs a lock.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass, field
from typing import cast

from confluent_kafka import Message

from layer.api.service import DeliverySink
from layer.config import QueueConfig
from layer.coordinator.ingest import bookmark_of
from layer.engine.model import Arrival, Bookmark, Change, TopicPartition
from layer.engine.queue import QueueEngine
from layer.state.base import Store, StoreBatch, StoredMessage

log = logging.getLogger(__name__)


def json_path(path: str) -> tuple[str, ...]:
    """``/order/rank`` -> ("order", "rank"); RFC 6901 escapes (~1 = '/', ~0 = '~') honoured."""
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in path.strip("/").split("/"))


def extract_priority(doc: object, path: tuple[str, ...]) -> int | None:
    """The numeric value at ``path``, or None (lowest) when missing or not a number."""
    node = doc
    for part in path:
        if isinstance(node, dict):
            node = node.get(part)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    if node != node or node in (float("inf"), float("-inf")):  # NaN and infinities
        return None
    return int(node)


@dataclass(slots=True)
class SubscriptionState:
    id: str
    queue: str
    sink: DeliverySink
    backlog: int
    client: str
    closed: bool = False


@dataclass(slots=True)
class Counters:
    delivered: int = 0
    acked: int = 0
    dead_lettered: int = 0
    ingested: int = 0
    unparseable: int = 0


@dataclass
class QueueRuntime:
    config: QueueConfig
    engine: QueueEngine
    changelog_topic: str
    inbox: deque[Message] = field(default_factory=deque)
    subscriptions: dict[str, SubscriptionState] = field(default_factory=dict)
    # Restored from the changelog for messages not read yet (state dir wiped): skip the done ones,
    # give the others their delivery and cancel counts back when they are read again.
    restored_done: set[Bookmark] = field(default_factory=set)
    restored_counts: dict[Bookmark, tuple[int, int]] = field(default_factory=dict)
    # Changes the coordinator itself originates (a partition's start), written with the next round.
    pending_changes: list[Change] = field(default_factory=list)
    known_partitions: set[TopicPartition] = field(default_factory=set)
    counters: Counters = field(default_factory=Counters)
    # Payloads of recently admitted messages, so handing them out needs no RocksDB read. Bounded:
    # beyond ``payload_cache_size`` messages, payloads are read back from the store.
    payload_cache: dict[Bookmark, StoredMessage] = field(default_factory=dict)
    payload_cache_size: int = 20_000

    def __post_init__(self) -> None:
        self._priority_path = json_path(self.config.priority) if self.config.priority else None
        self._parse_json = self.config.message_type == "json"

    @property
    def name(self) -> str:
        return self.config.name

    def parse(self, msg: Message) -> tuple[StoredMessage, int | None]:
        """The local copy of a message and its priority. A payload that does not parse is still
        queued (priority lowest); its error travels with it to the consumer's dead letter."""
        value = msg.value()
        error: str | None = None
        priority: int | None = None
        if self._parse_json:
            try:
                doc = json.loads(value) if value is not None else None
            except (ValueError, UnicodeDecodeError) as exc:
                error = f"unparseable json: {exc}"
                self.counters.unparseable += 1
            else:
                if self._priority_path is not None:
                    priority = extract_priority(doc, self._priority_path)
        headers = cast(list[tuple[str, bytes | None]], msg.headers() or [])
        _ts_type, ts = msg.timestamp()
        stored = StoredMessage(
            key=msg.key(),
            value=value,
            headers=tuple(headers),
            timestamp_ms=ts if ts and ts > 0 else 0,
            priority=priority,
            error=error,
        )
        return stored, priority

    def admit(self, now: float, batch: StoreBatch, limit: int = 4096) -> int:
        """Move fetched messages from the inbox into the engine, as far as its room allows.

        At most ``limit`` a round: a burst of publishes must not make one round so long that
        deliveries and acks wait behind it."""
        room = min(self.engine.room(), limit)
        if not self.inbox or room <= 0:
            return 0
        arrivals: list[Arrival] = []
        read_to: dict[TopicPartition, int] = {}
        name = self.name
        inbox = self.inbox
        while inbox and room > 0:
            msg = inbox.popleft()
            bookmark = bookmark_of(msg)
            read_to[TopicPartition(bookmark.topic, bookmark.partition)] = bookmark.offset + 1
            if bookmark in self.restored_done:
                self.restored_done.discard(bookmark)
                continue
            stored, priority = self.parse(msg)
            batch.put_message(name, bookmark, stored)
            if len(self.payload_cache) < self.payload_cache_size:
                self.payload_cache[bookmark] = stored
            deliveries, cancels = self.restored_counts.pop(bookmark, (0, 0))
            ts = stored.timestamp_ms / 1000.0 if stored.timestamp_ms else now
            arrivals.append(Arrival(bookmark, ts, priority, deliveries, cancels))
            room -= 1
        if arrivals:
            self.engine.add(arrivals, now)
            self.counters.ingested += len(arrivals)
        for tp, position in read_to.items():
            self.engine.mark_read(tp, position)
            batch.put_read_position(name, tp, position)
        return len(arrivals)

    def payloads(
        self, store: Store, bookmarks: list[Bookmark]
    ) -> dict[Bookmark, StoredMessage | None]:
        """The stored copies of these messages: from the cache, the rest in one store read."""
        cache = self.payload_cache
        found: dict[Bookmark, StoredMessage | None] = {}
        missing = []
        for bm in bookmarks:
            stored = cache.get(bm)
            if stored is None:
                missing.append(bm)
            else:
                found[bm] = stored
        if missing:
            found.update(zip(missing, store.get_messages(self.name, missing), strict=True))
        return found
