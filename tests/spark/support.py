"""Helpers for the Spark tests: streaming queries that must end, reading what a sink wrote."""

from __future__ import annotations

from typing import Any


def await_query(query: Any, timeout: float = 60.0) -> None:
    """Wait for a query that ends by itself (Trigger.AvailableNow); fail if it does not or fails."""
    if not query.awaitTermination(timeout):
        query.stop()
        raise AssertionError(f"streaming query {query.id} still running after {timeout:.0f}s")
    if query.exception() is not None:
        raise AssertionError(f"streaming query {query.id} failed: {query.exception()}")
