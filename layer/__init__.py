"""qlayer: message-queue semantics (AMPS-style queues) on Apache Kafka.

Consumers use ``QueueClient`` (blocking) or ``AsyncQueueClient`` (asyncio) against a running
coordinator (``qlayer coordinator --config FILE``).
"""

from layer.client import AsyncQueueClient, QueueClient
from layer.engine.model import Bookmark
from layer.exceptions import (
    ClientError,
    ConfigError,
    LeaseError,
    NotLeaseHolder,
    NotOwner,
    QLayerError,
    UnknownBookmark,
    UnknownQueue,
)

__all__ = [
    "AsyncQueueClient",
    "Bookmark",
    "ClientError",
    "ConfigError",
    "LeaseError",
    "NotLeaseHolder",
    "NotOwner",
    "QLayerError",
    "QueueClient",
    "UnknownBookmark",
    "UnknownQueue",
]
