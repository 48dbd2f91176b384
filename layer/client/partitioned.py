"""A blocking subscription to a partitioned queue (``layer.shards``): one ``Subscription``
per shard, each on the member that serves its shard and following it as any subscription
follows its queue, their messages merged into one iterator.

A message's ``ack()`` / ``cancel()`` / ``extend()`` / ``expire()`` go to the stream that
delivered it (the owner of its lease); by bookmark (``sub.ack("t/3/42")``) they go to the shard
of the bookmark's partition. Order holds per partition, as the queue's semantics do.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from layer.api.service import AckFailure
from layer.client._common import KEEP, Keep
from layer.engine.model import Bookmark
from layer.exceptions import ClientError, MalformedBookmark, QLayerError
from layer.shards import parse_shard

if TYPE_CHECKING:
    from layer.client.aio import AsyncMessage, AsyncQueueClient, AsyncSubscription
    from layer.client.sync import Message, QueueClient, Subscription

__all__ = ["AsyncPartitionedSubscription", "PartitionedSubscription", "ShardsFields"]


class _Shard(Protocol):
    """What ``ShardsFields`` reads of a shard's subscription (``SubscriptionFields``)."""

    @property
    def queue(self) -> str: ...
    @property
    def filter(self) -> str | None: ...
    @property
    def max_backlog(self) -> int: ...
    @property
    def backlog(self) -> int: ...
    @property
    def acked_count(self) -> int: ...
    @property
    def ack_failures(self) -> list[AckFailure]: ...
    @property
    def unconfirmed_acks(self) -> int: ...
    @property
    def reconnects(self) -> int: ...
    @property
    def address(self) -> str: ...
    @property
    def closed(self) -> bool: ...


_Sub = TypeVar("_Sub", bound=_Shard)


class ShardsFields(Generic[_Sub]):
    """What a partitioned subscription shows, from its shards' subscriptions (both faces)."""

    _queue: str
    shards: list[_Sub]
    _by_partition: dict[int, _Sub]

    def _take_shards(self, subs: list[_Sub]) -> None:
        self.shards = subs
        self._by_partition = {}
        for sub in subs:
            parsed = parse_shard(sub.queue)
            if parsed is not None:
                self._by_partition[parsed[1]] = sub

    def _shard_of(self, bookmark: str) -> _Sub:
        """The shard's subscription a bookmark's operation goes to: its partition's."""
        partition = Bookmark.parse(bookmark).partition
        sub = self._by_partition.get(partition)
        if sub is None:
            raise MalformedBookmark(
                f"bookmark {bookmark!r}: partition {partition} is not one of queue"
                f" {self._queue!r}'s {len(self.shards)}"
            )
        return sub

    def _check_replace(self, queue: str | None) -> None:
        if queue is not None and queue != self._queue:
            raise ClientError(
                f"the subscription to partitioned queue {self._queue!r} cannot be replaced by"
                " one to another queue: open a new subscription"
            )

    # --- what it shows ------------------------------------------------------------------------

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def filter(self) -> str | None:
        return self.shards[0].filter

    @property
    def max_backlog(self) -> int:
        return self.shards[0].max_backlog

    @property
    def backlog(self) -> int:
        return sum(sub.backlog for sub in self.shards)

    @property
    def acked_count(self) -> int:
        return sum(sub.acked_count for sub in self.shards)

    @property
    def ack_failures(self) -> list[AckFailure]:
        return [failure for sub in self.shards for failure in sub.ack_failures]

    @property
    def unconfirmed_acks(self) -> int:
        return sum(sub.unconfirmed_acks for sub in self.shards)

    @property
    def reconnects(self) -> int:
        return sum(sub.reconnects for sub in self.shards)

    @property
    def address(self) -> str:
        """The members the shards are served by now, comma-separated."""
        return ",".join(sorted({sub.address for sub in self.shards}))

    @property
    def closed(self) -> bool:
        return all(sub.closed for sub in self.shards)


class PartitionedSubscription(ShardsFields["Subscription"]):
    """The shards' subscriptions of a partitioned queue as one: iterate it (or call
    ``next``); ``shards`` are the per-shard subscriptions (their figures, addresses,
    reconnects). ``max_backlog`` holds per shard."""

    def __init__(
        self,
        client: QueueClient,
        queue_name: str,
        shards: list[str],
        max_backlog: int,
        filter: str | None,
    ) -> None:
        from layer.client.sync import Subscription

        self._queue = queue_name
        self._buffer: queue.Queue[Any] = queue.Queue()
        self._ready: deque[Message] = deque()
        self._ended: set[int] = set()
        opened: list[Subscription] = []
        try:
            for name in shards:
                opened.append(Subscription(client, name, max_backlog, filter, buffer=self._buffer))
        except BaseException:
            for sub in opened:
                sub.close()
            raise
        self._take_shards(opened)

    # --- consuming ----------------------------------------------------------------------------

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message of any shard; None after ``timeout`` seconds or once every shard's
        subscription is closed. Raises the error that ended a shard's."""
        from layer.client.sync import Ended

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ready:
                item = self._ready.popleft()
                if item.barrier or item._epoch == item._subscription._core.epoch:
                    return item  # else its lease ended with its connection: it will come back
                continue
            if self._buffer.empty():
                for sub in self.shards:  # about to block: what was acked goes out first
                    sub._send_pending()
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                batch = self._buffer.get(timeout=wait)
            except queue.Empty:
                return None
            if isinstance(batch, Ended):
                sub = batch.subscription
                self._ended.add(id(sub))
                if sub._core.error is not None:
                    raise sub._core.error.with_traceback(None)
                if len(self._ended) >= len(self.shards):
                    self._buffer.put(batch)  # every later call sees the end too
                    return None
                continue
            self._ready.extend(batch)

    def __iter__(self) -> Iterator[Message]:
        while (message := self.next()) is not None:
            yield message

    # --- the spec -----------------------------------------------------------------------------

    def replace(
        self,
        queue: str | None = None,
        filter: str | None | Keep = KEEP,
        max_backlog: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """Replace the filter or ``max_backlog`` of every shard's subscription (the queue of a
        partitioned subscription cannot change: open another). Returns the new backlog of all
        shards together."""
        self._check_replace(queue)
        return sum(sub.replace(None, filter, max_backlog, timeout) for sub in self.shards)

    # --- acks ---------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send every shard's pending acks and wait for their answers (see ``Subscription``)."""
        for sub in self.shards:
            sub.flush(timeout)

    def ack(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        self._shard_of(bookmark).ack(bookmark, wait, timeout)

    def cancel(
        self,
        bookmark: str,
        delay: float | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._shard_of(bookmark).cancel(bookmark, delay, wait, timeout)

    def expire(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        self._shard_of(bookmark).expire(bookmark, wait, timeout)

    def extend(
        self, bookmark: str, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        self._shard_of(bookmark).extend(bookmark, seconds, wait, timeout)

    # --- closing ------------------------------------------------------------------------------

    def close(self, timeout: float = 5.0) -> None:
        """Close every shard's subscription (see ``Subscription.close``). Idempotent."""
        errors: list[QLayerError] = []
        for sub in self.shards:
            try:
                sub.close(timeout)
            except QLayerError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> PartitionedSubscription:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class AsyncPartitionedSubscription(ShardsFields["AsyncSubscription"]):
    """The asyncio twin of ``PartitionedSubscription``: ``async for msg in sub``."""

    def __init__(self, queue_name: str) -> None:
        self._queue = queue_name
        self._buffer: asyncio.Queue[Any] = asyncio.Queue()
        self._ended: set[int] = set()
        self.shards = []
        self._by_partition = {}

    @classmethod
    async def open(
        cls,
        client: AsyncQueueClient,
        queue_name: str,
        shards: list[str],
        max_backlog: int,
        filter: str | None,
    ) -> AsyncPartitionedSubscription:
        from layer.client.aio import AsyncSubscription

        self = cls(queue_name)
        opened: list[AsyncSubscription] = []
        try:
            for name in shards:
                sub = AsyncSubscription(client, name, max_backlog, filter, buffer=self._buffer)
                await sub._start()
                opened.append(sub)
        except BaseException:
            for sub in opened:
                await sub.close()
            raise
        self._take_shards(opened)
        return self

    async def next(self, timeout: float | None = None) -> AsyncMessage | None:
        """As ``PartitionedSubscription.next``."""
        from layer.client.aio import Ended

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._buffer.empty():
                for sub in self.shards:  # about to wait: the server must see our acks first
                    sub._send_pending()
            if not self._buffer.empty():
                item = self._buffer.get_nowait()
            else:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    item = await asyncio.wait_for(self._buffer.get(), wait)
                except TimeoutError:
                    return None
            if isinstance(item, Ended):
                sub = item.subscription
                self._ended.add(id(sub))
                if sub._core.error is not None:
                    raise sub._core.error.with_traceback(None)
                if len(self._ended) >= len(self.shards):
                    self._buffer.put_nowait(item)  # every later call sees the end too
                    return None
                continue
            if item.barrier or item._epoch == item._subscription._core.epoch:
                return cast("AsyncMessage", item)

    def __aiter__(self) -> AsyncIterator[AsyncMessage]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[AsyncMessage]:
        while (message := await self.next()) is not None:
            yield message

    async def replace(
        self,
        queue: str | None = None,
        filter: str | None | Keep = KEEP,
        max_backlog: int | None = None,
        timeout: float | None = None,
    ) -> int:
        """As ``PartitionedSubscription.replace``."""
        self._check_replace(queue)
        total = 0
        for sub in self.shards:
            total += await sub.replace(None, filter, max_backlog, timeout)
        return total

    async def flush(self, timeout: float | None = None) -> None:
        for sub in self.shards:
            await sub.flush(timeout)

    async def ack(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        await self._shard_of(bookmark).ack(bookmark, wait, timeout)

    async def cancel(
        self,
        bookmark: str,
        delay: float | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        await self._shard_of(bookmark).cancel(bookmark, delay, wait, timeout)

    async def expire(self, bookmark: str, wait: bool = False, timeout: float | None = None) -> None:
        await self._shard_of(bookmark).expire(bookmark, wait, timeout)

    async def extend(
        self, bookmark: str, seconds: float, wait: bool = False, timeout: float | None = None
    ) -> None:
        await self._shard_of(bookmark).extend(bookmark, seconds, wait, timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Close every shard's subscription. Idempotent."""
        for sub in self.shards:
            await sub.close(timeout)

    async def __aenter__(self) -> AsyncPartitionedSubscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
