"""Blobs: the local copies of a run of plain messages, stored as one value (column family BLOBS).

A plain message (no headers, priority or parse error: the short way of
``QueueRuntime.admit``) needs only its key, value and timestamp kept. The messages one round
admits from one partition go into the store as one blob instead of one ``StoredMessage`` record
each: one put at admission, one get (and no Avro decode) per blob a delivery touches.

Key: ``partition_prefix(queue, topic, partition) + last offset u64 BE``, as run records, so
the blobs of one partition sort by offset and a range delete below a low-water mark drops
exactly those whose every message is below it.

Value (version 1), integers little-endian::

    u8    version (1)
    u32   count (n)
    u8    flags: 1 = no message has a key
    n  x i64  offsets (ascending; gaps allowed: transaction markers, skipped messages)
    n  x i64  timestamps (ms)
    n  x i32  key lengths (-1: no key; absent with flag 1)
    n  x i32  value lengths (-1: no value)
    keys, concatenated; then values, concatenated

A blob goes when the low-water mark passes its last offset: by its key when this process wrote
it (``QueueRuntime.blobs_below``: a range tombstone per mark would slow every later seek),
in one range delete for those a restart found (``StoreBatch.delete_blobs_below``), or with its
queue (``wipe_queue``). A message of a blob that is done before then keeps its bytes until that
mark: ENTRIES keeps its done entry just as long.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_left
from itertools import accumulate, chain

from layer.exceptions import StateError

__all__ = ["Blob", "encode_blob"]

_HEAD = struct.Struct("<BIB")
_VERSION = 1
_NO_KEYS = 1
_SWAP = sys.byteorder != "little"


def _lengths(items: list[bytes | None]) -> tuple[array[int], list[bytes]]:
    """The lengths of ``items`` (-1: None) and the items to concatenate (b"" for None)."""
    if None in items:
        lengths = array("i", [-1 if item is None else len(item) for item in items])
        return lengths, [item or b"" for item in items]
    return array("i", map(len, items)), items  # type: ignore[arg-type,return-value]


def _raw(a: array[int]) -> bytes:
    if _SWAP:
        a = array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def encode_blob(
    offsets: list[int],
    keys: list[bytes | None],
    values: list[bytes | None],
    times_ms: list[int],
) -> bytes:
    """The blob of messages at ``offsets`` (ascending) with these keys, values and times.
    The keys and values are copied once, by the one join that makes the blob (a join of
    them first and of the parts then copied each payload twice: 0.1 µs a KiB)."""
    n = len(offsets)
    if not n or len(keys) != n or len(values) != n or len(times_ms) != n:
        raise StateError(f"a blob of {n} offsets for {len(keys)}/{len(values)}/{len(times_ms)}")
    no_keys = keys.count(None) == n
    parts = [_HEAD.pack(_VERSION, n, _NO_KEYS if no_keys else 0)]
    parts.append(_raw(array("q", offsets)))
    parts.append(_raw(array("q", times_ms)))
    key_data: list[bytes] = []
    if not no_keys:
        key_lengths, key_data = _lengths(keys)
        parts.append(_raw(key_lengths))
    value_lengths, value_data = _lengths(values)
    parts.append(_raw(value_lengths))
    return b"".join(chain(parts, key_data, value_data))


def _read(typecode: str, data: bytes, at: int, n: int) -> tuple[array[int], int]:
    a = array(typecode)
    end = at + n * a.itemsize
    a.frombytes(data[at:end])
    if _SWAP:
        a.byteswap()
    return a, end


class Blob:
    """A decoded blob: its messages' fields by offset, sliced out of the value on demand."""

    __slots__ = ("data", "offsets", "times", "_keys", "_values", "first", "last", "dense")

    def __init__(self, data: bytes) -> None:
        if len(data) < _HEAD.size or data[0] != _VERSION:
            raise StateError(f"blob of version {data[:1]!r} is not known (expected {_VERSION})")
        _version, n, flags = _HEAD.unpack_from(data)
        at = _HEAD.size
        self.offsets, at = _read("q", data, at, n)
        self.times, at = _read("q", data, at, n)
        self._keys: _Bounds | None = None
        if not flags & _NO_KEYS:
            key_lengths, at = _read("i", data, at, n)
        value_lengths, at = _read("i", data, at, n)
        if not flags & _NO_KEYS:
            self._keys = _Bounds(key_lengths, at)
            at = self._keys.ends[-1]
        self._values = _Bounds(value_lengths, at)
        if self._values.ends[-1] > len(data):
            raise StateError(f"blob of {n} messages is truncated ({len(data)} bytes)")
        self.data = data
        self.first = self.offsets[0]
        self.last = self.offsets[-1]
        #: no gap: the message at position ``i`` has the offset ``first + i``
        self.dense = self.last - self.first == n - 1

    def __len__(self) -> int:
        return len(self.offsets)

    def index(self, offset: int) -> int:
        """The position of the message at ``offset`` in the blob; -1: not in it."""
        if self.dense:
            i = offset - self.first
            return i if 0 <= i < len(self.offsets) else -1
        i = bisect_left(self.offsets, offset)
        return i if i < len(self.offsets) and self.offsets[i] == offset else -1

    def key(self, i: int) -> bytes | None:
        keys = self._keys
        if keys is None or i in keys.absent:
            return None
        ends = keys.ends
        return self.data[ends[i] : ends[i + 1]]

    def value(self, i: int) -> bytes | None:
        values = self._values
        if values.absent and i in values.absent:
            return None
        ends = values.ends
        return self.data[ends[i] : ends[i + 1]]

    def run(self, i: int, j: int) -> tuple[list[bytes | None], list[bytes | None], list[int]]:
        """The keys, values and times of the messages at the positions ``i .. j - 1``, sliced
        in one pass each (as ``key``, ``value`` and ``times`` give them one by one)."""
        keys = self._keys
        return (
            [None] * (j - i) if keys is None else keys.slices(self.data, i, j),
            self._values.slices(self.data, i, j),
            self.times[i:j].tolist(),
        )


class _Bounds:
    """Where each of a blob's keys (or values) lies: item ``i`` is ``data[ends[i]:ends[i+1]]``,
    unless ``i`` is in ``absent`` (None; stored with length -1)."""

    __slots__ = ("ends", "absent")

    def __init__(self, lengths: array[int], at: int) -> None:
        self.absent: frozenset[int] = frozenset()
        if min(lengths, default=0) < 0:
            self.absent = frozenset(i for i, length in enumerate(lengths) if length < 0)
            lengths = array("i", [max(length, 0) for length in lengths])
        self.ends = list(accumulate(lengths, initial=at))

    def slices(self, data: bytes, i: int, j: int) -> list[bytes | None]:
        """Items ``i .. j - 1`` of ``data``."""
        ends = self.ends
        bounds = zip(ends[i:j], ends[i + 1 : j + 1], strict=True)
        found: list[bytes | None] = [data[a:b] for a, b in bounds]
        absent = self.absent
        if absent:
            if len(absent) < j - i:
                for k in absent:
                    if i <= k < j:
                        found[k - i] = None
            else:
                for k in range(i, j):
                    if k in absent:
                        found[k - i] = None
        return found
