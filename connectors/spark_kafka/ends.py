"""Where the partitions a stream reads end, kept by one consumer on the driver for the stream's
life.

Spark asks a stream's source for its latest offsets before every micro-batch. Asking the broker
afresh each time (a new consumer: connect, metadata, ListOffsets, then a fetch whose response
carries the high watermark, or under ``read_committed`` the last stable offset, which librdkafka
reports only in its statistics; :func:`connectors.kafka.read_watermarks`) took ~120 ms of every
micro-batch on the embedded broker, more under load. ``EndFollower`` keeps one consumer
assigned to the partitions and reads them forward, dropping the records: a partition ends
where the records and end-of-partition events it handed over reach. Like ``read_watermarks``
that comes from fetch responses, so it is right on every broker (ListOffsets(latest) is not on
Tansu), and under ``read_committed`` it is the last stable offset. It is as fresh as the last
fetch response: librdkafka fetches again as soon as one returns (Tansu holds an empty fetch for
``fetch.wait.max.ms``, 10 ms by default here). So that a record committed just before Spark asks
is not left for the micro-batch after, each call first asks ListOffsets(latest) (one request
on the open connection) and waits until the records read reach it.

It reads every record of its partitions, so it suits small topics, such as a queue's view
topic (a record per coordinator round, ~12 bytes a change), not a topic of messages.

The consumer is made anew whenever the set of partitions changes (a stream goes on into a new
view generation, or stops reading an old one; ``retain`` drops the generations a planned
micro-batch finishes as soon as it is planned), so it never stays on a topic it stopped reading:
librdkafka crashes the process on Tansu when a topic is deleted under an assigned consumer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from connectors.spark_kafka.options import TP, Offsets
from connectors.spark_kafka.reading import low_watermarks, message_offset, take
from layer.exceptions import BrokerError

__all__ = ["EndFollower"]

#: records taken from librdkafka per call while catching up
_TAKE = 10_000
#: how long ``ends`` waits for the follower to reach what ListOffsets says is there
SETTLE_S = 0.2
#: how long ``ends`` waits for a ListOffsets answer (without one, the end is as last fetched)
BOUND_TIMEOUT_S = 5.0


class EndFollower:
    """The ends of partitions, followed by one long-lived consumer (see the module docstring).

    ``config`` is the stream's consumer configuration (bootstrap servers, security settings,
    isolation level); ``timeout``: how long to wait for the first fetch response of a partition.
    """

    def __init__(self, config: dict[str, Any], timeout: float) -> None:
        self._config = {
            **config,
            "enable.partition.eof": True,
            # an offset the broker no longer has: go on from the end (only the end matters)
            "auto.offset.reset": "latest",
        }
        self._timeout = timeout
        self._consumer: Consumer | None = None
        self._assigned: frozenset[TP] = frozenset()
        self._ends: dict[TP, int] = {}
        self._answered: set[TP] = set()  # a fetch response came back for it since assigned

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def ends(self, partitions: Sequence[TP]) -> Offsets:
        """Where each of ``partitions`` ends: at least as far as what was committed when the
        call began (see ``_bounds``), waiting for the first fetch response of a partition not
        followed before."""
        wanted = frozenset(partitions)
        if not wanted:
            self.close()
            self._assigned = wanted
            return {}
        if self._consumer is None or wanted != self._assigned:
            self._follow(wanted)
        consumer = self._consumer
        assert consumer is not None
        bounds = self._bounds(consumer, wanted)
        self._take(consumer, 0)
        deadline = time.monotonic() + self._timeout
        while not wanted <= self._answered:
            if time.monotonic() > deadline:
                missing = ", ".join(f"{t}/{p}" for t, p in sorted(wanted - self._answered))
                raise BrokerError(
                    f"no fetch response within {self._timeout:.0f}s for {missing}"
                    " (kafkaConsumer.pollTimeoutMs)"
                )
            self._take(consumer, 0.05)
        settle = time.monotonic() + SETTLE_S
        while any(self._ends[tp] < bound for tp, bound in bounds.items()):
            if time.monotonic() > settle:
                break  # a transaction still open at the end: the next micro-batch has it
            self._take(consumer, 0.01)
        return {tp: self._ends[tp] for tp in sorted(wanted)}

    def _bounds(self, consumer: Consumer, wanted: frozenset[TP]) -> dict[TP, int]:
        """Per partition, ListOffsets(latest) now: what a fetch response the follower got
        before the call began may not show yet. On Kafka under ``read_committed`` it is the
        last stable offset; on Tansu, the last batch's base offset + 1: past what is stable
        while a transaction is open at the end (``ends`` waits at most ``SETTLE_S`` for it).
        A partition the broker cannot answer for now has no bound (its end stays as last
        fetched)."""
        bounds = {}
        for topic, partition in sorted(wanted):
            try:
                _low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=min(self._timeout, BOUND_TIMEOUT_S)
                )
            except KafkaException:
                continue
            if high is not None and high >= 0:
                bounds[(topic, partition)] = int(high)
        return bounds

    def retain(self, partitions: Sequence[TP]) -> None:
        """Follow only those of the followed partitions that are in ``partitions``: the others
        are closed now (a new consumer on the rest, from their known ends)."""
        keep = self._assigned & frozenset(partitions)
        if self._consumer is None or keep == self._assigned:
            return
        if keep:
            self._follow(keep)
        else:
            self.close()
            self._assigned = keep

    def earliest(self, partitions: Sequence[TP]) -> Offsets | None:
        """Low watermarks of ``partitions`` through the follower's consumer, or None when it
        does not follow them all (it asks only about topics it is assigned)."""
        if self._consumer is None or not set(partitions) <= self._assigned:
            return None
        return low_watermarks(self._consumer, partitions, self._timeout)

    def _follow(self, wanted: frozenset[TP]) -> None:
        """A new consumer on ``wanted``: each partition from its known end, a new one from
        ListOffsets(latest) (the end on Kafka, the last batch's base offset + 1 on Tansu:
        never past the end), read from there to its end."""
        self.close()
        self._answered &= wanted
        self._ends = {tp: end for tp, end in self._ends.items() if tp in wanted}
        consumer = Consumer(self._config)
        try:
            assignment = []
            for topic, partition in sorted(wanted):
                start = self._ends.get((topic, partition))
                if start is None:
                    try:
                        _low, start = consumer.get_watermark_offsets(
                            TopicPartition(topic, partition), timeout=self._timeout
                        )
                    except KafkaException as exc:
                        raise BrokerError(
                            f"cannot read the watermarks of {topic}/{partition}: {exc}"
                        ) from exc
                    start = max(0, int(start))
                    self._ends[(topic, partition)] = start
                assignment.append(TopicPartition(topic, partition, start))
            consumer.assign(assignment)
        except BaseException:
            consumer.close()
            raise
        self._consumer, self._assigned = consumer, wanted

    def _take(self, consumer: Consumer, timeout: float) -> None:
        """Take what librdkafka has fetched (waiting up to ``timeout`` for the first of it)."""
        ends, answered = self._ends, self._answered
        while True:
            messages = take(consumer, _TAKE, timeout)
            if not messages:
                return
            timeout = 0
            for message in messages:
                tp = (message.topic(), message.partition())
                error = message.error()
                if error is None:
                    offset = message_offset(message) + 1
                elif error.code() == KafkaError._PARTITION_EOF:
                    offset = message_offset(message)
                elif tp[0] is None or error.retriable():
                    continue  # librdkafka retries; a partition not answered times out
                else:
                    raise BrokerError(f"following the end of {tp[0]}/{tp[1]}: {error}")
                if tp in self._assigned:
                    ends[tp] = max(ends.get(tp, 0), offset)
                    answered.add(tp)
