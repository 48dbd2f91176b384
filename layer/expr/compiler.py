"""Syntax tree to nested closures, folding whatever does not depend on the document.

Every closure takes ``(doc, now, rec)`` (``rec``: the Kafka record, see ``layer.expr.record``,
or None) and returns a value (see ``layer.expr.values``). A sub-tree
whose inputs are all constants is run once here and replaced by its value, so ``/qty > 2 * 50``
costs what ``/qty > 100`` does. Comparisons, IN and BETWEEN against constants get closures that
test the common types first; the general rules are the fallback, so the fast paths never change
an answer.

The closures are built to not raise: arithmetic and functions catch their own errors and give
NULL (a raising sub-expression must not turn ``x OR TRUE`` into NULL). ``Expression`` still wraps
each evaluation as a last guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from layer.exceptions import ExpressionError
from layer.expr import nodes
from layer.expr.closures import (
    Code,
    compare_const,
    compare_values,
    in_constants,
    not3,
    path_code,
    top_field,
)
from layer.expr.functions import FUNCTIONS
from layer.expr.record import Record, header_value, key_text, timestamp_seconds
from layer.expr.values import ARITHMETIC, COMPARISONS, FLOAT_ARITHMETIC, to_number

__all__ = ["Code", "Uses", "compile_tree"]

_Compiled = Code | nodes.Const

_FLIPPED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_ERRORS = (ArithmeticError, ValueError, TypeError, MemoryError, RecursionError)


def compile_tree(text: str, tree: nodes.Node) -> tuple[Code, Uses]:
    """The closure for ``tree`` and what it reads besides constants."""
    compiler = _Compiler(text)
    code = _code(compiler.compile(tree))
    return code, Uses(compiler.uses_now, compiler.uses_record, compiler.uses_document)


@dataclass(frozen=True, slots=True)
class Uses:
    """What an expression reads: NOW() (evaluation needs the time), the Kafka record (KEY,
    HEADER, TIMESTAMP, TOPIC, PARTITION: callers build a ``Record``), the document (a field
    path: the payload must be parsed)."""

    now: bool = False
    record: bool = False
    document: bool = False


def _code(compiled: _Compiled) -> Code:
    if isinstance(compiled, nodes.Const):
        value = compiled.value

        def constant(doc: object, now: float, rec: Record | None) -> object:
            return value

        return constant
    return compiled


def _fold(code: Code, node: nodes.Node, *parts: _Compiled) -> _Compiled:
    """``code``, or its value if every part it depends on is a constant."""
    if all(isinstance(part, nodes.Const) for part in parts):
        try:
            value = code(None, 0.0, None)
        except Exception:
            value = None
        return nodes.Const(value, pos=node.pos)
    return code


class _Compiler:
    def __init__(self, text: str) -> None:
        self.text = text
        self.uses_now = False
        self.uses_record = False
        self.uses_document = False

    def compile(self, node: nodes.Node) -> _Compiled:
        method = getattr(self, f"_{type(node).__name__.lower()}")
        result: _Compiled = method(node)
        return result

    # -- values --------------------------------------------------------------------------------

    def _const(self, node: nodes.Const) -> _Compiled:
        return node

    def _path(self, node: nodes.Path) -> _Compiled:
        self.uses_document = True
        return path_code(node.steps)

    def _unary(self, node: nodes.Unary) -> _Compiled:
        operand = self.compile(node.operand)
        inner = _code(operand)
        negate = node.op == "-"

        def unary(doc: object, now: float, rec: Record | None) -> object:
            number = to_number(inner(doc, now, rec))
            if number is None:
                return None
            return -number if negate else number

        return _fold(unary, node, operand)

    def _binary(self, node: nodes.Binary) -> _Compiled:
        left, right = self.compile(node.left), self.compile(node.right)
        lcode, rcode = _code(left), _code(right)
        op, float_op = ARITHMETIC[node.op], FLOAT_ARITHMETIC[node.op]

        def arithmetic(doc: object, now: float, rec: Record | None) -> object:
            a = lcode(doc, now, rec)
            kind = type(a)
            x = a if kind is int or kind is float else to_number(a)
            if x is None:
                return None
            b = rcode(doc, now, rec)
            kind = type(b)
            y = b if kind is int or kind is float else to_number(b)
            if y is None:
                return None
            try:
                if kind is float or type(x) is float:
                    return float_op(x, y)  # type: ignore[arg-type]
                return op(x, y)  # type: ignore[arg-type]
            except _ERRORS:
                return None

        return _fold(arithmetic, node, left, right)

    def _call(self, node: nodes.Call) -> _Compiled:
        args = [self.compile(arg) for arg in node.args]
        codes = [_code(arg) for arg in args]
        if node.name == "NOW":
            self.uses_now = True
            return _now
        if node.name == "HEADER":
            self.uses_record = True
            return self._header(node)
        if node.name in _RECORD_FIELDS:
            self.uses_record = True  # never folded: they read each evaluation's record
            return _RECORD_FIELDS[node.name]
        if node.name == "COALESCE":
            return _coalesce(node, args, codes)
        apply = FUNCTIONS[node.name].apply
        assert apply is not None
        if len(codes) == 1:
            (only,) = codes

            def call1(doc: object, now: float, rec: Record | None) -> object:
                try:
                    return apply(only(doc, now, rec))
                except _ERRORS:
                    return None

            return _fold(call1, node, *args)

        def call(doc: object, now: float, rec: Record | None) -> object:
            try:
                return apply(*[code(doc, now, rec) for code in codes])
            except _ERRORS:
                return None

        return _fold(call, node, *args)

    def _header(self, node: nodes.Call) -> Code:
        """HEADER('name'): the name must be a literal, so what an expression reads is fixed
        when it is compiled (and checked when the config is loaded)."""
        (arg,) = node.args
        if not isinstance(arg, nodes.Const) or type(arg.value) is not str:
            raise ExpressionError(
                self.text,
                arg.pos + 1,
                "HEADER takes the header's name as a string literal",
                "for example HEADER('JMSPriority')",
            )
        name = arg.value

        def header(doc: object, now: float, rec: Record | None) -> object:
            return None if rec is None else header_value(rec, name)

        return header

    # -- predicates ----------------------------------------------------------------------------

    def _compare(self, node: nodes.Compare) -> _Compiled:
        left, right = self.compile(node.left), self.compile(node.right)
        # x op constant, or constant op x: the constant's type is known now
        for op_name, side, constant, tree in (
            (node.op, left, right, node.left),
            (_FLIPPED[node.op], right, left, node.right),
        ):
            if isinstance(constant, nodes.Const) and not isinstance(side, nodes.Const):
                if constant.value is None:
                    return nodes.Const(None, pos=node.pos)  # anything compared with NULL is NULL
                return compare_const(op_name, _code(side), constant.value, top_field(tree))
        lcode, rcode, op = _code(left), _code(right), COMPARISONS[node.op]

        def compare(doc: object, now: float, rec: Record | None) -> object:
            return compare_values(op, lcode(doc, now, rec), rcode(doc, now, rec))

        return _fold(compare, node, left, right)

    def _between(self, node: nodes.Between) -> _Compiled:
        operand, low, high = (self.compile(n) for n in (node.operand, node.low, node.high))
        code, lcode, hcode = _code(operand), _code(low), _code(high)
        negated = node.negated
        ge, le = COMPARISONS[">="], COMPARISONS["<="]
        # numeric constant bounds and a numeric value: one chained comparison
        lo_const: object = low.value if isinstance(low, nodes.Const) else None
        hi_const: object = high.value if isinstance(high, nodes.Const) else None
        fast = type(lo_const) in (int, float) and type(hi_const) in (int, float)

        def between(doc: object, now: float, rec: Record | None) -> object:
            value = code(doc, now, rec)
            kind = type(value)
            if fast and (kind is int or kind is float):
                inside: object = lo_const <= value <= hi_const  # type: ignore[operator]
            else:
                above = compare_values(ge, value, lcode(doc, now, rec))
                if above is False:
                    inside = False
                else:
                    below = compare_values(le, value, hcode(doc, now, rec))
                    if below is False:
                        inside = False
                    else:
                        inside = True if above is True and below is True else None
            return not3(inside) if negated else inside

        return _fold(between, node, operand, low, high)

    def _in(self, node: nodes.In) -> _Compiled:
        operand = self.compile(node.operand)
        items = [self.compile(item) for item in node.items]
        code = _code(operand)
        if all(isinstance(item, nodes.Const) for item in items):
            values = [item.value for item in items]  # type: ignore[union-attr]
            return _fold(in_constants(code, values, node.negated), node, operand)
        codes = [_code(item) for item in items]
        negated = node.negated
        eq = COMPARISONS["="]

        def in_list(doc: object, now: float, rec: Record | None) -> object:
            value = code(doc, now, rec)
            result: object = False
            for item in codes:
                found = compare_values(eq, value, item(doc, now, rec))
                if found is True:
                    result = True
                    break
                if found is None:
                    result = None
            return not3(result) if negated else result

        return in_list

    def _like(self, node: nodes.Like) -> _Compiled:
        operand, pattern = self.compile(node.operand), self.compile(node.pattern)
        code, negated = _code(operand), node.negated
        if isinstance(pattern, nodes.Const):
            if type(pattern.value) is not str:
                return nodes.Const(None, pos=node.pos)  # LIKE NULL (or a number) is NULL
            try:
                search = re.compile(pattern.value).search
            except (re.error, OverflowError, RecursionError) as exc:
                raise self._regex_error(node.pattern, pattern.value, exc) from None

            def like(doc: object, now: float, rec: Record | None) -> object:
                value = code(doc, now, rec)
                if type(value) is not str:
                    return None
                return (search(value) is None) if negated else (search(value) is not None)

            return _fold(like, node, operand)
        pcode = _code(pattern)

        def like_dynamic(doc: object, now: float, rec: Record | None) -> object:
            value, regex = code(doc, now, rec), pcode(doc, now, rec)
            if type(value) is not str or type(regex) is not str:
                return None
            try:
                found = re.search(regex, value) is not None  # re caches compiled patterns
            except (re.error, OverflowError, RecursionError):
                return None
            return not found if negated else found

        return like_dynamic

    def _regex_error(self, pattern: nodes.Node, regex: str, exc: Exception) -> ExpressionError:
        """Point at the bad character when the pattern is a literal written without escapes."""
        column = pattern.pos + 1
        offset = getattr(exc, "pos", None)
        start = pattern.pos + 1  # after the opening quote
        if isinstance(offset, int) and self.text[start : start + len(regex)] == regex:
            column = start + offset + 1
        reason = getattr(exc, "msg", None) or str(exc)
        return ExpressionError(self.text, column, f"invalid regular expression {regex!r}: {reason}")

    def _isnull(self, node: nodes.IsNull) -> _Compiled:
        operand = self.compile(node.operand)
        code = _code(operand)
        # bytes count as NULL everywhere else, but the field is there: IS NULL is false for it
        if node.negated:

            def is_not_null(doc: object, now: float, rec: Record | None) -> object:
                return code(doc, now, rec) is not None

            return _fold(is_not_null, node, operand)

        def is_null(doc: object, now: float, rec: Record | None) -> object:
            return code(doc, now, rec) is None

        return _fold(is_null, node, operand)

    # -- logic ---------------------------------------------------------------------------------

    def _not(self, node: nodes.Not) -> _Compiled:
        operand = self.compile(node.operand)
        code = _code(operand)

        def negation(doc: object, now: float, rec: Record | None) -> object:
            return not3(code(doc, now, rec))

        return _fold(negation, node, operand)

    def _and(self, node: nodes.And) -> _Compiled:
        return _junction(node, [self.compile(o) for o in node.operands], decisive=False)

    def _or(self, node: nodes.Or) -> _Compiled:
        return _junction(node, [self.compile(o) for o in node.operands], decisive=True)


def _now(doc: object, now: float, rec: Record | None) -> object:
    return now


def _key(doc: object, now: float, rec: Record | None) -> object:
    return key_text(rec)


def _timestamp(doc: object, now: float, rec: Record | None) -> object:
    return timestamp_seconds(rec)


def _topic(doc: object, now: float, rec: Record | None) -> object:
    return None if rec is None else rec.topic


def _partition(doc: object, now: float, rec: Record | None) -> object:
    return None if rec is None else rec.partition


_RECORD_FIELDS: dict[str, Code] = {
    "KEY": _key,
    "PARTITION": _partition,
    "TIMESTAMP": _timestamp,
    "TOPIC": _topic,
}


def _coalesce(node: nodes.Call, args: list[_Compiled], codes: list[Code]) -> _Compiled:
    first = args[0]
    if isinstance(first, nodes.Const) and first.value is not None:
        return first

    def coalesce(doc: object, now: float, rec: Record | None) -> object:
        for code in codes:
            value = code(doc, now, rec)
            if value is not None and type(value) is not bytes:
                return value
        return None

    return _fold(coalesce, node, *args)


def _junction(node: nodes.Node, operands: list[_Compiled], decisive: bool) -> _Compiled:
    """AND (``decisive`` False: one false operand decides) or OR (one true operand decides).

    Constant operands are settled here: a decisive one makes the whole a constant, the neutral
    one drops out, and a NULL one leaves the answer unknown unless another operand decides.
    """
    neutral = not decisive
    unknown = False
    codes: list[Code] = []
    for operand in operands:
        if isinstance(operand, nodes.Const):
            if operand.value is decisive:
                return nodes.Const(decisive, pos=node.pos)
            if operand.value is not neutral:
                unknown = True
        else:
            codes.append(operand)
    if not codes:
        return nodes.Const(None if unknown else neutral, pos=node.pos)
    settled: object = None if unknown else neutral
    if len(codes) == 1:
        (only,) = codes

        def junction1(doc: object, now: float, rec: Record | None) -> object:
            value = only(doc, now, rec)
            if value is decisive:
                return decisive
            return settled if value is neutral else None

        return junction1
    if len(codes) == 2 and not unknown:
        first, second = codes

        def junction2(doc: object, now: float, rec: Record | None) -> object:
            a = first(doc, now, rec)
            if a is decisive:
                return decisive
            b = second(doc, now, rec)
            if b is decisive:
                return decisive
            return neutral if a is neutral and b is neutral else None

        return junction2

    def junction(doc: object, now: float, rec: Record | None) -> object:
        result = settled
        for code in codes:
            value = code(doc, now, rec)
            if value is decisive:
                return decisive
            if value is not neutral:
                result = None
        return result

    return junction
