"""Hand-written Avro binary for the records on the hot path: ChangelogValue and StoredMessage
(the view topic's ViewRound is in layer.viewcodec).

fastavro's schemaless writer costs ~10 µs a call for these small records (validation, buffer
set-up), and the coordinator writes several per message. These functions produce the same bytes
as ``layer.codec`` for the current schema versions (tests/unit/test_avro_fast.py compares them
with fastavro on generated records), so ``avro/*.avsc`` stays the contract: a schema change
that these functions do not follow fails that test.

Avro binary, as used here: int/long are zig-zag varints; a string or bytes is its length then
its bytes; a union is the branch index then the value; an array is one block (count, items)
then 0; an enum is its symbol's index.
"""

from __future__ import annotations

from layer.exceptions import SerializationError

CHANGELOG_VALUE_VERSION = 1
STORED_MESSAGE_VERSION = 1

_KIND_INDEX = {"LEASED": 0, "RETURNED": 1, "DONE": 2, "POSITION": 3}

# small non-negative longs are by far the most common: precompute their encodings
_SMALL = [bytes([(n << 1)]) if (n << 1) < 0x80 else b"" for n in range(64)]


# ... and the two-byte ones (64 <= n < 8192), for lengths: filled below, once _varint exists
_TWO: list[bytes] = []

# Millisecond times (lease deadlines, record and message times) are 6-byte varints and repeat
# a lot: one round stamps every record with the same time, a producer batch shares one. Remember
# the recent ones (bounded) rather than encoding them again.
_TIMES: dict[int, bytes] = {}
_TIMES_MAX = 8192


def long(n: int) -> bytes:
    if 0 <= n < 64:
        return _SMALL[n]
    if 0 <= n < 8192:  # lengths of payloads and strings: two bytes, precomputed
        return _TWO[n]
    if n >= 0x1_0000_0000:
        found = _TIMES.get(n)
        if found is None:
            found = _varint(n)
            if len(_TIMES) >= _TIMES_MAX:
                _TIMES.clear()
            _TIMES[n] = found
        return found
    return _varint(n)


def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_TWO.extend(_varint(n) if n >= 64 else b"" for n in range(8192))


def _opt_long(n: int | None) -> bytes:
    return b"\x00" if n is None else b"\x02" + long(n)


def _opt_str(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    raw = s.encode()
    return b"\x02" + long(len(raw)) + raw


def _opt_bytes(b: bytes | None) -> bytes:
    return b"\x00" if b is None else b"\x02" + long(len(b)) + b


def changelog_value(
    kind: str,
    deliveries: int,
    cancels: int,
    holder: str | None,
    lease_deadline_ms: int | None,
    reason: str | None,
    at_ms: int,
    low_water: int | None,
) -> bytes:
    return b"".join(
        (
            b"\x01",  # CHANGELOG_VALUE_VERSION
            long(_KIND_INDEX[kind]),
            long(deliveries),
            long(cancels),
            _opt_str(holder),
            _opt_long(lease_deadline_ms),
            _opt_str(reason),
            long(at_ms),
            _opt_long(low_water),
        )
    )


def _headers(headers: tuple[tuple[str, bytes | None], ...]) -> bytes:
    if not headers:
        return b"\x00"
    parts = [long(len(headers))]
    for hk, hv in headers:
        raw = hk.encode()
        parts.append(long(len(raw)))
        parts.append(raw)
        parts.append(_opt_bytes(hv))
    parts.append(b"\x00")
    return b"".join(parts)


def stored_message(
    key: bytes | None,
    value: bytes | None,
    headers: tuple[tuple[str, bytes | None], ...],
    timestamp_ms: int,
    priority: int | None,
    error: str | None,
) -> bytes:
    parts = [b"\x01", _opt_bytes(key), _opt_bytes(value), _headers(headers)]  # version 1
    parts.append(long(timestamp_ms))
    parts.append(_opt_long(priority))
    parts.append(_opt_str(error))
    return b"".join(parts)


def stored_plain(key: bytes | None, value: bytes | None, timestamp_ms: int) -> bytes:
    """``stored_message`` of a message without headers, priority or error (most of a restored
    backlog: ``layer.coordinator.backlog``), in one join."""
    return b"".join(
        (
            b"\x01\x00" if key is None else b"\x01\x02" + long(len(key)) + key,
            b"\x00" if value is None else b"\x02" + long(len(value)),
            value or b"",
            b"\x00",  # no headers
            long(timestamp_ms),
            b"\x00\x00",  # no priority, no error
        )
    )


def plain_head(key: bytes | None, value_length: int) -> bytes:
    """The bytes of ``stored_plain`` before the value, for a message with a value of this
    length: ``plain_head(key, len(v)) + v + plain_tail(ts) == stored_plain(key, v, ts)``. A bulk
    reader keeps them per length and per timestamp (``layer.coordinator.backlog``)."""
    return (b"\x01\x00" if key is None else b"\x01\x02" + long(len(key)) + key) + (
        b"\x02" + long(value_length)
    )


def plain_tail(timestamp_ms: int) -> bytes:
    """The bytes of ``stored_plain`` after the value (see ``plain_head``)."""
    return b"\x00" + long(timestamp_ms) + b"\x00\x00"


class PlainRecords:
    """``stored_plain`` of the messages of one read (a live round, a fetch of a backlog): a
    message without key is the head kept per value length + its value + the tail kept per
    timestamp (a producer's batch shares one), so most take two lookups and one join.

    The one short way of the live admission (``QueueRuntime.admit``) and the bulk read
    (``layer.coordinator.backlog``); its ``encode`` is taken once per read and called per
    message."""

    __slots__ = ("_heads", "_tail", "_tail_ts")

    def __init__(self) -> None:
        self._heads: dict[int, bytes] = {}  # value length -> plain_head(None, it)
        self._tail_ts = -1
        self._tail = b""

    def encode(self, key: bytes | None, value: bytes | None, timestamp_ms: int) -> bytes:
        if key is not None or value is None:
            return stored_plain(key, value, timestamp_ms)
        head = self._heads.get(len(value))
        if head is None:
            head = self._heads[len(value)] = plain_head(None, len(value))
        if timestamp_ms != self._tail_ts:
            self._tail_ts = timestamp_ms
            self._tail = plain_tail(timestamp_ms)
        return head + value + self._tail


class _Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def long(self) -> int:
        data = self.data
        pos = self.pos
        b = data[pos]
        pos += 1
        if b < 0x80:  # one byte: union branches, short lengths, small counts
            self.pos = pos
            return (b >> 1) ^ -(b & 1)
        z = b & 0x7F
        shift = 7
        while b & 0x80:
            b = data[pos]
            pos += 1
            z |= (b & 0x7F) << shift
            shift += 7
        self.pos = pos
        return (z >> 1) ^ -(z & 1)

    def raw(self) -> bytes:
        n = self.long()
        if n < 0 or self.pos + n > len(self.data):
            raise IndexError("length past the end")
        start = self.pos
        self.pos = start + n
        return self.data[start : self.pos]

    def skip(self) -> None:
        n = self.long()
        if n < 0 or self.pos + n > len(self.data):
            raise IndexError("length past the end")
        self.pos += n

    def branch(self) -> bool:
        b = self.data[self.pos]  # a two-branch union's index is one byte: 0x00 or 0x02
        self.pos += 1
        if b == 0x02:
            return True
        if b == 0x00:
            return False
        raise ValueError(f"union branch byte {b:#x}")


def read_stored_message(
    data: bytes,
) -> tuple[
    bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...], int, int | None, str | None
]:
    """The fields of a StoredMessage written with version 1 (the caller checks the version)."""
    plain = _read_plain(data)
    if plain is not None:
        return None, plain[0], (), plain[1], None, None
    r = _Reader(data, 1)
    try:
        key = r.raw() if r.branch() else None
        value = r.raw() if r.branch() else None
        headers: list[tuple[str, bytes | None]] = []
        while (count := r.long()) != 0:
            if count < 0:  # a block with its byte size: Avro allows it, our writer never uses it
                count = -count
                r.long()
            for _ in range(count):
                hk = r.raw().decode()
                headers.append((hk, r.raw() if r.branch() else None))
        timestamp_ms = r.long()
        priority = r.long() if r.branch() else None
        error = r.raw().decode() if r.branch() else None
    except (IndexError, ValueError, UnicodeDecodeError) as exc:
        raise SerializationError(f"schema 'stored_message': cannot decode: {exc!r}") from exc
    if r.pos != len(data):
        raise SerializationError(
            f"schema 'stored_message': {len(data) - r.pos} trailing bytes after the record"
        )
    return key, value, tuple(headers), timestamp_ms, priority, error


def _read_plain(data: bytes) -> tuple[bytes, int] | None:
    """``(value, timestamp_ms)`` of a version-1 record as ``plain_head(None, n) + value +
    plain_tail(ts)`` writes it (no key, headers, priority or error: a payload read back for a
    delivery, most of the time), in one pass without a reader object; None for any other
    (``read_stored_message`` reads it field by field, and words what is wrong)."""
    size = len(data)
    if size < 6 or data[1] != 0 or data[2] != 2 or data[size - 2] != 0 or data[size - 1] != 0:
        return None
    pos, z, shift = 3, 0, 0
    while True:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
        if pos >= size:
            return None
    end = pos + ((z >> 1) ^ -(z & 1))
    if end < pos or end >= size or data[end] != 0:  # no headers
        return None
    value = data[pos:end]
    pos, z, shift = end + 1, 0, 0
    while pos < size:
        b = data[pos]
        pos += 1
        z |= (b & 0x7F) << shift
        if b < 0x80:
            break
        shift += 7
    if pos != size - 2:  # the timestamp, then no priority and no error, then the end
        return None
    return value, (z >> 1) ^ -(z & 1)


def read_stored_meta(data: bytes) -> tuple[int, int | None]:
    """Only ``(timestamp_ms, priority)`` of a version-1 StoredMessage: what a restart needs to
    rebuild the queue's order, without copying payloads."""
    r = _Reader(data, 1)
    try:
        if r.branch():
            r.skip()  # key
        if r.branch():
            r.skip()  # value
        while (count := r.long()) != 0:
            if count < 0:
                count = -count
                r.long()
            for _ in range(count):
                r.skip()  # header key
                if r.branch():
                    r.skip()  # header value
        timestamp_ms = r.long()
        priority = r.long() if r.branch() else None
    except (IndexError, ValueError) as exc:
        raise SerializationError(f"schema 'stored_message': cannot decode: {exc!r}") from exc
    return timestamp_ms, priority
