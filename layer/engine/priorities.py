"""Qpid's priority queues: JMS priorities 0-9 mapped onto fewer distinct levels.

A Qpid priority queue has ``priorities`` levels (2 to 10, 10 by default). A message's JMS
priority (0 lowest, 9 highest; 4, JMS's default, when it has none) falls into a level by the
rule of AMQP 0-10 that Qpid's brokers follow: the priorities up to ``5 - ceil(levels / 2)`` share
the lowest level, each one above that has a level of its own, and whatever is left at the top
shares the highest. With 2 levels, 0-4 are "lower" and 5-9 "higher", as the Qpid book says.
Messages of one level are delivered oldest first.
"""

from __future__ import annotations

__all__ = ["JMS_DEFAULT_PRIORITY", "JMS_PRIORITY_HEADER", "MAX_LEVELS", "MIN_LEVELS", "qpid_level"]

JMS_DEFAULT_PRIORITY = 4
JMS_PRIORITY_HEADER = "JMSPriority"
MIN_LEVELS = 2
MAX_LEVELS = 10
_HIGHEST = 9


def qpid_level(priority: int | None, levels: int) -> int:
    """The level (0 lowest, ``levels - 1`` highest) of a message with this JMS priority.

    None (no priority) is JMS's default, 4; a priority above 9 counts as 9 (the engine's
    priorities are never negative).
    """
    if not MIN_LEVELS <= levels <= MAX_LEVELS:
        raise ValueError(f"priorities must be {MIN_LEVELS} to {MAX_LEVELS}, got {levels}")
    jms = JMS_DEFAULT_PRIORITY if priority is None else min(priority, _HIGHEST)
    first = 5 - (levels + 1) // 2  # 5 - ceil(levels / 2)
    return 0 if jms <= first else min(jms - first, levels - 1)
