"""What the operators do to values: SQL three-valued logic with AMPS's type conversions.

A value is what a field path finds in a decoded document (str, int, float, bool, None, and from
Avro also bytes; lists and dicts for paths that stop at an array or object) or what an operator
made. NULL is None. Anything an operator cannot apply to gives NULL, never an exception, because a
filter must decide on every message, including the malformed ones.

Numbers: ``int`` and ``float`` compare and compute with each other (``bool`` is not a number here,
although Python makes it an ``int``). A *numeric string* is a string that is entirely a decimal
number in the expression language's own syntax, with an optional sign and surrounding whitespace
(``"42"``, ``" -1.5e3 "``; not ``"0x10"``, ``"1_000"``, ``"nan"`` or ``"inf"``). Where a number is
needed (arithmetic, ``ABS``, ``ROUND``, a comparison with a number, a priority) a numeric string
counts as that number, as AMPS does: in XML and FIX messages every field is text. Two strings
compare as strings, exactly and by code point, even if both look like numbers.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable

__all__ = [
    "ARITHMETIC",
    "FLOAT_ARITHMETIC",
    "COMPARISONS",
    "comparable",
    "int_result",
    "is_bool",
    "text_to_number",
    "to_number",
]

# Possessive quantifiers keep the match linear: a field value is untrusted input, and a plain
# `\d+\.?\d*` backtracks quadratically on a long run of digits followed by a letter.
_NUMERIC_TEXT = re.compile(
    r"[ \t\r\n]*+[+-]?+(?:[0-9]++(?:\.[0-9]*+)?+|\.[0-9]++)(?:[eE][+-]?+[0-9]++)?+[ \t\r\n]*+"
)
# Integers past the float range become +-inf instead of growing without bound: a balanced tree of
# multiplications in a 64 KiB expression could otherwise build numbers of millions of digits.
_INT_LIMIT_BITS = 1024


def text_to_number(text: str) -> int | float | None:
    """The number a numeric string stands for, or None if it is not one."""
    if text.isascii() and text.isdigit():  # the common case (a header's "7"): no regex
        try:
            return int(text)
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
            return float(text)
    if _NUMERIC_TEXT.fullmatch(text) is None:
        return None
    text = text.strip()
    if "." in text or "e" in text or "E" in text:
        return float(text)
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        return float(text)


def to_number(value: object) -> int | float | None:
    """``value`` as a number (numeric strings converted), or None."""
    if type(value) is int or type(value) is float:
        return value
    if type(value) is str:
        return text_to_number(value)
    return None


def is_bool(value: object) -> bool:
    return value is True or value is False


def int_result(value: int) -> int | float:
    """An integer result, or +-inf once it leaves the float range."""
    if value.bit_length() > _INT_LIMIT_BITS:
        return math.inf if value > 0 else -math.inf
    return value


_NUMBER_TYPES = frozenset((int, float))


def comparable(a: object, b: object) -> tuple[object, object] | None:
    """The pair to compare, after AMPS's conversions, or None if the two do not compare.

    Numbers compare with numbers and with numeric strings, strings with strings, booleans with
    booleans; every other pairing (and NULL) is NULL.
    """
    ta = type(a)
    tb = type(b)
    if ta is tb:
        return (a, b) if ta in _COMPARABLE_TYPES else None
    if ta in _NUMBER_TYPES:
        if tb in _NUMBER_TYPES:
            return a, b
        if type(b) is str:
            n = text_to_number(b)
            return None if n is None else (a, n)
        return None
    if type(a) is str and tb in _NUMBER_TYPES:
        n = text_to_number(a)
        return None if n is None else (n, b)
    return None


_COMPARABLE_TYPES = frozenset((int, float, str, bool))

Comparison = Callable[[object, object], bool]
# operator's functions, typed loosely: comparable() has already matched the operand types
COMPARISONS: dict[str, Comparison] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,  # type: ignore[dict-item]
    "<=": operator.le,  # type: ignore[dict-item]
    ">": operator.gt,  # type: ignore[dict-item]
    ">=": operator.ge,  # type: ignore[dict-item]
}


def _add(x: int | float, y: int | float) -> int | float:
    r = x + y
    return int_result(r) if type(r) is int else r


def _sub(x: int | float, y: int | float) -> int | float:
    r = x - y
    return int_result(r) if type(r) is int else r


def _mul(x: int | float, y: int | float) -> int | float:
    if type(x) is int and type(y) is int and x and y:
        if x.bit_length() + y.bit_length() > 2 * _INT_LIMIT_BITS:
            return math.inf if (x > 0) == (y > 0) else -math.inf
        return int_result(x * y)
    return x * y


def _mod(x: int | float, y: int | float) -> int | float | None:
    # The remainder takes the dividend's sign (C's fmod, SQL's MOD), not Python's floor modulo.
    if y == 0:
        return None
    if type(x) is int and type(y) is int:
        r = abs(x) % abs(y)
        return -r if x < 0 else r
    return math.fmod(x, y)


Arithmetic = Callable[[int | float, int | float], int | float | None]
# `/` divides exactly (7 / 2 = 3.5), as AMPS does. The callers turn ZeroDivisionError and the
# other arithmetic errors into NULL.
ARITHMETIC: dict[str, Arithmetic] = {
    "+": _add,
    "-": _sub,
    "*": _mul,
    "/": operator.truediv,
    "%": _mod,
}
# With a float operand the result is a float, which cannot grow without bound: the C operators do.
FLOAT_ARITHMETIC: dict[str, Arithmetic] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "%": _mod,
}
