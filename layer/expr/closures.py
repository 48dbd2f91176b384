"""The closures behind the compiler: field lookups and the fast paths for constants.

Each fast path tests the common types first and falls back to the general rules of
``layer.expr.values``, so it never changes an answer, only the time it takes.
"""

from __future__ import annotations

from collections.abc import Callable

from layer.expr import nodes
from layer.expr.record import Record
from layer.expr.values import COMPARISONS, comparable, text_to_number

__all__ = [
    "Code",
    "compare_const",
    "compare_values",
    "in_constants",
    "not3",
    "path_code",
    "top_field",
]

# (document, NOW()'s value, the Kafka record or None) -> value
Code = Callable[[object, float, Record | None], object]


def not3(value: object) -> object:
    if value is True:
        return False
    if value is False:
        return True
    return None


def compare_values(op: Callable[[object, object], bool], a: object, b: object) -> bool | None:
    pair = comparable(a, b)
    return None if pair is None else op(*pair)


def path_code(steps: tuple[str | int, ...]) -> Code:
    """A lookup that gives NULL for a missing field, a step through a non-object, a bad index."""
    if len(steps) == 1 and type(steps[0]) is str:
        key = steps[0]

        def field(doc: object, now: float, rec: Record | None) -> object:
            return doc.get(key) if isinstance(doc, dict) else None

        return field
    if len(steps) == 2 and type(steps[0]) is str and type(steps[1]) is str:
        outer, inner = steps

        def field2(doc: object, now: float, rec: Record | None) -> object:
            if isinstance(doc, dict):
                value = doc.get(outer)
                if isinstance(value, dict):
                    return value.get(inner)
            return None

        return field2

    def walk(doc: object, now: float, rec: Record | None) -> object:
        value = doc
        for step in steps:
            if isinstance(step, str):
                if not isinstance(value, dict):
                    return None
                value = value.get(step)
            elif isinstance(value, list | tuple) and step < len(value):
                value = value[step]
            else:
                return None
        return value

    return walk


def top_field(node: nodes.Node) -> str | None:
    """The field name if ``node`` is a one-step path such as ``/qty``."""
    if isinstance(node, nodes.Path) and len(node.steps) == 1 and type(node.steps[0]) is str:
        return node.steps[0]
    return None


def compare_const(op: str, code: Code, constant: object, field: str | None) -> Code:
    """``x op constant`` for a non-NULL constant, with the constant's type decided once.

    The commonest filters compare a top-level field with a constant; for those (``field`` given)
    the lookup is done inline, which saves a Python call per comparison (a third of the time).
    """
    compare = COMPARISONS[op]
    kind = type(constant)
    if field is not None and kind is str:

        def field_versus_text(doc: object, now: float, rec: Record | None) -> object:
            value = doc.get(field) if isinstance(doc, dict) else None
            if type(value) is str:
                return compare(value, constant)
            return None if value is None else compare_values(compare, value, constant)

        return field_versus_text
    if field is not None and (kind is int or kind is float):

        def field_versus_number(doc: object, now: float, rec: Record | None) -> object:
            value = doc.get(field) if isinstance(doc, dict) else None
            kind = type(value)
            if kind is int or kind is float:
                return compare(value, constant)
            return None if value is None else compare_values(compare, value, constant)

        return field_versus_number
    if isinstance(constant, str):
        as_number = text_to_number(constant)

        def versus_text(doc: object, now: float, rec: Record | None) -> object:
            value = code(doc, now, rec)
            if type(value) is str:
                return compare(value, constant)
            kind = type(value)
            if as_number is not None and (kind is int or kind is float):
                return compare(value, as_number)
            return None

        return versus_text
    if kind is int or kind is float:

        def versus_number(doc: object, now: float, rec: Record | None) -> object:
            value = code(doc, now, rec)
            kind = type(value)
            if kind is int or kind is float:
                return compare(value, constant)
            if type(value) is str:
                number = text_to_number(value)
                return None if number is None else compare(number, constant)
            return None

        return versus_number

    def versus_bool(doc: object, now: float, rec: Record | None) -> object:
        value = code(doc, now, rec)
        return compare(value, constant) if value is True or value is False else None

    return versus_bool


def in_constants(code: Code, values: list[object], negated: bool) -> Code:
    """``x IN (constants...)`` by set lookups, with SQL's answer when nothing matches.

    Equality is the same as ``=``: strings match strings exactly, numbers match numbers and numeric
    strings, booleans match booleans. When nothing matches, the answer is NULL rather than false if
    some item could not be compared with x (a NULL item, or an item of a type x does not compare
    with), as ``x = a OR x = b ...`` would give.
    """
    texts = {v for v in values if type(v) is str}
    numbers = {v for v in values if type(v) in (int, float) and v == v}  # NaN equals nothing
    text_numbers = {n for n in map(text_to_number, texts) if n is not None}
    bools = {v for v in values if v is True or v is False}
    has_null = any(v is None for v in values)
    has_number = any(type(v) in (int, float) for v in values)
    has_text_not_number = any(text_to_number(v) is None for v in texts)
    if_no_match_for_text = None if has_null or bools or has_number else False
    if_no_match_for_number = None if has_null or bools or has_text_not_number else False
    if_no_match_for_bool = None if has_null or texts or has_number else False
    all_numbers = numbers | text_numbers

    def in_constants(doc: object, now: float, rec: Record | None) -> object:
        value = code(doc, now, rec)
        kind = type(value)
        result: object
        if kind is str:
            if value in texts:
                result = True
            else:
                number = text_to_number(value) if has_number else None  # type: ignore[arg-type]
                if number is not None:
                    result = True if number in numbers else (None if has_null or bools else False)
                else:
                    result = if_no_match_for_text
        elif kind is int or kind is float:
            result = True if value in all_numbers else if_no_match_for_number
        elif kind is bool:
            result = True if value in bools else if_no_match_for_bool
        else:
            result = None
        return not3(result) if negated else result

    return in_constants
