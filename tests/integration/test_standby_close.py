"""A standby's close while its first copy of a queue is under way (``Standby.close``), against
a real broker: the copy's restore stops at its next fetch instead of running to its end."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from layer.coordinator.standby import Standby
from layer.state.memory import MemoryStore


def test_a_standby_closes_while_its_first_copy_is_under_way(
    topic_factory: Callable[..., str],
    producer_factory: Callable[..., Producer],
    kafka_settings: dict[str, Any],
) -> None:
    topic = topic_factory(partitions=1)
    # a transaction left open: a read_committed restore does not find the end of the topic
    # soon (on Kafka: not before its 10 s idle timeout; on Tansu after 1-2 s of fetches that
    # bring nothing), so the copy is still under way when the close comes
    open_tx = producer_factory(transactional_id=f"open-{uuid.uuid4().hex}")
    open_tx.init_transactions(10)
    open_tx.begin_transaction()
    open_tx.produce(topic, b"never committed", key=b"k")
    assert open_tx.flush(10) == 0
    standby = Standby(MemoryStore(), kafka_settings)
    standby.start()
    try:
        standby.want({"q": topic})
        deadline = time.monotonic() + 20
        while standby._busy != "q":  # its first copy (a restore) started
            assert time.monotonic() < deadline, "the standby never began its copy"
            time.sleep(0.01)
        started = time.monotonic()
        standby.close()
        took = time.monotonic() - started
    finally:
        standby.close()
        open_tx.abort_transaction(10)
    assert standby._thread is not None and not standby._thread.is_alive()
    assert took < 3.0, f"close took {took:.1f}s"
    assert standby.tailing == set()  # the copy stopped: it did not run to its end
