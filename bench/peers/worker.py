"""The consumer process entry: runs one peer's ``consume`` and reports what it measured.

``ConsumerPool`` (in ``common``) starts ``run`` in a spawned process. The peer's consumer calls the
``Recorder`` on every delivery (latency = now - the message's ``ts``) and after every ack.
"""

from __future__ import annotations

import importlib
import json
import time
from array import array
from pathlib import Path
from typing import Any


class Recorder:
    """One consumer's view of the run: its slot in the shared counters and its latencies."""

    def __init__(self, index: int, shared: tuple[Any, Any, Any, Any]) -> None:
        self.index = index
        self._acks, self._last, self._redelivered, self._ready = shared
        self.latencies = array("d")

    def ready(self) -> None:
        """The consumer is subscribed: the driver may start publishing."""
        self._ready[self.index] = 1

    def delivered(self, body: bytes, redelivered: bool = False) -> None:
        self.latencies.append(time.time() - json.loads(body)["ts"])
        if redelivered:
            self._redelivered[self.index] += 1

    def acked(self, count: int = 1) -> None:
        """``count`` acks were handed to the broker."""
        self._acks[self.index] += count
        self._last[self.index] = time.time()


def run(
    module: str,
    target: dict[str, Any],
    index: int,
    shared: tuple[Any, Any, Any, Any],
    stop: Any,
    out: str,
) -> None:
    """Consume ``target`` with the peer in ``module`` until ``stop`` is set."""
    rec = Recorder(index, shared)
    importlib.import_module(module).consume(target, rec, stop)
    Path(out).write_bytes(rec.latencies.tobytes())
