"""The AMPS-style expression language: content filters, queue filters, priorities, barriers and
message-group / conflation keys.

``compile_expression(text)`` parses once (a lark LALR grammar, ``layer.expr.parser``) and compiles
to nested closures with constants folded (``layer.expr.compiler``). Callers keep the returned
``Expression``: evaluating it on a decoded document costs a few hundred nanoseconds, compiling it
a hundred microseconds or so. Nothing is cached globally.

The language, loosest binding first::

    OR
    AND
    NOT
    = == != <> < <= > >=   [NOT] LIKE   [NOT] IN (a, b, ...)   [NOT] BETWEEN a AND b   IS [NOT] NULL
    + -
    * / %
    unary - +
    literals, /field/paths, FUNCTION(...), ( ... )

- Field paths are XPath-like: ``/order/qty``; ``/items[0]/qty`` reads the first element of a JSON
  array (indexes are 0-based). A missing field, a step through anything but an object (an array
  needs an index), or an index out of range is NULL. Paths that stop at an array or object give
  NULL to operators and to ``evaluate``, but ``key`` uses them. Spelling rules for names, strings
  and numbers are in ``layer.expr.parser``.
- NULL follows SQL's three-valued logic: NULL in arithmetic or a comparison gives NULL;
  ``NULL AND FALSE`` is false, ``NULL OR TRUE`` is true, ``NOT NULL`` is NULL; ``x IN (...)`` is
  NULL when nothing matches and some item was NULL. A value of the wrong type (``'abc' * 2``,
  ``TRUE = 1``, a non-boolean under AND/OR/NOT) is NULL too, never an error; so is division or
  modulo by zero. Avro ``bytes`` count as NULL, except that ``IS NULL`` is false for them.
- Numbers and numeric strings: see ``layer.expr.values`` (``'150' = 150`` is true, as in AMPS; two
  strings compare as strings; ``+`` never concatenates).
- ``x LIKE 'regex'`` searches x with Python's ``re`` (unanchored; ``^``/``$`` anchor, ``(?i)``
  ignores case). A literal pattern is compiled once, and a bad one is a compile error; a pattern
  read from the document is compiled on use, and a bad one is NULL. Non-strings are NULL.
- Functions (any case): ``UPPER(s)``, ``LOWER(s)``, ``LENGTH(s)`` (NULL for non-strings),
  ``COALESCE(a, b, ...)`` (the first that is not NULL), ``ABS(x)``, ``ROUND(x)`` and
  ``ROUND(x, digits)`` (half away from zero), ``NOW()`` (seconds since the epoch; see
  ``Expression.evaluate``).
- The Kafka record's own fields (any case): ``KEY()`` (the key as UTF-8 text), ``HEADER('name')``
  (the header's value as UTF-8 text, a list of texts when the header repeats; the name is a
  string literal, matched exactly), ``TIMESTAMP()`` (seconds since the epoch, as NOW()),
  ``TOPIC()`` and ``PARTITION()``. Absent, or not UTF-8, is NULL, as a missing field is; a
  repeated header is a list, so NULL to operators, but ``key`` uses it. A header's text compares
  with numbers as a numeric string does (``HEADER('JMSPriority') > 4``). See ``layer.expr.record``.
- Limits: at most 64 KiB of UTF-8 and 100 levels of nesting; beyond, ``ExpressionError``.
"""

from typing import TYPE_CHECKING

from layer._lazy import lazy_exports

if TYPE_CHECKING:
    from layer.exceptions import ExpressionError
    from layer.expr.expression import Expression, compile_expression
    from layer.expr.record import Record
else:
    __getattr__, __dir__ = lazy_exports(
        __name__,
        {
            "layer.exceptions": ("ExpressionError",),
            "layer.expr.expression": ("Expression", "compile_expression"),
            "layer.expr.record": ("Record",),
        },
    )

__all__ = ["Expression", "ExpressionError", "Record", "compile_expression"]
