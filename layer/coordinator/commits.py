"""How a round's changelog transaction is committed: the port a round commits through
(``Changelog``) and ``CommitPool``, which runs a blocking changelog's commits (``DurableChangelog``
of ``layer.state.changelog``) one at a time on a thread of their own, so the event loop keeps
serving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from layer.state.changelog import ChangelogRecord, ExtraRecord

__all__ = ["BlockingChangelog", "Changelog", "CommitPool", "Offsets"]

log = logging.getLogger(__name__)

#: the last offset written, per changelog (topic, partition)
Offsets = dict[tuple[str, int], int]


class Changelog(Protocol):
    """The port a round commits through (``CommitPool`` over Kafka)."""

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        views: Sequence[ExtraRecord] = (),
        begin_next: Sequence[ChangelogRecord] = (),
    ) -> Awaitable[Offsets]:
        """Begin committing these records in one transaction, at once; commits complete in the
        order they were begun. The awaitable gives the last offset per changelog partition.
        ``begin_next``: once committed, the next commit's transaction is begun with these
        records (durable by then: written again), so their partitions join it before it
        commits."""
        ...

    def abandon(self) -> None:
        """The commit ``begin_next`` began a transaction for never comes: it is aborted."""
        ...


class BlockingChangelog(Protocol):
    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        bulk: Sequence[ExtraRecord] = (),
        begin_next: Sequence[ChangelogRecord] = (),
    ) -> Offsets: ...

    def abandon(self) -> None: ...


class CommitPool:
    """``Changelog`` over a blocking one (``DurableChangelog``): commits run one at a time, in
    the order they were asked for, on a thread of their own, so the event loop keeps serving."""

    def __init__(self, changelog: BlockingChangelog) -> None:
        self._changelog = changelog
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="changelog")

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        views: Sequence[ExtraRecord] = (),
        begin_next: Sequence[ChangelogRecord] = (),
    ) -> asyncio.Future[Offsets]:
        loop = asyncio.get_running_loop()
        commit = self._changelog.commit
        return loop.run_in_executor(self._pool, commit, records, extra, views, begin_next)

    def abandon(self) -> None:
        # on the commit thread, before the next commit: never waited for
        self._pool.submit(self._changelog.abandon).add_done_callback(_log_error)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


def _log_error(done: Future[None]) -> None:
    """An ``abandon`` that raised (it handles Kafka's errors itself)."""
    exc = None if done.cancelled() else done.exception()
    if exc is not None:
        log.error("changelog transaction step failed: %r", exc, exc_info=exc)
