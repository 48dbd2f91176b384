"""The API: gRPC transport (protobuf, ``proto/qlayer/v1/queue.proto``) in front of the
coordinator's ``QueueService``."""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from layer.api.access import RPC_RIGHTS, Access, Grant, Principal, Right
    from layer.api.server import ApiServer
    from layer.api.service import (
        AckFailure,
        AckWhereResult,
        DeadLetter,
        DeliveredMessage,
        DeliverySink,
        QueueDefinitionInfo,
        QueueInfo,
        QueueService,
        QueueStats,
        RedriveResult,
        ReloadChange,
        ReloadRefusal,
        ReloadResult,
        Subscription,
    )
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.api.access": ("RPC_RIGHTS", "Access", "Grant", "Principal", "Right"),
            "layer.api.server": ("ApiServer",),
            "layer.api.service": (
                "AckFailure",
                "AckWhereResult",
                "DeadLetter",
                "DeliveredMessage",
                "DeliverySink",
                "QueueDefinitionInfo",
                "QueueInfo",
                "QueueService",
                "QueueStats",
                "RedriveResult",
                "ReloadChange",
                "ReloadRefusal",
                "ReloadResult",
                "Subscription",
            ),
        },
    )

__all__ = [
    "RPC_RIGHTS",
    "Access",
    "AckFailure",
    "AckWhereResult",
    "ApiServer",
    "DeadLetter",
    "DeliveredMessage",
    "DeliverySink",
    "Grant",
    "Principal",
    "QueueInfo",
    "QueueService",
    "QueueStats",
    "RedriveResult",
    "QueueDefinitionInfo",
    "ReloadChange",
    "ReloadRefusal",
    "ReloadResult",
    "Right",
    "Subscription",
]
