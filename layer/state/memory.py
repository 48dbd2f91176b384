"""An in-memory ``Store`` for unit tests: the same keys and values as RocksDB, in dicts."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

from layer.state.base import COLUMN_FAMILIES, KeyValueStore, Op, _Each, _Many, _Range

__all__ = ["MemoryStore"]


class MemoryStore(KeyValueStore):
    """Byte-level column families kept in dicts; ``write`` is atomic under a lock."""

    def __init__(self) -> None:
        super().__init__()
        self._data: dict[str, dict[bytes, bytes]] = {cf: {} for cf in COLUMN_FAMILIES}
        self._sorted: dict[str, list[bytes] | None] = {cf: None for cf in COLUMN_FAMILIES}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return "MemoryStore()"

    def _apply(self, ops: Sequence[Op]) -> None:
        with self._lock:
            for cf, key, value in ops:
                data = self._data[cf]
                if value is None:
                    data.pop(key, None)
                elif isinstance(value, _Range):
                    for doomed in [k for k in data if key <= k < value.end]:
                        del data[doomed]
                elif isinstance(value, _Each):
                    if value.value is None:
                        for k in value.keys:
                            data.pop(k, None)
                    else:
                        data.update(dict.fromkeys(value.keys, value.value))
                elif isinstance(value, _Many):
                    data.update(zip(value.keys, value.values, strict=True))
                else:
                    data[key] = value
                self._sorted[cf] = None

    def _keys(self, cf: str) -> list[bytes]:
        keys = self._sorted[cf]
        if keys is None:
            keys = self._sorted[cf] = sorted(self._data[cf])
        return keys

    def _get(self, cf: str, key: bytes) -> bytes | None:
        with self._lock:
            return self._data[cf].get(key)

    def _multi_get(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        with self._lock:
            data = self._data[cf]
            return [data.get(key) for key in keys]

    def _scan(self, cf: str, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        with self._lock:
            keys = self._keys(cf)
            data = self._data[cf]
            i = bisect.bisect_left(keys, start)
            j = min(bisect.bisect_left(keys, end), i + limit)
            return [(k, data[k]) for k in keys[i:j]]

    def _first_key_at_or_after(self, cf: str, key: bytes) -> bytes | None:
        with self._lock:
            keys = self._keys(cf)
            i = bisect.bisect_left(keys, key)
            return keys[i] if i < len(keys) else None

    def _close(self) -> None:
        pass
