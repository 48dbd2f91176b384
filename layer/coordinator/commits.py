"""How a round's changelog transaction is committed: the port a round commits through
(``Changelog``) and ``CommitPool``, which runs a blocking changelog's commits (``DurableChangelog``
of ``layer.state.changelog``) one at a time on a thread of their own, so the event loop keeps
serving."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from layer.state.changelog import ChangelogRecord, ExtraRecord

__all__ = ["BlockingChangelog", "Changelog", "CommitPool", "Offsets"]

#: the last offset written, per changelog (topic, partition)
Offsets = dict[tuple[str, int], int]


class Changelog(Protocol):
    """The port a round commits through (``CommitPool`` over Kafka)."""

    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        views: Sequence[ExtraRecord] = (),
    ) -> Awaitable[Offsets]:
        """Begin committing these records in one transaction, at once; commits complete in the
        order they were begun. The awaitable gives the last offset per changelog partition."""
        ...


class BlockingChangelog(Protocol):
    def commit(
        self,
        records: Sequence[ChangelogRecord],
        extra: Sequence[ExtraRecord] = (),
        bulk: Sequence[ExtraRecord] = (),
    ) -> Offsets: ...


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
    ) -> asyncio.Future[Offsets]:
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._pool, self._changelog.commit, records, extra, views)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
