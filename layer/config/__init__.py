"""qlayer's configuration: one TOML file, validated once at load into frozen objects.

The file has three parts::

    [broker]                      # where Kafka is; omit bootstrap_servers for the embedded broker
    bootstrap_servers = "kafka:9092"
    [broker.kafka]                # librdkafka settings passed through verbatim (SASL, SSL...)
    "security.protocol" = "SASL_SSL"
    [coordinator]                 # the coordinator process: id, API address, state directory
    listen = "0.0.0.0:7070"
    [[queue]]                     # one table per queue, AMPS's queue options in snake_case
    name = "orders"
    underlying_topic = "orders"

Precedence, lowest first: defaults, the file, the environment (``QLAYER_BOOTSTRAP_SERVERS``,
``QLAYER_BROKER_PROFILE``, ``QLAYER_KAFKA_<KEY>``), then the CLI's overrides. Every error is a
``ConfigError`` that names the file, the section or queue, the option and, for values that did not
come from the file, the variable or flag they came from.

Objects built directly (in tests, say) are not validated: build them through ``load``/``loads``.
"""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from layer.config.loader import load, loads, queue_from_table, queue_table, reread
    from layer.config.model import (
        BrokerConfig,
        BrokerProfile,
        Config,
        CoordinatorConfig,
        Distribution,
        MessageType,
        OnUnparseable,
        QueueConfig,
        StartFrom,
    )
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.config.loader": ("load", "loads", "queue_from_table", "queue_table", "reread"),
            "layer.config.model": (
                "BrokerConfig",
                "BrokerProfile",
                "Config",
                "CoordinatorConfig",
                "Distribution",
                "MessageType",
                "OnUnparseable",
                "QueueConfig",
                "StartFrom",
            ),
        },
    )

__all__ = [
    "BrokerConfig",
    "BrokerProfile",
    "Config",
    "CoordinatorConfig",
    "Distribution",
    "MessageType",
    "OnUnparseable",
    "QueueConfig",
    "StartFrom",
    "load",
    "loads",
    "queue_from_table",
    "queue_table",
    "reread",
]
