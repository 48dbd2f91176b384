"""The view journal of a queue engine: how each message's presence in the view (what a browse
lists) changed since the last drain, for a queue with a view topic (``track_view``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from layer.engine.index import Entry
from layer.engine.model import Bookmark, ViewChanges

# the view changes of a message by (it left during the round, it is in the view at its end)
_SIGNS = {(False, False): (), (False, True): (1,), (True, False): (-1,), (True, True): (-1, 1)}


class ViewJournal:
    """Per message since the last drain: its first change, its last, and its entry."""

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        # bookmark -> [first sign, last sign, entry]
        self._marks: dict[Bookmark, list[Any]] = {}

    def __len__(self) -> int:
        return len(self._marks)

    def record(self, entry: Entry, sign: int) -> None:
        """``entry`` entered (+1) or left (-1) the view."""
        found = self._marks.get(entry.bookmark)
        if found is None:
            self._marks[entry.bookmark] = [sign, sign, entry]
        else:
            found[1] = sign
            found[2] = entry  # a run's message: the entry it became replaces the one made for it

    def clear(self) -> None:
        self._marks.clear()

    def drain(self, view: ViewChanges, priority_of: Callable[[Entry], int | None] | None) -> None:
        """The net changes into ``view``'s columns (``priority_of``: a priority queue's, else
        None), then forget them. Columns, not a ViewChange per change: this runs for every
        message of a queue with a view topic, twice."""
        marks, signs, counts, cancels = view.bookmarks, view.signs, view.deliveries, view.cancels
        priorities = view.priorities = [] if priority_of is not None else None
        for first, last, entry in self._marks.values():
            # -1 if it was in the view when the round began, +1 if it is in it now
            for sign in _SIGNS[first < 0, last > 0]:
                marks.append(entry.bookmark)
                signs.append(sign)
                counts.append(entry.deliveries)
                cancels.append(entry.cancels)
                if priorities is not None:
                    priorities.append(priority_of(entry))  # type: ignore[misc]
        self._marks.clear()
