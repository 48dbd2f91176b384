"""Calls one member of a cluster forwards to another: ``stats``, ``browse`` and ``publish`` of a
queue another member serves, so they work against any member (issue 12).

One client per peer address, made on first use and kept. The peer checks the call as its own
(the forwarding member's token: its ``admin_token``, else its ``auth_token``); the caller's
rights were checked by the member it called. Over TLS nothing is forwarded (the member's
certificate is a server's, not a client's): the caller gets ``NotOwner`` with the address.
"""

from __future__ import annotations

from layer.api.service import DeliveredMessage, QueueStats
from layer.client.aio import AsyncQueueClient
from layer.engine.model import Bookmark

__all__ = ["Peers"]


class Peers:
    def __init__(self, token: str | None) -> None:
        self._token = token
        self._clients: dict[str, AsyncQueueClient] = {}

    def _client(self, address: str) -> AsyncQueueClient:
        client = self._clients.get(address)
        if client is None:
            # no reconnect loop: the owner may be gone, the caller gets that at once
            client = self._clients[address] = AsyncQueueClient(
                address, self._token, reconnect=False, client_name="qlayer-peer"
            )
        return client

    async def stats(self, address: str, queue: str) -> list[QueueStats]:
        return await self._client(address).stats(queue)

    async def browse(
        self, address: str, queue: str, filter: str | None, limit: int | None
    ) -> list[DeliveredMessage]:
        browsed = await self._client(address).browse(queue, filter, limit)
        return [
            DeliveredMessage(
                bookmark=Bookmark.parse(m.bookmark),
                key=m.key,
                value=m.value,
                headers=list(m.headers),
                timestamp_ms=m.timestamp_ms,
                deliveries=m.deliveries,
                cancels=m.cancels,
                lease_deadline_ms=None,
                barrier=m.barrier,
                queue=queue,
                parse_error=m.parse_error,
            )
            for m in browsed
        ]

    async def publish(
        self,
        address: str,
        queue: str,
        value: bytes,
        key: bytes | None,
        headers: list[tuple[str, bytes | None]],
    ) -> Bookmark:
        bookmark = await self._client(address).publish(queue, value, key, headers or None)
        return Bookmark.parse(bookmark)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
