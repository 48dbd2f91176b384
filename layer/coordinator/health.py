"""What the coordinator knows of its own health: restored, serving, Kafka reachable.

One plain object, written by the coordinator (its life cycle) and by the Kafka ports (they see
the broker go and come back), read by the health endpoints (gRPC ``grpc.health.v1`` and HTTP
``/healthz``, ``/readyz``). Runs on the event loop except ``kafka_down`` / ``kafka_up``, which
librdkafka callbacks may call from their threads: those take a lock.

Outages are logged once each way (one line when Kafka becomes unreachable, one when it is back,
with the outage's length), however many clients see the errors in between.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Readiness:
    """Ready to serve, or why not. ``reasons`` is empty when ready; ``detail`` is the JSON body
    of ``/readyz`` (and what ``qlayer stats`` may show)."""

    ready: bool
    reasons: tuple[str, ...]
    detail: dict[str, object] = field(default_factory=dict)


class Health:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._restored = False
        self._restoring = "not started"
        self._restore_done = 0  # changelog records applied by the restore under way
        self._restore_total = 0
        self._serving = False
        self._stopping = False
        self._kafka_down_since: float | None = None
        self._kafka_reason = ""
        self.outages = 0  # how many times Kafka became unreachable since start

    # --- the coordinator's life cycle ------------------------------------------------------

    def restoring(self, detail: str, done: int | None = None, total: int | None = None) -> None:
        """Restore is under way (``detail``: which queue, how far; ``done`` of ``total``
        changelog records, when known)."""
        self._restored = False
        self._restoring = detail
        if done is not None and total is not None:
            self._restore_done, self._restore_total = done, total

    @property
    def restore_progress(self) -> tuple[int, int]:
        """(records applied, records to apply) of the restore under way or the last one."""
        return self._restore_done, self._restore_total

    @property
    def is_restored(self) -> bool:
        return self._restored

    def restored(self) -> None:
        self._restored = True
        self._restoring = ""

    def serving(self, on: bool = True) -> None:
        """The API accepts calls (False again while stopping)."""
        self._serving = on

    def stopping(self) -> None:
        self._stopping = True
        self._serving = False

    # --- Kafka, from any thread --------------------------------------------------------------

    def kafka_down(self, reason: str) -> bool:
        """Kafka could not be reached (``reason``: what failed). True the first time of an
        outage, when the one log line is written."""
        with self._lock:
            if self._kafka_down_since is not None:
                return False
            self._kafka_down_since = self._clock()
            self._kafka_reason = reason
            self.outages += 1
        log.warning("Kafka is unreachable: %s", reason, extra={"reason": reason})
        return True

    def kafka_up(self) -> float | None:
        """Kafka answered. Returns the outage's length in seconds if one just ended."""
        with self._lock:
            since = self._kafka_down_since
            if since is None:
                return None
            self._kafka_down_since = None
            self._kafka_reason = ""
        seconds = self._clock() - since
        log.warning("Kafka is reachable again after %.1f s", seconds, extra={"seconds": seconds})
        return seconds

    @property
    def kafka_reachable(self) -> bool:
        return self._kafka_down_since is None

    @property
    def kafka_reason(self) -> str:
        """Why Kafka is taken to be unreachable ("" while it is reachable)."""
        return self._kafka_reason

    def kafka_down_for(self) -> float:
        """Seconds since Kafka became unreachable (0 while reachable)."""
        since = self._kafka_down_since
        return 0.0 if since is None else self._clock() - since

    # --- what the endpoints answer ---------------------------------------------------------

    def readiness(self) -> Readiness:
        reasons: list[str] = []
        if self._stopping:
            reasons.append("stopping")
        if not self._restored:
            reasons.append(f"restoring state: {self._restoring}")
        if not self.kafka_reachable:
            reasons.append(
                f"Kafka unreachable for {self.kafka_down_for():.1f} s: {self._kafka_reason}"
            )
        if not self._serving and not self._stopping:
            reasons.append("API not serving yet")
        detail: dict[str, object] = {
            "ready": not reasons,
            "restored": self._restored,
            "serving": self._serving,
            "kafka_reachable": self.kafka_reachable,
            "kafka_outages": self.outages,
            "reasons": reasons,
        }
        return Readiness(not reasons, tuple(reasons), detail)
