"""qlayer: message-queue semantics (AMPS-style queues) on Apache Kafka.

Consumers use ``QueueClient`` (blocking) or ``AsyncQueueClient`` (asyncio) against a running
coordinator (``qlayer coordinator --config FILE``).
"""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
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
else:
    # the client (and grpc) only for a caller that asks for it: ``import layer.config`` or the
    # CLI's ``--help`` goes through this file too
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.client": ("AsyncQueueClient", "QueueClient"),
            "layer.engine.model": ("Bookmark",),
            "layer.exceptions": (
                "ClientError",
                "ConfigError",
                "LeaseError",
                "NotLeaseHolder",
                "NotOwner",
                "QLayerError",
                "UnknownBookmark",
                "UnknownQueue",
            ),
        },
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
