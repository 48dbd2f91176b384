"""Dead-letter redrive (SQS's redrive): dead letters of a queue go back into it, once each.

The queue's dead-letter topic is read from the beginning; every envelope of this queue that was
not redriven before (and matches the filter) is published again to the queue's publish target
as a new message, so it gets a new bookmark and fresh delivery counts. Each move is recorded in
the queue's changelog, in the same Kafka transaction as the copy: a DONE record with reason
``redriven`` keyed by the dead letter's own bookmark, under the companion name
``<queue>~redrive`` (``~`` is never part of a queue name). A later redrive skips what those
records name, across restarts and with the state directory wiped.

A copy keeps the original key, value and headers and adds ``qlayer.redriven-from``: the
bookmark the message had when it was dead-lettered.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import Message

from layer.api.service import RedriveResult
from layer.codec import ChangeKind, decode, encode_key, encode_value
from layer.codec import ChangelogKey as Key
from layer.coordinator.commits import Changelog
from layer.coordinator.scan import scan_topic
from layer.engine.model import Bookmark
from layer.exceptions import SerializationError
from layer.state.base import Store, StoreBatch
from layer.state.changelog import ChangelogRecord, ExtraRecord

log = logging.getLogger(__name__)

REDRIVE_SUFFIX = "~redrive"
REDRIVEN_FROM = "qlayer.redriven-from"

#: (bookmark in the dead-letter topic, decoded envelope)
Letter = tuple[Bookmark, dict[str, Any]]


def read_dead_letters(
    settings: Mapping[str, Any], topic: str, queue: str, idle_timeout: float = 30.0
) -> list[Letter]:
    """Every committed dead letter of ``queue`` in ``topic`` (a topic may collect the letters
    of several queues), in log order. Records that are not envelopes are skipped and logged.

    One letter per dead message: a copy with the same original bookmark is passed over. A
    message is dead-lettered once, but its letter can be in the topic twice when the
    changelog transaction that wrote it had to be redone (``DurableChangelog``: a commit whose
    outcome was unknown, or an aborted one on a broker that shows aborted records)."""
    letters: list[Letter] = []
    seen: set[str] = set()

    def collect(msg: Message) -> None:
        where = Bookmark(topic, msg.partition() or 0, msg.offset() or 0)
        try:
            envelope = decode("dead_letter", msg.value() or b"")
        except SerializationError as exc:
            log.warning("dead-letter topic=%s record=%s skipped: %s", topic, where, exc)
            return
        if envelope["queue"] == queue and envelope["bookmark"] not in seen:
            seen.add(envelope["bookmark"])
            letters.append((where, envelope))

    scan_topic(settings, topic, "dead-letter topic", collect, idle_timeout)
    return letters


def redriven_record(queue: str, letter: Bookmark, at_ms: int) -> tuple[bytes, bytes]:
    """The changelog record (key, value) that marks ``letter`` redriven."""
    key = encode_key(Key(queue + REDRIVE_SUFFIX, letter.topic, letter.partition, letter.offset))
    value = encode_value(ChangeKind.DONE, deliveries=0, cancels=0, reason="redriven", at_ms=at_ms)
    return key, value


def copy_of(
    target: str, letter: Bookmark, envelope: Mapping[str, Any]
) -> tuple[str, bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """The message to publish again: the original key, value and headers, plus where it was."""
    headers = [(h["key"], h["value"]) for h in envelope["headers"]]
    headers.append((REDRIVEN_FROM, envelope["bookmark"].encode()))
    return (target, envelope["key"], envelope["payload"], headers)


async def move(
    letters: Sequence[Letter],
    *,
    queue: str,
    changelog_topic: str,
    target: str,
    matches: Callable[[Mapping[str, Any]], bool] | None,
    limit: int | None,
    store: Store,
    changelog: Changelog,
    now_ms: int,
) -> RedriveResult:
    """Publish again the letters not redriven before that match (a predicate on the envelope), up to
    ``limit``; each copy and its changelog record in one transaction, then in the store."""
    done = {bm for bm, _ in store.entries(queue + REDRIVE_SUFFIX)}
    records: list[ChangelogRecord] = []
    extra: list[ExtraRecord] = []
    batch = StoreBatch()
    already = unmatched = 0
    for letter, envelope in letters:
        if letter in done:
            already += 1
            continue
        if matches is not None and not matches(envelope):
            unmatched += 1
            continue
        if limit is not None and len(extra) >= limit:
            break
        key, value = redriven_record(queue, letter, now_ms)
        records.append((changelog_topic, key, value))
        extra.append(copy_of(target, letter, envelope))
        batch.put_entry_value(queue + REDRIVE_SUFFIX, letter, value)
    if records:
        offsets = await changelog.commit(records, extra)
        for (topic, partition), last in offsets.items():
            batch.set_changelog_offset(topic, partition, last + 1)
        store.write(batch)
    return RedriveResult(len(extra), already, unmatched)
