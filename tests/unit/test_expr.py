"""The expression language: every operator and function, NULL semantics, errors with columns."""

from __future__ import annotations

import math
import pickle

import pytest

from layer.exceptions import ExpressionError, InvalidRequest, QLayerError
from layer.expr import Expression, compile_expression

DOC: dict[str, object] = {
    "symbol": "IBM",
    "qty": 150,
    "price": 10.5,
    "text_qty": "150",
    "padded": " 42 ",
    "word": "abc",
    "empty": "",
    "flag": True,
    "off": False,
    "nothing": None,
    "blob": b"\x00\x01",
    "order": {"qty": 7, "side": "buy", "legs": [{"px": 1.25}, {"px": 2}]},
    "items": [{"qty": 3}, {"qty": "4"}, 5],
    "matrix": [[1, 2], [3, 4]],
    "order-id": "A-1",
    "$meta": 1,
    "a.b": "dotted",
    "pattern": "^I",
    "bad_pattern": "(",
    "big": 10**300,
}


def value(text: str, doc: object = DOC, now: float | None = 1_000.0) -> object:
    return compile_expression(text).evaluate(doc, now)


def same(got: object, want: object) -> bool:
    """Equal and of the same type (True is not 1 here), NaN equal to NaN."""
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return type(got) is type(want) and got == want


LITERALS = [
    ("42", 42),
    ("4.25", 4.25),
    (".5", 0.5),
    ("5.", 5.0),
    ("1e3", 1000.0),
    ("2.5E-1", 0.25),
    ("'plain'", "plain"),
    ("''", ""),
    ('"double"', "double"),
    ("'it''s'", "it's"),
    ('"say ""hi"""', 'say "hi"'),
    (r"'it\'s'", "it's"),
    (r"'back\\slash'", "back\\slash"),
    (r"'tab\there'", "tab\there"),
    (r"'\x41\u00e9'", "Aé"),
    (r"'\d+\.\d*'", r"\d+\.\d*"),  # other backslashes stay, for regular expressions
    ("TRUE", True),
    ("false", False),
    ("Null", None),
]

ARITHMETIC = [
    ("1 + 2", 3),
    ("7 - 10", -3),
    ("6 * 7", 42),
    ("7 / 2", 3.5),
    ("6 / 3", 2.0),
    ("7 % 3", 1),
    ("-7 % 3", -1),  # the remainder has the dividend's sign
    ("7 % -3", 1),
    ("7.5 % 2", 1.5),
    ("1 / 0", None),
    ("1 % 0", None),
    ("1.5 / 0.0", None),
    ("2 + 3 * 4", 14),
    ("(2 + 3) * 4", 20),
    ("10 - 4 - 3", 3),
    ("100 / 10 / 5", 2.0),
    ("2 * 3 % 4", 2),
    ("-2 * 3", -6),
    ("- - 2", 2),
    ("+'5'", 5),
    ("-'x'", None),
    ("-/qty", -150),
    ("'3' + 4", 7),
    ("'3' + '4'", 7),  # numeric strings are numbers in arithmetic
    ("/text_qty * 2", 300),
    ("/padded + 0", 42),
    ("'a' + 'b'", None),  # no string concatenation in AMPS
    ("'abc' * 2", None),
    ("TRUE + 1", None),
    ("NULL + 1", None),
    ("/missing * 2", None),
    ("/blob + 1", None),
    ("/order + 1", None),
    ("/price * /qty", 1575.0),
    ("/big * /big", math.inf),  # integers past the float range become infinite
    ("-/big * /big", -math.inf),
]

COMPARISONS = [
    ("1 = 1.0", True),
    ("/qty = 150", True),
    ("/qty == 150", True),
    ("/qty != 150", False),
    ("/qty <> 151", True),
    ("/qty > 100", True),
    ("/qty >= 150", True),
    ("/qty < 150", False),
    ("/qty <= 149", False),
    ("100 < /qty", True),
    ("/price > 10", True),
    ("/text_qty = 150", True),  # numeric string and number
    ("150 = /text_qty", True),
    ("/text_qty > 99.5", True),
    ("/padded = 42", True),
    ("/word < 5", None),  # not a numeric string
    ("/word = 5", None),
    ("'10' = '10.0'", False),  # two strings compare as strings
    ("'b' > 'a'", True),
    ("'B' = 'b'", False),
    ("/symbol = 'IBM'", True),
    ("'IBM' = /symbol", True),
    ("/symbol = 'ibm'", False),
    ("/flag = TRUE", True),
    ("/off = FALSE", True),
    ("/flag = 1", None),  # booleans compare only with booleans
    ("/flag = 'true'", None),
    ("FALSE < TRUE", True),
    ("NULL = NULL", None),
    ("/missing = 1", None),
    ("/nothing != 1", None),
    ("/blob = 'x'", None),
    ("/order = 1", None),
    ("/items = 1", None),
    ("/qty = /text_qty", True),
    ("/symbol = /word", False),
    ("/word > /qty", None),
]

LOGIC = [
    ("TRUE AND TRUE", True),
    ("TRUE AND FALSE", False),
    ("TRUE AND NULL", None),
    ("NULL AND FALSE", False),
    ("FALSE AND NULL", False),
    ("NULL AND NULL", None),
    ("TRUE OR FALSE", True),
    ("NULL OR TRUE", True),
    ("TRUE OR NULL", True),
    ("NULL OR FALSE", None),
    ("FALSE OR FALSE", False),
    ("NOT TRUE", False),
    ("NOT FALSE", True),
    ("NOT NULL", None),
    ("NOT /missing", None),
    ("NOT 5", None),  # a non-boolean is unknown, not truthy
    ("1 AND TRUE", None),
    ("'x' OR FALSE", None),
    ("/flag AND /qty > 1", True),
    ("/missing > 1 AND /qty > 1", None),
    ("/missing > 1 OR /qty > 1", True),
    ("/missing > 1 AND /qty < 1", False),
    ("/flag AND /flag AND /off", False),
    ("/flag OR /missing OR /off", True),
    ("/missing OR /off OR /nothing", None),
    ("/flag AND NULL AND /flag", None),
    ("/flag OR NULL", True),
    ("/off OR NULL", None),
    ("/flag AND TRUE", True),
    ("/qty AND TRUE", None),
]

PREDICATES = [
    ("/symbol LIKE 'B'", True),  # a search, not anchored
    ("/symbol LIKE '^B'", False),
    ("/symbol LIKE '^I.M$'", True),
    ("/symbol NOT LIKE 'X'", True),
    ("/symbol not like 'I'", False),
    ("/symbol LIKE '(?i)ibm'", True),
    ("/a.b LIKE 'dot'", True),
    (r"'a.c' LIKE '^a\.c$'", True),
    (r"'abc' LIKE '^a\.c$'", False),
    ("/qty LIKE '1'", None),  # LIKE is for strings
    ("/missing LIKE 'a'", None),
    ("/missing NOT LIKE 'a'", None),
    ("/symbol LIKE NULL", None),
    ("/symbol LIKE /pattern", True),
    ("/symbol LIKE /bad_pattern", None),  # a bad pattern from the document is NULL
    ("/symbol LIKE /missing", None),
    ("/qty IN (1, 150)", True),
    ("/qty IN (1, 2)", False),
    ("/qty NOT IN (1, 2)", True),
    ("/qty NOT IN (150)", False),
    ("/qty IN (1, NULL)", None),
    ("/qty IN (150, NULL)", True),
    ("/qty NOT IN (1, NULL)", None),
    ("/qty IN (150.0)", True),
    ("/qty IN ('150')", True),
    ("/qty IN ('x')", None),
    ("/qty IN ('x', 150)", True),
    ("/qty IN (TRUE)", None),
    ("/text_qty IN (150)", True),
    ("/text_qty IN ('150.0')", False),
    ("/word IN (1)", None),
    ("/word IN ('abc', 1)", True),
    ("/symbol IN ('IBM', 'MSFT')", True),
    ("/symbol IN ('MSFT', 'AAPL')", False),
    ("/flag IN (TRUE)", True),
    ("/flag IN (FALSE)", False),
    ("/flag IN (1)", None),
    ("/missing IN (1, 2)", None),
    ("/missing NOT IN (1, 2)", None),
    ("/qty IN (/qty, 1)", True),
    ("/qty IN (/missing, 1)", None),
    ("/qty IN (/missing, 150)", True),
    ("/qty IN (1 + 149)", True),
    ("/qty BETWEEN 100 AND 200", True),
    ("/qty BETWEEN 150 AND 150", True),
    ("/qty BETWEEN 151 AND 200", False),
    ("/qty NOT BETWEEN 151 AND 200", True),
    ("/qty NOT BETWEEN 100 AND 200", False),
    ("/qty BETWEEN NULL AND 200", None),
    ("/qty BETWEEN 200 AND NULL", False),
    ("/qty BETWEEN '100' AND '200'", True),
    ("/text_qty BETWEEN 100 AND 200", True),
    ("/symbol BETWEEN 'A' AND 'J'", True),
    ("/word BETWEEN 1 AND 2", None),
    ("/missing BETWEEN 1 AND 2", None),
    ("/qty BETWEEN /order/qty AND /qty", True),
    ("/qty BETWEEN 1 AND 2 AND TRUE", False),
    ("/missing IS NULL", True),
    ("/nothing IS NULL", True),
    ("/qty IS NULL", False),
    ("/qty IS NOT NULL", True),
    ("/missing is not null", False),
    ("/blob IS NULL", False),  # bytes are NULL to operators, but the field is there
    ("/blob IS NOT NULL", True),
    ("NULL IS NULL", True),
    ("/qty / 0 IS NULL", True),
    ("/order IS NULL", False),
]

PATHS = [
    ("/order/qty", 7),
    ("/order/side", "buy"),
    ("/order/legs[0]/px", 1.25),
    ("/order/legs[1]/px * 2", 4),
    ("/items[0]/qty", 3),  # indexes are 0-based
    ("/items[1]/qty", "4"),
    ("/items[1]/qty + 1", 5),
    ("/items[2]", 5),
    ("/items[3]", None),  # out of range
    ("/items[2]/qty", None),  # through a number
    ("/items/qty", None),  # through an array without an index
    ("/symbol/x", None),  # through a string
    ("/symbol[0]", None),  # strings are not arrays
    ("/order[0]", None),  # objects are not arrays
    ("/matrix[1][0]", 3),
    ("/order", None),  # an object is no value (key() has it)
    ("/items", None),
    ("/order-id", "A-1"),
    ("/$meta", 1),
    ("/a.b", "dotted"),
    ("/missing/deeper/still", None),
    ("/nothing/x", None),
    ("/blob", None),
]

FUNCTIONS = [
    ("UPPER(/symbol)", "IBM"),
    ("upper('abc')", "ABC"),
    ("Lower(/symbol)", "ibm"),
    ("UPPER(5)", None),
    ("UPPER(NULL)", None),
    ("LENGTH('abc')", 3),
    ("LENGTH(/empty)", 0),
    ("LENGTH(5)", None),
    ("LENGTH(/missing)", None),
    ("COALESCE(/missing, 'x')", "x"),
    ("COALESCE(/symbol, 'x')", "IBM"),
    ("COALESCE(/missing, /nothing)", None),
    ("COALESCE(/blob, 1)", 1),
    ("COALESCE(NULL, /qty, 1)", 150),
    ("COALESCE(/missing)", None),
    ("ABS(-3)", 3),
    ("ABS(2.5)", 2.5),
    ("ABS('-2.5')", 2.5),
    ("ABS('x')", None),
    ("ABS(TRUE)", None),
    ("ROUND(2.5)", 3),
    ("ROUND(-2.5)", -3),  # half away from zero
    ("ROUND(2.4)", 2),
    ("ROUND(7)", 7),
    ("ROUND('2.5')", 3),
    ("ROUND(2.675, 2)", 2.68),  # as written, not as the binary float
    ("ROUND(2.5, 0)", 3.0),
    ("ROUND(1250, -2)", 1300),
    ("ROUND(-1250, -2)", -1300),
    ("ROUND(1249, -2)", 1200),
    ("ROUND(5, -1000000)", 0),
    ("ROUND(1.5, 1000000)", 1.5),
    ("ROUND(1.5, 'x')", None),
    ("ROUND(1.5, 1.5)", None),
    ("ROUND(1.5, NULL)", None),
    ("ROUND(NULL)", None),
    ("NOW()", 1_000.0),
    ("NOW() - 100", 900.0),
    ("now() > 999", True),
]

PRECEDENCE = [
    ("TRUE OR FALSE AND FALSE", True),  # AND before OR
    ("(TRUE OR FALSE) AND FALSE", False),
    ("NOT FALSE AND FALSE", False),  # NOT before AND
    ("NOT (FALSE AND FALSE)", True),
    ("NOT 1 = 2", True),  # comparison before NOT
    ("1 + 2 = 3", True),  # arithmetic before comparison
    ("-2 + 3", 1),
    ("2 * -3", -6),
    ("1 + 2 * 3 - 4 / 2", 5.0),
    ("1 = 1 OR 1 / 0 = 1", True),
    ("/qty BETWEEN 100 + 1 AND 2 * 100", True),
    ("/qty IN (149 + 1) AND NOT /off", True),
    ("((((/qty))))", 150),
]

CASES = LITERALS + ARITHMETIC + COMPARISONS + LOGIC + PREDICATES + PATHS + FUNCTIONS + PRECEDENCE


@pytest.mark.parametrize(("text", "want"), CASES, ids=[c[0] for c in CASES])
def test_evaluate(text: str, want: object) -> None:
    got = value(text)
    assert same(got, want), f"{text} gave {got!r}, expected {want!r}"


@pytest.mark.parametrize(
    "text",
    [
        "/symbol = 'IBM' and /qty > 100",
        "/SYMBOL = 'IBM' AND /QTY > 100",  # paths are case-sensitive: NULL AND NULL
        "/symbol = 'IBM' AnD /qty BeTwEeN 100 aNd 200",
        "/symbol iN ('IBM') oR fAlSe",
        "NoT /off",
        "/nothing Is NuLl",
        "/symbol nOt LiKe 'x'",
        "lOwEr(/symbol) = 'ibm'",
        "CoAlEsCe(/missing, TrUe)",
    ],
)
def test_keywords_and_functions_are_case_insensitive(text: str) -> None:
    want = "SYMBOL" not in text
    assert compile_expression(text).matches(DOC) is want


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("TRUE", True),
        ("FALSE", False),
        ("NULL", False),
        ("1", False),
        ("'true'", False),
        ("/flag", True),
        ("/missing = 1", False),
        ("NOT (/missing = 1)", False),  # neither the filter nor its negation matches NULL
        ("/symbol = 'IBM' AND /qty > 100", True),
    ],
)
def test_matches_only_boolean_true(text: str, want: bool) -> None:
    assert compile_expression(text).matches(DOC) is want


def test_evaluate_never_raises_on_odd_documents() -> None:
    expression = compile_expression("/a/b[0] * 2 > 1 OR UPPER(/a) LIKE 'X' OR /a IN (1, 'x')")
    for doc in (None, 5, "text", b"raw", [1, 2], {"a": None}, {"a": [1]}, {"a": {"b": "x"}}):
        assert expression.evaluate(doc) is None
        assert expression.matches(doc) is False
        assert expression.priority(doc) is None


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        ({"p": 5}, 5),
        ({"p": -5}, 0),
        ({"p": 2**70}, 2**64 - 1),
        ({"p": 2**64 - 1}, 2**64 - 1),
        ({"p": 3.9}, 3),
        ({"p": -0.5}, 0),
        ({"p": "42"}, 42),
        ({"p": " 7.9 "}, 7),
        ({"p": "-3"}, 0),
        ({"p": "1e30"}, 2**64 - 1),
        ({"p": "abc"}, None),
        ({"p": None}, None),
        ({}, None),
        ({"p": True}, None),
        ({"p": b"1"}, None),
        ({"p": [1]}, None),
        ({"p": math.nan}, None),
        ({"p": math.inf}, 2**64 - 1),
        ({"p": -math.inf}, 0),
    ],
)
def test_priority_truncates_and_clamps(doc: dict[str, object], want: int | None) -> None:
    got = compile_expression("/p").priority(doc)
    assert got == want and type(got) is type(want)


def test_priority_of_the_amps_guide_example() -> None:
    # 10.5 * 3 = 31.5: the priority is its integer part
    assert compile_expression("/price * /qty").priority({"price": 10.5, "qty": 3}) == 31


@pytest.mark.parametrize(
    ("doc", "want"),
    [
        ({"k": "A"}, "A"),
        ({"k": 7}, 7),
        ({"k": 7.5}, 7.5),
        ({"k": True}, True),
        ({"k": None}, None),
        ({}, None),
        ({"k": b"\x00"}, None),
        ({"k": math.nan}, None),
        ({"k": [1, "a", None]}, '[1,"a",null]'),
        ({"k": {"b": 2, "a": [1]}}, '{"a":[1],"b":2}'),
        ({"k": {"a": [1], "b": 2}}, '{"a":[1],"b":2}'),  # key order does not matter
        ({"k": [b"\x01"]}, '[{"$bytes":"01"}]'),
    ],
)
def test_key(doc: dict[str, object], want: object) -> None:
    got = compile_expression("/k").key(doc)
    assert got == want and type(got) is type(want)
    hash(got)


def test_key_of_an_expression() -> None:
    key = compile_expression("COALESCE(/group, UPPER(/symbol))")
    assert key.key({"symbol": "ibm"}) == "IBM"
    assert key.key({"group": 3, "symbol": "ibm"}) == 3


def test_now_is_read_once_per_call_when_not_given() -> None:
    expression = compile_expression("NOW() = NOW() AND NOW() > 1600000000")
    assert expression.matches({}) is True
    assert expression.matches({}, now=5.0) is False


def test_expressions_compare_by_text() -> None:
    a, b = compile_expression("/a = 1"), compile_expression("/a = 1")
    assert a == b and hash(a) == hash(b) and a != compile_expression("/a = 2")
    assert repr(a) == "Expression('/a = 1')" and a.text == "/a = 1"
    assert isinstance(a, Expression)


# -- errors --------------------------------------------------------------------------------------

ERRORS = [
    (
        "/a > ",
        6,
        'expression "/a > " : unexpected end of expression at column 6; expected a value: a '
        "/field/path, a number, a 'string', TRUE, FALSE, NULL or a function",
    ),
    (
        "(/a > 1",
        8,
        "expression \"(/a > 1\" : unexpected end of expression at column 8; expected ')'",
    ),
    (
        "/a > 1)",
        7,
        "expression \"/a > 1)\" : unexpected ')' without a matching '(' at column 7",
    ),
    (
        "(/a > (1 + 2)",
        14,
        "expression \"(/a > (1 + 2)\" : unexpected end of expression at column 14; expected ')'",
    ),
    (
        "/a > 1 AND",
        11,
        'expression "/a > 1 AND" : unexpected end of expression at column 11; expected a value: '
        "a /field/path, a number, a 'string', TRUE, FALSE, NULL or a function",
    ),
    (
        "/a > foo(1)",
        6,
        'expression "/a > foo(1)" : unknown function foo at column 6; '
        "known functions: ABS, COALESCE, HEADER, KEY, LENGTH, LOWER, NOW, PARTITION, ROUND, "
        "TIMESTAMP, TOPIC, UPPER",
    ),
    (
        "UPPER(/a, 1) = 'X'",
        1,
        "expression \"UPPER(/a, 1) = 'X'\" : UPPER takes 1 argument but was given 2 at column 1",
    ),
    ("NOW(1)", 1, 'expression "NOW(1)" : NOW takes 0 arguments but was given 1 at column 1'),
    (
        "/a LIKE 'x(y'",
        11,
        "expression \"/a LIKE 'x(y'\" : invalid regular expression 'x(y': "
        "missing ), unterminated subpattern at column 11",
    ),
    (
        "/a LIKE '[a-' OR TRUE",
        10,
        "expression \"/a LIKE '[a-' OR TRUE\" : invalid regular expression '[a-': "
        "unterminated character set at column 10",
    ),
    (
        "",
        1,
        'expression "" : empty expression at column 1; expected a filter such as /price > 100',
    ),
    (
        "   ",
        1,
        'expression "   " : empty expression at column 1; expected a filter such as /price > 100',
    ),
    (
        "/a = 'abc",
        6,
        "expression \"/a = 'abc\" : unterminated string at column 6; expected a closing '",
    ),
    (
        "price > 1",
        1,
        'expression "price > 1" : unknown name price at column 1; a field path starts with '
        "'/', as in /price; a function call needs (...)",
    ),
    (
        "/a /b",
        4,
        'expression "/a /b" : unexpected field path /b at column 4; expected an operator '
        "(to divide, put spaces around '/': /a / /b)",
    ),
    ("/a # 1", 4, "expression \"/a # 1\" : unexpected character '#' at column 4"),
    (
        "/a ! 1",
        4,
        "expression \"/a ! 1\" : unexpected '!' at column 4; did you mean != or NOT?",
    ),
    (
        "/a > 1 < 2",
        8,
        "expression \"/a > 1 < 2\" : unexpected '<' at column 8; comparisons do not chain: "
        "join them with AND",
    ),
    (
        "/a AND AND /b",
        8,
        'expression "/a AND AND /b" : unexpected AND at column 8; expected a value: a '
        "/field/path, a number, a 'string', TRUE, FALSE, NULL or a function",
    ),
    (
        "/a BETWEEN 1",
        13,
        'expression "/a BETWEEN 1" : unexpected end of expression at column 13; '
        "expected an operator or AND",
    ),
    (
        "/a IS NOT",
        10,
        'expression "/a IS NOT" : unexpected end of expression at column 10; expected NULL',
    ),
    (
        "/a NOT 5",
        8,
        'expression "/a NOT 5" : unexpected number 5 at column 8; expected LIKE, IN or BETWEEN',
    ),
    (
        "/a IN ()",
        8,
        "expression \"/a IN ()\" : unexpected ')' at column 8; expected a value: a /field/path, "
        "a number, a 'string', TRUE, FALSE, NULL or a function",
    ),
    (
        "/a 5",
        4,
        'expression "/a 5" : unexpected number 5 at column 4; expected an operator or the end '
        "of the expression",
    ),
]


@pytest.mark.parametrize(("text", "position", "message"), ERRORS, ids=[e[0] for e in ERRORS])
def test_errors_name_the_column(text: str, position: int, message: str) -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_expression(text)
    error = caught.value
    assert str(error) == message
    assert (error.text, error.position) == (text, position)
    assert error.reason and f"{error.reason} at column {position}" in message


def test_nesting_is_bounded() -> None:
    compile_expression("-" * 99 + "1")
    with pytest.raises(ExpressionError, match="nested deeper than 100 levels at column"):
        compile_expression("-" * 100 + "1")
    with pytest.raises(ExpressionError, match="nested deeper than 100 levels"):
        compile_expression("NOT " * 150 + "TRUE")
    # parentheses alone add no level, and flat AND/OR chains stay shallow
    assert compile_expression("(" * 5000 + "1" + ")" * 5000).evaluate({}) == 1
    assert compile_expression(" OR ".join(["/a = 1"] * 2000)).matches({"a": 1})


def test_long_text_is_refused() -> None:
    text = "/a = '" + "x" * 70_000 + "'"
    with pytest.raises(ExpressionError, match="longer than 65536 bytes at column 65537") as caught:
        compile_expression(text)
    assert caught.value.position == 65_537
    assert len(str(caught.value)) < 300  # the message shows only the start of the text
    compile_expression("/a = '" + "x" * 60_000 + "'")


def test_expression_error_is_an_invalid_request() -> None:
    with pytest.raises(ExpressionError) as caught:
        compile_expression("/a >")
    error = caught.value
    assert isinstance(error, InvalidRequest) and isinstance(error, QLayerError)
    assert (error.position, error.reason) == (5, "unexpected end of expression")
    assert error.hint and error.hint.startswith("expected a value")
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.text, copy.position) == (str(error), error.text, error.position)
    assert str(ExpressionError()) == "The expression is invalid."


def test_non_text_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        compile_expression(b"/a = 1")  # type: ignore[arg-type]


def test_constant_regex_error_after_folding_points_at_the_pattern() -> None:
    with pytest.raises(ExpressionError, match=r"invalid regular expression '\(': .* at column 10"):
        compile_expression("/ab LIKE LOWER('(')")
    with pytest.raises(ExpressionError, match=r"unbalanced parenthesis at column 9"):
        compile_expression(r"/a LIKE '\x29'")  # escaped: the column is the literal's
