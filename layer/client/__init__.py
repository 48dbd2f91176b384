"""Python clients of a qlayer server: blocking (``QueueClient``) and asyncio
(``AsyncQueueClient``). Both hide the gRPC stream behind an iterator of messages with batched
``ack()`` / ``cancel()`` / ``expire()`` / ``extend(seconds)``."""

from layer.client.aio import AsyncMessage, AsyncQueueClient, AsyncSubscription
from layer.client.sync import Message, QueueClient, Subscription

__all__ = [
    "AsyncMessage",
    "AsyncQueueClient",
    "AsyncSubscription",
    "Message",
    "QueueClient",
    "Subscription",
]
