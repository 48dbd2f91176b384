"""The Kafka record's fields in expressions: KEY(), HEADER('name'), TIMESTAMP(), TOPIC(),
PARTITION(); their NULL rules, and that expressions without them need no record."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.exceptions import ExpressionError
from layer.expr import Record, compile_expression

RECORD = Record(
    key=b"order-7",
    headers=(
        ("JMSPriority", b"7"),
        ("region", b"emea"),
        ("tag", b"a"),
        ("tag", b"b"),
        ("empty", b""),
        ("nil", None),
        ("latin1", b"\xe9t\xe9"),
        ("Region", b"other-case"),
    ),
    timestamp_ms=1_700_000_000_250,
    topic="orders",
    partition=3,
)
DOC = {"qty": 5, "region": "apac"}


def value(text: str, record: Record | None = RECORD, doc: object = DOC) -> object:
    return compile_expression(text).evaluate(doc, 1_000.0, record)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("KEY()", "order-7"),
        ("key()", "order-7"),
        ("HEADER('region')", "emea"),
        ("header('Region')", "other-case"),  # the function's name is any case, the header's not
        ("HEADER('JMSPriority')", "7"),
        ("HEADER('empty')", ""),
        ("HEADER('missing')", None),
        ("HEADER('nil')", None),
        ("HEADER('latin1')", None),  # not UTF-8: NULL
        ("TIMESTAMP()", 1_700_000_000.25),
        ("TOPIC()", "orders"),
        ("PARTITION()", 3),
        # a header's text compares with numbers as a numeric string does
        ("HEADER('JMSPriority') > 4", True),
        ("HEADER('JMSPriority') = 7", True),
        ("HEADER('JMSPriority') + 1", 8),
        ("HEADER('JMSPriority') = '7'", True),
        ("HEADER('JMSPriority') IN (5, 6, 7)", True),
        ("HEADER('JMSPriority') BETWEEN 0 AND 9", True),
        ("HEADER('region') = /region", False),
        ("HEADER('region') LIKE '^em'", True),
        ("UPPER(HEADER('region'))", "EMEA"),
        ("COALESCE(HEADER('missing'), KEY())", "order-7"),
        ("KEY() = 'order-7' AND /qty > 2", True),
        ("TIMESTAMP() < NOW()", False),
        ("TOPIC() = 'orders' AND PARTITION() IN (1, 3)", True),
        # the NULL rules of a missing field
        ("HEADER('missing') IS NULL", True),
        ("HEADER('missing') = 'x'", None),
        ("HEADER('missing') > 4", None),
        ("NOT HEADER('missing') = 'x'", None),
        ("HEADER('missing') = 'x' OR TRUE", True),
        # a repeated header is a list: NULL to operators, as a path that stops at an array
        ("HEADER('tag')", None),
        ("HEADER('tag') = 'a'", None),
        ("HEADER('tag') IS NULL", False),
    ],
)
def test_record_fields(text: str, expected: object) -> None:
    assert value(text) == expected


@pytest.mark.parametrize(
    "text",
    ["KEY()", "HEADER('region')", "TIMESTAMP()", "TOPIC()", "PARTITION()", "KEY() = 'x'"],
)
def test_without_a_record_the_fields_are_null(text: str) -> None:
    assert value(text, record=None) is None
    assert compile_expression(text).matches(DOC) is False


def test_absent_key_non_utf8_key_and_no_timestamp_are_null() -> None:
    assert value("KEY()", Record(key=None)) is None
    assert value("KEY()", Record(key=b"\xff\xfe")) is None
    assert value("KEY() IS NULL", Record(key=None)) is True
    assert value("TIMESTAMP()", Record(timestamp_ms=0)) is None
    assert value("TIMESTAMP()", Record(timestamp_ms=-1)) is None
    assert value("TOPIC()", Record()) is None


def test_repeated_header_is_a_list_for_keys() -> None:
    expression = compile_expression("HEADER('tag')")
    assert expression.key(DOC, None, RECORD) == '["a","b"]'
    one = Record(headers=(("tag", b"a"),))
    assert expression.key(DOC, None, one) == "a"
    with_null = Record(headers=(("tag", b"a"), ("tag", None)))
    assert expression.key(DOC, None, with_null) == '["a",null]'


def test_priority_and_key_read_the_record() -> None:
    assert compile_expression("HEADER('JMSPriority')").priority(DOC, None, RECORD) == 7
    assert compile_expression("HEADER('missing')").priority(DOC, None, RECORD) is None
    assert compile_expression("KEY()").key(DOC, None, RECORD) == "order-7"
    assert compile_expression("PARTITION()").key(DOC, None, RECORD) == 3


@pytest.mark.parametrize(
    ("text", "uses_record", "uses_document"),
    [
        ("/qty > 1", False, True),
        ("NOW() > 1", False, False),
        ("KEY() = 'a'", True, False),
        ("header('x') = 'a' AND /qty > 1", True, True),
        ("TIMESTAMP() > 0", True, False),
        ("TOPIC() = 't' OR PARTITION() = 1", True, False),
        ("1 = 1", False, False),
    ],
)
def test_uses_flags(text: str, uses_record: bool, uses_document: bool) -> None:
    expression = compile_expression(text)
    assert expression.uses_record is uses_record
    assert expression.uses_document is uses_document


def test_record_functions_are_not_folded_as_constants() -> None:
    expression = compile_expression("KEY() = 'a' OR KEY() = 'b'")
    assert expression.matches(None, None, Record(key=b"a"))
    assert expression.matches(None, None, Record(key=b"b"))
    assert not expression.matches(None, None, Record(key=b"c"))


@pytest.mark.parametrize(
    ("text", "column", "message"),
    [
        (
            "HEADER(/name) = 'x'",
            8,
            "expression \"HEADER(/name) = 'x'\" : HEADER takes the header's name as a string"
            " literal at column 8; for example HEADER('JMSPriority')",
        ),
        (
            "HEADER(1)",
            8,
            'expression "HEADER(1)" : HEADER takes the header\'s name as a string literal at'
            " column 8; for example HEADER('JMSPriority')",
        ),
        (
            "HEADER(UPPER('x'))",
            8,
            "expression \"HEADER(UPPER('x'))\" : HEADER takes the header's name as a string"
            " literal at column 8; for example HEADER('JMSPriority')",
        ),
        (
            "HEADER()",
            1,
            'expression "HEADER()" : HEADER takes 1 argument but was given 0 at column 1',
        ),
        ("KEY(1)", 1, 'expression "KEY(1)" : KEY takes 0 arguments but was given 1 at column 1'),
    ],
)
def test_header_needs_a_string_literal(text: str, column: int, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_expression(text)
    assert caught.value.position == column
    assert str(caught.value) == message


_headers = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c"]), st.none() | st.binary(max_size=6)), max_size=6
)


@given(_headers, st.sampled_from(["a", "b", "c"]))
def test_header_value_is_every_value_of_that_name_in_order(
    headers: list[tuple[str, bytes | None]], name: str
) -> None:
    def text(raw: bytes | None) -> str | None:
        if raw is None:
            return None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None

    expected = [text(raw) for key, raw in headers if key == name]
    got = compile_expression(f"HEADER('{name}')").key(None, None, Record(headers=headers))
    record = Record(headers=headers)
    if not expected:
        assert value(f"HEADER('{name}') IS NULL", record) is True
    elif len(expected) == 1:
        assert value(f"HEADER('{name}')", record) == expected[0]
        assert got == expected[0]
    else:
        assert value(f"HEADER('{name}')", record) is None  # a list: NULL to operators
        assert value(f"HEADER('{name}') IS NULL", record) is False


# -- a header behaves as a top-level text field ----------------------------------------------------

_TEXTS = st.text(alphabet="ab1 .-", max_size=4)
_LEAVES = st.one_of(
    st.sampled_from(("@a", "@b", "@c")),
    st.integers(-3, 3).map(str),
    st.sampled_from(("1.5", "TRUE", "FALSE", "NULL", "'1'", "'a'", "' 1 '", "''")),
    _TEXTS.map(lambda t: f"'{t}'"),
)


def _grow(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.builds(
            lambda a, op, b: f"({a} {op} {b})",
            children,
            st.sampled_from(("=", "!=", "<", ">=", "+", "*", "AND", "OR")),
            children,
        ),
        st.builds(lambda a: f"(NOT {a})", children),
        st.builds(lambda a: f"({a} IS NULL)", children),
        st.builds(lambda a: f"({a} IN ('1', 1, 'a'))", children),
        st.builds(lambda a: f"({a} LIKE '^a')", children),
        st.builds(lambda a: f"UPPER({a})", children),
        st.builds(lambda a, b: f"COALESCE({a}, {b})", children, children),
    )


_SHAPES = st.recursive(_LEAVES, _grow, max_leaves=10)
_FIELD_VALUES = st.dictionaries(
    st.sampled_from(("a", "b", "c")), _TEXTS | st.lists(_TEXTS, min_size=2, max_size=3)
)


@given(_SHAPES, _FIELD_VALUES)
def test_a_header_is_null_and_compares_as_a_text_field_does(
    shape: str, fields: dict[str, str | list[str]]
) -> None:
    """HEADER('a') over a record gives what /a gives over a document holding the same text (a
    repeated header as an array of texts): the same NULL rules, comparisons and keys."""
    on_doc = compile_expression(shape.replace("@", "/"))
    on_record = compile_expression(
        shape.replace("@a", "HEADER('a')").replace("@b", "HEADER('b')").replace("@c", "HEADER('c')")
    )
    headers = [
        (name, text.encode())
        for name, value in fields.items()
        for text in ([value] if isinstance(value, str) else value)
    ]
    record = Record(headers=headers)
    assert on_record.evaluate(None, 0.0, record) == on_doc.evaluate(fields, 0.0)
    assert on_record.matches(None, 0.0, record) == on_doc.matches(fields, 0.0)
    assert on_record.key(None, 0.0, record) == on_doc.key(fields, 0.0)
    assert on_record.priority(None, 0.0, record) == on_doc.priority(fields, 0.0)
