"""``Expression``: a compiled expression and the four ways callers read its value."""

from __future__ import annotations

import json
import time

from layer.expr.compiler import Code, Uses, compile_tree
from layer.expr.record import Record
from layer.expr.values import text_to_number

__all__ = ["Expression", "Record", "compile_expression"]

_SCALARS = frozenset((str, int, float, bool))
_PRIORITY_MAX = 2**64 - 1
_PRIORITY_CAP = float(2**64)


def compile_expression(text: str) -> Expression:
    """Parse and compile ``text``; ``ExpressionError`` (with the column) if it is not valid.

    Compiling costs far more than evaluating: callers compile once and keep the Expression.
    """
    if not isinstance(text, str):
        raise TypeError(f"an expression is a str, not {type(text).__name__}")
    # lark and the grammar load with the first expression, not with every importer of
    # ``layer.expr`` (a config without expressions, the CLI, the client)
    from layer.expr.parser import parse

    code, uses = compile_tree(text, parse(text))
    return Expression(text, code, uses)


class Expression:
    """A compiled AMPS-style expression. Immutable and safe to share between threads.

    ``doc`` is a decoded JSON value or a fastavro record. Evaluation never raises: whatever the
    document holds, a problem gives NULL (None). ``now`` is the value of NOW() in seconds since the
    epoch; None reads the clock once per call, and only if the expression uses NOW(). ``record``
    is the Kafka record around the document (``layer.expr.record.Record``): what KEY(),
    HEADER('name'), TIMESTAMP(), TOPIC() and PARTITION() read; without one they are NULL.
    Callers build a record only when ``uses_record`` is true, and parse the payload only when
    ``uses_document`` is.
    """

    __slots__ = ("_code", "_uses_now", "text", "uses_document", "uses_record")

    def __init__(self, text: str, code: Code, uses: Uses) -> None:
        self.text = text
        self._code = code
        self._uses_now = uses.now
        self.uses_record = uses.record
        self.uses_document = uses.document

    def __repr__(self) -> str:
        return f"Expression({self.text!r})"

    def __eq__(self, other: object) -> bool:
        # the same text always compiles to the same behaviour
        return isinstance(other, Expression) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def evaluate(
        self, doc: object, now: float | None = None, record: Record | None = None
    ) -> object:
        """The value: str, int, float, bool, or None for NULL (also for an array or object)."""
        if now is None:
            now = time.time() if self._uses_now else 0.0
        try:
            value = self._code(doc, now, record)
        except Exception:  # a last guard: the closures are written not to raise
            return None
        return value if type(value) in _SCALARS else None

    def matches(self, doc: object, now: float | None = None, record: Record | None = None) -> bool:
        """True only if the value is boolean true; NULL, false and non-booleans are no match."""
        if now is None:
            now = time.time() if self._uses_now else 0.0
        try:
            return self._code(doc, now, record) is True
        except Exception:
            return False

    def priority(
        self, doc: object, now: float | None = None, record: Record | None = None
    ) -> int | None:
        """The value as an AMPS priority: a number (or numeric string) truncated toward zero and
        clamped to [0, 2**64 - 1]; None for NULL, NaN, booleans and anything else."""
        if now is None:
            now = time.time() if self._uses_now else 0.0
        try:
            value = self._code(doc, now, record)
        except Exception:  # a last guard: the closures are written not to raise
            return None
        if type(value) is str:
            value = text_to_number(value)
        if type(value) is int:
            return min(max(value, 0), _PRIORITY_MAX)
        if type(value) is float:
            if value != value:  # NaN
                return None
            if value < 1.0:
                return 0
            # int() is exact below 2**64; from there up (and inf) the clamp decides
            return _PRIORITY_MAX if value >= _PRIORITY_CAP else int(value)
        return None

    def key(
        self, doc: object, now: float | None = None, record: Record | None = None
    ) -> object | None:
        """A hashable key for message groups and last-value conflation.

        A str, int, float or bool value is the key itself, so keys equal as Python values are the
        same group (1 and 1.0; also True and 1); NULL, bytes and NaN (which equals nothing, not even
        itself) give None.
        An array or object gives its canonical JSON text (sorted keys, no spaces), so equal
        documents give equal keys whatever their key order.
        """
        if now is None:
            now = time.time() if self._uses_now else 0.0
        try:
            value = self._code(doc, now, record)
        except Exception:  # a last guard: the closures are written not to raise
            return None
        kind = type(value)
        if kind in _SCALARS:
            return None if kind is float and value != value else value
        if kind is list or kind is dict or kind is tuple:
            try:
                return json.dumps(value, sort_keys=True, separators=(",", ":"), default=_jsonable)
            except (TypeError, ValueError, RecursionError):
                return None
        return None


def _jsonable(value: object) -> object:
    """What json.dumps cannot write: Avro bytes (as tagged hex) and anything else as its repr."""
    if isinstance(value, bytes | bytearray):
        return {"$bytes": value.hex()}
    return repr(value)
