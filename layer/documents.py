"""How a queue reads the fields of its messages, for its expressions (filters, priorities...).

A ``json`` queue parses the payload as JSON; an ``avro`` queue decodes it with the writer schema
named in its config (schemaless Avro, as plain Kafka producers with a fixed schema write it).
Either way the result is a plain document of dicts, lists and scalars that ``layer.expr``
evaluates. A payload that does not decode yields no document and an error text; it is still
queued (its expressions see NULL) and the error travels with it to its dead letter.
"""

from __future__ import annotations

import io
import json
import threading
from collections import deque
from collections.abc import Callable
from functools import lru_cache
from itertools import chain, repeat
from operator import add
from pathlib import Path
from typing import Any, cast

import orjson
import simdjson

from layer.exceptions import SerializationError

__all__ = ["DocumentReader", "load_avro_schema"]


@lru_cache(maxsize=32)
def load_avro_schema(path: Path) -> Any:
    """The parsed Avro schema in ``path``; SerializationError says what is wrong with it."""
    # fastavro loads with the first avro queue: a config of json queues (and the CLI, and the
    # client) never needs it
    import fastavro

    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        return fastavro.parse_schema(raw)
    except OSError as exc:
        raise SerializationError(f"cannot read Avro schema {path}: {exc}") from exc
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise SerializationError(f"invalid Avro schema {path}: {exc}") from exc


#: brackets in a JSON payload from which ``DocumentReader.check`` asks the standard parser too
_DEEP = 256
#: what orjson makes of a JSON object or array (every other value it makes is a scalar)
_CONTAINERS = frozenset((dict, list))
_OBJECT_VALUES = cast(Callable[[Any], Any], dict.values)


class DocumentReader:
    """Decodes payloads of one message type into documents."""

    __slots__ = ("_avro", "message_type")

    def __init__(self, message_type: str, avro_schema: Path | None = None) -> None:
        self.message_type = message_type
        self._avro = load_avro_schema(avro_schema) if avro_schema is not None else None

    def read(self, value: bytes | None) -> tuple[Any, str | None]:
        """``(document, None)``, or ``(None, why)`` when the payload does not decode."""
        if value is None:
            return None, None
        if self.message_type == "json":
            try:
                return json.loads(value), None
            except (ValueError, UnicodeDecodeError) as exc:
                return None, f"unparseable json: {exc}"
            except RecursionError:  # valid JSON nested deeper than the parser goes
                return None, "unparseable json: nested too deep"
        if self._avro is not None:
            import fastavro  # loaded with the schema: a lookup in sys.modules

            buffer = io.BytesIO(value)
            try:
                doc = fastavro.schemaless_reader(buffer, self._avro, None)
            except Exception as exc:  # fastavro raises many types on bad bytes
                return None, f"unparseable avro: {type(exc).__name__}: {exc}"
            if buffer.tell() != len(value):
                return None, f"unparseable avro: {len(value) - buffer.tell()} trailing bytes"
            return doc, None
        return None, None

    def check(self, value: bytes | None) -> str | None:
        """``read(value)[1]`` without keeping the document, for a queue whose expressions read
        none: JSON is only checked (``orjson``, ~10x the standard parser), and parsed again by
        the standard parser only to word the error of one that fails (orjson is also stricter:
        NaN, integers past 64 bits, which the standard parser accepts, so it decides)."""
        if value is None or self.message_type != "json":
            return self.read(value)[1]
        try:
            orjson.loads(value)
        except orjson.JSONDecodeError:
            return self.read(value)[1]
        # orjson goes 1,024 levels deep, the standard parser as deep as Python's recursion
        # limit lets it (about 1,000 less the stack in use): a payload that could be nested
        # that deep is parsed by the standard parser, which decides, as for every other queue
        if value.count(b"[") + value.count(b"{") >= _DEEP:
            return self.read(value)[1]
        return None

    def check_all(self, values: list[bytes | None]) -> bool:
        """Whether ``check`` says None of every one of ``values`` (False: maybe not; ask
        ``check`` of each). Per batch, not per value: simdjson's parser is mapped over the
        batch in C, with no Python call per value, and builds no document (~0.2 µs a KiB,
        orjson ~0.7 µs: it builds one). A JSON queue's only; False for the others and for a
        tombstone (None) among the values.

        What simdjson accepts, the standard parser accepts (``check``'s judge; simdjson is
        stricter: integers past 64 bits, a lone surrogate, a float past the double range,
        all left to ``check``), but for depth: as ``check``, none may be nested as deep as
        the standard parser goes (``_DEEP``). A value shorter than ``2 * _DEEP`` bytes cannot
        be (each level opens and closes), nor one with no ``[`` and no ``{`` past its first
        byte (``bytes.find``: ~0.1 µs a KiB, where the bracket counts ``check`` makes cost
        0.8-1.2 µs), nor a JSON object whose values are all scalars (seen from its document
        as orjson makes it: ``dict.values`` and ``type`` mapped over the documents). Any
        other batch is counted as ``check`` counts."""
        if self.message_type != "json" or not values:
            return False
        checked = cast(list[bytes], values)
        try:
            deque(map(_simdjson_parser().parse, checked), maxlen=0)
            if max(map(len, checked)) < 2 * _DEEP:
                return True
        except Exception:  # noqa: BLE001 - rejected (or a tombstone): ``check`` decides, says why
            return False
        find = cast(Callable[..., int], bytes.find)
        if (
            max(map(find, checked, repeat(b"["))) < 0
            and max(map(find, checked, repeat(b"{"), repeat(1))) < 0
        ):
            return True
        # brackets somewhere: a batch of objects of scalars (brackets in strings only) still
        # passes from its documents as orjson makes them, with no pass over the bytes
        try:
            docs = map(cast(Callable[[bytes], Any], orjson.loads), checked)
            kinds = map(type, chain.from_iterable(map(_OBJECT_VALUES, docs)))
            if not any(map(_CONTAINERS.__contains__, kinds)):
                return True
        except (TypeError, orjson.JSONDecodeError):  # not an object (or orjson's stricter)
            pass
        count = cast(Callable[[bytes, bytes], int], bytes.count)
        brackets = map(add, map(count, checked, repeat(b"[")), map(count, checked, repeat(b"{")))
        return max(brackets) < _DEEP


_PARSERS = threading.local()
#: the largest payload the batch check parses (a larger one makes ``check_all`` say False, and
#: ``check`` decides): a simdjson parser keeps the buffers of the largest document it parsed,
#: ~14 times its size (a 10 MB one kept 137 MB), for as long as it lives
SIMDJSON_CAPACITY = 256 * 1024


def _simdjson_parser() -> simdjson.Parser:
    """This thread's simdjson parser: one may not parse while another thread's parse (or a
    document it made) uses it, and it keeps its buffers from one batch to the next (at most
    for a ``SIMDJSON_CAPACITY`` document)."""
    parser: simdjson.Parser | None = getattr(_PARSERS, "parser", None)
    if parser is None:
        parser = _PARSERS.parser = simdjson.Parser(max_capacity=SIMDJSON_CAPACITY)
    return parser
