"""Frames that came late: held until the server says they are still its to deliver (issue 12).

A cluster member stopped (SIGSTOP, a frozen VM) past its group session loses its queues to
another member, which restores their leases and returns, leases again or dead-letters the
messages. The member holds new pushes once it wakes (``layer.coordinator.session_guard``), but
a frame it had already handed to its transport still goes out: messages no longer leased to
this consumer. Nothing in such a frame says so, and the client has no reason to ask anyone
about the stream it reads.

So the server stamps each Messages frame with the time it decided to write it (``made_at``,
its own monotonic clock) and tells, in Subscribed, its clock at that answer and how old a
frame must be to be asked about (``stale_after_s``: half the stop that makes the member hold
its pushes). The two clocks are never compared as if they agreed: the Subscribe round trip
gives a lower bound of their offset (the server read its clock after the client sent
Subscribe: ``client - server >= sent_at - server_time``), so ``arrival - made_at - bound`` is
an upper bound of the frame's age. A frame decided before a stop long enough to cost the
member its queues is at least that old, whatever the clocks read; one that bound calls older
than ``stale_after_s`` is held, and so is every frame after it (order), while a Check asks the
server. Its Checked answer: current (the member lost no partitions since ``made_at`` and is not
waiting to learn whether it did): the held frames go to the consumer, those decided after the
answer asked about again if late; not current: every held message is dropped (the queue's
owner delivers it again). A fenced member exits instead of answering; its connection drops and
the held frames go with it, as any delivery of a lost connection does. Each answer tightens
the bound (another round trip).

The cost where nothing stops: a frame that waited long in the transport (a consumer slower
than its backlog) or a machine stall past ``stale_after_s`` costs one round trip before its
messages go on. A coordinator alone says ``stale_after_s`` 0: nothing is held.

I/O-free: the subscription core calls in with the frames and the time; its face sends the
Checks.
"""

from __future__ import annotations

import logging

from layer.api.frames import Check, Checked, Messages, Subscribed
from layer.api.service import DeliveredMessage

__all__ = ["LateFrames"]

log = logging.getLogger("layer.client")


class LateFrames:
    """One subscription's late-frame check, per connection (``subscribed`` starts one)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.stale_after_s = 0.0  # 0: this connection's frames are never held
        self.dropped = 0  # messages of late frames not handed to the consumer
        self._bound: float | None = None  # lower bound of client clock - server clock
        self._held: list[Messages] = []
        self._asking: int | None = None  # the request id of the Check in flight
        self._asked_at = 0.0  # when it was made (client clock)
        self._next_id = 1
        self._to_send: list[Check] = []

    def subscribed(self, frame: Subscribed, sent_at: float | None) -> None:
        """A connection opened; ``sent_at``: when its Subscribe was sent (client clock)."""
        self.reset()
        usable = frame.stale_after_s > 0 and frame.server_time > 0 and sent_at is not None
        self.stale_after_s = frame.stale_after_s if usable else 0.0
        self._bound = sent_at - frame.server_time if usable and sent_at is not None else None

    def reset(self) -> None:
        """The connection ended: what it held goes with its leases."""
        if self._held:
            count = self.holding
            self.dropped += count
            log.warning(
                "dropped %d messages of a late frame: the connection ended before the server"
                " answered whether it still owned them (they come again) queue=%s",
                count,
                self.queue,
                extra={"queue": self.queue},
            )
        self.stale_after_s, self._bound = 0.0, None
        self._held.clear()
        self._to_send.clear()
        self._asking = None

    @property
    def holding(self) -> int:
        return sum(len(f.messages) for f in self._held)

    def _late(self, frame: Messages, now: float) -> bool:
        if self._bound is None or frame.made_at <= 0:
            return False
        return now - frame.made_at - self._bound > self.stale_after_s

    def _ask(self, frame: Messages, now: float) -> None:
        self._asking = self._next_id
        self._next_id += 1
        self._asked_at = now
        self._to_send.append(Check(self._asking, frame.made_at))
        log.debug(
            "holding a late frame queue=%s messages=%d age_at_most=%.2fs",
            self.queue,
            len(frame.messages),
            now - frame.made_at - (self._bound or 0.0),
        )

    def messages(self, frame: Messages, now: float) -> list[DeliveredMessage]:
        """The messages of ``frame`` to hand to the consumer now (none while held)."""
        if self._asking is None and not self._late(frame, now):
            return list(frame.messages)
        self._held.append(frame)
        if self._asking is None:
            self._ask(frame, now)
        return []

    def answered(self, frame: Checked, now: float) -> list[DeliveredMessage]:
        """The server answered a Check: the held messages that go to the consumer now."""
        if frame.request_id != self._asking:
            return []  # an answer to a connection's check that no longer counts
        self._asking = None
        if self._bound is not None:
            self._bound = max(self._bound, self._asked_at - frame.server_time)
        held, self._held = self._held, []
        if not frame.current:
            count = sum(len(f.messages) for f in held)
            self.dropped += count
            log.warning(
                "dropped %d messages of a late frame: the server no longer owned them (it had"
                " stopped past its session; the queue's owner delivers them again) queue=%s",
                count,
                self.queue,
                extra={"queue": self.queue},
            )
            return []
        out: list[DeliveredMessage] = []
        for i, held_frame in enumerate(held):
            # current at the answer: so is what it had decided by then
            if held_frame.made_at <= frame.server_time or not self._late(held_frame, now):
                out.extend(held_frame.messages)
            else:
                self._held = held[i:]
                self._ask(held_frame, now)
                break
        return self._unexpired(out, frame.wall_ms)

    def _unexpired(self, messages: list[DeliveredMessage], wall_ms: int) -> list[DeliveredMessage]:
        """``messages`` but those whose lease ran out while they were held (by the server's
        own clock: the answer's ``wall_ms`` against the deadline it set)."""
        if not wall_ms:
            return messages
        kept = [m for m in messages if m.lease_deadline_ms is None or m.lease_deadline_ms > wall_ms]
        if len(kept) < len(messages):
            count = len(messages) - len(kept)
            self.dropped += count
            log.warning(
                "dropped %d messages of a late frame: their leases ran out while the server"
                " was asked about them (they come again) queue=%s",
                count,
                self.queue,
                extra={"queue": self.queue},
            )
        return kept

    def take_checks(self) -> list[Check]:
        """The Checks to send now."""
        checks, self._to_send = self._to_send, []
        return checks
