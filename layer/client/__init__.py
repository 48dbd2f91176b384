"""Python clients of a qlayer server: blocking (``QueueClient``) and asyncio
(``AsyncQueueClient``). Both hide the gRPC stream behind an iterator of messages with batched
``ack()`` / ``cancel(delay)`` / ``expire()`` / ``extend(seconds)``, replace a subscription's queue,
content filter or backlog in place, and browse or ack a queue by filter."""

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
