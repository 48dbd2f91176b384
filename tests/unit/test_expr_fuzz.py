"""Property tests of the expression language.

(a) No text makes ``compile_expression`` raise anything but ``ExpressionError``.
(b) Every expression built from the grammar compiles, and evaluating it on any JSON-like (or Avro
    bytes-holding) document gives None/bool/int/float/str without raising.
(c) Comparisons and boolean logic agree with a small reference evaluator written here, apart from
    the compiler: SQL three-valued logic, AMPS's numeric strings, booleans only with booleans.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from layer.exceptions import ExpressionError
from layer.expr import compile_expression

FIELDS = ("a", "b", "c", "items")
PATHS = ("/a", "/b", "/c", "/items", "/items[0]", "/items[1]/a", "/a/b", "/c/a[0]", "/zz")
REGEXES = ("^a", "b", "1", "^$", "(?i)ABC", r"\d+", ".")
SETTINGS = settings(max_examples=200, deadline=None)


def quote(text: str) -> str:
    """A single-quoted literal that reads back as ``text``."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


# -- (a) arbitrary text --------------------------------------------------------------------------

TOKENS = (
    "/a",
    "/b/c",
    "/x[0]",
    "1",
    "2.5",
    "'s'",
    '"d"',
    "(",
    ")",
    ",",
    "+",
    "-",
    "*",
    "/",
    "%",
    "=",
    "!=",
    "<",
    ">=",
    "AND",
    "OR",
    "NOT",
    "LIKE",
    "IN",
    "BETWEEN",
    "IS",
    "NULL",
    "TRUE",
    "UPPER",
    "COALESCE",
    "NOW",
    "'",
    "[",
    "]",
    "\\",
)


def check_compiles_or_refuses(text: str) -> None:
    try:
        expression = compile_expression(text)
    except ExpressionError as exc:
        assert exc.text == text
        assert 1 <= exc.position <= len(text) + 1
        assert f"at column {exc.position}" in str(exc)
        return
    expression.evaluate({"a": 1, "b": {"c": "x"}, "x": [True]})


@SETTINGS
@given(st.text(max_size=80))
def test_arbitrary_text_compiles_or_raises_expression_error(text: str) -> None:
    check_compiles_or_refuses(text)


@SETTINGS
@given(st.lists(st.sampled_from(TOKENS), max_size=25), st.sampled_from((" ", "")))
def test_token_soup_compiles_or_raises_expression_error(tokens: list[str], glue: str) -> None:
    check_compiles_or_refuses(glue.join(tokens))


@SETTINGS
@given(st.text(), st.sampled_from(("'", '"')))
def test_string_literals_read_back(text: str, mark: str) -> None:
    literal = mark + text.replace("\\", "\\\\").replace(mark, mark + mark) + mark
    assert compile_expression(literal).evaluate(None) == text


# -- (b) valid expressions on random documents ---------------------------------------------------

LEAVES = st.one_of(
    st.sampled_from(PATHS),
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.text(max_size=6).map(quote),
    st.sampled_from(("TRUE", "FALSE", "NULL", "NOW()", "'12'", "' 3.5 '")),
)
BINARY = ("+", "-", "*", "/", "%", "=", "==", "!=", "<>", "<", "<=", ">", ">=", "AND", "OR")
ONE_ARG = ("UPPER", "LOWER", "LENGTH", "ABS", "ROUND")


def not_(negated: bool) -> str:
    return "NOT " if negated else ""


def grow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(lambda a, op, b: f"({a} {op} {b})", children, st.sampled_from(BINARY), children),
        st.builds(lambda a: f"(NOT {a})", children),
        st.builds(lambda sign, a: f"({sign}{a})", st.sampled_from(("-", "+")), children),
        st.builds(
            lambda a, n, p: f"({a} {not_(n)}LIKE {quote(p)})",
            children,
            st.booleans(),
            st.sampled_from(REGEXES),
        ),
        # a pattern from the document (a constant one that is no regex is a compile error)
        st.builds(
            lambda a, n, p: f"({a} {not_(n)}LIKE {p})",
            children,
            st.booleans(),
            st.sampled_from(PATHS),
        ),
        st.builds(
            lambda a, n, items: f"({a} {not_(n)}IN ({', '.join(items)}))",
            children,
            st.booleans(),
            st.lists(children, min_size=1, max_size=4),
        ),
        st.builds(
            lambda a, n, lo, hi: f"({a} {not_(n)}BETWEEN {lo} AND {hi})",
            children,
            st.booleans(),
            children,
            children,
        ),
        st.builds(lambda a, n: f"({a} IS {not_(n)}NULL)", children, st.booleans()),
        st.builds(lambda f, a: f"{f}({a})", st.sampled_from(ONE_ARG), children),
        st.builds(lambda a, b: f"ROUND({a}, {b})", children, children),
        st.lists(children, min_size=1, max_size=3).map(lambda xs: f"COALESCE({', '.join(xs)})"),
    )


EXPRESSIONS = st.recursive(LEAVES, grow, max_leaves=24)

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities too
    st.text(max_size=6),
    st.sampled_from(("12", " 3.5 ", "-0", "1e400", "abc")),
    st.binary(max_size=3),  # Avro bytes
)
DOCUMENTS = st.one_of(
    st.recursive(
        SCALARS,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(FIELDS), inner),
        max_leaves=12,
    ),
)
RESULT_TYPES = (type(None), bool, int, float, str)


@settings(max_examples=300, deadline=None)
@given(EXPRESSIONS, st.lists(DOCUMENTS, min_size=1, max_size=4))
def test_generated_expressions_compile_and_never_raise(text: str, docs: list[object]) -> None:
    expression = compile_expression(text)
    for doc in docs:
        assert type(expression.evaluate(doc, now=1e9)) in RESULT_TYPES
        assert type(expression.evaluate(doc)) in RESULT_TYPES
        assert type(expression.matches(doc)) is bool
        priority = expression.priority(doc)
        assert priority is None or 0 <= priority <= 2**64 - 1
        hash(expression.key(doc))


# -- (c) a reference evaluator for comparisons and logic -----------------------------------------

Tree = tuple[object, ...]

VALUES = (None, True, False, 0, 1, 2, -1, 1.5, 2.0, "1", "2", "1.5", " 2 ", "abc", "", "ABC")
DOC_VALUES = st.sampled_from((*VALUES, b"x", math.nan, [1], {"a": 1}))
REF_DOCS = st.fixed_dictionaries({}, optional={name: DOC_VALUES for name in ("a", "b", "c")})

OPERANDS = st.one_of(
    st.sampled_from(("a", "b", "c", "zz")).map(lambda name: ("field", name)),
    st.sampled_from(VALUES).map(lambda v: ("literal", v)),
)
COMPARE_OPS: dict[str, Callable[[object, object], bool]] = {
    "=": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,  # type: ignore[dict-item]
    "<=": operator.le,  # type: ignore[dict-item]
    ">": operator.gt,  # type: ignore[dict-item]
    ">=": operator.ge,  # type: ignore[dict-item]
}
PREDICATES = st.one_of(
    st.tuples(st.just("compare"), st.sampled_from(tuple(COMPARE_OPS)), OPERANDS, OPERANDS),
    st.tuples(st.just("in"), OPERANDS, st.lists(OPERANDS, min_size=1, max_size=4), st.booleans()),
    st.tuples(st.just("between"), OPERANDS, OPERANDS, OPERANDS, st.booleans()),
    st.tuples(st.just("isnull"), OPERANDS, st.booleans()),
    st.tuples(st.just("like"), OPERANDS, st.sampled_from(REGEXES), st.booleans()),
    st.tuples(st.just("bare"), OPERANDS),
)
LOGIC = st.recursive(
    PREDICATES,
    lambda inner: st.one_of(
        st.tuples(st.just("not"), inner),
        st.tuples(st.sampled_from(("and", "or")), st.lists(inner, min_size=2, max_size=4)),
    ),
    max_leaves=10,
)


def render_operand(operand: Tree) -> str:
    kind, v = operand
    if kind == "field":
        return f"/{v}"
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return str(v).upper()
    if isinstance(v, str):
        return quote(v)
    return repr(v)


def render(tree: Tree) -> str:
    kind = tree[0]
    if kind == "compare":
        _, op, a, b = tree
        return f"{render_operand(a)} {op} {render_operand(b)}"  # type: ignore[arg-type]
    if kind == "in":
        _, a, items, negated = tree
        listed = ", ".join(render_operand(i) for i in items)  # type: ignore[attr-defined]
        return f"{render_operand(a)} {not_(negated)}IN ({listed})"  # type: ignore[arg-type]
    if kind == "between":
        _, a, lo, hi, negated = tree
        parts = [render_operand(x) for x in (a, lo, hi)]  # type: ignore[arg-type]
        return f"{parts[0]} {not_(negated)}BETWEEN {parts[1]} AND {parts[2]}"  # type: ignore[arg-type]
    if kind == "isnull":
        _, a, negated = tree
        return f"{render_operand(a)} IS {not_(negated)}NULL"  # type: ignore[arg-type]
    if kind == "like":
        _, a, pattern, negated = tree
        return f"{render_operand(a)} {not_(negated)}LIKE {quote(pattern)}"  # type: ignore[arg-type]
    if kind == "bare":
        return render_operand(tree[1])  # type: ignore[arg-type]
    if kind == "not":
        return f"NOT ({render(tree[1])})"  # type: ignore[arg-type]
    joiner = f" {str(kind).upper()} "
    return joiner.join(f"({render(t)})" for t in tree[1])  # type: ignore[attr-defined]


_NUMBER_TEXT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def ref_kind(v: object) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "text"
    return "null"  # None, bytes, arrays and objects do not compare


def ref_number(text: str) -> int | float | None:
    stripped = text.strip(" \t\r\n")
    if not _NUMBER_TEXT.fullmatch(stripped):
        return None
    return float(stripped) if any(c in stripped for c in ".eE") else int(stripped)


def ref_compare(op: str, a: object, b: object) -> bool | None:
    ka, kb = ref_kind(a), ref_kind(b)
    if "null" in (ka, kb):
        return None
    if ka != kb:
        if {ka, kb} != {"number", "text"}:
            return None
        if ka == "text":
            a = ref_number(a)  # type: ignore[arg-type]
        else:
            b = ref_number(b)  # type: ignore[arg-type]
        if a is None or b is None:
            return None
    return COMPARE_OPS[op](a, b)


def ref_and(values: list[object]) -> object:
    if any(v is False for v in values):
        return False
    return True if all(v is True for v in values) else None


def ref_or(values: list[object]) -> object:
    if any(v is True for v in values):
        return True
    return False if all(v is False for v in values) else None


def ref_not(v: object) -> object:
    return (not v) if isinstance(v, bool) else None


def ref_eval(tree: Tree, doc: dict[str, object]) -> object:
    def operand(o: object) -> object:
        assert isinstance(o, tuple)
        source, v = o
        return doc.get(v) if source == "field" else v

    kind = tree[0]
    if kind == "compare":
        return ref_compare(tree[1], operand(tree[2]), operand(tree[3]))  # type: ignore[arg-type]
    if kind == "in":
        x = operand(tree[1])
        found = ref_or([ref_compare("=", x, operand(i)) for i in tree[2]])  # type: ignore[attr-defined]
        return ref_not(found) if tree[3] else found
    if kind == "between":
        x = operand(tree[1])
        inside = ref_and(
            [ref_compare(">=", x, operand(tree[2])), ref_compare("<=", x, operand(tree[3]))]
        )
        return ref_not(inside) if tree[4] else inside
    if kind == "isnull":
        missing = operand(tree[1]) is None
        return not missing if tree[2] else missing
    if kind == "like":
        x = operand(tree[1])
        if not isinstance(x, str):
            return None
        found = re.search(tree[2], x) is not None  # type: ignore[call-overload]
        return not found if tree[3] else found
    if kind == "bare":
        return operand(tree[1])
    if kind == "not":
        return ref_not(ref_eval(tree[1], doc))  # type: ignore[arg-type]
    values = [ref_eval(t, doc) for t in tree[1]]  # type: ignore[attr-defined]
    return ref_and(values) if kind == "and" else ref_or(values)


def as_result(v: object) -> object:
    """What evaluate() shows of a value: scalars, else NULL."""
    return v if isinstance(v, bool | int | float | str) else None


@settings(max_examples=400, deadline=None)
@given(LOGIC, st.lists(REF_DOCS, min_size=1, max_size=5))
def test_logic_agrees_with_the_reference(tree: Tree, docs: list[dict[str, object]]) -> None:
    text = render(tree)
    expression = compile_expression(text)
    for doc in docs:
        want = as_result(ref_eval(tree, doc))
        got = expression.evaluate(doc)
        if isinstance(want, float) and math.isnan(want):
            assert isinstance(got, float) and math.isnan(got), (text, doc)
        else:
            assert got == want and type(got) is type(want), (text, doc, got, want)
        assert expression.matches(doc) is (want is True), (text, doc)
