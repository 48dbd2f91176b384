"""The doors to Kafka: broker launchers, librdkafka settings, per-broker profiles, topic admin."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Literal, Protocol

from layer._lazy import lazy_exports
from layer.exceptions import BrokerError, ConfigError

if TYPE_CHECKING:
    from connectors.admin import TopicAdmin, TopicSpec
    from connectors.containers import KafkaContainerBroker
    from connectors.embedded import EmbeddedBroker, find_tansu_binary
    from connectors.kafka import (
        KAFKA,
        PROFILES,
        TANSU,
        BrokerProfile,
        IsolationLevel,
        Watermarks,
        admin_settings,
        cached_high_watermark,
        client_settings,
        consumer_settings,
        detect_profile,
        producer_settings,
        read_watermarks,
    )
else:
    # confluent_kafka, psutil and the launchers only for a caller that uses them
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "connectors.admin": ("TopicAdmin", "TopicSpec"),
            "connectors.containers": ("KafkaContainerBroker",),
            "connectors.embedded": ("EmbeddedBroker", "find_tansu_binary"),
            "connectors.kafka": (
                "KAFKA",
                "PROFILES",
                "TANSU",
                "BrokerProfile",
                "IsolationLevel",
                "Watermarks",
                "admin_settings",
                "cached_high_watermark",
                "client_settings",
                "consumer_settings",
                "detect_profile",
                "producer_settings",
                "read_watermarks",
            ),
        },
    )

BOOTSTRAP_ENV_VAR = "QLAYER_BOOTSTRAP_SERVERS"

BrokerKind = Literal["embedded", "testcontainers", "external"]


class RunningBroker(Protocol):
    """A broker some code started (or was pointed at): where it is, and how to let it go."""

    @property
    def bootstrap_servers(self) -> str: ...

    def stop(self) -> object: ...


class ExternalBroker:
    """A broker qlayer did not start: ``stop()`` leaves it running."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers

    def stop(self) -> None:
        """Nothing to do: the broker belongs to someone else."""

    def __repr__(self) -> str:
        return f"ExternalBroker({self.bootstrap_servers})"


def start_broker(
    kind: BrokerKind | str = "embedded", bootstrap: str | None = None
) -> RunningBroker:
    """Start (or, for ``external``, locate) a broker; the caller must ``stop()`` it.

    ``external`` uses ``bootstrap`` or else ``$QLAYER_BOOTSTRAP_SERVERS``.
    """
    if kind == "embedded":
        from connectors.embedded import EmbeddedBroker

        return EmbeddedBroker().start()
    if kind == "testcontainers":
        from connectors.containers import KafkaContainerBroker

        return KafkaContainerBroker().start()
    if kind == "external":
        address = bootstrap or os.environ.get(BOOTSTRAP_ENV_VAR, "").strip()
        if not address:
            raise BrokerError(
                f"an external broker needs a bootstrap address: pass one or set {BOOTSTRAP_ENV_VAR}"
            )
        return ExternalBroker(address)
    raise ConfigError(
        f"unknown broker kind {kind!r}: expected embedded, external or testcontainers"
    )


__all__ = [
    "BOOTSTRAP_ENV_VAR",
    "BrokerKind",
    "BrokerProfile",
    "EmbeddedBroker",
    "ExternalBroker",
    "IsolationLevel",
    "KAFKA",
    "KafkaContainerBroker",
    "PROFILES",
    "RunningBroker",
    "TANSU",
    "TopicAdmin",
    "TopicSpec",
    "Watermarks",
    "admin_settings",
    "cached_high_watermark",
    "client_settings",
    "consumer_settings",
    "detect_profile",
    "find_tansu_binary",
    "producer_settings",
    "read_watermarks",
    "start_broker",
]
