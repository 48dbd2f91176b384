"""Where a delivery's latency goes: the coordinator's stages, timed per batch.

A message's way from its Kafka timestamp to the consumer, as the coordinator sees it:

- ``fetch``: Kafka timestamp (the producer's create time) to the ingest reader holding it (the
  producer's linger, the broker's append, the fetch wait);
- ``round_wait``: fetched to the start of the round that admits it (the hand-over to the event
  loop, the round under way, the group-commit window);
- ``lease``: Kafka timestamp to the start of the round that leases it: ``fetch`` and
  ``round_wait``, plus the time it waited in the queue for a consumer's room (its backlog full,
  e.g. while the acks that free it wait for a commit): what this stage exceeds the two by;
- ``decide``: round start to its commit begun (admit, tick, dispatch, changelog records);
- ``commit``: the round's Kafka transaction, begun to durable (and applied to the store);
- ``push``: handed to the subscription's stream to written to the transport;
- ``server``: Kafka timestamp to written, per message: the whole of the coordinator's part, so a
  client's end-to-end latency less this is the wire and the client;
- ``ack``: an at-least-once ack batch received to confirmed (its done records durable), per
  acked message.

Each stage is timed with one clock reading per batch (a fetch, a round, a frame), never per
message, and counted with the batch's message count as its weight in a histogram of
log-spaced buckets (5% wide, 10 µs to 100 s: fixed memory, since the coordinator started).
Wall clock (``time.time``) throughout: the Kafka timestamp is one, and it compares across
processes on one machine.
"""

from __future__ import annotations

import math
from array import array

__all__ = ["STAGES", "Stages"]

STAGES = ("fetch", "round_wait", "lease", "decide", "commit", "push", "server", "ack")

_LOW = 1e-5  # seconds: the first bucket's upper bound
_GROWTH = 1.05  # each bucket's upper bound over the previous one's
_BUCKETS = int(math.log(1e2 / _LOW, _GROWTH)) + 2  # the last holds everything beyond 100 s
_LOG_GROWTH = math.log(_GROWTH)


def _bucket(seconds: float) -> int:
    if seconds <= _LOW:
        return 0
    return min(_BUCKETS - 1, 1 + int(math.log(seconds / _LOW) / _LOG_GROWTH))


def _upper(bucket: int) -> float:
    """A bucket's upper bound in seconds: what a percentile falling in it reports."""
    return _LOW * _GROWTH**bucket


class Stages:
    """A histogram of messages per stage; percentiles on demand."""

    def __init__(self) -> None:
        self._counts = {name: array("q", bytes(8 * _BUCKETS)) for name in STAGES}

    def add(self, stage: str, seconds: float, weight: int = 1) -> None:
        if weight > 0:
            self._counts[stage][_bucket(seconds)] += weight

    def percentiles(self, stage: str, qs: tuple[float, ...] = (0.5, 0.99)) -> list[float] | None:
        """The stage's seconds at each quantile of messages (None before any sample), within
        one bucket (5%) above the true value."""
        counts = self._counts[stage]
        total = sum(counts)
        if not total:
            return None
        out = []
        bucket = seen = 0
        for q in sorted(qs):
            # the message at index int(q * total), as bench.harness.percentiles picks it
            target = min(total - 1, int(q * total))
            while seen + counts[bucket] <= target:
                seen += counts[bucket]
                bucket += 1
            out.append(_upper(bucket))
        return out

    def extra(self) -> dict[str, float]:
        """The stages as ``stats`` extras: ``stage_<name>_p50_ms`` and ``..._p99_ms``."""
        out: dict[str, float] = {}
        for name in STAGES:
            at = self.percentiles(name)
            if at is not None:
                out[f"stage_{name}_p50_ms"] = round(at[0] * 1000.0, 3)
                out[f"stage_{name}_p99_ms"] = round(at[1] * 1000.0, 3)
        return out
