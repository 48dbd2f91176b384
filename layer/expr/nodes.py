"""The syntax tree the parser builds and the compiler turns into closures.

Every node keeps ``pos`` (0-based offset of its first character, for error messages) and ``depth``
(1 for a leaf), so that the parser can refuse a too deeply nested expression while it builds it,
before anything recursive walks the tree.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "And",
    "Between",
    "Binary",
    "Call",
    "Compare",
    "Const",
    "In",
    "IsNull",
    "Like",
    "Node",
    "Not",
    "Or",
    "Path",
    "Unary",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Node:
    pos: int
    depth: int = 1


@dataclass(frozen=True, slots=True)
class Const(Node):
    """A literal, or a sub-expression folded at compile time. None is NULL."""

    value: object


@dataclass(frozen=True, slots=True)
class Path(Node):
    """``/a/b[0]``: field names (str) and 0-based array indexes (int), outermost first."""

    steps: tuple[str | int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Unary(Node):
    op: str  # "-" or "+"
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary(Node):
    op: str  # "+", "-", "*", "/", "%"
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare(Node):
    op: str  # "=", "!=", "<", "<=", ">", ">=" (the parser maps "==" and "<>")
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Like(Node):
    operand: Node
    pattern: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class In(Node):
    operand: Node
    items: tuple[Node, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Between(Node):
    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull(Node):
    operand: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class Not(Node):
    operand: Node


@dataclass(frozen=True, slots=True)
class And(Node):
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Or(Node):
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Call(Node):
    name: str  # upper case
    args: tuple[Node, ...]
