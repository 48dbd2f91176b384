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
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaPartition

from layer.codec import ChangeKind, decode, encode_key, encode_value
from layer.codec import ChangelogKey as Key
from layer.engine.model import Bookmark
from layer.exceptions import BrokerError, SerializationError

log = logging.getLogger(__name__)

REDRIVE_SUFFIX = "~redrive"
REDRIVEN_FROM = "qlayer.redriven-from"

#: (bookmark in the dead-letter topic, decoded envelope)
Letter = tuple[Bookmark, dict[str, Any]]


def read_dead_letters(
    settings: Mapping[str, Any], topic: str, queue: str, idle_timeout: float = 30.0
) -> list[Letter]:
    """Every committed dead letter of ``queue`` in ``topic`` (a topic may collect the letters
    of several queues), in log order. Records that are not envelopes are skipped and logged."""
    consumer = Consumer(
        {
            **settings,
            "group.id": f"qlayer-redrive-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    letters: list[Letter] = []
    try:
        meta = consumer.list_topics(topic, timeout=idle_timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise BrokerError(f"dead-letter topic {topic} is not available")
        partitions = sorted(meta.partitions)
        consumer.assign([KafkaPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, last = set(partitions), time.monotonic()
        while pending:
            batch = consumer.consume(num_messages=10_000, timeout=0.2)
            for msg in batch:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                        continue
                    raise BrokerError(f"reading dead-letter topic {topic} failed: {err}")
                where = Bookmark(topic, msg.partition() or 0, msg.offset() or 0)
                try:
                    envelope = decode("dead_letter", msg.value() or b"")
                except SerializationError as exc:
                    log.warning("dead-letter topic=%s record=%s skipped: %s", topic, where, exc)
                    continue
                if envelope["queue"] == queue:
                    letters.append((where, envelope))
            if batch:
                last = time.monotonic()
            elif time.monotonic() - last > idle_timeout:
                raise BrokerError(f"dead-letter topic {topic}: no end of partition in time")
    except KafkaException as exc:
        raise BrokerError(f"reading dead-letter topic {topic} failed: {exc}") from exc
    finally:
        consumer.close()
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
