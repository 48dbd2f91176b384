"""Durable queue state: the store (RocksDB or in-memory), the changelog and recovery from it."""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from layer.state.base import EntryState, PartitionPosition, Store, StoreBatch, StoredMessage
    from layer.state.changelog import ChangelogWriter
    from layer.state.memory import MemoryStore
    from layer.state.ownership import check_state
    from layer.state.recovery import RestoreResult, restore
    from layer.state.rocksdb import RocksDBStore, discard_state_dir
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.state.base": (
                "EntryState",
                "PartitionPosition",
                "Store",
                "StoreBatch",
                "StoredMessage",
            ),
            "layer.state.changelog": ("ChangelogWriter",),
            "layer.state.memory": ("MemoryStore",),
            "layer.state.ownership": ("check_state",),
            "layer.state.recovery": ("RestoreResult", "restore"),
            "layer.state.rocksdb": ("RocksDBStore", "discard_state_dir"),
        },
    )

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
