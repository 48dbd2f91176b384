"""The RocksDB ``Store`` (through ``rocksdict``): six column families of raw byte keys and values
(and a seventh, ``flush``, that only makes RocksDB flush the others).

Durability: every ``write`` is one RocksDB ``WriteBatch``, so no reader ever sees part of one.
With ``sync=False`` (the default) writes skip RocksDB's write-ahead log, as Kafka Streams' state
stores do: the changelog in Kafka is the source of truth, and the state directory is its cache.
The column families are flushed together (``atomic_flush``), when a memtable fills, within
``flush_interval`` seconds of a write (``flush``, in RocksDB's own threads, with the GIL free),
and on close, so a process killed at any moment reopens at the end of one complete write, the
last flushed: never with part of a write, never with one column family ahead of another. A
restart then reads what came after from Kafka, as it does for a directory that is behind for
any other reason (the changelog's records from the stored offsets, the underlying topics'
messages from the read positions), so a kill costs at most ``flush_interval`` seconds (or a
few MiB) of re-reading, and nothing is lost as long as the topics keep that long. The WAL cost
the live path ~1.1 µs of CPU per KiB of payload (``rocksdict``'s RocksDB computes its CRC32C
without the CPU's instruction), and the GIL for as long, since ``rocksdict`` holds it while it
writes. ``sync=True`` writes the WAL and fsyncs every write, for a state directory that must
survive the machine losing power.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from itertools import islice, repeat
from pathlib import Path
from typing import Any

import rocksdict

from layer.exceptions import StateError
from layer.state.base import (
    BLOBS,
    COLUMN_FAMILIES,
    MESSAGES,
    KeyValueStore,
    Op,
    _Each,
    _Many,
    _Range,
)

__all__ = ["RocksDBStore", "discard_state_dir"]

logger = logging.getLogger(__name__)


def _options() -> rocksdict.Options:
    # raw_mode: keys and values are bytes as given, not rocksdict's pickled Python objects.
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    opts.set_keep_log_file_num(3)
    opts.set_max_total_wal_size(64 << 20)
    opts.set_max_background_jobs(2)
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    # without the WAL, what survives a crash is what was flushed: all column families at once
    opts.set_atomic_flush(True)
    # Memtables: RocksDB's default (64 MiB each, two per column family) held ~65 B of resident
    # memory per queued message at 1M queued (bench/memory.py); they flush sooner instead (and
    # make what they held durable: there is no WAL). 8 MiB each, 32 MiB for all together.
    opts.set_write_buffer_size(8 << 20)
    opts.set_db_write_buffer_size(32 << 20)
    return opts


# While a restore's backlog is read in bulk (1,000,000 messages, ~230 MB, in a few seconds), the
# messages' column family compacts level 0 from 16 files, slows writes from 40, stops them at 60;
# then RocksDB's defaults again (4, 20, 36), and what the read wrote is compacted once, in the
# background. With the defaults throughout, 1,000,000 messages (flushed as ~8 MiB files) were
# rewritten several times while they were written (2.0-2.8 s of the compaction threads' CPU in a
# restore from the changelog) and the writer stalled: writing them alone took 22.4 s and 4.33
# CPU s, 7.7 s and 3.30 CPU s with these. Only the bulk load: the live path keeps the defaults
# (with 16 files, the coordinator's memory at 1,000,000 queued measured 152 B a message, 113 B
# without, in one run each).
_BULK = {
    "level0_file_num_compaction_trigger": "16",
    "level0_slowdown_writes_trigger": "40",
    "level0_stop_writes_trigger": "60",
}
_AFTER_BULK = {
    "level0_file_num_compaction_trigger": "4",
    "level0_slowdown_writes_trigger": "20",
    "level0_stop_writes_trigger": "36",
}


def _open_error(path: Path, exc: Exception) -> StateError:
    text = str(exc)
    # RocksDB reports a held LOCK file as "IO error: While lock file: <dir>/LOCK: Resource
    # temporarily unavailable" (another process) or "lock hold by current process".
    if "LOCK" in text or "lock hold" in text:
        return StateError(f"state dir {path} is in use by another store (RocksDB LOCK): {text}")
    return StateError(f"cannot open state dir {path}: {text}")


#: seconds after a write within which the memtables are flushed (``RocksDBStore.flush``)
FLUSH_INTERVAL = 5.0

# where ``flush`` makes its checkpoint, in the state directory; removed at once
_FLUSH_DIR = "flush.tmp"

# ``flush``'s column family: one key, written over with a value larger than the column family's
# memtable, which makes RocksDB flush every column family at the next write, together
# (``atomic_flush``), in its background threads. rocksdict holds the GIL for the whole of any
# flush it is asked for (a checkpoint, which the flush was before, stopped every thread of a
# coordinator for 100-365 ms every 5 s: a latency run's p99 at 1,000 msg/s was those stalls).
_FLUSH_CF = "flush"
_FLUSH_KEY = b"flush"
_FLUSH_MEMTABLE = 64 << 10
_FLUSH_FILL = bytes(_FLUSH_MEMTABLE + (16 << 10))
# how long ``flush`` waits for RocksDB's flush before it makes a checkpoint instead
_FLUSH_WAIT_S = 60.0
_FLUSH_POLL_S = 0.002


def _flush_cf_options() -> rocksdict.Options:
    opts = _options()
    opts.set_write_buffer_size(_FLUSH_MEMTABLE)
    return opts


class RocksDBStore(KeyValueStore):
    """One coordinator's state in ``state_dir`` (created if missing; locked while open)."""

    def __init__(
        self, state_dir: Path | str, *, sync: bool = False, flush_interval: float = FLUSH_INTERVAL
    ) -> None:
        super().__init__()
        self._path = Path(state_dir)
        try:
            self._path.mkdir(parents=True, exist_ok=True)
            opts = _options()
            self._db: Any = rocksdict.Rdict(
                str(self._path),
                options=opts,
                column_families={
                    **{cf: _options() for cf in COLUMN_FAMILIES},
                    _FLUSH_CF: _flush_cf_options(),
                },
            )
        except Exception as exc:
            raise _open_error(self._path, exc) from exc
        self._cfs: dict[str, Any] = {cf: self._db.get_column_family(cf) for cf in COLUMN_FAMILIES}
        self._handles: dict[str, Any] = {
            cf: self._db.get_column_family_handle(cf) for cf in COLUMN_FAMILIES
        }
        self._flush_handle: Any = self._db.get_column_family_handle(_FLUSH_CF)
        self._flush_cf: Any = self._db.get_column_family(_FLUSH_CF)
        self._write_opts = rocksdict.WriteOptions()
        self._write_opts.sync = sync
        # a property (rocksdict's stub calls it a method; assigning it works, a call does not)
        self._write_opts.disable_wal = not sync  # type: ignore[method-assign,assignment]
        # Closing while another thread reads would free the database under it.
        self._lock = threading.RLock()
        # ``flush`` runs outside ``_lock`` (writers go on meanwhile); close waits for it
        self._flush_lock = threading.Lock()
        self._written = False  # a write since the last flush began
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if not sync:
            self._flusher = threading.Thread(
                target=self._flush_every,
                args=(flush_interval,),
                name=f"state-flush-{self._path.name}",
                daemon=True,
            )
            self._flusher.start()
        logger.debug("opened state store path=%s sync=%s", self._path, sync)

    def __repr__(self) -> str:
        return f"RocksDBStore({str(self._path)!r})"

    @property
    def path(self) -> Path:
        return self._path

    def _apply(self, ops: Sequence[Op]) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        handles = self._handles
        for cf, key, value in ops:
            if value is None:
                batch.delete(key, handles[cf])
            elif isinstance(value, _Range):
                batch.delete_range(key, value.end, handles[cf])
            elif isinstance(value, _Each):
                handle, one = handles[cf], value.value
                if one is None:
                    delete = batch.delete
                    for k in value.keys:
                        delete(k, handle)
                else:
                    put = batch.put
                    for k in value.keys:
                        put(k, one, handle)
            elif isinstance(value, _Many):
                if len(value.keys) != len(value.values):
                    raise StateError(f"{len(value.keys)} keys for {len(value.values)} values")
                # the puts driven from C (no bytecode per key): 400 ns a key, 530 in a loop
                deque(map(batch.put, value.keys, value.values, repeat(handles[cf])), 0)
            else:
                batch.put(key, value, handles[cf])
        with self._lock:
            self._check_open()
            try:
                self._db.write(batch, self._write_opts)
            except Exception as exc:
                raise StateError(f"write to state dir {self._path} failed: {exc}") from exc
            self._written = True

    def flush(self) -> None:
        """Every column family's memtable to disk, together (the writes since the last flush
        then survive a crash). Writers go on meanwhile: their writes after its start may or may
        not be in it, never in part.

        RocksDB's own threads do it, so the GIL is free meanwhile: two writes to the ``flush``
        column family (see ``_FLUSH_CF``) fill its memtable, and at the second RocksDB switches
        every column family's memtable and schedules one atomic flush of them all; this waits
        until no column family has a memtable left to flush (and, first, for a flush already
        under way). A checkpoint does it instead (it flushes them all at once too, with the GIL
        held) if RocksDB did not switch them, or did not flush within ``_FLUSH_WAIT_S``."""
        with self._flush_lock:
            # A flush under way first: the switch below would wait for it in a write stall
            # (a column family's memtables all full), with the GIL held: one such write took 73 ms.
            if self._flushed_within(_FLUSH_WAIT_S):
                with self._lock:
                    if self._closed:
                        return
                    self._written = False
                    try:
                        switched = self._request_flush()
                    except StateError:
                        self._written = True  # to be tried again
                        raise
                if switched and self._flushed_within(_FLUSH_WAIT_S):
                    logger.debug("flushed state store path=%s", self._path)
                    return
            with self._lock:
                if self._closed or self._stop.is_set():
                    return  # closing: close flushes
            logger.warning(
                "state store path=%s: RocksDB did not flush in time; flushing by checkpoint",
                self._path,
            )
            self._checkpoint_flush()

    def _request_flush(self) -> bool:
        """Make RocksDB switch every column family's memtable and flush them; whether it did
        (the ``flush`` column family's memtable holds no more than the second write)."""
        for value in (_FLUSH_FILL, b""):
            batch = rocksdict.WriteBatch(raw_mode=True)
            batch.put(_FLUSH_KEY, value, self._flush_handle)
            try:
                self._db.write(batch, self._write_opts)
            except Exception as exc:
                raise StateError(f"write to state dir {self._path} failed: {exc}") from exc
        active = self._flush_cf.property_int_value("rocksdb.cur-size-active-mem-table")
        return active is not None and active < len(_FLUSH_FILL)

    def _flushed_within(self, timeout: float) -> bool:
        """Whether, within ``timeout`` seconds, no column family has a memtable waiting to be
        flushed (False at once if the store is closing)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._closed or self._stop.is_set():
                    return False
                waiting = sum(
                    cf.property_int_value("rocksdb.num-immutable-mem-table") or 0
                    for cf in (*self._cfs.values(), self._flush_cf)
                )
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_FLUSH_POLL_S)

    def _checkpoint_flush(self) -> None:
        """A flush of every column family by a checkpoint (``flush``'s fallback, and on close);
        the caller holds ``_flush_lock`` and the database is open."""
        with self._lock:
            checkpoint = rocksdict.Checkpoint(self._db)
        target = self._path / _FLUSH_DIR
        shutil.rmtree(target, ignore_errors=True)  # left by a crash during a flush
        try:
            checkpoint.create_checkpoint(str(target))
        except Exception as exc:
            self._written = True  # to be tried again
            raise StateError(f"flush of state dir {self._path} failed: {exc}") from exc
        finally:
            del checkpoint
            shutil.rmtree(target, ignore_errors=True)
        logger.debug("flushed state store path=%s", self._path)

    def _flush_every(self, interval: float) -> None:
        """The flusher thread: ``flush`` within ``interval`` of a write (at once when woken)."""
        while not self._stop.is_set():
            self._wake.wait(interval)
            self._wake.clear()
            if self._stop.is_set() or not self._written:
                continue
            try:
                self.flush()
            except StateError as exc:
                logger.warning("%s", exc)

    @contextlib.contextmanager
    def bulk_load(self) -> Iterator[None]:
        loaded = [self._cfs[MESSAGES], self._cfs[BLOBS]]
        with self._lock:
            self._check_open()
            for cf in loaded:
                cf.set_options(_BULK)
        try:
            yield
        finally:
            with self._lock:
                if not self._closed:
                    for cf in loaded:
                        cf.set_options(_AFTER_BULK)
                    # Flushed now, in the background (all column families at once: one's own
                    # flush would let it run ahead of the others), so a crash soon after does
                    # not make the next start read the load again.
                    self._wake.set()

    def _get(self, cf: str, key: bytes) -> bytes | None:
        with self._lock:
            self._check_open()
            value: bytes | None = self._cfs[cf].get(key)
            return value

    def _multi_get(self, cf: str, keys: list[bytes]) -> list[bytes | None]:
        with self._lock:
            self._check_open()
            values: list[bytes | None] = self._cfs[cf][keys]
            return values

    def _scan(self, cf: str, start: bytes, end: bytes, limit: int) -> list[tuple[bytes, bytes]]:
        read_opts = rocksdict.ReadOptions()
        read_opts.set_iterate_upper_bound(end)
        with self._lock:
            self._check_open()
            items = self._cfs[cf].items(from_key=start, read_opt=read_opts)
            page: list[tuple[bytes, bytes]] = list(islice(items, limit))
            del items  # the iterator keeps the database (and its LOCK) alive
            return page

    def _first_key_at_or_after(self, cf: str, key: bytes) -> bytes | None:
        with self._lock:
            self._check_open()
            keys = self._cfs[cf].keys(from_key=key)
            first: bytes | None = next(keys, None)
            del keys
            return first

    def _close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join()
        with self._flush_lock:
            if self._written and not self._write_opts.sync:
                try:
                    self._checkpoint_flush()  # RocksDB flushes on close too; this tells a failure
                except StateError as exc:
                    logger.error("%s: the next start reads again what came after the last", exc)
            with self._lock:
                # Every column family object and handle holds the database open: drop them
                # first.
                self._cfs.clear()
                self._handles.clear()
                del self._flush_cf, self._flush_handle
                try:
                    self._db.close()
                finally:
                    del self._db
                logger.debug("closed state store path=%s", self._path)


# The files RocksDB (and rocksdict) keep in a database directory: the only ones a reset removes,
# so a state_dir pointed by mistake at a directory holding other files loses none of them.
_OWNED_FILE = re.compile(
    r"CURRENT|IDENTITY|LOG(\.old\.\d+)?|(MANIFEST|OPTIONS)-\d+(\.dbtmp)?"
    r"|\d+\.(log|sst|blob|dbtmp)|rocksdict-config\.json"
)


def discard_state_dir(state_dir: Path | str) -> list[str]:
    """Delete the RocksDB files of a state directory (for ``qlayer coordinator --reset-state``).

    Takes the database's LOCK first, as RocksDB does (a POSIX ``fcntl`` lock), so the state of a
    running coordinator is never pulled from under it. Files that are not RocksDB's and
    subdirectories are left alone (and logged). Returns the names of the files removed.
    """
    path = Path(state_dir)
    if not path.exists():
        return []
    if not path.is_dir():
        raise StateError(f"state dir {path} is not a directory")
    lock_path = path / "LOCK"
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644) if lock_path.exists() else None
    try:
        if lock_fd is not None:
            try:
                fcntl.lockf(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EACCES, errno.EAGAIN):
                    raise StateError(
                        f"state dir {path} is in use by another process (RocksDB LOCK):"
                        " stop that coordinator first"
                    ) from exc
                raise StateError(f"cannot lock state dir {path}: {exc}") from exc
        removed: list[str] = []
        left: list[str] = []
        for entry in sorted(path.iterdir()):
            if entry.name == "LOCK":
                continue  # RocksDB reopens it; it holds no state
            if entry.is_file() and _OWNED_FILE.fullmatch(entry.name):
                entry.unlink()
                removed.append(entry.name)
            elif entry.name == _FLUSH_DIR and entry.is_dir():  # a flush's, left by a crash
                shutil.rmtree(entry)
                removed.append(entry.name)
            else:
                left.append(entry.name)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)  # releases the lock
    logger.info(
        "discarded the local state: removed %d RocksDB files",
        len(removed),
        extra={"state_dir": str(path), "removed": removed, "left": left},
    )
    if left:
        logger.warning(
            "state dir holds files that are not qlayer's; left them: %s",
            ", ".join(left),
            extra={"state_dir": str(path)},
        )
    return removed
