"""What a reload of the config file would do: a pure plan from the running config to the new one.

``plan(old, new)`` compares two loaded configs and sorts every difference:

- a queue only in ``new`` is *added* (topics created, changelog restored, reader started);
- a queue only in ``old`` is *removed* (subscriptions end, reader stops, state kept on disk, so
  adding it back later resumes where it stopped);
- an option of a queue in both either *changes live* (``LIVE_OPTIONS``: the engine and the
  coordinator can take a new value while serving) or is *refused* (``FIXED_OPTIONS``: the state
  already built depends on it), with the reason;
- any difference in ``[broker]`` or ``[coordinator]`` is refused: those settings are the
  process's own (its broker connection, API listener, state directory, transactional id).

The coordinator applies a plan only when nothing is refused: a reload is all or nothing, so the
running queues always match one whole file, never a mix of two.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum
from pathlib import Path

from layer.api.service import ReloadChange, ReloadRefusal, ReloadResult
from layer.config import Config, QueueConfig
from layer.coordinator.live_options import FIXED_OPTIONS, LIVE_OPTIONS

__all__ = ["FIXED_OPTIONS", "LIVE_OPTIONS", "ReloadPlan", "plan"]

_SECTION_REASON = (
    "a setting of the coordinator process itself (broker connection, API listener, state"
    " directory, transactional id)"
)


@dataclass(frozen=True, slots=True)
class ReloadPlan:
    source: str
    added: tuple[QueueConfig, ...] = ()
    removed: tuple[str, ...] = ()
    # the new config of every queue with live changes only (one with a refusal is not here)
    changed: tuple[QueueConfig, ...] = ()
    changes: tuple[ReloadChange, ...] = ()
    refused: tuple[ReloadRefusal, ...] = ()
    # the queues with a refused option: they keep their running config where the rest applies
    refused_queues: frozenset[str] = frozenset()

    @property
    def applicable(self) -> bool:
        return not self.refused

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changes or self.refused)

    def result(self, applied: bool) -> ReloadResult:
        return ReloadResult(
            source=self.source,
            applied=applied,
            added=[q.name for q in self.added],
            removed=list(self.removed),
            changed=list(self.changes),
            refused=list(self.refused),
        )


def plan(old: Config, new: Config) -> ReloadPlan:
    """The plan that takes a coordinator running ``old`` to ``new`` (no I/O)."""
    refused: list[ReloadRefusal] = []
    for section, old_part, new_part in (
        ("[broker]", old.broker, new.broker),
        ("[coordinator]", old.coordinator, new.coordinator),
    ):
        for option, before, after in _differences(old_part, new_part):
            refused.append(ReloadRefusal(section, option, before, after, _SECTION_REASON))

    old_queues = {q.name: q for q in old.queues}
    new_queues = {q.name: q for q in new.queues}
    added = tuple(q for q in new.queues if q.name not in old_queues)
    removed = tuple(q.name for q in old.queues if q.name not in new_queues)
    changed: list[QueueConfig] = []
    changes: list[ReloadChange] = []
    refused_queues: set[str] = set()
    for name, new_queue in new_queues.items():
        old_queue = old_queues.get(name)
        if old_queue is None:
            continue
        live: list[ReloadChange] = []
        fixed = False
        for option, before, after in _differences(old_queue, new_queue):
            if option in LIVE_OPTIONS:
                live.append(ReloadChange(name, option, before, after))
            else:
                fixed = True
                refused_queues.add(name)
                reason = FIXED_OPTIONS.get(option, "the queue's state is built on it")
                refused.append(ReloadRefusal(f"queue {name!r}", option, before, after, reason))
        changes.extend(live)
        if live and not fixed:
            changed.append(new_queue)
    return ReloadPlan(
        source=new.source,
        added=added,
        removed=removed,
        changed=tuple(changed),
        changes=tuple(changes),
        refused=tuple(refused),
        refused_queues=frozenset(refused_queues),
    )


def _differences(old: object, new: object) -> list[tuple[str, str, str]]:
    """(option, old value, new value) for every field of two config objects that differs."""
    out = []
    for f in fields(old):  # type: ignore[arg-type]
        before, after = getattr(old, f.name), getattr(new, f.name)
        if before != after:
            out.append((f.name, _shown(f.name, before), _shown(f.name, after)))
    return out


def _shown(option: str, value: object) -> str:
    """A value as TOML would write it; secrets masked (a summary is printed and logged)."""
    if value is None:
        return "(unset)"
    if any(hint in option for hint in ("token", "password", "secret")) or option == "kafka":
        return "***" if option != "kafka" else "(librdkafka settings)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Enum):
        return f'"{value.value}"'
    if isinstance(value, str | Path):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_shown(option, v) for v in value) + "]"
    return repr(value)
