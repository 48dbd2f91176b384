"""One TOML value as text and back: how a queue's options travel (the definitions topic, the
API's create and alter requests).

Apart from ``layer.definitions`` so that a client, which only writes options, does not load the
Avro codec and the config loader with it.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping

__all__ = ["parse_literal", "toml_literal"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def toml_literal(value: object) -> str:
    """A TOML value as the file would write it (strings, numbers, booleans, inline tables)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, Mapping):
        items = (f"{_toml_key(str(k))} = {toml_literal(v)}" for k, v in value.items())
        return "{ " + ", ".join(items) + " }"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    raise ValueError(f"cannot write {value!r} as a TOML value")


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters (DEL too, which JSON
    leaves as it is and TOML refuses) escaped."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def parse_literal(text: str) -> object:
    """The value of one TOML literal; ``ValueError`` if it is none."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not a TOML value: {text!r}") from exc
