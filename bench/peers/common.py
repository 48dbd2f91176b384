"""What every peer shares: the workload, the consumer processes, the two measurements.

A peer supplies a small object (``Peer``) that creates and deletes a fresh queue, publishes into it
and counts what is left, plus a ``consume`` function run in each consumer process. The drivers here
(``throughput`` and ``latency``) do the rest the same way for every peer, so the figures compare.

The payload and percentile helpers are copied from ``bench/queue_bench.py`` on purpose: the peer
bench must not move when the qlayer bench does.
"""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import shutil
import statistics
import tempfile
import time
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

CONSUMERS = 4
# broker confirmations a publisher may wait on at once (confirms, pub acks, pipelined replies)
PUBLISH_WINDOW = 1000
# below this share of the offered rate, a latency point is reported as not sustained
SUSTAINED_SHARE = 0.95


class PeerUnavailable(Exception):
    """A peer's service cannot be reached; the message says how to start it."""


def payload(size: int, i: int) -> bytes:
    """A JSON message of about ``size`` bytes carrying its publish time ``ts`` (epoch seconds)."""
    base = {"id": i, "symbol": "ACME", "qty": i % 100, "ts": time.time(), "pad": ""}
    raw = json.dumps(base)
    base["pad"] = "x" * max(0, size - len(raw))
    return json.dumps(base).encode()


def percentiles(values: list[float]) -> dict[str, float]:
    """Latency percentiles in milliseconds of ``values`` given in seconds."""
    if not values:
        return {}
    v = sorted(values)

    def at(q: float) -> float:
        return v[min(len(v) - 1, int(q * len(v)))] * 1000.0

    return {
        "p50_ms": round(at(0.50), 2),
        "p90_ms": round(at(0.90), 2),
        "p99_ms": round(at(0.99), 2),
        "p999_ms": round(at(0.999), 2),
        "max_ms": round(v[-1] * 1000.0, 2),
        "mean_ms": round(statistics.fmean(v) * 1000.0, 2),
    }


class Pacer:
    """When message ``i`` is due: at once for rate 0, else ``i / rate`` after the start.

    With ``seconds``, a publisher that falls behind the offered rate stops once that time (and a
    second's grace) is up rather than running on: a latency point takes its length whatever the
    peer achieves, and reports the rate it did achieve.
    """

    def __init__(self, rate: float, seconds: float = 0.0) -> None:
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.start = time.monotonic()
        self.end = self.start + seconds + 1.0 if seconds > 0 else float("inf")

    def over(self) -> bool:
        """The time for publishing is up."""
        return time.monotonic() > self.end

    def wait(self, i: int) -> float:
        """Seconds until message ``i`` is due; zero or less means now."""
        if not self.interval:
            return 0.0
        return self.start + i * self.interval - time.monotonic()


@dataclass(frozen=True)
class Published:
    """Wall-clock marks of one publish run."""

    count: int  # fewer than asked when a paced run's time was up
    first: float  # the first message handed to the client
    last_sent: float  # the last message handed to the client
    confirmed: float  # the broker confirmed the last outstanding message


class Peer(Protocol):
    """One broker under test, seen from the driver process."""

    # the module whose ``consume(target, recorder, stop)`` runs in each consumer process
    worker_module: str

    def create(self) -> dict[str, Any]:
        """Make a fresh, uniquely named queue; return what a consumer needs to reach it."""
        ...

    def delete(self, target: dict[str, Any]) -> None: ...

    def publish(
        self, target: dict[str, Any], n: int, size: int, rate: float = 0.0, seconds: float = 0.0
    ) -> Published:
        """Publish ``n`` messages, at ``rate`` per second or as fast as allowed (rate 0).

        With ``seconds``, stop early if the peer falls behind (see ``Pacer``).
        """
        ...

    def outstanding(self, target: dict[str, Any]) -> int:
        """Messages the broker still holds as not acknowledged."""
        ...

    def settings(self) -> dict[str, Any]:
        """Client and server versions and the settings that shape the figures."""
        ...


@dataclass(frozen=True)
class Collected:
    acked: int
    redelivered: int
    latencies: list[float]


class ConsumerPool:
    """``consumers`` processes consuming and acking ``target``; counts shared through memory.

    Each process owns one slot of the shared arrays (acks counted, wall time of its last ack,
    redeliveries seen, ready flag), so no locks are needed. Latencies go through a file at the end.
    """

    def __init__(self, module: str, target: dict[str, Any], consumers: int) -> None:
        from bench.peers import worker  # the worker imports the peer modules, which import us

        ctx = mp.get_context("spawn")
        self._dir = Path(tempfile.mkdtemp(prefix="qlayer-peers-"))
        self.acks = ctx.Array("q", consumers, lock=False)
        self.last = ctx.Array("d", consumers, lock=False)
        self.redelivered = ctx.Array("q", consumers, lock=False)
        self.ready = ctx.Array("b", consumers, lock=False)
        self.stop = ctx.Event()
        self.procs = [
            ctx.Process(
                target=worker.run,
                args=(
                    module,
                    target,
                    i,
                    (self.acks, self.last, self.redelivered, self.ready),
                    self.stop,
                    str(self._dir / f"latencies-{i}"),
                ),
                name=f"{module.rsplit('.', 1)[-1]}-consumer-{i}",
                daemon=True,
            )
            for i in range(consumers)
        ]

    def __enter__(self) -> ConsumerPool:
        try:
            for p in self.procs:
                p.start()
            deadline = time.monotonic() + 60
            while not all(self.ready):
                self._check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("consumer processes did not subscribe within 60 s")
                time.sleep(0.02)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._shutdown()
        shutil.rmtree(self._dir, ignore_errors=True)

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.exitcode is not None:
                raise RuntimeError(
                    f"{p.name} exited early with code {p.exitcode} (its error is above)"
                )

    def wait_acked(self, n: int, timeout: float) -> float:
        """Block until ``n`` acks are counted; return the wall time of the last one."""
        deadline = time.monotonic() + timeout
        report = time.monotonic() + 5
        while (acked := sum(self.acks)) < n:
            self._check_alive()
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"only {acked} of {n} messages acked after {timeout:.0f} s")
            if now > report:
                log.info("acked %d/%d", acked, n)
                report = now + 5
            time.sleep(0.005)
        return max(self.last)

    def finish(self) -> Collected:
        """Stop the consumers and gather what they measured."""
        self._shutdown()
        failed = [p.name for p in self.procs if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"consumer processes failed: {', '.join(failed)}")
        latencies: list[float] = []
        for i in range(len(self.procs)):
            lat = array("d")
            lat.frombytes((self._dir / f"latencies-{i}").read_bytes())
            latencies.extend(lat)
        return Collected(sum(self.acks), sum(self.redelivered), latencies)

    def _shutdown(self) -> None:
        self.stop.set()
        for p in self.procs:
            if p.pid is None:
                continue
            p.join(30)
            if p.exitcode is None:
                log.warning("consumer did not stop in 30 s, terminating: process=%s", p.name)
                p.terminate()
                p.join(5)


def _drained(peer: Peer, target: dict[str, Any], timeout: float = 10.0) -> int:
    """What the broker still holds once the last acks had time to land (they are async)."""
    deadline = time.monotonic() + timeout
    while (left := peer.outstanding(target)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        log.warning("broker still holds %d unacked messages after the run", left)
    return left


def throughput(peer: Peer, n: int, size: int, consumers: int = CONSUMERS) -> dict[str, Any]:
    """Publish ``n`` as fast as the peer allows while ``consumers`` processes consume and ack."""
    target = peer.create()
    try:
        with ConsumerPool(peer.worker_module, target, consumers) as pool:
            pub = peer.publish(target, n, size, 0.0)
            end = pool.wait_acked(n, timeout=60 + n / 200)
            got = pool.finish()
        left = _drained(peer, target)
    finally:
        peer.delete(target)
    # the publish side again with nobody consuming: the peer's publish capacity on its own
    target = peer.create()
    try:
        alone = peer.publish(target, n, size, 0.0)
    finally:
        peer.delete(target)
    elapsed = end - pub.first
    return {
        "n": n,
        "size": size,
        "consumers": consumers,
        "throughput_msg_s": round(n / elapsed),
        "elapsed_s": round(elapsed, 3),
        "publish_msg_s": round(n / max(1e-9, pub.confirmed - pub.first)),
        "publish_only_msg_s": round(n / max(1e-9, alone.confirmed - alone.first)),
        "acked": got.acked,
        "redelivered": got.redelivered,
        "unacked_after": left,
        "latency_saturated": percentiles(got.latencies),
        "settings": peer.settings(),
    }


def latency(
    peer: Peer, rate: float, seconds: float, size: int, consumers: int = CONSUMERS
) -> dict[str, Any]:
    """Publish at ``rate`` per second for ``seconds``; latency is delivery time minus ``ts``."""
    n = max(2, int(rate * seconds))
    target = peer.create()
    try:
        with ConsumerPool(peer.worker_module, target, consumers) as pool:
            pub = peer.publish(target, n, size, rate, seconds)
            end = pool.wait_acked(pub.count, timeout=60 + 4 * seconds)
            got = pool.finish()
        left = _drained(peer, target)
    finally:
        peer.delete(target)
    # n messages paced at `rate` span n - 1 intervals
    achieved = (pub.count - 1) / max(1e-9, pub.last_sent - pub.first)
    delivered = (pub.count - 1) / max(1e-9, end - pub.first)
    sustained = min(achieved, delivered) >= SUSTAINED_SHARE * rate
    res: dict[str, Any] = {
        "offered_rate": rate,
        "achieved_rate": round(achieved),
        "delivered_rate": round(delivered),
        "sustained": sustained,
        "seconds": seconds,
        "published": pub.count,
        "size": size,
        "consumers": consumers,
        "count": len(got.latencies),
        "latency": percentiles(got.latencies),
        "redelivered": got.redelivered,
        "unacked_after": left,
        "settings": peer.settings(),
    }
    if not sustained:
        res["note"] = (
            f"did not sustain {rate:.0f} msg/s offered: published at {achieved:.0f}/s, "
            f"delivered and acked at {delivered:.0f}/s"
        )
    return res
