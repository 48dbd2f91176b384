"""What the cluster's group consumer says about its rebalances: the leader of each round.

On Tansu, a JoinGroup round may complete with a leader that has left the group: a member
SIGKILLed while its own JoinGroup was pending (the harness of the history test kills members
while the previous fault's rebalance is still under way), removed from the group at once by the
survivors (``layer.coordinator.evict``), is still named leader of the round its JoinGroup was
in. The followers' SyncGroup then waits out the session (2 s) and fails with "rebalance in
progress"; usually the next round names a live leader. A group **wedged** by a departed leader
(``layer.coordinator.membership``, module doc) names that leader in every round, forever.

librdkafka tells only its debug log (``debug=cgrp``) who led a round, so this module reads the
group consumer's log records (:class:`GroupLog`, a ``logging.Handler`` behind the consumer's
``logger``) and matches its "JoinGroup response" line in one place (:func:`join_leader`).
:class:`LeaderWatch` (pure) counts the rounds in a row whose leader this member knows has left
the group (its ``group/<id>`` tombstoned or replaced in the members topic, or removed by this
member for refusing connections): two in a row is a wedge, taken up at once rather than after
the 8-20 s a control partition must stay unowned (``Membership._stalled``). One such round is
not: the next one named a live leader in every run looked at.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container

__all__ = ["DEAD_LEADER_ROUNDS", "GroupLog", "LeaderWatch", "join_leader"]

#: JoinGroup rounds in a row led by a member that left the group: a wedge
DEAD_LEADER_ROUNDS = 2

# librdkafka (rdkafka_cgrp.c): "JoinGroup response: GenerationId %d, Protocol %s, LeaderId %s%s,
# my MemberId %s, member metadata count %d: %s"; the "%s" after the leader is " (me)" or "".
_JOIN_RESPONSE = re.compile(
    r"JoinGroup response: GenerationId (-?\d+), Protocol [^,]*, LeaderId (\S*)(?: \(me\))?,"
    r" my MemberId (\S+), member metadata count \d+: (.*)$"
)


def join_leader(message: str) -> tuple[int, str, str] | None:
    """(generation, leader id, own member id) of a successful JoinGroup response line of
    librdkafka's ``cgrp`` debug log; None for any other line or a failed JoinGroup."""
    m = _JOIN_RESPONSE.search(message)
    if m is None or m.group(4) != "(no error)" or int(m.group(1)) < 0:
        return None
    return int(m.group(1)), m.group(2), m.group(3)


class LeaderWatch:
    """Counts JoinGroup rounds in a row led by a member in ``departed`` (pure)."""

    def __init__(self, departed: Container[str]) -> None:
        self._departed = departed
        self.leader: str | None = None  # the departed leader of the last rounds
        self.rounds = 0

    def joined(self, leader: str, me: str) -> None:
        if leader != me and leader in self._departed:
            self.rounds = self.rounds + 1 if leader == self.leader else 1
            self.leader = leader
        else:
            self.reset()

    def reset(self) -> None:
        self.leader = None
        self.rounds = 0

    @property
    def wedged(self) -> bool:
        return self.rounds >= DEAD_LEADER_ROUNDS


class GroupLog(logging.Handler):
    """The group consumer's ``logger`` handler: JoinGroup responses go to ``joined`` (leader,
    own id); debug records are dropped unless ``debug`` (the user asked librdkafka for its
    debug log), the rest go on to ``forward`` (where every client's librdkafka logs go).
    librdkafka passes ``(facility, client name, text)`` as the record's arguments."""

    def __init__(
        self, joined: Callable[[str, str], None], forward: logging.Logger, debug: bool
    ) -> None:
        super().__init__(logging.DEBUG)
        self._joined = joined
        self._forward = forward
        self._debug = debug

    def emit(self, record: logging.LogRecord) -> None:
        try:
            args = record.args
            if isinstance(args, tuple) and len(args) == 3 and args[0] == "JOINGROUP":
                found = join_leader(str(args[2]))
                if found is not None:
                    self._joined(found[1], found[2])
            wanted = record.levelno > logging.DEBUG or self._debug
            if wanted and self._forward.isEnabledFor(record.levelno):
                self._forward.handle(record)
        except Exception:
            self.handleError(record)

    @classmethod
    def logger(
        cls, name: str, joined: Callable[[str, str], None], forward: logging.Logger, debug: bool
    ) -> logging.Logger:
        """A logger of its own (not in the logging tree) with this handler alone."""
        log = logging.Logger(name, logging.DEBUG)
        log.propagate = False
        log.addHandler(cls(joined, forward, debug))
        return log
