"""Text to syntax tree: a lark LALR grammar whose reductions build ``layer.expr.nodes`` directly.

The tree is built inside the parser (lark's ``transformer=`` for LALR), so no recursive walk over a
lark tree happens: a pathological nesting is refused by depth as soon as it is reduced. Lark's
errors are turned into ``ExpressionError`` with the column and what was expected, in words.

Lexical rules worth knowing:

- A field path is ``/`` then a name, repeated, each name optionally followed by ``[n]`` array
  indexes (0-based). A name is any run of characters other than whitespace, ``/ [ ] ( ) , ' "``
  and the operator characters ``= ! < > + * %``; ``-`` may appear in a name but not start it. So
  ``/order-id`` is one field and subtraction needs spaces: ``/a - /b``. Division too:
  ``/a / /b`` (``/a/b`` is the path a -> b).
- Strings are in single or double quotes. A backslash escapes the quote, ``\\\\``, ``\\n``,
  ``\\r``, ``\\t``, ``\\xHH`` and ``\\uHHHH``; any other backslash stays as written, so that
  regular expressions such as ``'^\\d+\\.\\d*$'`` read naturally. A doubled quote (``'it''s'``)
  is a quote too, as in SQL.
- Numbers: ``42``, ``4.2``, ``.5``, ``1e-3``. Keywords and function names are case-insensitive.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from lark import Lark, Token, Transformer
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from layer.exceptions import ExpressionError
from layer.expr import nodes
from layer.expr.functions import FUNCTIONS
from layer.expr.values import text_to_number

__all__ = ["MAX_DEPTH", "MAX_TEXT_BYTES", "parse"]

MAX_DEPTH = 100
MAX_TEXT_BYTES = 64 * 1024

# lark's /regexp/ literals need their slashes escaped
_NAME_CHAR = r"[^\s\/\[\]()',\"=!<>+*%]"
_NAME_FIRST = r"[^\s\/\[\]()',\"=!<>+*%\-]"
_STEP = rf"\/{_NAME_FIRST}{_NAME_CHAR}*(?:\[[0-9]+\])*"

GRAMMAR = rf"""
?start: or_expr

?or_expr: and_expr (_OR and_expr)*
?and_expr: not_expr (_AND not_expr)*
?not_expr: NOT not_expr -> not_
         | predicate

?predicate: sum
          | sum COMPARE sum                     -> compare
          | sum [NOT] LIKE sum                  -> like
          | sum [NOT] IN LPAR args RPAR         -> in_
          | sum [NOT] BETWEEN sum _AND sum      -> between
          | sum IS [NOT] NULL                   -> is_null

?sum: product
    | sum (PLUS | MINUS) product -> binary
?product: unary
        | product (STAR | SLASH | PERCENT) unary -> binary
?unary: atom
      | (MINUS | PLUS) unary -> unary

?atom: NUMBER                -> number
     | STRING                -> string
     | TRUE                  -> true
     | FALSE                 -> false
     | NULL                  -> null
     | PATH                  -> path
     | NAME LPAR [args] RPAR -> call
     | NAME                  -> bare_name
     | LPAR or_expr RPAR     -> group

args: or_expr (_COMMA or_expr)*

_OR: "or"i
_AND: "and"i
NOT: "not"i
LIKE: "like"i
IN: "in"i
BETWEEN: "between"i
IS: "is"i
NULL: "null"i
TRUE: "true"i
FALSE: "false"i
NAME: /[a-z_][a-z0-9_]*/i

COMPARE: /==|!=|<>|<=|>=|=|<|>/
PLUS: "+"
MINUS: "-"
STAR: "*"
SLASH: "/"
PERCENT: "%"
LPAR: "("
RPAR: ")"
_COMMA: ","

PATH: /(?:{_STEP})+/
NUMBER: /(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?/
STRING: /'(?:[^'\\]|\\.|'')*'/s | /"(?:[^"\\]|\\.|"")*"/s

%ignore /\s+/
"""

_COMPARE_OPS = {"==": "=", "<>": "!="}
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "r": "\r", "t": "\t"}
# one pass, left to right, so that an escape and a doubled quote never overlap
_UNQUOTE = {
    quote: re.compile(rf"\\(x[0-9a-fA-F]{{2}}|u[0-9a-fA-F]{{4}}|.)|{quote}{quote}", re.DOTALL)
    for quote in "'\""
}
_STEP_RE = re.compile(r"/([^/\[]+)|\[([0-9]+)\]")


class _Refused(Exception):
    """A semantic error found while building the tree; parse() adds the text."""

    def __init__(self, pos: int, reason: str, hint: str | None = None, kind: str = "") -> None:
        super().__init__(reason)
        self.pos, self.reason, self.hint, self.kind = pos, reason, hint, kind


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1)
    if code is None:  # a doubled quote
        return match.group(0)[0]
    if len(code) > 1:
        return chr(int(code[1:], 16))
    return _ESCAPES.get(code, match.group(0))


def _string_value(token: str) -> str:
    body = token[1:-1]
    return _UNQUOTE[token[0]].sub(_unescape, body)


def _node(
    cls: type[nodes.Node], pos: int, children: Sequence[nodes.Node], *fields: object
) -> nodes.Node:
    depth = 1 + max((child.depth for child in children), default=0)
    if depth > MAX_DEPTH:
        raise _Refused(pos, f"expression nested deeper than {MAX_DEPTH} levels")
    return cls(*fields, pos=pos, depth=depth)


class _Builder(Transformer[Token, nodes.Node]):
    """Called by the LALR parser at each reduction; stateless, so one parser serves all threads."""

    def number(self, children: list[Token]) -> nodes.Node:
        (token,) = children
        return nodes.Const(text_to_number(str(token)), pos=token.start_pos or 0)

    def string(self, children: list[Token]) -> nodes.Node:
        (token,) = children
        return nodes.Const(_string_value(str(token)), pos=token.start_pos or 0)

    def true(self, children: list[Token]) -> nodes.Node:
        return nodes.Const(True, pos=children[0].start_pos or 0)

    def false(self, children: list[Token]) -> nodes.Node:
        return nodes.Const(False, pos=children[0].start_pos or 0)

    def null(self, children: list[Token]) -> nodes.Node:
        return nodes.Const(None, pos=children[0].start_pos or 0)

    def path(self, children: list[Token]) -> nodes.Node:
        (token,) = children
        steps: list[str | int] = []
        for name, index in _STEP_RE.findall(str(token)):
            steps.append(name if name else int(index))
        return nodes.Path(tuple(steps), str(token), pos=token.start_pos or 0)

    def bare_name(self, children: list[Token]) -> nodes.Node:
        (token,) = children
        raise _Refused(token.start_pos or 0, str(token), kind="name")

    def call(self, children: list[object]) -> nodes.Node:
        name_token, _, args, _ = children
        assert isinstance(name_token, Token)
        name = str(name_token).upper()
        pos = name_token.start_pos or 0
        arguments: tuple[nodes.Node, ...] = tuple(args) if isinstance(args, list) else ()
        function = FUNCTIONS.get(name)
        if function is None:
            raise _Refused(
                pos, f"unknown function {name_token!s}", f"known functions: {', '.join(FUNCTIONS)}"
            )
        if not function.min_args <= len(arguments) <= function.max_args:
            takes = _takes(function.min_args, function.max_args)
            raise _Refused(pos, f"{name} {takes} but was given {len(arguments)}")
        return _node(nodes.Call, pos, arguments, name, arguments)

    def args(self, children: list[nodes.Node]) -> list[nodes.Node]:
        return children

    def group(self, children: list[object]) -> nodes.Node:
        inner = children[1]
        assert isinstance(inner, nodes.Node)
        return inner

    def unary(self, children: list[object]) -> nodes.Node:
        sign, operand = children
        assert isinstance(sign, Token) and isinstance(operand, nodes.Node)
        return _node(nodes.Unary, sign.start_pos or 0, [operand], str(sign), operand)

    def binary(self, children: list[object]) -> nodes.Node:
        left, op, right = children
        assert isinstance(left, nodes.Node) and isinstance(right, nodes.Node)
        return _node(nodes.Binary, left.pos, [left, right], str(op), left, right)

    def compare(self, children: list[object]) -> nodes.Node:
        left, op, right = children
        assert isinstance(left, nodes.Node) and isinstance(right, nodes.Node)
        symbol = _COMPARE_OPS.get(str(op), str(op))
        return _node(nodes.Compare, left.pos, [left, right], symbol, left, right)

    def like(self, children: list[object]) -> nodes.Node:
        operand, negated, _, pattern = children
        assert isinstance(operand, nodes.Node) and isinstance(pattern, nodes.Node)
        return _node(
            nodes.Like, operand.pos, [operand, pattern], operand, pattern, negated is not None
        )

    def in_(self, children: list[object]) -> nodes.Node:
        operand, negated, _, _, items, _ = children
        assert isinstance(operand, nodes.Node) and isinstance(items, list)
        return _node(
            nodes.In, operand.pos, [operand, *items], operand, tuple(items), negated is not None
        )

    def between(self, children: list[object]) -> nodes.Node:
        operand, negated, _, low, high = children
        assert isinstance(operand, nodes.Node)
        assert isinstance(low, nodes.Node) and isinstance(high, nodes.Node)
        return _node(
            nodes.Between,
            operand.pos,
            [operand, low, high],
            operand,
            low,
            high,
            negated is not None,
        )

    def is_null(self, children: list[object]) -> nodes.Node:
        operand, _, negated, _ = children
        assert isinstance(operand, nodes.Node)
        return _node(nodes.IsNull, operand.pos, [operand], operand, negated is not None)

    def not_(self, children: list[object]) -> nodes.Node:
        token, operand = children
        assert isinstance(token, Token) and isinstance(operand, nodes.Node)
        return _node(nodes.Not, token.start_pos or 0, [operand], operand)

    def and_expr(self, children: list[nodes.Node]) -> nodes.Node:
        return _node(nodes.And, children[0].pos, children, tuple(children))

    def or_expr(self, children: list[nodes.Node]) -> nodes.Node:
        return _node(nodes.Or, children[0].pos, children, tuple(children))


def _takes(low: int, high: int) -> str:
    if low == high:
        return f"takes {low} argument{'' if low == 1 else 's'}"
    if high >= 255:
        return f"takes at least {low} argument{'' if low == 1 else 's'}"
    return f"takes {low} to {high} arguments"


def _first_char_past_limit(text: str) -> int:
    """The column of the first character that does not fit in MAX_TEXT_BYTES of UTF-8."""
    encoded = text.encode("utf-8", "surrogatepass")[:MAX_TEXT_BYTES]
    for trim in range(4):  # a UTF-8 sequence is at most 4 bytes: drop a cut one
        try:
            return len(encoded[: len(encoded) - trim].decode("utf-8", "surrogatepass")) + 1
        except UnicodeDecodeError:
            continue
    return 1  # not reached: one of the four cuts ends on a character boundary


@functools.cache
def _parser() -> Lark:
    # Built once: the grammar is a constant and building the LALR tables takes tens of ms.
    return Lark(
        GRAMMAR, parser="lalr", lexer="contextual", transformer=_Builder(), maybe_placeholders=True
    )


def parse(text: str) -> nodes.Node:
    """The syntax tree of ``text``; ``ExpressionError`` if it is not a valid expression."""
    if len(text) > MAX_TEXT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_TEXT_BYTES:
        raise ExpressionError(
            text, _first_char_past_limit(text), f"expression longer than {MAX_TEXT_BYTES} bytes"
        )
    if not text.strip():
        raise ExpressionError(text, 1, "empty expression", "expected a filter such as /price > 100")
    parser = _parser()
    try:
        tree = parser.parse(text)
    except _Refused as exc:
        if exc.kind == "name":
            raise _name_error(text, exc) from None
        raise ExpressionError(text, exc.pos + 1, exc.reason, exc.hint) from None
    except UnexpectedInput as exc:
        raise _syntax_error(text, exc) from None
    except LarkError as exc:  # anything else lark reports is still a bad expression
        raise ExpressionError(text, 1, f"cannot parse: {exc}") from None
    assert isinstance(tree, nodes.Node)
    return tree


# What the parser expected, in words, in the order a message lists them.
_VALUE_START = frozenset({"PATH", "NUMBER", "STRING"})
_OPERATORS = frozenset({"COMPARE", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "_OR", "IS"})
_EXPECTED_WORDS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"RPAR"}), "')'"),
    (frozenset({"_COMMA"}), "','"),
    (frozenset({"LPAR"}), "'('"),
    (
        frozenset({"COMPARE", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "_OR", "IS"}),
        "an operator",
    ),
    (frozenset({"LIKE", "IN", "BETWEEN"}), "LIKE, IN or BETWEEN"),
    (frozenset({"_AND"}), "AND"),
    (frozenset({"NULL"}), "NULL"),
    (frozenset({"$END"}), "the end of the expression"),
)
_KEYWORDS = frozenset({"AND", "OR", "NOT", "LIKE", "IN", "BETWEEN", "IS", "NULL", "TRUE", "FALSE"})


def _expected_words(expected: set[str]) -> str | None:
    if expected & _VALUE_START:
        # '(', unary signs and NOT also start a value; naming them would only confuse
        return (
            "expected a value: a /field/path, a number, a 'string', TRUE, FALSE, NULL or a function"
        )
    # "an operator" covers AND where OR also fits, and LIKE/IN/BETWEEN where a comparison does;
    # alone (after BETWEEN x, after NOT) they are worth naming
    if "_OR" in expected:
        expected = expected - {"_AND"}
    if "COMPARE" in expected:
        expected = expected - {"LIKE", "IN", "BETWEEN"}
    words = [word for names, word in _EXPECTED_WORDS if expected & names]
    if not words:
        return None
    return "expected " + (
        words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]
    )


def _acceptable(exc: UnexpectedToken) -> set[str]:
    # LALR merges states, so exc.expected may list tokens that only fit in another context (a ')'
    # at the top level); feeding each candidate to a copy of the parser tells exactly.
    try:
        if exc.interactive_parser is not None:
            return set(exc.interactive_parser.accepts())
    except Exception:  # noqa: S110 - only a better message is lost
        pass
    return set(exc.expected)


def _open_parens(text: str, end: int) -> int:
    """How many '(' are open before ``end``, not counting any inside strings."""
    depth = 0
    quote = ""
    escaped = False
    for char in text[:end]:
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
    return depth


def _describe(token: Token) -> str:
    kind = token.type
    if kind == "PATH":
        return f"field path {token}"
    if kind == "NUMBER":
        return f"number {token}"
    if kind == "STRING":
        return f"string {token}"
    if kind == "NAME":
        return f"name {token}"
    if kind in ("COMPARE", "PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "LPAR", "RPAR", "_COMMA"):
        return f"'{token}'"
    return str(token).upper()  # a keyword


def _syntax_error(text: str, exc: UnexpectedInput) -> ExpressionError:
    if isinstance(exc, UnexpectedToken):
        token = exc.token
        expected = _expected_words(_acceptable(exc))
        if token.type == "$END":
            return ExpressionError(text, len(text) + 1, "unexpected end of expression", expected)
        start = token.start_pos or 0
        if token.type == "RPAR" and _open_parens(text, start) <= 0:
            return ExpressionError(text, start + 1, "unexpected ')' without a matching '('")
        if token.type == "COMPARE":
            expected = "comparisons do not chain: join them with AND"
        return ExpressionError(text, start + 1, f"unexpected {_describe(token)}", expected)
    if isinstance(exc, UnexpectedCharacters):
        char = exc.char
        position = (exc.pos_in_stream or 0) + 1
        if char in "'\"":
            return ExpressionError(
                text, position, "unterminated string", f"expected a closing {char}"
            )
        if char == "!":
            return ExpressionError(text, position, "unexpected '!'", "did you mean != or NOT?")
        return ExpressionError(text, position, f"unexpected character {char!r}")
    return ExpressionError(text, 1, f"cannot parse: {exc}")


def _name_error(text: str, exc: _Refused) -> ExpressionError:
    """A bare name: a keyword out of place, a path split by a space, or a missing '/'."""
    name = exc.reason
    if name.upper() in _KEYWORDS:
        return ExpressionError(
            text, exc.pos + 1, f"unexpected {name.upper()}", _expected_words(set(_VALUE_START))
        )
    if exc.pos > 0 and text[exc.pos - 1] == "/":
        return ExpressionError(
            text,
            exc.pos,
            f"unexpected field path /{name}",
            "expected an operator (to divide, put spaces around '/': /a / /b)",
        )
    return ExpressionError(
        text,
        exc.pos + 1,
        f"unknown name {name}",
        f"a field path starts with '/', as in /{name}; a function call needs (...)",
    )
