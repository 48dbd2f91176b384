"""Topic administration: create (idempotently), list, count partitions, delete."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from layer.exceptions import BrokerError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """A topic to create: its name, partition count and topic configs (``cleanup.policy``...)."""

    name: str
    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    replication_factor: int = -1  # the broker's default.replication.factor


def _error_code(exc: KafkaException) -> int | None:
    error = exc.args[0] if exc.args else None
    return error.code() if isinstance(error, KafkaError) else None


class TopicAdmin:
    """Topic administration over one confluent-kafka ``AdminClient``.

    ``settings`` are librdkafka settings, usually ``admin_settings(client_settings(...))``.
    """

    def __init__(self, settings: Mapping[str, Any], *, timeout: float = DEFAULT_TIMEOUT) -> None:
        # Never create a topic as a side effect of a metadata request (see admin_settings).
        self._admin = AdminClient({**settings, "allow.auto.create.topics": False})
        self._timeout = timeout

    def ensure_topics(self, specs: Iterable[TopicSpec]) -> list[str]:
        """Create the topics that do not exist yet; return the names created by this call.

        A topic that already exists is left as it is (its partitions and configs unchecked).
        """
        specs = list(specs)
        if not specs:
            return []
        new_topics = [
            NewTopic(
                spec.name,
                num_partitions=spec.partitions,
                replication_factor=spec.replication_factor,
                config=dict(spec.config),
            )
            for spec in specs
        ]
        try:
            futures = self._admin.create_topics(
                new_topics, operation_timeout=self._timeout, request_timeout=self._timeout
            )
        except KafkaException as exc:
            names = ", ".join(spec.name for spec in specs)
            raise BrokerError(f"cannot create topics {names}: {exc}") from exc
        created = []
        for spec in specs:
            try:
                futures[spec.name].result(timeout=self._timeout + 5)
            except KafkaException as exc:
                if _error_code(exc) == KafkaError.TOPIC_ALREADY_EXISTS:
                    logger.debug("topic exists topic=%s", spec.name)
                    continue
                raise BrokerError(f"cannot create topic {spec.name!r}: {exc}") from exc
            except TimeoutError as exc:
                raise BrokerError(f"creating topic {spec.name!r} timed out") from exc
            logger.info("topic created topic=%s partitions=%s", spec.name, spec.partitions)
            created.append(spec.name)
        return created

    def topic_config(self, topic: str) -> dict[str, str]:
        """The topic's configuration as the broker describes it (Tansu: only what was set)."""
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        try:
            future = self._admin.describe_configs([resource], request_timeout=self._timeout)
            entries = future[resource].result(timeout=self._timeout + 5)
        except (KafkaException, TimeoutError) as exc:
            raise BrokerError(f"cannot describe topic {topic!r}: {exc}") from exc
        return {name: entry.value for name, entry in entries.items() if entry.value is not None}

    def list_topics(self, pattern: re.Pattern[str] | None = None) -> dict[str, int]:
        """Topic name -> partition count, for topics whose whole name matches ``pattern``.

        Internal topics (names starting with ``__``) are left out.
        """
        try:
            metadata = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            raise BrokerError(f"cannot list topics: {exc}") from exc
        return {
            name: len(topic.partitions)
            for name, topic in sorted(metadata.topics.items())
            if not name.startswith("__")
            and topic.error is None
            and (pattern is None or pattern.fullmatch(name))
        }

    def partitions(self, topic: str) -> int:
        """The number of partitions of ``topic``; BrokerError if it does not exist."""
        try:
            metadata = self._admin.list_topics(topic=topic, timeout=self._timeout)
        except KafkaException as exc:
            raise BrokerError(f"cannot read the metadata of topic {topic!r}: {exc}") from exc
        entry = metadata.topics.get(topic)
        if entry is None or entry.error is not None:
            reason = entry.error if entry is not None else "not in the metadata"
            raise BrokerError(f"topic {topic!r} is unavailable: {reason}")
        return len(entry.partitions)

    def delete_topics(self, names: Iterable[str], *, missing_ok: bool = True) -> None:
        """Delete the topics; with ``missing_ok`` a topic that does not exist is no error."""
        names = list(names)
        if not names:
            return
        try:
            futures = self._admin.delete_topics(
                names, operation_timeout=self._timeout, request_timeout=self._timeout
            )
        except KafkaException as exc:
            raise BrokerError(f"cannot delete topics {', '.join(names)}: {exc}") from exc
        for name in names:
            try:
                futures[name].result(timeout=self._timeout + 5)
            except KafkaException as exc:
                if missing_ok and _error_code(exc) == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    continue
                raise BrokerError(f"cannot delete topic {name!r}: {exc}") from exc
            except TimeoutError as exc:
                raise BrokerError(f"deleting topic {name!r} timed out") from exc
            logger.info("topic deleted topic=%s", name)
