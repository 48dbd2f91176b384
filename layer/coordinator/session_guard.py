"""A member that may have lost its group session holds its deliveries (issue 12).

A member stopped (SIGSTOP, a frozen VM, a machine too loaded to run it) longer than its group
session is evicted: another member takes its queues, fences its changelog writer and serves
them. When the stopped member runs again, whatever it had already decided goes on as if
nothing happened: a push of messages leased before the stop, queued for a stream or waiting on
a commit that the broker had answered, reaches the consumer before the member learns, at its
next heartbeat, that it lost its partitions. By then the successor may have returned those
leases, leased the messages again, or dead-lettered them.

So, as Kafka Streams does, a member that has not run for most of a session considers itself
possibly fenced: it holds every push until the group tells it either way. A ticker thread
notes the time every ``TICK_S`` on a monotonic clock (``time.monotonic`` also advances while
the process is stopped); a gap longer than the session less two heartbeats (librdkafka's last
heartbeat answered may have been that much earlier) makes the member *suspect*. A sender that
finds the ticker's last tick that old makes it suspect itself, so a push right after a wake
waits even when the ticker has not run yet. The suspicion ends when

- the member lost its partitions (``lose``): the held pushes are dropped (those decided later,
  after the group gave it partitions again, go); or
- the ticker ran on, with no gap, for a session and a heartbeat since: librdkafka declares
  the assignment lost when no heartbeat is answered within the session (its session check),
  and the member's group thread polls many times a second, so a loss would have been
  delivered by then. (An assignment is no proof: one the group made before the stop may be
  delivered after the wake.)

What the member had handed to the transport before a stop still goes out after the wake (a
frame grpc held, for the client's flow-control window or its own write queue): no hold here
reaches it. So every Messages frame carries the time it was decided (``made_at``, this clock)
and ``stale_after_s``, told to the client, is half the gap that makes the member suspect: a
frame decided before such a gap and sent after it is at least that old when it arrives, and
the client, bounding a frame's age without trusting its clock to agree with the member's,
asks about any frame that old (``settled_since``): current only if the member lost no
partitions since ``made_at`` and is not suspect now (after a gap, once its probation passed).

Pure but for the clock: the ticker thread and the waiting are the callers'.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

__all__ = ["TICK_S", "SessionGuard"]

log = logging.getLogger(__name__)

TICK_S = 0.1  # how often the ticker notes that the process runs
WAIT_S = 0.05  # how often a held push looks again


class SessionGuard:
    """Whether this member may push deliveries now (see the module doc)."""

    def __init__(
        self,
        session_s: float,
        heartbeat_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        # a gap this long may have let the session run out (the broker's last heartbeat from
        # this member may be a heartbeat interval before the last tick, and one more is slack)
        self.gap_s = max(session_s - 2 * heartbeat_s, 2 * TICK_S)
        # without a gap for this long after one, librdkafka would have reported a loss
        self.probation_s = session_s + heartbeat_s
        # a gap this long may have let the group evict the member and give its partitions to
        # another (the session, less the heartbeat before the gap, and a rebalance of at least
        # a heartbeat); the machine's own stalls stay under it (1.0-2.0 s seen at load 16-40,
        # a 2 s session)
        self.evicted_gap_s = session_s + heartbeat_s
        # a frame decided before a gap of ``gap_s`` and sent after it is older than this when
        # it arrives (half: the gap is measured from the last tick, the frame may be a tick
        # younger, and a loaded machine delays that tick)
        self.stale_after_s = self.gap_s / 2
        self._lock = threading.Lock()
        self._last_tick = clock()
        self._suspect_since: float | None = None
        self._losses = 0  # partitions lost so far: a push held across a loss is dropped
        self._lost_at: float | None = None  # the last loss (this clock)
        self._lost_since_gap = False  # partitions lost since the last gap was seen
        self._gap_from: float | None = None  # the last tick before that gap
        self._long_gap = False  # that gap was long enough for an eviction and a reassignment
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def losses(self) -> int:
        return self._losses

    def tick(self) -> None:
        """The process runs (the ticker, every ``TICK_S``)."""
        with self._lock:
            now = self._clock()
            self._check_gap(now)
            self._last_tick = now

    def _check_gap(self, now: float) -> None:
        gap = now - self._last_tick
        if gap > self.gap_s:
            if self._suspect_since is None:
                log.warning(
                    "this member did not run for %.1fs (its session may have run out): holding"
                    " deliveries until the group confirms its partitions",
                    gap,
                )
            self._suspect_since = now
            if self._gap_from != self._last_tick:  # a new gap, not one seen already
                self._gap_from = self._last_tick
                self._lost_since_gap = False
                self._long_gap = gap > self.evicted_gap_s
            else:
                self._long_gap = self._long_gap or gap > self.evicted_gap_s

    def suspect(self) -> bool:
        """Whether this member did not run for most of a session lately (a loss of its
        partitions now is its own stop's doing, not a Kafka outage's)."""
        with self._lock:
            self._check_gap(self._clock())
            return self._suspect_since is not None

    def stale_assignment(self) -> bool:
        """Whether an assignment delivered now may predate this member's eviction: it did not
        run for longer than a session and a heartbeat lately and has not lost its partitions
        since (after a loss the group's next assignment is a fresh one)."""
        with self._lock:
            self._check_gap(self._clock())
            return self._suspect_since is not None and self._long_gap and not self._lost_since_gap

    def deliverable(self, losses: int) -> bool | None:
        """True: push; None: hold (ask again); False: drop (partitions were lost since
        ``losses`` was read)."""
        with self._lock:
            if self._losses != losses:
                return False
            return self._settled()

    def _settled(self) -> bool | None:
        now = self._clock()
        self._check_gap(now)  # the ticker may not have run since a wake
        since = self._suspect_since
        if since is None:
            return True
        if now - since < self.probation_s:
            return None
        self._suspect_since = None
        log.info("the group kept this member's partitions: delivering again")
        return True

    def settled_since(self, made_at: float) -> bool | None:
        """Whether a frame decided at ``made_at`` (this clock) is still this member's to
        deliver: False if it lost partitions since; None while it may have lost its session
        (ask again); True otherwise."""
        with self._lock:
            if self._lost_at is not None and self._lost_at >= made_at:
                return False
            return self._settled()

    async def wait_since(self, made_at: float) -> bool:
        """Until ``settled_since(made_at)`` says True or False."""
        while (ok := self.settled_since(made_at)) is None:
            await asyncio.sleep(WAIT_S)
        return ok

    async def wait(self) -> bool:
        """Until pushes may go (True) or must be dropped (False)."""
        losses = self._losses
        while (ok := self.deliverable(losses)) is None:
            await asyncio.sleep(WAIT_S)
        return ok

    def lose(self) -> None:
        """The group took this member's partitions (lost, not handed over): drop every push
        held now."""
        with self._lock:
            self._losses += 1
            self._lost_since_gap = True
            self._lost_at = self._clock()

    def start(self) -> None:
        self._last_tick = self._clock()
        self._thread = threading.Thread(target=self._run, name="session-guard", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            self.tick()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
