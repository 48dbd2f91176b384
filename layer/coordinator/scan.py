"""Reading a whole topic once, committed records only, to the end of every partition.

For what the coordinator reads back from its own output topics on demand: the view topic at a
restart (``view``), the dead-letter topic for a redrive (``redrive``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaPartition

from layer.exceptions import BrokerError


def scan_topic(
    settings: Mapping[str, Any],
    topic: str,
    what: str,
    on_message: Callable[[Message], None],
    idle_timeout: float = 30.0,
) -> None:
    """Call ``on_message`` for every committed record of ``topic`` in log order per partition
    (``what`` names the topic in errors, e.g. "view topic"). Raises ``BrokerError`` when the
    topic is missing, a fetch fails, or nothing arrives for ``idle_timeout`` seconds."""
    consumer = Consumer(
        {
            **settings,
            "group.id": f"qlayer-scan-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        meta = consumer.list_topics(topic, timeout=idle_timeout).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise BrokerError(f"{what} {topic} is not available: {meta and meta.error}")
        partitions = sorted(meta.partitions)
        consumer.assign([KafkaPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        pending, last = set(partitions), time.monotonic()
        while pending:
            batch = consumer.consume(num_messages=10_000, timeout=0.2)
            for msg in batch:
                err = msg.error()
                if err is None:
                    on_message(msg)
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise BrokerError(f"reading {what} {topic} failed: {err}")
            if batch:
                last = time.monotonic()
            elif time.monotonic() - last > idle_timeout:
                raise BrokerError(
                    f"{what} {topic}: no records nor end of partition for {idle_timeout:.0f}s"
                )
    except KafkaException as exc:
        raise BrokerError(f"reading {what} {topic} failed: {exc}") from exc
    finally:
        consumer.close()
