"""CPU per message of the blocking client's own code, without a network or other threads.

A ``Subscription`` is put together around its core without connecting (no runner, flusher or
grpc thread), and fed what a consumer's stream carries with a window of ``--window``: a
``Messages`` frame of that many messages (columns, ``--size`` bytes each, encoded as the
coordinator encodes them), decoded, taken through the core and handed over as the runner
does; the consumer takes each with ``next()`` and ``msg.ack()``s it; the acks go out as the
consumer's empty buffer sends them (``Ack`` frames, encoded), and an ``AckResult`` answers
them. The figure is µs of CPU a message for all of that, in one thread: the client's part of
``bench.wire_cpu``'s consumer figure, without grpc's threads and hand-offs. Best and median
of ``--repeats`` runs of ``--messages`` messages.

    .venv/bin/python -m bench.client_cpu --messages 100000 --repeats 7 --label after
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from collections import deque
from typing import Any

from bench import cpu_result
from bench.harness import payload
from layer.api.frames import CLIENT_FRAME_CODEC, SERVER_FRAME_CODEC, Ack, AckResult, Messages
from layer.api.service import DeliveredMessage
from layer.client._core import Addresses, ReconnectPolicy, SubscriptionCore
from layer.client.sync import Subscription
from layer.engine.model import Bookmark

PARTITIONS = 4


def frames(window: int, size: int, rounds: int) -> list[bytes]:
    """``rounds`` encoded Messages frames of ``window`` messages each, offsets going on."""
    out = []
    lease = int(time.time() * 1000) + 60_000
    for r in range(rounds):
        messages = [
            DeliveredMessage(
                Bookmark("bench-topic", i % PARTITIONS, r * window + i),
                None,
                payload(size, r * window + i),
                [],
                lease - 60_000,
                1,
                0,
                lease,
                False,
                "bench",
            )
            for i in range(window)
        ]
        out.append(SERVER_FRAME_CODEC.encode(Messages(messages, True, 1.0)))
    return out


def detached() -> Subscription:
    """A connected-looking Subscription with no threads: what the runner would feed it."""
    sub = Subscription.__new__(Subscription)
    core: SubscriptionCore[Any] = SubscriptionCore(
        "bench", 1000, None, "bench", Addresses("127.0.0.1:1"), ReconnectPolicy()
    )
    core.connected = True
    sub._core = core
    sub._mutex = threading.RLock()
    sub._cond = threading.Condition(sub._mutex)
    sub._buffer = queue.Queue()
    sub._ready = deque()
    sub._requests = queue.Queue()
    sub._end = object()
    sub._timeout = None
    return sub


def one_run(encoded: list[bytes], window: int) -> float:
    """Seconds of CPU for every frame of ``encoded`` through a fresh subscription."""
    sub = detached()
    core = sub._core
    requests = sub._requests
    decode, encode = SERVER_FRAME_CODEC.decode, CLIENT_FRAME_CODEC.encode
    t0 = time.process_time()
    for data in encoded:
        frame = decode(data)
        with sub._cond:
            out = core.on_frame(frame, 0.0)
        sub._apply(out)
        for _ in range(window):
            msg = sub.next(0)
            assert msg is not None
            msg.ack()
        sub._send_pending()  # what next() does before it would block
        while not requests.empty():
            ack = requests.get_nowait()
            assert isinstance(ack, Ack)
            encode(ack)
            with sub._cond:
                core.on_frame(AckResult(ack.request_id, []), 0.0)
    cpu = time.process_time() - t0
    assert core.acked_count == len(encoded) * window
    return cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--window", type=int, default=100, help="messages a frame")
    parser.add_argument("--size", type=int, default=200, help="payload bytes")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--label", default="", help="a name for this build (before, after)")
    args = parser.parse_args(argv)
    rounds = max(1, args.messages // args.window)
    encoded = frames(args.window, args.size, rounds)
    n = rounds * args.window
    one_run(encoded[:10], args.window)  # warm up
    us = [one_run(encoded, args.window) / n * 1e6 for _ in range(args.repeats)]
    result = {
        **cpu_result.head("client-cpu", args, ("messages", "window", "size", "repeats")),
        "best_us_per_msg": round(min(us), 3),
        "median_us_per_msg": round(statistics.median(us), 3),
        "runs_us_per_msg": [round(u, 3) for u in us],
    }
    out = cpu_result.write(result)
    print(json.dumps({k: result[k] for k in ("best_us_per_msg", "median_us_per_msg")}))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
