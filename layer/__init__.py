"""qlayer: message-queue semantics (AMPS-style queues) on Apache Kafka.

Consumers use ``QueueClient`` (blocking) or ``AsyncQueueClient`` (asyncio) against a running
coordinator (``qlayer coordinator --config FILE``).
"""

import os
from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

# grpc core's own fork handlers are on by default while its Python side is not: a fork made
# while a gRPC call runs in another thread (a subprocess with preexec_fn, as pyspark launches
# its JVM) then aborts the child now and then (8-11 children in 300 here), and the launch
# fails. Off, a child that execs at once is safe. grpc reads this when it is imported: from
# here it is set before any qlayer module imports grpc. A caller's own setting is kept.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

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
