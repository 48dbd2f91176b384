"""Where a delivery's latency goes: the coordinator's stages, timed per batch.

A message's way from its Kafka timestamp to the consumer, as the coordinator sees it:

- ``fetch``: Kafka timestamp (the producer's create time) to the ingest reader holding it (the
  producer's linger, the broker's append, the fetch wait);
- ``round_wait``: fetched to the start of the round that admits it (the hand-over to the event
  loop, the round under way, the group-commit window);
- ``decide``: round start to its commit begun (admit, tick, dispatch, changelog records);
- ``commit``: the round's Kafka transaction, begun to durable (and applied to the store);
- ``push``: handed to the subscription's stream to written to the transport;
- ``server``: Kafka timestamp to written, per message: the whole of the coordinator's part, so a
  client's end-to-end latency less this is the wire and the client.

Each stage is timed with one clock reading per batch (a fetch, a round, a frame), never per
message, and recorded with the batch's message count as its weight; the recorder keeps the last
``window`` batches of each stage. Wall clock (``time.time``) throughout: the Kafka timestamp is
one, and it compares across processes on one machine.
"""

from __future__ import annotations

from collections import deque

__all__ = ["STAGES", "Stages"]

STAGES = ("fetch", "round_wait", "decide", "commit", "push", "server")


class Stages:
    """Weighted samples (seconds, messages) of each stage; percentiles on demand."""

    def __init__(self, window: int = 20_000) -> None:
        self._samples: dict[str, deque[tuple[float, int]]] = {
            name: deque(maxlen=window) for name in STAGES
        }

    def add(self, stage: str, seconds: float, weight: int = 1) -> None:
        if weight > 0:
            self._samples[stage].append((seconds, weight))

    def percentiles(self, stage: str, qs: tuple[float, ...] = (0.5, 0.99)) -> list[float] | None:
        """The stage's seconds at each quantile of messages (None before any sample)."""
        samples = sorted(self._samples[stage])
        total = sum(w for _s, w in samples)
        if not total:
            return None
        out = []
        i = seen = 0
        for q in sorted(qs):
            target = q * total
            while i < len(samples) - 1 and seen + samples[i][1] <= target:
                seen += samples[i][1]
                i += 1
            out.append(samples[i][0])
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
