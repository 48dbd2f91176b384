"""Subscriptions merged from several streams, each a ``Subscription`` on the member that
serves its queue and following it as any subscription follows its queue, their messages
merged into one iterator:

- a partitioned queue (``layer.shards``): one stream per shard (``PartitionedSubscription``);
- in a cluster, a regex of queue names (``^orders-``): one stream per matching queue, a
  partitioned one with all its shards (``RegexSubscription``; ``_follow.matching_queues``).

A message's ``ack()`` / ``cancel()`` / ``extend()`` / ``expire()`` go to the stream that
delivered it (the owner of its lease). By bookmark (``sub.ack("t/3/42")``) they go, for a
partitioned queue, to the shard of the bookmark's partition; for a regex, to the stream that
last delivered that bookmark (a topic may feed several of its queues, so the bookmark alone
does not say which). Order holds per queue and partition, as the queues' semantics do.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Protocol, Self, TypeVar

from layer.api.service import AckFailure
from layer.client._common import KEEP, Keep
from layer.engine.model import Bookmark
from layer.exceptions import (
    ClientError,
    MalformedBookmark,
    QLayerError,
    QueueRemoved,
    UnknownBookmark,
)
from layer.shards import parse_shard

if TYPE_CHECKING:
    from layer.client.aio import AsyncMessage, AsyncQueueClient, AsyncSubscription
    from layer.client.sync import Message, QueueClient, Subscription

__all__ = [
    "AsyncMergedSubscription",
    "AsyncPartitionedSubscription",
    "AsyncRegexSubscription",
    "MergedSubscription",
    "PartitionedSubscription",
    "RegexSubscription",
    "ShardsFields",
    "split_backlog",
]

log = logging.getLogger(__name__)

#: a regex subscription remembers which stream delivered each of its last this many bookmarks
#: (or four times its backlog, if more), for acks by bookmark
ROUTES_KEPT = 4096


def split_backlog(total: int, streams: int) -> list[int]:
    """A regex subscription's ``max_backlog`` split over its ``streams``: as even as it goes,
    the first ones taking the remainder, at least 1 each (0 stays 0: barrier messages only),
    so at most ``max(total, streams)`` messages are leased to it at a time."""
    if total <= 0 or streams <= 0:
        return [total] * streams
    base, extra = divmod(total, streams)
    return [max(1, base + (1 if i < extra else 0)) for i in range(streams)]


class _Shard(Protocol):
    """What ``ShardsFields`` reads of a stream's subscription (``SubscriptionFields``)."""

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
    """What a merged subscription shows and decides, from its streams' subscriptions (both
    faces): ``shards`` are the streams' subscriptions (a partitioned queue's shards, or a
    regex's queues), figures are their sums."""

    #: a regex of queue names (else a partitioned queue): routes, backlog and ends differ
    regex = False
    _queue: str
    shards: list[_Sub]
    _by_partition: dict[int, _Sub]
    _routes: dict[str, _Sub]  # a regex's: bookmark -> the stream that last delivered it
    _ended: set[int]
    _max_backlog: int

    def _take_shards(self, subs: list[_Sub], max_backlog: int | None = None) -> None:
        self.shards = subs
        self._by_partition = {}
        self._routes = {}
        self._ended = set()
        if max_backlog is not None:
            self._max_backlog = max_backlog
        for sub in subs:
            parsed = parse_shard(sub.queue)
            if parsed is not None and not self.regex:
                self._by_partition[parsed[1]] = sub

    def _backlogs(self, max_backlog: int, streams: int) -> list[int]:
        """Each stream's ``max_backlog``: a partitioned queue's shards each take it whole, a
        regex's queues share it (``split_backlog``)."""
        if self.regex:
            return split_backlog(max_backlog, streams)
        return [max_backlog] * streams

    def _shard_of(self, bookmark: str) -> _Sub:
        """The stream's subscription a bookmark's operation goes to: for a partitioned queue,
        its partition's; for a regex, the one that last delivered it."""
        try:
            parsed = Bookmark.parse(bookmark)
        except ValueError as exc:
            raise MalformedBookmark(f"malformed bookmark: {exc}") from None
        if self.regex:
            sub = self._routes.get(str(parsed))
            if sub is not None:
                return sub
            if len(self.shards) == 1:
                return self.shards[0]
            raise UnknownBookmark(
                f"bookmark {bookmark!r} was not delivered by this subscription to"
                f" {self._queue!r}, whose {len(self.shards)} queues are served apart: ack it"
                " with the message's own ack(), or through a subscription to its queue"
            )
        sub = self._by_partition.get(parsed.partition)
        if sub is None:
            raise MalformedBookmark(
                f"bookmark {bookmark!r}: partition {parsed.partition} is not one of queue"
                f" {self._queue!r}'s {len(self.shards)}"
            )
        return sub

    def _handing(self, bookmark: str, sub: _Sub) -> None:
        """A regex's message of ``sub`` goes to the consumer: remember where it came from."""
        routes = self._routes
        routes.pop(bookmark, None)  # the latest delivery goes last: the oldest go first
        routes[bookmark] = sub
        if len(routes) > max(ROUTES_KEPT, 4 * self._max_backlog):
            del routes[next(iter(routes))]

    def _check_replace(self, queue: str | None) -> None:
        if queue is None or queue == self._queue:
            return
        if self.regex:
            raise ClientError(
                f"the subscription to {self._queue!r} holds one stream per matching queue on"
                " the members serving them: it cannot be replaced by one to another queue"
                " or regex: open a new subscription (and close this one)"
            )
        raise ClientError(
            f"the subscription to partitioned queue {self._queue!r} cannot be replaced by"
            " one to another queue: open a new subscription"
        )

    def _replacing(self, max_backlog: int | None) -> list[tuple[_Sub, int | None]]:
        """The streams a replace goes to, each with its new ``max_backlog`` (None: kept): a
        regex's open ones share the new backlog (those that left are not replaced)."""
        if not self.regex:
            return [(sub, max_backlog) for sub in self.shards]
        open_ = [sub for sub in self.shards if not sub.closed] or self.shards
        if max_backlog is None:
            return [(sub, None) for sub in open_]
        self._max_backlog = max_backlog
        return list(zip(open_, split_backlog(max_backlog, len(open_)), strict=True))

    def _stream_ended(self, sub: _Sub, error: QLayerError | None) -> bool:
        """A stream's subscription ended (its ``Ended`` came through the shared buffer) with
        ``error``: raises it, or says whether every stream has ended. A regex leaves a queue
        that was deleted (``QueueRemoved``) and goes on with the others, as a coordinator
        alone does; the last one's end is the subscription's."""
        self._ended.add(id(sub))
        last = len(self._ended) >= len(self.shards)
        if error is not None:
            if self.regex and isinstance(error, QueueRemoved) and not last:
                log.warning("subscription %s left queue %s: %s", self._queue, sub.queue, error)
                return False
            raise error.with_traceback(None)
        return last

    # --- what it shows ------------------------------------------------------------------------

    @property
    def queue(self) -> str:
        return self._queue

    @property
    def filter(self) -> str | None:
        return self.shards[0].filter

    @property
    def max_backlog(self) -> int:
        """As requested: each shard's (partitioned), shared by the queues (a regex)."""
        return self._max_backlog if self.regex else self.shards[0].max_backlog

    @property
    def backlog(self) -> int:
        return sum(sub.backlog for sub in self.shards if not sub.closed)

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
        """The members the open streams are served by now, comma-separated."""
        open_ = [sub for sub in self.shards if not sub.closed] or self.shards
        return ",".join(sorted({sub.address for sub in open_}))

    @property
    def closed(self) -> bool:
        return all(sub.closed for sub in self.shards)


class MergedSubscription(ShardsFields["Subscription"]):
    """Several streams' subscriptions as one: iterate it (or call ``next``); ``shards`` are
    the streams' subscriptions (their figures, addresses, reconnects)."""

    def __init__(
        self,
        client: QueueClient,
        queue_name: str,
        streams: list[str],
        max_backlog: int,
        filter: str | None,
    ) -> None:
        from layer.client.sync import Subscription

        self._queue = queue_name
        self._buffer: queue.Queue[Any] = queue.Queue()
        self._ready: deque[Message] = deque()
        opened: list[Subscription] = []
        try:
            for name, backlog in zip(
                streams, self._backlogs(max_backlog, len(streams)), strict=True
            ):
                opened.append(Subscription(client, name, backlog, filter, buffer=self._buffer))
        except BaseException:
            for sub in opened:
                sub.close()
            raise
        self._take_shards(opened, max_backlog)

    # --- consuming ----------------------------------------------------------------------------

    def next(self, timeout: float | None = None) -> Message | None:
        """The next message of any stream; None after ``timeout`` seconds or once every
        stream's subscription is closed. Raises the error that ended a stream's."""
        from layer.client.sync import Ended

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._ready:
                item = self._ready.popleft()
                if item.barrier:
                    return item
                if item._epoch == item._subscription._core.epoch:
                    if self.regex:
                        self._handing(item.bookmark, item._subscription)
                    return item
                continue  # its lease ended with its connection: it will come back
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
                if self._stream_ended(sub, sub._core.error):
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
        """Replace the filter or ``max_backlog`` of every stream's subscription (the queue
        cannot change: open another subscription). Returns the new backlog of all streams
        together."""
        self._check_replace(queue)
        return sum(
            sub.replace(None, filter, backlog, timeout)
            for sub, backlog in self._replacing(max_backlog)
        )

    # --- acks ---------------------------------------------------------------------------------

    def flush(self, timeout: float | None = None) -> None:
        """Send every stream's pending acks and wait for their answers (see ``Subscription``)."""
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
        """Close every stream's subscription (see ``Subscription.close``). Idempotent."""
        errors: list[QLayerError] = []
        for sub in self.shards:
            try:
                sub.close(timeout)
            except QLayerError as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class PartitionedSubscription(MergedSubscription):
    """A partitioned queue's shards' subscriptions as one; ``max_backlog`` holds per
    shard, operations by bookmark go to the shard of its partition."""


class RegexSubscription(MergedSubscription):
    """In a cluster, a subscription to a regex of queue names: one stream per matching
    queue (``_follow.matching_queues``), each on its owner and following it; ``max_backlog``
    is split over them (``split_backlog``); a deleted queue leaves it."""

    regex = True


class AsyncMergedSubscription(ShardsFields["AsyncSubscription"]):
    """The asyncio twin of ``MergedSubscription``: ``async for msg in sub``."""

    def __init__(self, queue_name: str) -> None:
        self._queue = queue_name
        # each stream's frames as lists of messages (and its ``Ended``), taken one by one
        self._buffer: asyncio.Queue[Any] = asyncio.Queue()
        self._ready: deque[AsyncMessage] = deque()
        self._take_shards([], 0)

    @classmethod
    async def open(
        cls,
        client: AsyncQueueClient,
        queue_name: str,
        streams: list[str],
        max_backlog: int,
        filter: str | None,
    ) -> Self:
        from layer.client.aio import AsyncSubscription

        self = cls(queue_name)
        opened: list[AsyncSubscription] = []
        try:
            for name, backlog in zip(
                streams, self._backlogs(max_backlog, len(streams)), strict=True
            ):
                sub = AsyncSubscription(client, name, backlog, filter, buffer=self._buffer)
                await sub._start()
                opened.append(sub)
        except BaseException:
            for sub in opened:
                await sub.close()
            raise
        self._take_shards(opened, max_backlog)
        return self

    async def next(self, timeout: float | None = None) -> AsyncMessage | None:
        """As ``MergedSubscription.next``."""
        from layer.client.aio import Ended

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._ready:
                item = self._ready.popleft()
                if item.barrier:
                    return item
                if item._epoch == item._subscription._core.epoch:
                    if self.regex:
                        self._handing(item.bookmark, item._subscription)
                    return item
                continue  # its lease ended with its connection: it will come back
            if self._buffer.empty():
                for sub in self.shards:  # about to wait: the server must see our acks first
                    sub._send_pending()
            if not self._buffer.empty():
                batch = self._buffer.get_nowait()
            else:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                try:
                    batch = await asyncio.wait_for(self._buffer.get(), wait)
                except TimeoutError:
                    return None
            if isinstance(batch, Ended):
                sub = batch.subscription
                if self._stream_ended(sub, sub._core.error):
                    self._buffer.put_nowait(batch)  # every later call sees the end too
                    return None
                continue
            self._ready.extend(batch)

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
        """As ``MergedSubscription.replace``."""
        self._check_replace(queue)
        total = 0
        for sub, backlog in self._replacing(max_backlog):
            total += await sub.replace(None, filter, backlog, timeout)
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
        """Close every stream's subscription. Idempotent."""
        for sub in self.shards:
            await sub.close(timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class AsyncPartitionedSubscription(AsyncMergedSubscription):
    """The asyncio twin of ``PartitionedSubscription``."""


class AsyncRegexSubscription(AsyncMergedSubscription):
    """The asyncio twin of ``RegexSubscription``."""

    regex = True
