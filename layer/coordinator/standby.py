"""Standby replicas: a member of a cluster keeps a warm copy of the state of queues another
member serves, so that taking them over reads only the changelog's tail (issue 12).

Which queues (``standby_partitions``, pure): for each control partition claimed by a member,
the next ``standby_replicas`` members after it in id order, among the members that hold a
partition (a member killed and taken over holds none, so it drops out of the ring). A member
tails the changelog topics of the queues of the partitions it is standby for.

How (``Standby``): one thread and one read_committed consumer for all of them. A queue newly
tailed is first brought up to date by the ordinary ``restore`` (from the store's changelog
offsets, or from the last snapshot when it has none); then its changelog partitions join the
consumer's assignment at the store's offsets, and every batch is applied as a restore applies
it (``layer.state.recovery.Tail``: entries and offsets in one store write). The copy is the same
local state a restart on this state directory finds, no more: the takeover itself is unchanged
(``Seat.assigned``): the last owner is fenced, then the queue is restored, which reads
the changelog from the stored offsets to its end, so nothing confirmed is lost and no lease is
granted twice; the standby only makes that tail short. Before the takeover restores a queue it
``release``s it: no batch of it is applied after ``release`` returns.

Cost: one consumer (an idle fetch every ``FETCH_WAIT_MS``), and the store writes a restore would
do, spread over time. The backlog of a queue (its messages not done yet) is not copied: a
takeover reads it from the underlying topics, as a restart without local state does.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from layer.coordinator.membership import ClusterMap
from layer.exceptions import QLayerError, RestoreStopped
from layer.state.base import Store
from layer.state.recovery import Tail, restore, take_batch

__all__ = ["FETCH_WAIT_MS", "Standby", "standby_partitions"]

log = logging.getLogger(__name__)

#: how long an idle fetch of the standby consumer waits (a standby lags by about this much)
FETCH_WAIT_MS = 200
#: how long ``close`` waits for the thread (it stops between fetches: well under a second,
#: but a metadata request may take up to its 10 s timeout)
CLOSE_WAIT_S = 12.0
#: a queue whose tail failed (its topic missing, a record that does not apply) is tried again
#: after this long
RETRY_S = 10.0


def standby_partitions(cmap: ClusterMap, me: str, replicas: int) -> set[int]:
    """The control partitions ``me`` is a standby of: for each partition claimed by another
    member, the ``replicas`` members after its owner in id order, among the members holding a
    partition (so every member works out the same ring from the members topic)."""
    if replicas <= 0:
        return set()
    claims = {p: o.member for p, o in cmap.owners.items() if not o.released}
    ring = sorted(set(claims.values()) & set(cmap.members))
    mine: set[int] = set()
    if me not in ring:
        return mine
    for p, owner in claims.items():
        if owner == me or owner not in ring:
            continue
        at = ring.index(owner)
        after = [ring[(at + k) % len(ring)] for k in range(1, min(replicas, len(ring) - 1) + 1)]
        if me in after:
            mine.add(p)
    return mine


class Standby:
    """Tails the changelog topics of the queues it is told to ``want`` into ``store``."""

    def __init__(
        self,
        store: Store,
        consumer_settings: Mapping[str, Any],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._settings = {
            **consumer_settings,
            "group.id": f"qlayer-standby-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "error",  # a stored offset outside the log: not skipped
            "fetch.wait.max.ms": FETCH_WAIT_MS,
        }
        self._restore_settings = dict(consumer_settings)
        self._clock = clock
        self._lock = threading.Condition()
        self._wanted: dict[str, str] = {}  # queue -> changelog topic (the loop's wish)
        self._tails: dict[str, Tail] = {}  # queue -> its tail, once caught up (the thread's)
        self._topics: dict[str, str] = {}  # changelog topic -> queue, of the tails
        self._busy: str | None = None  # the queue being restored by the thread
        self._failed: dict[str, float] = {}  # queue -> when it may be tried again
        self._stop = threading.Event()
        self._changed = True  # the assignment is to be made again
        self._gen = 0  # changes asked for ...
        self._assigned_gen = 0  # ... and the last one the consumer's assignment reflects
        self._thread: threading.Thread | None = None
        self.applied = 0  # records applied by the tails (not by the first restores)

    # --- the loop's side ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="standby", daemon=True)
        self._thread.start()

    def want(self, queues: Mapping[str, str]) -> None:
        """Tail these queues (name -> changelog topic) from now on, and no other."""
        with self._lock:
            if dict(queues) != self._wanted:
                self._wanted = dict(queues)
                self._change()
                self._lock.notify_all()

    @property
    def tailing(self) -> set[str]:
        """The queues whose copy is caught up and followed."""
        with self._lock:
            return set(self._tails)

    async def release(self, queues: set[str], unassigned: bool = False) -> None:
        """Stop tailing ``queues`` (before this member restores them itself): returns once no
        batch of theirs can be applied any more (a first restore of one under way stops at
        its next fetch); ``unassigned``: and once the consumer no longer reads their topics
        (before they are deleted)."""
        with self._lock:
            held = queues & (set(self._wanted) | set(self._tails) | {self._busy})
            if not held and (not unassigned or self._assigned_gen >= self._gen):
                return
            for name in queues:
                self._wanted.pop(name, None)
            self._change()
            self._lock.notify_all()
        await asyncio.to_thread(self._released, queues, unassigned)

    def _change(self) -> None:
        self._changed = True
        self._gen += 1

    def _released(self, queues: set[str], unassigned: bool) -> None:
        with self._lock:
            # a batch is applied holding the lock, only for a wanted queue: once the first
            # restore of a released queue is over, nothing of it is written any more
            target = self._gen
            self._lock.wait_for(
                lambda: (
                    self._stop.is_set()
                    or (
                        self._busy not in queues
                        and (not unassigned or self._assigned_gen >= target or not self._running)
                    )
                )
            )
            for name in queues & set(self._tails):
                del self._tails[name]
            self._topics = {t: q for t, q in self._topics.items() if q in self._tails}

    def close(self) -> None:
        """Stop the thread, a first restore under way too (between two fetches: what it
        applied is kept and a later restore resumes there)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(CLOSE_WAIT_S)
            if self._thread.is_alive():
                log.warning("standby: its thread did not stop within %.0fs", CLOSE_WAIT_S)

    # --- the thread --------------------------------------------------------------------------

    @property
    def _running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        consumer = Consumer(self._settings)
        try:
            while not self._stop.is_set():
                try:
                    self._step(consumer)
                except (QLayerError, KafkaException) as exc:
                    log.warning("standby: %s", exc)
                    self._stop.wait(1.0)
        except Exception:
            log.exception("standby replica stopped")
        finally:
            consumer.close()

    def _step(self, consumer: Consumer) -> None:
        self._catch_up_one()
        with self._lock:
            if self._changed:
                self._changed = False
                gen = self._gen
                for gone in set(self._tails) - set(self._wanted):
                    del self._tails[gone]
                self._topics = {t: q for t, q in self._topics.items() if q in self._tails}
                assignment = self._assignment(consumer)
                consumer.assign(assignment)
                self._assigned_gen = gen
                self._lock.notify_all()
            idle = not self._topics
            if idle and not self._to_catch_up():
                self._lock.wait(0.5)
                return
        if idle:
            return
        messages = take_batch(consumer, 5_000, 0.2)
        records: dict[str, list[Any]] = {}
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    self._fail(self._topics.get(str(msg.topic())), str(err))
                continue
            records.setdefault(str(msg.topic()), []).append(msg)
        with self._lock:
            for topic, batch in records.items():
                name = self._topics.get(topic)
                tail = None if name is None else self._tails.get(name)
                if name is None or tail is None or name not in self._wanted:
                    continue  # released meanwhile: its records are no longer this copy's
                try:
                    self.applied += tail.apply(batch)
                except QLayerError as exc:
                    self._fail(name, str(exc))

    def _assignment(self, consumer: Consumer) -> list[KafkaPartition]:
        """Every changelog partition of the tails, at the offsets the store reached."""
        out = []
        for topic in self._topics:
            if self._stop.is_set():
                break  # closing: the assignment no longer matters
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is None or metadata.error is not None:
                continue
            for p in sorted(metadata.partitions):
                offset = self._store.changelog_offset(topic, p)
                out.append(KafkaPartition(topic, p, OFFSET_BEGINNING if offset is None else offset))
        return out

    def _to_catch_up(self) -> list[str]:
        now = self._clock()
        return [
            name
            for name in sorted(self._wanted)
            if name not in self._tails and self._failed.get(name, 0.0) <= now
        ]

    def _catch_up_one(self) -> None:
        """Bring one wanted queue's copy up to date with a restore, then follow it."""
        with self._lock:
            todo = self._to_catch_up()
            if not todo:
                return
            name = self._busy = todo[0]
            topic = self._wanted[name]
        started = self._clock()

        def stop() -> bool:  # closing, or the queue released (its takeover waits on this)
            with self._lock:
                return self._stop.is_set() or self._wanted.get(name) != topic

        try:
            result = restore(
                self._store,
                self._restore_settings,
                topic,
                name,
                idle_timeout=10.0,
                stop=stop,
            )
        except RestoreStopped:
            with self._lock:
                self._busy = None
                self._lock.notify_all()
            return
        except QLayerError as exc:
            with self._lock:
                self._busy = None
                self._lock.notify_all()
            self._fail(name, str(exc))
            return
        with self._lock:
            self._busy = None
            self._lock.notify_all()
            if self._wanted.get(name) != topic:
                return  # released (or changed) while it restored
            self._tails[name] = Tail(self._store, topic)
            self._topics[topic] = name
            self._change()
        log.info(
            "standby of queue=%s: %d changelog records caught up in %.2fs, following",
            name,
            result.records_applied,
            self._clock() - started,
            extra={"queue": name},
        )

    def _fail(self, name: str | None, why: str) -> None:
        if name is None:
            log.warning("standby: %s", why)
            return
        log.warning("standby of queue=%s stopped, tried again in %.0fs: %s", name, RETRY_S, why)
        with self._lock:
            self._tails.pop(name, None)
            self._topics = {t: q for t, q in self._topics.items() if q != name}
            self._failed[name] = self._clock() + RETRY_S
            self._change()
