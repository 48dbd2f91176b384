"""The API: gRPC transport (Avro frames) in front of the coordinator's ``QueueService``."""

from layer.api.server import ApiServer
from layer.api.service import (
    AckFailure,
    AckWhereResult,
    DeliveredMessage,
    DeliverySink,
    QueueInfo,
    QueueService,
    QueueStats,
    RedriveResult,
    Subscription,
)

__all__ = [
    "AckFailure",
    "AckWhereResult",
    "ApiServer",
    "DeliveredMessage",
    "DeliverySink",
    "QueueInfo",
    "QueueService",
    "QueueStats",
    "RedriveResult",
    "Subscription",
]
