"""CPU per message from a round's deliveries to the encoded MessageColumns frame, in process.

``--rounds`` rounds of ``--round`` deliveries each (``--size`` bytes, consecutive offsets of
one partition, one subscription, each round its own lease deadline, payloads in the runtime's
cache) are turned into what a round hands a subscription, then written as one stream write
does: what piled up as one Messages frame to a client that takes columns, encoded. That is
``QueueRuntime.stored`` + ``layer.coordinator.deliveries.by_subscription`` +
``SERVER_FRAME_CODEC.encode`` on a build with DeliveryBatch, and ``QueueRuntime.payloads`` +
``round.materialize`` + the same encode on one without (main before it): run it on both builds
for a before/after. The figure is process CPU time per message of ``--writes`` such writes;
the best and the median of ``--runs`` go to ``bench/results/deliver-cpu-<label>-<time>.json``.

    .venv/bin/python -m bench.deliver_cpu --label after
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bench import cpu_result
from layer.api.frames import SERVER_FRAME_CODEC
from layer.coordinator.app import tune_gc
from layer.engine.model import Bookmark, Delivery
from layer.state.base import StoredMessage

TOPIC = "orders"


def _write(rt: Any, rounds: list[list[Delivery]]) -> int:
    """One stream write of ``rounds``: bytes encoded."""
    from layer.api import server

    try:  # a build with DeliveryBatch
        from layer.coordinator.deliveries import by_subscription
    except ImportError:
        from layer.coordinator import round as round_module

        items: list[Any] = []
        for deliveries in rounds:
            payloads = rt.payloads(None, [d.bookmark for d in deliveries])
            for _sub, messages in round_module.materialize(rt, deliveries, payloads):  # type: ignore[attr-defined]
                items.extend(messages)
        frames = server._message_frames(items, True)
    else:
        batches: list[Any] = []
        for deliveries in rounds:
            stored = rt.stored(None, [d.bookmark for d in deliveries])
            batches += [batch for _sub, batch in by_subscription(rt.name, deliveries, stored)]
        frames = server._message_frames(server._joined(batches), True)
    return sum(len(SERVER_FRAME_CODEC.encode(frame)) for frame in frames)


class _Runtime:
    """What the delivery path reads of a QueueRuntime: its name and payload cache."""

    def __init__(self, cache: dict[Bookmark, StoredMessage]) -> None:
        from layer.coordinator.runtime import QueueRuntime

        self.name = "q"
        self.payload_cache = cache
        self._payloads = QueueRuntime.payloads
        self._stored = getattr(QueueRuntime, "stored", None)

    def payloads(self, store: Any, bookmarks: list[Bookmark]) -> Any:
        return self._payloads(self, store, bookmarks)  # type: ignore[arg-type]

    def stored(self, store: Any, bookmarks: list[Bookmark]) -> Any:
        assert self._stored is not None
        return self._stored(self, store, bookmarks)  # type: ignore[arg-type]


def one_run(writes: int, rounds: int, per_round: int, size: int) -> dict[str, float]:
    value = b"x" * size
    all_rounds = []
    cache: dict[Bookmark, StoredMessage] = {}
    offset = 0
    for r in range(rounds):
        deliveries = []
        for _ in range(per_round):
            bm = Bookmark(TOPIC, 0, offset)
            cache[bm] = StoredMessage(None, value, (), 1_700_000_000_000 + offset)
            deliveries.append(Delivery("s", bm, 1, 0, 1_700_000_030.0 + r))
            offset += 1
        all_rounds.append(deliveries)
    rt = _Runtime(cache)
    tune_gc()
    began = time.process_time()
    encoded = 0
    for _ in range(writes):
        encoded += _write(rt, all_rounds)
    cpu = time.process_time() - began
    n = writes * rounds * per_round
    return {"cpu_s": round(cpu, 4), "us_per_msg": round(cpu / n * 1e6, 3), "bytes": encoded}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5, help="rounds piled up for a write")
    parser.add_argument("--round", type=int, default=100, help="deliveries a round")
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    cpu_result.repeat(
        "deliver-cpu",
        args,
        ("writes", "rounds", "round", "size", "runs"),
        lambda: one_run(args.writes, args.rounds, args.round, args.size),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
