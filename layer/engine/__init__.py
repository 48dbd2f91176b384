"""The pure queue engine: events in, effects out, no I/O (see ``layer.engine.queue``)."""

from layer.engine.queue import UNLIMITED, Lease, QueueEngine

__all__ = ["UNLIMITED", "Lease", "QueueEngine"]
