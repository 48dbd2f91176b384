"""Where a queue's view is and how to read it: from the coordinator's config, or given outright."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from layer.config import Config, MessageType
from layer.config import load as load_config
from layer.exceptions import ConfigError
from layer.shards import view_topics

BOOTSTRAP_ENV = "QLAYER_BOOTSTRAP_SERVERS"

ConfigLike = Config | str | os.PathLike[str] | None


@dataclass(frozen=True, slots=True)
class ViewSettings:
    """One queue's view: the ``qlayer_view`` options that read it and how to parse its messages."""

    queue: str
    #: the queue's view topic; a partitioned queue's shards each write their own
    #: (``view_topics``), which the view reads together
    view_topic: str
    #: ``qlayer_view`` options: bootstrap, subscription, security settings, the caller's extras
    options: Mapping[str, str] = field(default_factory=dict)
    message_type: MessageType = MessageType.JSON
    #: the queue's Avro schema (JSON text) for ``message_type = "avro"``
    avro_schema: str | None = None
    #: the view topics read: ``view_topic``, or a partitioned queue's shards' (``layer.shards``)
    view_topics: tuple[str, ...] = ()


def view_settings(
    queue: str,
    *,
    config: ConfigLike = None,
    bootstrap_servers: str | None = None,
    view_topic: str | None = None,
    options: Mapping[str, str] | None = None,
) -> ViewSettings:
    """Resolve a queue's view. With ``config`` (the coordinator's file, or a loaded ``Config``)
    the queue must be configured there; ``view_topic`` and ``bootstrap_servers`` override what it
    says. Without it both must be given (``bootstrap_servers`` may come from
    ``$QLAYER_BOOTSTRAP_SERVERS``), and messages are taken for JSON.

    A partitioned queue (``distribution = "partitioned"``) is read from the view topics of its
    shards (``<view_topic>.shard-<i>``), merged: the config says how many. Without ``config``,
    ``view_topic`` may name those topics, comma-separated."""
    loaded = _load(config)
    message_type, avro_schema, kafka = MessageType.JSON, None, {}
    topics: list[str] = []
    where = f"queue {queue!r}"
    if loaded is not None:
        queue_config = loaded.queue(queue)  # UnknownQueue names the queue and the file
        where = f"{loaded.source}: queue {queue!r}"
        view_topic = view_topic or queue_config.view_topic
        if view_topic is None:
            raise ConfigError(
                f"{where}: option 'view_topic' is not set, so the coordinator publishes no view"
                ' of it: add view_topic = "<topic>" to its [[queue]] table and restart the'
                " coordinator"
            )
        topics = view_topics(replace(queue_config, view_topic=view_topic))
        message_type = queue_config.message_type
        if message_type == MessageType.AVRO and queue_config.avro_schema is not None:
            avro_schema = _read_schema(queue_config.avro_schema, where)
        bootstrap_servers = bootstrap_servers or loaded.broker.bootstrap_servers
        kafka = dict(loaded.broker.kafka)
    elif view_topic is None:
        raise ConfigError(
            f"{where}: no view topic: pass config= (the coordinator's config file, where the"
            " queue's option 'view_topic' is) or view_topic="
        )
    bootstrap_servers = bootstrap_servers or os.environ.get(BOOTSTRAP_ENV, "").strip() or None
    if bootstrap_servers is None:
        raise ConfigError(
            f"{where}: no Kafka bootstrap servers: pass bootstrap_servers=, set [broker]"
            f" bootstrap_servers in the config or ${BOOTSTRAP_ENV}"
        )
    resolved = {f"kafka.{key}": str(value) for key, value in kafka.items()}
    resolved["kafka.bootstrap.servers"] = bootstrap_servers
    topics = topics or [view_topic]
    resolved["subscribe"] = ",".join(topics)
    for key, value in (options or {}).items():
        if key.lower() in ("subscribe", "subscribepattern", "assign"):
            raise ConfigError(
                f"{where}: option {key!r}: the view reads the queue's view topic {view_topic!r};"
                " pass view_topic= to read another"
            )
        resolved[key] = str(value)
    return ViewSettings(queue, view_topic, resolved, message_type, avro_schema, tuple(topics))


def _load(config: ConfigLike) -> Config | None:
    if config is None or isinstance(config, Config):
        return config
    if isinstance(config, str | os.PathLike):
        return load_config(config)
    raise TypeError(f"config must be a path, a layer.config.Config or None, got {config!r}")


def _read_schema(path: Path, where: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{where}: option 'avro_schema': cannot read {path}: {exc}") from exc
