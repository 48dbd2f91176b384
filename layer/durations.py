"""Durations as people write them in config: ``30``, ``1.5``, ``"500ms"``, ``"30s"``, ``"5m"``.

Numbers are seconds. Strings are a non-negative decimal number with an optional unit (``ms``, ``s``,
``m``, ``h``, ``d``; none means seconds). The parser only rejects what is not a duration; the
caller checks the bounds its option needs (``> 0``, ``>= 0``) so that the message can say which.
"""

from __future__ import annotations

import json
import math
import re

__all__ = ["format_value", "parse_duration"]

_UNITS: dict[str, float] = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_RE = re.compile(r"(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>ms|s|m|h|d)?")


def format_value(value: object) -> str:
    """Show a config value the way it was written: strings quoted, TOML's true/false."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


def parse_duration(value: object) -> float:
    """Return ``value`` in seconds; ``ValueError`` (with the text shown) if it is no duration."""
    # bool is an int subclass, but `lease_period = true` is a mistake, not one second.
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION_RE.fullmatch(value.strip())):
        seconds = float(match["number"]) * _UNITS[match["unit"] or "s"]
    else:
        raise ValueError(f'expected a duration like 30 or "30s", got {format_value(value)}')
    if not math.isfinite(seconds):
        raise ValueError(f"expected a finite duration, got {format_value(value)}")
    return seconds
