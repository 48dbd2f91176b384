"""What waits in a queue engine before it may be delivered: delayed messages, messages held
behind a barrier (and the barriers), and a last-value queue's newest message per key.

A part of ``QueueEngine`` (``layer.engine.core``): it keeps these and their counts; what
happens to a message when it stops waiting (it becomes available, it is done) is the core's.
"""

from __future__ import annotations

from collections import deque

from layer.engine.index import AVAILABLE, DELAYED, HELD, DelayIndex, Entry

_REPLACEABLE = frozenset({AVAILABLE, DELAYED, HELD})


class Holding:
    __slots__ = ("delays", "delayed", "barriers", "held", "held_count", "conflate", "latest")

    def __init__(self, conflate: bool) -> None:
        self.delays = DelayIndex()
        self.delayed = 0  # messages waiting for their delayed (re)delivery time
        # Barriers: the pending ones in arrival order; the first holds every later arrival.
        self.barriers: deque[Entry] = deque()
        self.held: deque[Entry] = deque()  # in arrival order, barriers included
        self.held_count = 0  # of those, still held (an acked one stays in ``held`` until passed)
        self.conflate = conflate  # a last-value queue
        self.latest: dict[object, Entry] = {}  # last-value queues: conflate key -> newest

    # -- delays ------------------------------------------------------------------------------

    def delay(self, entry: Entry, until: float) -> None:
        entry.state = DELAYED
        self.delayed += 1
        self.delays.push(entry, until)

    def pop_due(self, now: float) -> Entry | None:
        """A delayed message whose time came (no longer counted as delayed), or None."""
        entry = self.delays.pop_due(now)
        if entry is not None:
            self.delayed -= 1
        return entry

    # -- barriers ----------------------------------------------------------------------------

    def hold(self, entry: Entry, barrier: bool) -> None:
        """``entry`` waits behind the pending barriers (or is one: ``barrier``)."""
        entry.state = HELD
        self.held.append(entry)
        self.held_count += 1
        if barrier:
            self.barriers.append(entry)

    def left_held(self, entry: Entry) -> bool:
        """The held ``entry`` is done before it was released (acked, conflated, expired).
        True when it was the first pending barrier: what it held may be released now."""
        self.held_count -= 1
        barriers = self.barriers
        if entry not in barriers:
            return False
        first = barriers[0] is entry  # a barrier acked (lenient) before it was sent
        barriers.remove(entry)
        return first

    def release(self) -> list[Entry]:
        """The held messages up to the next pending barrier, in arrival order, no longer held
        (their state is the caller's to set)."""
        held, barriers = self.held, self.barriers
        stop = barriers[0] if barriers else None
        out: list[Entry] = []
        while held:
            entry = held[0]
            if entry is stop:
                break
            held.popleft()
            if entry.state != HELD:  # acked or conflated while held
                continue
            self.held_count -= 1
            out.append(entry)
        return out

    # -- last value --------------------------------------------------------------------------

    def newest(self, entry: Entry, key: object) -> Entry | None:
        """``entry`` is the newest message of conflation ``key``: the older one it replaces
        (to finish as conflated), None if none or if that one is leased (then both stay; the
        older is conflated if it comes back, see ``superseded``)."""
        entry.ckey = key
        older = self.latest.get(key)
        self.latest[key] = entry
        if older is not None and older.state in _REPLACEABLE:
            return older
        return None

    def superseded(self, entry: Entry) -> bool:
        """A newer message with ``entry``'s conflation key arrived after it."""
        return entry.ckey is not None and self.latest.get(entry.ckey) is not entry

    def forget(self, entry: Entry) -> None:
        """``entry`` is done: no longer its key's newest."""
        if entry.ckey is not None and self.latest.get(entry.ckey) is entry:
            del self.latest[entry.ckey]
