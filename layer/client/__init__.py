"""Python clients of a qlayer server: blocking (``QueueClient``) and asyncio
(``AsyncQueueClient``). Both hide the gRPC stream behind an iterator of messages with batched
``ack()`` / ``cancel(delay)`` / ``expire()`` / ``extend(seconds)``, replace a subscription's queue,
content filter or backlog in place, and browse or ack a queue by filter."""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from layer.client._common import BrowsedMessage
    from layer.client._core import Reconnected
    from layer.client.aio import AsyncMessage, AsyncQueueClient, AsyncSubscription
    from layer.client.partitioned import (
        AsyncMergedSubscription,
        AsyncPartitionedSubscription,
        AsyncRegexSubscription,
        MergedSubscription,
        PartitionedSubscription,
        RegexSubscription,
    )
    from layer.client.sync import Message, QueueClient, Subscription
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.client._common": ("BrowsedMessage",),
            "layer.client._core": ("Reconnected",),
            "layer.client.aio": ("AsyncMessage", "AsyncQueueClient", "AsyncSubscription"),
            "layer.client.partitioned": (
                "AsyncMergedSubscription",
                "AsyncPartitionedSubscription",
                "AsyncRegexSubscription",
                "MergedSubscription",
                "PartitionedSubscription",
                "RegexSubscription",
            ),
            "layer.client.sync": ("Message", "QueueClient", "Subscription"),
        },
    )

__all__ = [
    "AsyncMergedSubscription",
    "AsyncMessage",
    "AsyncPartitionedSubscription",
    "AsyncQueueClient",
    "AsyncRegexSubscription",
    "AsyncSubscription",
    "BrowsedMessage",
    "Message",
    "MergedSubscription",
    "PartitionedSubscription",
    "QueueClient",
    "Reconnected",
    "RegexSubscription",
    "Subscription",
]
