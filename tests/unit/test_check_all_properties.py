"""``DocumentReader.check_all`` against ``check`` on generated JSON: True only when ``check``
says None of every value, and True for any batch of objects of scalars."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from layer.documents import DocumentReader

READER = DocumentReader("json")

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='ab[{}]"\\ é', max_size=40)
)
_DOCS = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=20,
)
_FLAT = st.dictionaries(st.text(max_size=8), _SCALARS, max_size=6)
#: long enough (512 bytes and more) that ``check_all`` looks at the documents, not the length
_PAD = b" " * 600


def _value(doc: object, pad: bool, cut: int) -> bytes:
    data = json.dumps(doc).encode() + (_PAD if pad else b"")
    return data[:cut] if cut else data


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(_DOCS | _FLAT, st.booleans(), st.integers(min_value=0, max_value=3)),
        min_size=1,
        max_size=8,
    )
)
def test_check_all_true_only_when_check_says_none_of_each(
    batch: list[tuple[object, bool, int]],
) -> None:
    values: list[bytes | None] = [_value(*item) for item in batch]
    if READER.check_all(values):
        assert all(READER.check(value) is None for value in values)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_FLAT, st.booleans()), min_size=1, max_size=8))
def test_check_all_passes_objects_of_scalars(batch: list[tuple[object, bool]]) -> None:
    values: list[bytes | None] = [_value(doc, pad, 0) for doc, pad in batch]
    assert READER.check_all(values)


#: bytes where parsers tend to differ: brackets, quotes, escapes, numbers' parts, a BOM's
#: bytes, invalid UTF-8 and an encoded surrogate, control characters
_TRICKY = st.sampled_from(
    [
        b"[",
        b"]",
        b"{",
        b"}",
        b'"',
        b"\\",
        b"\\u",
        b"d800",
        b"e",
        b"-",
        b".",
        b"0",
        b"9" * 25,
        b"\xef\xbb\xbf",
        b"\xff",
        b"\xed\xa0\x80",
        b"\x00",
        b"\x1f",
        b"\t",
        b"NaN",
        b"Infinity",
        b"1e400",
        b",",
        b":",
        b" ",
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    _DOCS | _FLAT,
    st.booleans(),
    st.lists(st.tuples(st.integers(min_value=0), _TRICKY, st.booleans()), max_size=3),
)
def test_check_all_true_only_when_check_says_none_of_mutated_values(
    doc: object, pad: bool, edits: list[tuple[int, bytes, bool]]
) -> None:
    """Valid JSON with bytes put in or replaced: whatever the batch check lets through, the
    standard parser (``check``) accepts too."""
    value = _value(doc, pad, 0)
    for at, piece, overwrite in edits:
        at %= len(value) + 1
        value = value[:at] + piece + value[at + len(piece) * overwrite :]
    if READER.check_all([value]):
        assert READER.check(value) is None, value
    if READER.check_all([value, value]):
        assert READER.check(value) is None, value


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40))
def test_check_all_true_only_when_check_says_none_of_any_bytes(value: bytes) -> None:
    if READER.check_all([value]):
        assert READER.check(value) is None, value
