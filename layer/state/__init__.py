"""Durable queue state: the store (RocksDB or in-memory), the changelog and recovery from it."""

from layer.state.base import EntryState, PartitionPosition, Store, StoreBatch, StoredMessage
from layer.state.changelog import ChangelogWriter
from layer.state.memory import MemoryStore
from layer.state.ownership import check_state
from layer.state.recovery import RestoreResult, restore
from layer.state.rocksdb import RocksDBStore, discard_state_dir

__all__ = [
    "ChangelogWriter",
    "EntryState",
    "MemoryStore",
    "PartitionPosition",
    "RestoreResult",
    "RocksDBStore",
    "Store",
    "StoreBatch",
    "StoredMessage",
    "check_state",
    "discard_state_dir",
    "restore",
]
