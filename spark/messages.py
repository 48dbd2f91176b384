"""The ``message`` column: a queue's payload parsed as its queue reads it.

- ``json`` queues: ``from_json`` with the schema given (a ``StructType`` or a DDL string such as
  ``"symbol STRING, qty INT, price DOUBLE"``), or without one to ``map<string,string>`` (nested
  values as JSON text). A payload that does not parse gives NULL.
- ``avro`` queues: decoded in Python with the queue's ``avro_schema`` (schemaless Avro, as the
  coordinator reads it) to a struct whose type follows the Avro schema; a ``schema`` given picks
  and types the fields instead. A payload that does not decode gives NULL.
- ``bytes`` queues (and avro queues without a schema file): NULL, unless a ``schema`` is given,
  which parses the payload as JSON.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from layer.config import MessageType
from layer.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

MAP_TYPE = MapType(StringType(), StringType())

SchemaLike = StructType | str | None

Convert = Callable[[Any], Any]


def message_type_of(schema: SchemaLike) -> DataType:
    """The type of ``message`` for a schema argument (DDL strings are parsed by Spark)."""
    if schema is None:
        return MAP_TYPE
    if isinstance(schema, StructType):
        return schema
    if isinstance(schema, str):
        return StructType.fromDDL(schema)
    raise TypeError(f"schema must be a StructType, a DDL string or None, got {schema!r}")


def message_column(
    message_type: MessageType, schema: SchemaLike, avro_schema: str | None, where: str
) -> Column:
    """The ``message`` column over a frame with the view's ``value`` column."""
    if message_type == MessageType.AVRO and avro_schema is not None:
        return _avro_column(avro_schema, None if schema is None else message_type_of(schema), where)
    if message_type == MessageType.JSON or schema is not None:
        text = F.col("value").cast("string")
        parsed: Any = message_type_of(schema)  # from_json takes a map type too
        # from_json makes a struct of NULLs of a payload that is not JSON: make it one NULL
        return F.when(F.get_json_object(text, "$").isNotNull(), F.from_json(text, parsed))
    return F.lit(None).cast(MAP_TYPE)


#: a field ``with_message`` adds to a JSON schema for ``from_json``'s unparsed text
_UNPARSED = "__qlayer_unparsed"


def with_message(
    frame: DataFrame,
    message_type: MessageType,
    schema: SchemaLike,
    avro_schema: str | None,
    where: str,
) -> DataFrame:
    """``frame`` (the view's columns) with ``message`` as :func:`message_column` makes it, the
    same values; a JSON payload with a struct schema is parsed once, not twice. ``message_column``
    asks ``get_json_object`` first whether the payload is JSON at all (``from_json`` alone
    makes a struct of NULLs of one that is not), which parses every payload a second time: in a
    stream's task it was half of the JVM's JSON time (a JFR profile at 1,000 msg/s). Here
    ``from_json`` parses into the schema plus a field for the text of a payload it could not
    parse (``columnNameOfCorruptRecord``), in a projection of its own (Spark does not inline
    an expensive expression used twice); a payload without that text is the parse without the
    field, and only one with it (not JSON, or not of the schema's shape) is judged as
    ``message_column`` does."""
    parsed: Any = message_type_of(schema) if schema is not None else None
    json_struct = isinstance(parsed, StructType) and (
        message_type == MessageType.JSON
        or not (message_type == MessageType.AVRO and avro_schema is not None)
    )
    message = message_column(message_type, schema, avro_schema, where)
    if not json_struct or _UNPARSED in parsed.fieldNames():
        return frame.withColumn("message", message)
    text = F.col("value").cast("string")
    with_text = StructType([*parsed.fields, StructField(_UNPARSED, StringType())])
    doc = F.from_json(text, with_text, {"columnNameOfCorruptRecord": _UNPARSED})
    parse = F.col(_UNPARSED)
    return (
        frame.withColumn(_UNPARSED, doc)
        .withColumn(
            "message",
            F.when(parse.isNull(), F.lit(None).cast(parsed))
            .when(parse[_UNPARSED].isNull(), parse.dropFields(_UNPARSED))
            .otherwise(message),
        )
        .drop(_UNPARSED)
    )


# -- Avro ------------------------------------------------------------------------------------


def _avro_column(avro_schema: str, schema: DataType | None, where: str) -> Column:
    try:
        parsed = _parse(avro_schema)
    except Exception as exc:
        raise ConfigError(
            f"{where}: option 'avro_schema' is not a valid Avro schema: {exc}"
        ) from exc
    spark_type, convert = (schema, _plain) if schema is not None else spark_type_of(parsed)

    def decode(value: bytes | None) -> Any:
        if value is None:
            return None
        import fastavro

        buffer = io.BytesIO(value)
        try:
            doc = fastavro.schemaless_reader(buffer, _parse(avro_schema), None)
        except Exception:  # fastavro raises many types on bad bytes: unparseable, as a queue reads
            return None
        if buffer.tell() != len(value):
            return None
        return convert(doc)

    # useArrow named: without it Spark 4.3 warns that it cannot infer it from type hints
    return F.udf(decode, spark_type, useArrow=False)(F.col("value"))


@lru_cache(maxsize=16)
def _parse(text: str) -> Any:
    import fastavro

    return fastavro.parse_schema(json.loads(text))


def _plain(doc: Any) -> Any:
    return doc


def _json_text(value: Any) -> str:
    return json.dumps(value, default=str)


_PRIMITIVES: dict[str, DataType] = {
    "boolean": BooleanType(),
    "int": IntegerType(),
    "long": LongType(),
    "float": FloatType(),
    "double": DoubleType(),
    "bytes": BinaryType(),
    "fixed": BinaryType(),
    "string": StringType(),
    "enum": StringType(),
}
_LOGICAL: dict[str, DataType] = {
    "timestamp-millis": TimestampType(),
    "timestamp-micros": TimestampType(),
    "date": DateType(),
    "uuid": StringType(),
}


def spark_type_of(avro: Any) -> tuple[DataType, Convert]:
    """The Spark type of a parsed Avro schema and the function that turns fastavro's value into
    it. A union of null and one type is that type (nullable); anything else Spark has no type for
    (other unions) becomes JSON text."""
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        if len(branches) == 1:
            return spark_type_of(branches[0])
        return StringType(), _json_text
    if isinstance(avro, str):
        return _PRIMITIVES.get(avro, StringType()), _plain if avro in _PRIMITIVES else _json_text
    logical = avro.get("logicalType")
    if logical in _LOGICAL:
        return _LOGICAL[logical], _plain
    if logical == "decimal":
        return DecimalType(int(avro["precision"]), int(avro.get("scale", 0))), _plain
    kind = avro.get("type")
    if kind == "record":
        fields = [(f["name"], spark_type_of(f["type"])) for f in avro["fields"]]
        struct = StructType([StructField(name, t) for name, (t, _c) in fields])
        converters = [(name, c) for name, (_t, c) in fields]

        def record(doc: Any) -> Any:
            if doc is None:
                return None
            return {name: None if doc.get(name) is None else c(doc[name]) for name, c in converters}

        return struct, record
    if kind == "array":
        item_type, item = spark_type_of(avro["items"])
        return ArrayType(item_type), lambda v: None if v is None else [item(x) for x in v]
    if kind == "map":
        value_type, value = spark_type_of(avro["values"])
        return MapType(
            StringType(), value_type
        ), lambda v: None if v is None else {k: value(x) for k, x in v.items()}
    if isinstance(kind, str | list | dict):
        return spark_type_of(kind)
    return StringType(), _json_text
