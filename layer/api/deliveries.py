"""A round's deliveries to one subscription as columns: ``DeliveryBatch``.

The coordinator hands a subscription what a round leased it as one batch of columns (the
bookmarks, keys, values and timestamps as lists; the lease deadline as one value with
per-message exceptions; headers, parse errors and barriers, which few messages have, as sparse
columns), and the API writes them into a ``MessageColumns`` frame (``layer.api.frames``) a
column at a time, without an object per message. It is also a ``Sequence[DeliveredMessage]``:
whatever wants messages (a client that takes ``Message`` frames, the stages, tests) gets them
built on demand.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar, overload

from layer.api.service import DeliveredMessage
from layer.engine.model import Bookmark

Headers = list[tuple[str, bytes | None]]
V = TypeVar("V")


def _sparse(column: dict[int, V], i: int, j: int) -> dict[int, V]:
    """The entries of a sparse column at the positions ``i .. j - 1``, from 0."""
    return {p - i: v for p, v in column.items() if i <= p < j}


class DeliveryBatch(Sequence[DeliveredMessage]):
    """The messages ``queue`` hands one subscription, as columns of equal length.

    ``deadline_ms`` is the lease deadline of every message (None: not leased), unless the
    batch has ``deadlines``, a deadline per message (a round's barriers among its leases, or
    batches of several rounds joined). ``headers`` and ``errors`` hold the messages that
    have any (position -> value); ``barriers`` the positions of barrier messages, in order.
    """

    __slots__ = (
        "queue", "bookmarks", "keys", "values", "times", "deliveries", "cancels",
        "deadline_ms", "deadlines", "barriers", "headers", "errors", "_messages",
    )  # fmt: skip

    def __init__(
        self,
        queue: str,
        bookmarks: list[Bookmark],
        keys: list[bytes | None],
        values: list[bytes | None],
        times: list[int],
        deliveries: list[int],
        cancels: list[int],
        deadline_ms: int | None,
        deadlines: list[int | None] | None = None,
        barriers: list[int] | None = None,
        headers: dict[int, Headers] | None = None,
        errors: dict[int, str] | None = None,
    ) -> None:
        self.queue = queue
        self.bookmarks = bookmarks
        self.keys = keys
        self.values = values
        self.times = times
        self.deliveries = deliveries
        self.cancels = cancels
        self.deadline_ms = deadline_ms
        self.deadlines = deadlines
        self.barriers: list[int] = barriers or []
        self.headers: dict[int, Headers] = headers or {}
        self.errors: dict[int, str] = errors or {}
        self._messages: list[DeliveredMessage] | None = None

    def __len__(self) -> int:
        return len(self.bookmarks)

    def __repr__(self) -> str:
        return f"DeliveryBatch(queue={self.queue!r}, messages={len(self.bookmarks)})"

    @overload
    def __getitem__(self, index: int) -> DeliveredMessage: ...

    @overload
    def __getitem__(self, index: slice) -> DeliveryBatch: ...

    def __getitem__(self, index: int | slice) -> DeliveredMessage | DeliveryBatch:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.bookmarks))
            if step != 1:
                raise ValueError("a DeliveryBatch slices with step 1 only")
            return self.slice(start, stop)
        if self._messages is not None:
            return self._messages[index]
        n = len(self.bookmarks)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(index)
        return self._message(index)

    def __iter__(self) -> Iterator[DeliveredMessage]:
        return iter(self.messages())

    def deadline(self, i: int) -> int | None:
        """The lease deadline of the message at position ``i``."""
        deadlines = self.deadlines
        return self.deadline_ms if deadlines is None else deadlines[i]

    def _message(self, i: int) -> DeliveredMessage:
        headers = self.headers.get(i)
        return DeliveredMessage(
            self.bookmarks[i],
            self.keys[i],
            self.values[i],
            list(headers) if headers else [],
            self.times[i],
            self.deliveries[i],
            self.cancels[i],
            self.deadline(i),
            i in self.barriers,
            self.queue,
            self.errors.get(i),
        )

    def messages(self) -> list[DeliveredMessage]:
        """The batch as messages (built once; for whatever does not take columns)."""
        if self._messages is None:
            plain = not (self.deadlines is not None or self.barriers or self.headers or self.errors)
            if plain:
                deadline, queue = self.deadline_ms, self.queue
                self._messages = [
                    DeliveredMessage(b, k, v, [], t, d, c, deadline, False, queue)
                    for b, k, v, t, d, c in zip(
                        self.bookmarks, self.keys, self.values, self.times, self.deliveries,
                        self.cancels, strict=True,
                    )
                ]  # fmt: skip
            else:
                self._messages = [self._message(i) for i in range(len(self.bookmarks))]
        return self._messages

    def leased(self) -> list[Bookmark]:
        """The bookmarks of the messages with a lease deadline."""
        deadlines = self.deadlines
        if deadlines is None:
            return [] if self.deadline_ms is None else list(self.bookmarks)
        return [b for b, d in zip(self.bookmarks, deadlines, strict=True) if d is not None]

    def restart(self, deadline_ms: int) -> None:
        """Every lease of the batch ends at ``deadline_ms`` (``restart_leases``: they were not
        handed out yet)."""
        if self.deadline_ms is not None:
            self.deadline_ms = deadline_ms
        if self.deadlines is not None:
            self.deadlines = [None if d is None else deadline_ms for d in self.deadlines]
        if self._messages is not None:
            for m in self._messages:
                if m.lease_deadline_ms is not None:
                    m.lease_deadline_ms = deadline_ms

    def slice(self, i: int, j: int) -> DeliveryBatch:
        """The messages at the positions ``i .. j - 1`` as a batch of their own."""

        return DeliveryBatch(
            self.queue,
            self.bookmarks[i:j],
            self.keys[i:j],
            self.values[i:j],
            self.times[i:j],
            self.deliveries[i:j],
            self.cancels[i:j],
            self.deadline_ms,
            None if self.deadlines is None else self.deadlines[i:j],
            [p - i for p in self.barriers if i <= p < j],
            _sparse(self.headers, i, j),
            _sparse(self.errors, i, j),
        )

    @classmethod
    def join(cls, batches: Sequence[DeliveryBatch]) -> DeliveryBatch:
        """One batch of ``batches`` (of one queue) in order."""
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        out = cls(first.queue, [], [], [], [], [], [], first.deadline_ms)
        deadlines: list[list[int | None]] = []
        for b in batches:
            if b.queue != first.queue:
                raise ValueError(f"joining batches of {first.queue!r} and {b.queue!r}")
            at = len(out.bookmarks)
            out.bookmarks += b.bookmarks
            out.keys += b.keys
            out.values += b.values
            out.times += b.times
            out.deliveries += b.deliveries
            out.cancels += b.cancels
            deadlines.append(b.deadlines or [b.deadline_ms] * len(b.bookmarks))
            out.barriers += [at + p for p in b.barriers]
            out.headers.update((at + p, h) for p, h in b.headers.items())
            out.errors.update((at + p, e) for p, e in b.errors.items())
        if any(b.deadlines is not None or b.deadline_ms != first.deadline_ms for b in batches):
            out.deadlines = [d for column in deadlines for d in column]
        return out

    def payload_size(self) -> int:
        """The bytes the batch carries as ``layer.api.server`` counts them: 64 a message,
        its key, its value and its headers."""
        size = 64 * len(self.bookmarks)
        size += sum(map(len, filter(None, self.values)))
        size += sum(map(len, filter(None, self.keys)))
        for headers in self.headers.values():
            size += sum(len(k) + len(v or b"") for k, v in headers)
        return size

    def cut(self, most: int) -> list[DeliveryBatch]:
        """The batch in pieces, a piece cut once its payload size reaches ``most``."""
        pieces: list[DeliveryBatch] = []
        keys, values, headers = self.keys, self.values, self.headers
        start = size = 0
        for i in range(len(self.bookmarks)):
            size += 64 + len(keys[i] or b"") + len(values[i] or b"")
            if i in headers:
                size += sum(len(k) + len(v or b"") for k, v in headers[i])
            if size >= most:
                pieces.append(self.slice(start, i + 1))
                start, size = i + 1, 0
        if start < len(self.bookmarks):
            pieces.append(self.slice(start, len(self.bookmarks)))
        return pieces
