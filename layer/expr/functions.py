"""The functions an expression may call, by upper-case name, with their argument counts.

Each takes values and returns a value; a wrong type gives NULL (see ``layer.expr.values``).
``COALESCE``, ``NOW`` and the record's fields (``KEY``, ``HEADER``, ``TIMESTAMP``, ``TOPIC``,
``PARTITION``) are here for their argument counts only: the compiler gives them their own closures,
because COALESCE must not evaluate past its first non-NULL argument, NOW reads the evaluation's
clock and the others its Kafka record.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from dataclasses import dataclass

from layer.expr.values import int_result, to_number

__all__ = ["FUNCTIONS", "Function"]

# Enough digits for any float written out in full (about 310 before the point, 330 after).
_ROUND_CONTEXT = decimal.Context(prec=800, Emax=10_000, Emin=-10_000)


@dataclass(frozen=True, slots=True)
class Function:
    min_args: int
    max_args: int
    apply: Callable[..., object] | None  # None: compiled specially


def _upper(value: object) -> object:
    return value.upper() if type(value) is str else None


def _lower(value: object) -> object:
    return value.lower() if type(value) is str else None


def _length(value: object) -> object:
    return len(value) if type(value) is str else None


def _abs(value: object) -> object:
    number = to_number(value)
    return None if number is None else abs(number)


def _round_int(value: int, digits: int) -> int | float:
    if digits >= 0:
        return value
    # 10**k > 2 * |value| once k exceeds a third of its bits: the result is 0, and 10**k for a
    # huge k is never computed.
    if -digits > value.bit_length() // 3 + 2:
        return 0
    step = 10**-digits
    rounded = (abs(value) + step // 2) // step * step
    return int_result(rounded if value >= 0 else -rounded)


def _round_float(value: float, digits: int) -> float:
    if not math.isfinite(value) or digits > 330:
        return value
    if digits < -330:
        return 0.0
    # repr, not the binary value: ROUND(2.675, 2) is 2.68 as written, where Python's round()
    # gives 2.67
    exact = decimal.Decimal(repr(value))
    step = decimal.Decimal(1).scaleb(-digits)
    return float(exact.quantize(step, rounding=decimal.ROUND_HALF_UP, context=_ROUND_CONTEXT))


def _round(value: object, *digits: object) -> object:
    """Half away from zero, as SQL rounds. ROUND(x) is an integer; ROUND(x, n) keeps x's type."""
    number = to_number(value)
    if number is None:
        return None
    if not digits:
        if type(number) is int:
            return number
        if not math.isfinite(number):
            return None  # no integer is infinite
        whole = math.trunc(number)
        return whole + (1 if number > 0 else -1) if abs(number - whole) >= 0.5 else whole
    places = to_number(digits[0])
    if places is None or (type(places) is float and not places.is_integer()):
        return None
    if type(number) is int:
        return _round_int(number, int(places))
    return _round_float(float(number), int(places))


FUNCTIONS: dict[str, Function] = {
    "ABS": Function(1, 1, _abs),
    "COALESCE": Function(1, 255, None),
    "HEADER": Function(1, 1, None),
    "KEY": Function(0, 0, None),
    "LENGTH": Function(1, 1, _length),
    "LOWER": Function(1, 1, _lower),
    "NOW": Function(0, 0, None),
    "PARTITION": Function(0, 0, None),
    "ROUND": Function(1, 2, _round),
    "TIMESTAMP": Function(0, 0, None),
    "TOPIC": Function(0, 0, None),
    "UPPER": Function(1, 1, _upper),
}
