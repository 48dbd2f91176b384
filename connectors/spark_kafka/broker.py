"""The driver's view of the broker: topic metadata and watermarks, never data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaException

from connectors.kafka import read_watermarks
from connectors.spark_kafka.options import (
    EARLIEST,
    LATEST,
    TP,
    KafkaSourceOptions,
    Offsets,
    OffsetSpec,
    Subscription,
)
from connectors.spark_kafka.reading import low_watermarks
from layer.exceptions import BrokerError, ConfigError

METADATA_TIMEOUT_S = 30.0


def metadata_consumer(options: KafkaSourceOptions) -> Consumer:
    """A consumer for metadata and watermarks (it is never assigned, so it reads no data)."""
    try:
        return Consumer(options.consumer_config(**{"enable.partition.eof": False}))
    except KafkaException as exc:
        raise ConfigError(f"the kafka.* options are refused by librdkafka: {exc}") from exc


class BrokerView:
    """The driver's questions to the broker for one planning step: topic metadata and
    watermarks, never data. The topics are listed once per ``BrokerView``, through ``lister``
    when given (a stream keeps one :func:`metadata_consumer` for its life: listing topics makes
    librdkafka hold no topic), else through a consumer of its own, made when first needed and
    closed on exit, which also asks for the watermarks."""

    def __init__(self, options: KafkaSourceOptions, lister: Consumer | None = None) -> None:
        self._options = options
        self._lister = lister
        self._own: Consumer | None = None
        self._topics: dict[str, list[int]] | None = None

    def __enter__(self) -> BrokerView:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._own is not None:
            self._own.close()
            self._own = None

    @property
    def _consumer(self) -> Consumer:
        if self._own is None:
            self._own = metadata_consumer(self._options)
        return self._own

    def topics(self) -> dict[str, list[int]]:
        """The broker's topics and their partitions (asked once per ``BrokerView``)."""
        if self._topics is not None:
            return self._topics
        try:
            lister = self._lister if self._lister is not None else self._consumer
            metadata = lister.list_topics(timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            raise BrokerError(
                f"cannot list the topics at {self._options.bootstrap_servers}: {exc}"
            ) from exc
        self._topics = {
            name: sorted(topic.partitions)
            for name, topic in metadata.topics.items()
            if topic.error is None
        }
        return self._topics

    def partitions(self, subscription: Subscription | None = None) -> list[TP]:
        """The partitions of ``subscription`` (default: the options'), as they are now."""
        return (subscription or self._options.subscription).resolve(self.topics())

    def resolve(
        self,
        spec: OffsetSpec,
        option: str,
        partitions: Sequence[TP],
        latest: Mapping[TP, int] | None = None,
    ) -> Offsets:
        """``spec`` for ``partitions``, asking the broker only for the watermarks it needs."""
        wants_earliest = spec.kind == "earliest" or bool(spec.uses(EARLIEST))
        wants_latest = spec.kind == "latest" or bool(spec.uses(LATEST))
        earliest = self.earliest(partitions) if wants_earliest else {}
        if wants_latest and latest is None:
            latest = self.latest(partitions)
        return spec.resolve(option, partitions, earliest, latest or {})

    def earliest(self, partitions: Sequence[TP]) -> Offsets:
        """Low watermarks (ListOffsets(earliest) is right on every broker)."""
        return low_watermarks(self._consumer, partitions, METADATA_TIMEOUT_S)

    def latest(self, partitions: Sequence[TP]) -> Offsets:
        """High watermarks (last stable offsets under read_committed) from fetch responses.

        ListOffsets(latest) is wrong on some brokers (see
        :class:`connectors.kafka.BrokerProfile`); :func:`connectors.kafka.read_watermarks` takes
        the offset a fetch response carried, which is right everywhere.
        """
        settings: dict[str, Any] = self._options.client_settings()
        marks = read_watermarks(
            settings,
            partitions,
            isolation_level="read_committed"
            if self._options.read_committed
            else "read_uncommitted",
            timeout=METADATA_TIMEOUT_S,
        )
        return {tp: mark.high for tp, mark in marks.items()}
