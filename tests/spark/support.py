"""Helpers for the Spark tests: streaming queries that must end, reading what a sink wrote."""

from __future__ import annotations

import json
import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from spark import foreach_batch


def await_query(query: Any, timeout: float = 60.0) -> None:
    """Wait for a query that ends by itself (Trigger.AvailableNow); fail if it does not or fails."""
    if not query.awaitTermination(timeout):
        query.stop()
        raise AssertionError(f"streaming query {query.id} still running after {timeout:.0f}s")
    if query.exception() is not None:
        raise AssertionError(f"streaming query {query.id} failed: {query.exception()}")


class LiveTotals:
    """A streaming aggregate in update mode, applied here: the totals after every micro-batch.

    ``after[batch_id]`` holds every group's row (as a dict, keyed by the ``key`` column) as it
    stood when that micro-batch had run; ``batches()`` gives each batch's trigger time (when its
    planning began, epoch seconds) and the view offsets it read up to, from the query's progress.
    """

    def __init__(
        self, frame: Any, checkpoint: Path, key: str, trigger: str = "300 milliseconds"
    ) -> None:
        self.key = key
        self.after: dict[int, dict[Any, dict[str, Any]]] = {}
        self._state: dict[Any, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self.query = (
            frame.writeStream.outputMode("update")
            .foreachBatch(foreach_batch(self._apply))
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime=trigger)
            .start()
        )

    def _apply(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        with self._lock:
            for row in rows:
                self._state[row[self.key]] = row.asDict()
            self.after[batch_id] = {k: dict(v) for k, v in self._state.items()}

    def now(self) -> dict[Any, dict[str, Any]]:
        with self._lock:
            return {k: dict(v) for k, v in self._state.items()}

    def batches(self) -> list[tuple[int, float, dict[str, Any]]]:
        """(batch id, trigger time, end offsets) of the micro-batches that ran, oldest first."""
        if self.query.exception() is not None:
            raise AssertionError(f"streaming query failed: {self.query.exception()}")
        found = []
        for progress in self.query.recentProgress:
            source = progress.sources[0] if progress.sources else None
            if source is None or source.startOffset == source.endOffset:
                continue  # a trigger that found nothing new ran no batch
            started = datetime.fromisoformat(progress.timestamp).timestamp()
            ends = json.loads(source.endOffset or "{}")
            found.append((progress.batchId, started, ends))
        return found

    def stop(self) -> None:
        self.query.stop()
