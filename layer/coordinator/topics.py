"""The topics a queue needs, created at start (and by a reload) when missing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from connectors.admin import TopicSpec
from layer.config import Config, QueueConfig
from layer.coordinator.publish_route import routes_publishes
from layer.coordinator.view_history import VIEW_TOPIC_CONFIG
from layer.exceptions import ConfigError

__all__ = ["check_view_topic", "needed_topics"]


def needed_topics(cfg: Config, queues: Sequence[QueueConfig]) -> list[TopicSpec]:
    """Changelog, dead-letter, underlying (a name, not a regex), publish and view topics;
    queues may share topics: each is named once (a duplicate in one request is an error)."""
    specs = []
    for q in queues:
        specs.append(
            TopicSpec(
                cfg.coordinator.changelog_topic(q.name),
                partitions=1,
                config={"cleanup.policy": "compact"},
            )
        )
        if q.dead_letter_topic:
            specs.append(TopicSpec(q.dead_letter_topic, partitions=1))
        if not q.topic_is_regex:
            specs.append(TopicSpec(q.underlying_topic, partitions=q.partitions or 1))
        if q.default_publish_target:
            specs.append(TopicSpec(q.default_publish_target, partitions=1))
        if routes_publishes(q):
            specs.append(TopicSpec(q.name, partitions=1))
        if q.view_topic:
            # a generation keeps every round: a queue's rounds share one key; whole generations
            # are deleted once a newer one's snapshot makes them obsolete (layer.viewgen)
            specs.append(TopicSpec(q.view_topic, partitions=1, config=VIEW_TOPIC_CONFIG))
    return list({spec.name: spec for spec in specs}.values())


def check_view_topic(cfg: Config, q: QueueConfig, topic_config: Mapping[str, str]) -> None:
    """``ConfigError`` when the queue's view topic (which exists) would not keep every round."""
    policy = topic_config.get("cleanup.policy", "delete")
    if "compact" in policy:
        raise ConfigError(
            f"{cfg.source}: queue {q.name!r}: option 'view_topic': topic"
            f" {q.view_topic!r} has cleanup.policy={policy}, but a view topic must"
            " keep every record (a queue's rounds share one key): use a new topic,"
            " or set cleanup.policy=delete and retention.ms=-1 on it"
        )
