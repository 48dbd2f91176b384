"""The standard gRPC health service (``grpc.health.v1.Health``) on the API server.

Answers for ``""`` (the whole server), for ``qlayer.v1.QueueService`` and for ``qlayer.Queue``
(the service's name before the API was protobuf, kept for probes that name it): SERVING while
the coordinator's ``Health.readiness()`` is ready, NOT_SERVING otherwise. The readiness is read
every ``interval`` seconds on the event loop rather than pushed from where it changes, because
Kafka's state changes on librdkafka's threads; ``Watch`` streams see each change within that
interval. At shutdown every service turns NOT_SERVING for good, so watchers learn of it before
the server goes.

Like any probe endpoint it needs no bearer token: it tells nothing but up or down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from grpc_health.v1 import health_pb2
from grpc_health.v1.health import aio

from layer.api.server import SERVICE_NAME
from layer.coordinator.health import Health

__all__ = ["GrpcHealth"]

log = logging.getLogger(__name__)

SERVICES = ("", SERVICE_NAME, "qlayer.Queue")


class GrpcHealth:
    """Keeps a ``grpc.health.v1`` servicer in step with ``Health``; register ``servicer``."""

    def __init__(self, health: Health, interval: float = 0.5) -> None:
        self.servicer = aio.HealthServicer()
        self._health = health
        self._interval = interval
        self._serving: bool | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Set the current status (so a Check never meets an unknown service) and follow it."""
        await self.update()
        self._task = asyncio.create_task(self._follow(), name="grpc-health")

    async def update(self) -> None:
        serving = self._health.readiness().ready
        if serving == self._serving:
            return
        self._serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in SERVICES:
            await self.servicer.set(service, status)
        log.debug("grpc health status changed", extra={"serving": serving})

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.servicer.enter_graceful_shutdown()

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.update()
