"""Riding out Kafka outages: a watch that knows whether Kafka answers, and backoff to wait by.

Kafka clients fail in many ways while the broker is away (a refused connect, a request that
never gets its answer while the broker is paused or the network stalls, a timed-out transaction)
and each client sees it at its own time. One ``KafkaWatch`` decides for the whole coordinator:
it asks the broker for metadata every ``interval`` seconds and counts Kafka away when that fails
or takes longer than ``timeout``, and back at the first answer after. It alone tells ``Health``
(one log line each way); the coordinator's Kafka ports report trouble to it (``suspect``) so it
asks at once instead of at its next tick, and wait on it (``wait_reachable``) before trying
again. Publishes fail fast while it says Kafka is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from connectors.kafka import (
    BrokerProfile,
    admin_settings,
    client_settings,
    detect_profile,
    with_client_logging,
)
from layer.coordinator.health import Health
from layer.exceptions import BrokerError, QLayerError

log = logging.getLogger(__name__)

T = TypeVar("T")


# A metadata request not answered within this is taken for Kafka away (by the watch, and while
# waiting for Kafka at start): an answer that slow means a broker that cannot serve anyway
PROBE_TIMEOUT = 2.0


class Backoff:
    """Exponential waits with jitter: ``base``, doubling to ``cap``; ``reset`` after a success."""

    def __init__(self, base: float = 0.2, cap: float = 5.0, factor: float = 2.0) -> None:
        self._base = base
        self._cap = cap
        self._factor = factor
        self._next = base

    def next(self) -> float:
        wait = self._next
        self._next = min(self._cap, self._next * self._factor)
        # jitter (from half to all of the wait) so clients that failed together do not retry
        # together
        return wait * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self._next = self._base


class KafkaWatch:
    """Probes the broker from a thread; the one judge of "Kafka is reachable" (see module doc).

    ``on_change(reachable)`` runs in the watch's thread after ``Health`` was told.
    """

    def __init__(
        self,
        settings: Mapping[str, Any],
        health: Health,
        *,
        interval: float = 0.5,
        timeout: float = PROBE_TIMEOUT,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        probe_settings = admin_settings(settings)
        # librdkafka waits up to 10 s between reconnects by default: the watch must notice
        # Kafka back within a second or two, or publishes stay refused that long after
        probe_settings.setdefault("reconnect.backoff.max.ms", 1000)
        self._admin = AdminClient(probe_settings)
        self._health = health
        self._interval = interval
        self._timeout = timeout
        self._on_change = on_change
        self._topic: str | None = None
        self._stop = threading.Event()
        self._nudge = threading.Event()
        self._changed = threading.Condition()
        self._probe_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="kafka-watch", daemon=True)

    def start(self, topic: str | None = None) -> None:
        """Start probing; ``topic``: ask for this topic's metadata only (a small answer)."""
        self._topic = topic
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._nudge.set()
        with self._changed:
            self._changed.notify_all()
        if self._thread.is_alive():
            self._thread.join(self._timeout + 5)

    @property
    def reachable(self) -> bool:
        return self._health.kafka_reachable

    def unreachable_error(self, what: str) -> BrokerError:
        """The error a call that needs Kafka answers while it is away."""
        health = self._health
        return BrokerError(
            f"{what}: Kafka unreachable for {health.kafka_down_for():.1f} s: {health.kafka_reason}"
        )

    def suspect(self, reason: str) -> None:
        """A Kafka call failed in a way that may mean Kafka is away: probe now."""
        log.debug("Kafka suspected unreachable: %s", reason, extra={"reason": reason})
        self._nudge.set()

    def probe(self) -> bool:
        """Ask the broker now (blocking, at most ``timeout`` seconds); tells ``Health``."""
        with self._probe_lock:
            try:
                if self._topic is None:
                    self._admin.list_topics(timeout=self._timeout)
                else:
                    self._admin.list_topics(self._topic, timeout=self._timeout)
            except KafkaException as exc:
                self._set(False, f"metadata request failed: {exc.args[0] if exc.args else exc}")
                return False
            finally:
                self._admin.poll(0)  # serves the client's log lines (rate-limited)
            self._set(True, "")
            return True

    def wait_reachable(self, timeout: float | None = None) -> bool:
        """Block until Kafka is taken to be reachable (or ``timeout``, or ``stop``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while not self._health.kafka_reachable and not self._stop.is_set():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._changed.wait(left if left is not None else 1.0)
        return self._health.kafka_reachable

    def _set(self, reachable: bool, reason: str) -> None:
        health = self._health
        was = health.kafka_reachable
        if reachable:
            health.kafka_up()
        else:
            health.kafka_down(reason)
        if was != reachable:
            with self._changed:
                self._changed.notify_all()
            if self._on_change is not None:
                self._on_change(reachable)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.probe()
            if self._nudge.wait(self._interval):
                self._nudge.clear()


async def until_reachable(
    watch: KafkaWatch,
    what: str,
    step: Callable[[], T],
    progress: Callable[[str], None],
) -> T:
    """Run the blocking ``step`` (a start-up step that needs Kafka) until it succeeds.

    A failure while Kafka does not answer is waited out (said once: ``waiting for Kafka to
    <what>``); a failure while Kafka answers is the step's own and is raised.
    """
    said = False
    while True:
        try:
            return await asyncio.to_thread(step)
        except (QLayerError, KafkaException) as exc:
            if await asyncio.to_thread(watch.probe):
                raise
            if not said:
                progress(f"waiting for Kafka to {what} ({exc})")
                said = True
            await asyncio.to_thread(watch.wait_reachable)


async def wait_for_profile(
    bootstrap_servers: str,
    kafka_settings: Mapping[str, str],
    hint: str,
    progress: Callable[[str], None],
    health: Health | None = None,
) -> BrokerProfile:
    """``detect_profile``, waiting (with backoff, said once) while the broker is unreachable.

    The broker must answer a metadata request, even when ``hint`` names its kind. ``health``
    is told (before the watch exists, this is the one judge): Kafka unreachable and "waiting
    for Kafka at ..." while it does not answer, reachable once it does. Each attempt
    runs in a daemon thread: a caller that stops meanwhile (cancels this) need not wait for a
    metadata request to a broker that does not answer (up to 10 s) before the process exits."""
    backoff = Backoff(cap=10.0)
    said = False
    # one client for every attempt, its librdkafka logs rate-limited: while the broker is away
    # each attempt's failed connections would write a line apiece
    probe = AdminClient(
        with_client_logging(admin_settings(client_settings(bootstrap_servers, kafka_settings)))
    )

    def attempt() -> BrokerProfile:
        # the broker must answer even when its kind is configured (no detection): what follows
        # (the state check, the restore) needs it
        try:
            probe.list_topics(timeout=PROBE_TIMEOUT)
        except KafkaException as exc:
            raise BrokerError(f"cannot reach the broker at {bootstrap_servers}: {exc}") from exc
        finally:
            probe.poll(0)  # serves the client's log lines
        return detect_profile(bootstrap_servers, kafka_settings, hint)

    while True:
        try:
            profile = await _in_daemon_thread(attempt)
        except BrokerError as exc:
            if health is not None:
                health.restoring(f"waiting for Kafka at {bootstrap_servers}")
                health.kafka_down(str(exc))
            if not said:
                progress(f"waiting for Kafka at {bootstrap_servers}: {exc}")
                said = True
            await asyncio.sleep(backoff.next())
            continue
        if health is not None:
            health.kafka_up()
            health.restoring("connecting to Kafka")
        return profile


def _in_daemon_thread(call: Callable[[], T]) -> asyncio.Future[T]:
    """``call()`` in a new daemon thread; its outcome in the returned future. Unlike
    ``asyncio.to_thread``, an interpreter that exits does not wait for it."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.cancelled():  # the caller stopped waiting
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting coroutine
            error = exc
        # the caller's loop may be closed by now: nobody wants the outcome then
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="kafka-wait", daemon=True).start()
    return future
