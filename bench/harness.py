"""The one harness every system under test goes through: workload, consumers, the two drivers.

A system (qlayer, raw Kafka, RabbitMQ, NATS JetStream, Redis Streams) supplies a small object
(``System``) that creates and deletes a fresh queue, publishes into it and counts what is left,
plus a module-level ``consume(target, recorder, stop)`` run in each consumer process. The drivers
here (``throughput`` and ``latency``) do the rest the same way for every system, so the figures
compare: the same payloads, the same number of consumer processes, the same pacing, the same
clock (latency = the consumer's wall clock at delivery minus the ``ts`` the publisher put in the
message, on one machine), the same end-of-run rule.
"""

from __future__ import annotations

import importlib
import json
import logging
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

CONSUMERS = 4
# broker confirmations a publisher may wait on at once (confirms, pub acks, pipelined replies)
PUBLISH_WINDOW = 1000
# below this share of the offered rate, a latency point is reported as not sustained
SUSTAINED_SHARE = 0.95


class ServiceUnavailable(Exception):
    """A service the run needs cannot be reached; the message says how to start it."""


_PAD = "x" * 65536


def payload(size: int, i: int) -> bytes:
    """A JSON message of ``size`` bytes (at least ~70) carrying its publish time ``ts`` first.

    ``{"ts": 1763800000.123456, "id": 7, "symbol": "ACME", "qty": 7, "pad": "xxx..."}``. Built by
    one format instead of ``json.dumps``: on two cores the publisher's CPU is taken from the
    systems under test (8.5 us a message with json.dumps twice, ~1 us like this).
    """
    head = f'{{"ts": {time.time():.6f}, "id": {i}, "symbol": "ACME", "qty": {i % 100}, "pad": "'
    return (head + _PAD[: max(0, size - len(head) - 2)] + '"}').encode()


def publish_time(body: bytes) -> float:
    """The ``ts`` of a message made by ``payload``: a slice, not a JSON parse of the message."""
    if body.startswith(b'{"ts": '):
        return float(body[7 : body.index(b",", 7)])
    return float(json.loads(body)["ts"])


def percentiles(values: list[float] | array[float]) -> dict[str, float]:
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


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# The coordinator's threads by what runs them (``/proc``'s thread name: Python's threads keep
# the process's name, librdkafka's, gRPC's and RocksDB's have their own)
THREAD_GROUPS = ("main", "python", "librdkafka", "grpc", "rocksdb", "other")


def thread_group(tid: int, pid: int, comm: str) -> str:
    """The group of thread ``tid`` of process ``pid`` named ``comm`` (``THREAD_GROUPS``)."""
    if tid == pid:
        return "main"  # the interpreter's main thread: the coordinator's event loop
    if comm.startswith("python"):
        return "python"
    if comm.startswith("rdk:"):
        return "librdkafka"
    if comm.startswith(("grpc", "event_engine", "lifeguard")):
        return "grpc"
    if comm.startswith("rocksdb"):
        return "rocksdb"
    return "other"


def thread_groups(pid: int) -> dict[str, tuple[int, float]] | None:
    """Per group of process ``pid``'s threads (``thread_group``): their voluntary context
    switches (wake-ups) and CPU seconds so far. None where ``/proc`` does not tell. Threads
    that already exited are not counted."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[int, float]] = {}
    for tid in tasks:
        base = f"/proc/{pid}/task/{tid}"
        try:
            with open(f"{base}/comm") as f:
                comm = f.read().strip()
            with open(f"{base}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"{base}/status") as f:
                woken = next(
                    int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt")
                )
        except (OSError, StopIteration):
            continue  # the thread exited meanwhile
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
        group = thread_group(int(tid), pid, comm)
        was_woken, was_cpu = out.get(group, (0, 0.0))
        out[group] = (was_woken + woken, was_cpu + cpu)
    return out


def thread_wakeups(pid: int) -> int | None:
    """The voluntary context switches of every thread of process ``pid`` so far: each one a
    thread that blocked (on a lock, a queue, a socket, a timer) and was woken again. None where
    ``/proc`` does not tell (not Linux). Threads that already exited are not counted."""
    return total_wakeups(thread_groups(pid))


def total_wakeups(groups: dict[str, tuple[int, float]] | None) -> int | None:
    """The wake-ups of all the groups of a ``thread_groups`` reading (None for none)."""
    return None if groups is None else sum(woken for woken, _cpu in groups.values())


def thread_split(
    before: dict[str, tuple[int, float]] | None,
    after: dict[str, tuple[int, float]] | None,
    rounds: int,
    messages: int,
) -> dict[str, dict[str, float]]:
    """What each group of threads cost between two ``thread_groups`` readings: CPU µs a
    message, its share of the threads' CPU (%), and wake-ups a round. Empty when either
    reading is missing, or no message or round was taken."""
    if before is None or after is None or messages <= 0 or rounds <= 0:
        return {}
    spent: dict[str, tuple[int, float]] = {}
    for group, (woken, cpu) in after.items():
        woken0, cpu0 = before.get(group, (0, 0.0))
        spent[group] = (max(woken - woken0, 0), max(cpu - cpu0, 0.0))
    total = sum(cpu for _woken, cpu in spent.values()) or 1.0
    out: dict[str, dict[str, float]] = {}
    for group in THREAD_GROUPS:
        if group in spent:
            woken, cpu = spent[group]
            out[group] = {
                "cpu_us_per_msg": round(cpu / messages * 1e6, 1),
                "cpu_share": round(100 * cpu / total, 1),
                "wakeups_per_round": round(woken / rounds, 1),
            }
    return out


def handoff_cpu_us(handoffs: int = 2000) -> float:
    """This machine's CPU cost (µs, both threads together) of one hand-off between two threads
    of one process: one sets an event the other waits on, and back. It prices what the
    coordinator's wake-ups cost here (a virtual machine's can cost several times a bare
    one's), so a per-round figure of wake-ups reads as time."""
    ping, pong = threading.Event(), threading.Event()

    def other() -> None:
        for _ in range(handoffs):
            ping.wait()
            ping.clear()
            pong.set()

    t = threading.Thread(target=other, name="handoff")
    t.start()
    start = time.process_time()
    for _ in range(handoffs):
        ping.set()
        pong.wait()
        pong.clear()
    t.join()
    return round((time.process_time() - start) / (2 * handoffs) * 1e6, 1)


def per_round(cpu_s: float, wakeups: int | None, rounds: int, messages: int) -> dict[str, float]:
    """A throughput run's coordinator figures per round (each round one Kafka transaction at
    most, one frame to each consumer at most): what a round costs whatever its size, next to
    what a message costs."""
    if rounds <= 0:
        return {}
    out = {
        "messages": round(messages / rounds, 1),
        "cpu_ms": round(cpu_s * 1e3 / rounds, 2),
    }
    if wakeups is not None:
        out["wakeups"] = round(wakeups / rounds, 1)
    return out


def settled_rss(rss: Callable[[], int], timeout: float = 60.0) -> int:
    """RSS once two readings half a second apart agree within 0.5% (allocations settled)."""
    deadline = time.monotonic() + timeout
    last = rss()
    while True:
        time.sleep(0.5)
        now = rss()
        if abs(now - last) <= 0.005 * last or time.monotonic() > deadline:
            return now
        last = now


class Pacer:
    """When message ``i`` is due: at once for rate 0, else ``i / rate`` after the start.

    With ``seconds``, a publisher that falls behind the offered rate stops once that time (and a
    second's grace) is up rather than running on: a latency point takes its length whatever the
    system achieves, and reports the rate it did achieve.
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


class System(Protocol):
    """One system under test, seen from the driver process."""

    name: str  # short key: "qlayer", "kafka", "rabbitmq", "nats", "redis"
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

        With ``seconds``, stop early if the system falls behind (see ``Pacer``).
        """
        ...

    def outstanding(self, target: dict[str, Any]) -> int:
        """Messages the broker still holds as not acknowledged."""
        ...

    def settings(self) -> dict[str, Any]:
        """Client and server versions and the settings that shape the figures."""
        ...


def _observed(system: System, target: dict[str, Any], messages: int) -> dict[str, Any]:
    """What a system reports of its own costs for a run, if it can (``observe``, optional)."""
    observe = getattr(system, "observe", None)
    return dict(observe(target, messages)) if observe is not None else {}


# --- the consumer processes ------------------------------------------------------------------


class Recorder:
    """One consumer's view of the run: its slot in the shared counters and its latencies.

    The system's consumer calls ``delivered`` on every delivery and ``acked`` after every ack (or,
    for raw Kafka, after every consumed batch: there is no ack). The process's CPU time (every
    thread: the client library's own included) is counted from ``ready`` to the consumer's end.
    """

    def __init__(self, index: int, shared: tuple[Any, Any, Any, Any, Any]) -> None:
        self.index = index
        self._acks, self._last, self._redelivered, self._ready, self._cpu = shared
        self.latencies = array("d")
        self._cpu_at_ready: float | None = None

    def ready(self) -> None:
        """The consumer is subscribed: the driver may start publishing."""
        self._cpu_at_ready = time.process_time()
        self._ready[self.index] = 1

    def ended(self) -> None:
        """The consumer returned: its CPU time since ``ready`` goes into the shared slot."""
        if self._cpu_at_ready is not None:
            self._cpu[self.index] = time.process_time() - self._cpu_at_ready

    def delivered(self, body: bytes, redelivered: bool = False) -> None:
        self.latencies.append(time.time() - publish_time(body))
        if redelivered:
            self._redelivered[self.index] += 1

    def acked(self, count: int = 1) -> None:
        """``count`` acks were handed to the broker's client."""
        self._acks[self.index] += count
        self._last[self.index] = time.time()


def _consumer_main(
    module: str,
    target: dict[str, Any],
    index: int,
    shared: tuple[Any, Any, Any, Any, Any],
    stop: Any,
    out: str,
) -> None:
    """A consumer process: consume ``target`` with the system in ``module`` until ``stop``."""
    rec = Recorder(index, shared)
    importlib.import_module(module).consume(target, rec, stop)
    rec.ended()
    Path(out).write_bytes(rec.latencies.tobytes())


@dataclass(frozen=True)
class Collected:
    acked: int
    redelivered: int
    latencies: array[float]
    cpu_s: float  # the consumer processes' CPU time from subscribed to stopped, summed

    def cpu_us_per_msg(self, messages: int) -> float:
        """The consumers' CPU per message (µs): the client's cost and the harness's own."""
        return round(self.cpu_s / max(1, messages) * 1e6, 1)


class ConsumerPool:
    """``consumers`` processes consuming and acking ``target``; counts shared through memory.

    Each process owns one slot of the shared arrays (acks counted, wall time of its last ack,
    redeliveries seen, ready flag, CPU seconds), so no locks are needed. Latencies go through a file at the end.
    """

    def __init__(self, module: str, target: dict[str, Any], consumers: int) -> None:
        ctx = mp.get_context("spawn")
        self._dir = Path(tempfile.mkdtemp(prefix="qlayer-bench-"))
        self.acks = ctx.Array("q", consumers, lock=False)
        self.last = ctx.Array("d", consumers, lock=False)
        self.redelivered = ctx.Array("q", consumers, lock=False)
        self.ready = ctx.Array("b", consumers, lock=False)
        self.cpu = ctx.Array("d", consumers, lock=False)
        self.stop = ctx.Event()
        self.procs = [
            ctx.Process(
                target=_consumer_main,
                args=(
                    module,
                    target,
                    i,
                    (self.acks, self.last, self.redelivered, self.ready, self.cpu),
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
        report = time.monotonic() + 10
        while (acked := sum(self.acks)) < n:
            self._check_alive()
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"only {acked} of {n} messages acked after {timeout:.0f} s")
            if now > report:
                log.info("  acked %d/%d", acked, n)
                report = now + 10
            time.sleep(0.005)
        return max(self.last)

    def finish(self) -> Collected:
        """Stop the consumers and gather what they measured."""
        self._shutdown()
        failed = [p.name for p in self.procs if p.exitcode != 0]
        if failed:
            raise RuntimeError(f"consumer processes failed: {', '.join(failed)}")
        latencies = array("d")
        for i in range(len(self.procs)):
            latencies.frombytes((self._dir / f"latencies-{i}").read_bytes())
        return Collected(sum(self.acks), sum(self.redelivered), latencies, sum(self.cpu))

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


# --- the two drivers -------------------------------------------------------------------------


def _drained(system: System, target: dict[str, Any], timeout: float = 10.0) -> int:
    """What the broker still holds once the last acks had time to land (they are async)."""
    deadline = time.monotonic() + timeout
    while (left := system.outstanding(target)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        log.warning("%s still holds %d unacked messages after the run", system.name, left)
    return left


def throughput(system: System, n: int, size: int, consumers: int = CONSUMERS) -> dict[str, Any]:
    """Publish ``n`` as fast as the system allows while ``consumers`` processes consume and ack.

    Throughput is ``n`` over the time from the first publish to the last ack a consumer handed
    to its client.
    """
    load_before = loadavg()
    target = system.create()
    try:
        with ConsumerPool(system.worker_module, target, consumers) as pool:
            pub = system.publish(target, n, size, 0.0)
            end = pool.wait_acked(n, timeout=120 + n / 500)
            got = pool.finish()
        left = _drained(system, target)
        observed = _observed(system, target, n)
    finally:
        system.delete(target)
    elapsed = end - pub.first
    return {
        "messages": n,
        "message_bytes": size,
        "consumers": consumers,
        "msgs_per_s": round(n / elapsed),
        "elapsed_s": round(elapsed, 3),
        "publish_msgs_per_s": round(n / max(1e-9, pub.confirmed - pub.first)),
        "acked": got.acked,
        "redelivered": got.redelivered,
        "unacked_after": left,
        # saturated: this is mostly how long messages waited in the queue, not the delivery path
        "latency_saturated": percentiles(got.latencies),
        # every consumer process's CPU (client library and harness) over the messages
        "consumer_cpu_us_per_msg": got.cpu_us_per_msg(n),
        **observed,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


def latency(
    system: System, rate: float, seconds: float, size: int, consumers: int = CONSUMERS
) -> dict[str, Any]:
    """Publish at ``rate`` per second for ``seconds``; latency is delivery time minus ``ts``.

    A system that does not keep up (publishes or acks below ``SUSTAINED_SHARE`` of the rate) is
    reported with the rates it achieved and no percentiles: under overload the percentiles would
    measure how long the run lasted, not the system.
    """
    load_before = loadavg()
    n = max(2, int(rate * seconds))
    target = system.create()
    try:
        with ConsumerPool(system.worker_module, target, consumers) as pool:
            pub = system.publish(target, n, size, rate, seconds)
            end = pool.wait_acked(pub.count, timeout=120 + 4 * seconds)
            got = pool.finish()
        left = _drained(system, target)
        observed = _observed(system, target, pub.count)
    finally:
        system.delete(target)
    # n messages paced at `rate` span n - 1 intervals
    achieved = (pub.count - 1) / max(1e-9, pub.last_sent - pub.first)
    delivered = (pub.count - 1) / max(1e-9, end - pub.first)
    sustained = min(achieved, delivered) >= SUSTAINED_SHARE * rate
    measured = percentiles(got.latencies)
    stages = observed.pop("stages", None)
    if stages and "p50_ms" in stages.get("server", {}) and measured and sustained:
        # What the system's own stages do not cover: the wire and the consumer's client. The
        # median only: a tail of a difference is not the difference of the tails (and under
        # overload the difference of two growing queues means nothing).
        # Left out when negative: the two medians are of different sets (the coordinator's
        # counts every message of the point, warm-up and drain included), which shows when a
        # queue builds up and the difference is lost in it.
        rest = round(measured["p50_ms"] - stages["server"]["p50_ms"], 2)
        if rest >= 0:
            stages["wire_and_client"] = {"p50_ms": rest}
    res: dict[str, Any] = {
        "offered_msgs_per_s": rate,
        "achieved_msgs_per_s": round(achieved),
        "delivered_msgs_per_s": round(delivered),
        "sustained": sustained,
        "seconds": seconds,
        "published": pub.count,
        "message_bytes": size,
        "consumers": consumers,
        "count": len(got.latencies),
        "latency": measured if sustained else None,
        "redelivered": got.redelivered,
        "unacked_after": left,
        "consumer_cpu_us_per_msg": got.cpu_us_per_msg(pub.count),
        **observed,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }
    if stages:
        res["stages"] = stages
    if not sustained:
        res["latency_while_overloaded"] = measured
        res["note"] = (
            f"did not sustain {rate:.0f} msg/s offered: published at {achieved:.0f}/s, "
            f"delivered and acked at {delivered:.0f}/s"
        )
    return res
