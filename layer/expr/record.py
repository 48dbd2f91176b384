"""The Kafka record around a document: what ``KEY()``, ``HEADER('name')``, ``TIMESTAMP()``,
``TOPIC()`` and ``PARTITION()`` read.

A ``Record`` is only built by callers whose expression reads one of them
(``Expression.uses_record``): the others evaluate on the document alone and pay nothing.
Without a record (None) the five functions are NULL, as a missing field is.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Record", "header_value", "key_text", "timestamp_seconds"]


class Record:
    """The fields of one Kafka record, as the coordinator and the readers hold them.

    ``key`` and header values are the raw bytes (None when absent); ``headers`` keeps the
    producer's order and repeats; ``timestamp_ms`` is 0 (or negative) when the record has none.
    """

    __slots__ = ("headers", "key", "partition", "timestamp_ms", "topic")

    def __init__(
        self,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = (),
        timestamp_ms: int = 0,
        topic: str | None = None,
        partition: int | None = None,
    ) -> None:
        self.key = key
        self.headers = headers or ()
        self.timestamp_ms = timestamp_ms
        self.topic = topic
        self.partition = partition

    def __repr__(self) -> str:
        return (
            f"Record(key={self.key!r}, headers={self.headers!r}, "
            f"timestamp_ms={self.timestamp_ms!r}, topic={self.topic!r}, "
            f"partition={self.partition!r})"
        )


def _text(value: object) -> str | None:
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return value if type(value) is str else None


def key_text(record: Record | None) -> str | None:
    """The key as UTF-8 text; None when there is no record, no key, or it is not UTF-8."""
    return None if record is None or record.key is None else _text(record.key)


def header_value(record: Record | None, name: str) -> str | list[str | None] | None:
    """The header's value as text; a list of texts (in order) when it repeats; None when absent.

    A value that is absent (a header with a null value) or not UTF-8 is None, alone or in a list.
    Header names match exactly (Kafka's header keys are case-sensitive).
    """
    if record is None:
        return None
    first: str | None = None
    found = False
    more: list[str | None] | None = None
    for key, value in record.headers:
        if key == name:
            text = None if value is None else _text(value)
            if not found:
                first, found = text, True
            elif more is None:
                more = [first, text]
            else:
                more.append(text)
    return first if more is None else more


def timestamp_seconds(record: Record | None) -> float | None:
    """The record's timestamp in seconds since the epoch; None when it has none."""
    if record is None or record.timestamp_ms <= 0:
        return None
    return record.timestamp_ms / 1000.0
