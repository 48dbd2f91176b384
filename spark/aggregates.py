"""Aggregates of a queue's live contents that stay right as the queue changes.

A change stream (:func:`spark.views.queue_contents_stream`) carries ``sign`` +1 when a message
becomes available and -1 when it stops being available, with the message either way. So the
count of live messages in a group is ``sum(sign)``, a sum is ``sum(sign * x)`` and an average is
the signed sum over the signed count of non-null values: ordinary Spark aggregations, which
streaming queries keep in update or complete mode::

    changes = queue_contents_stream(spark, "orders", config="qlayer.toml",
                                    schema="symbol STRING, qty INT, price DOUBLE")
    totals = live_aggregate(changes, by="symbol", sum={"value": "price * qty"},
                            avg={"avg_price": "price"})
    totals.writeStream.outputMode("update").format("console").start()

The same call works on the batch view (:func:`spark.views.queue_contents`, no ``sign`` column:
each row counts once).

A group whose messages have all left stays with a count of 0 (update mode reports that change;
complete mode keeps the row: filter ``count > 0`` to drop it). Sums of floating-point values are
running sums, so a group emptied of messages may show a rounding residue such as 1e-13.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import MapType, StructType

from layer.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# a message field path: name or name.name..., backquoted parts allowed
_PART = r"(?:[A-Za-z_][A-Za-z0-9_]*|`[^`]+`)"
_FIELD_PATH = re.compile(rf"^{_PART}(?:\.{_PART})*$")
_SIGN = "__qlayer_sign"


def live_aggregate(
    changes: DataFrame,
    by: str | Column | Sequence[str | Column] = (),
    *,
    count: str | None = "count",
    sum: Mapping[str, str | Column] | None = None,
    avg: Mapping[str, str | Column] | None = None,
) -> DataFrame:
    """The live ``count``, ``sum`` and ``avg`` of the messages in ``changes``, grouped by ``by``.

    ``changes`` is :func:`queue_contents_stream` (or :func:`queue_contents`). ``by`` is one
    grouping or a list of them. ``sum`` and ``avg`` map output column names to what to add up.

    A string names message fields: in ``by`` a field (``"symbol"``, ``"order.symbol"``); in
    ``sum``/``avg`` a field or, when ``message`` is a struct (a schema was given), any Spark SQL
    expression over the message's fields (``"price * qty"``). With a ``map<string,string>``
    message (JSON without a schema) a string must be a field name, read as a double. A
    ``Column`` is an expression over the change's own columns, e.g. ``F.col("topic")``,
    ``F.col("priority")`` or ``F.col("message.price") * 2``. ``count`` names the count column
    (None: leave it out).
    """
    groups = [by] if isinstance(by, str | Column) else list(by)
    sums, avgs = dict(sum or {}), dict(avg or {})
    if not (sums or avgs or count):
        raise ConfigError("live_aggregate needs something to compute: count, sum or avg")
    names = [_group_name(g, i) for i, g in enumerate(groups)] + list(sums) + list(avgs)
    names += [count] if count else []
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ConfigError(f"live_aggregate: output column names used twice: {duplicated}")

    message = changes.schema["message"].dataType if "message" in changes.columns else None
    # Step 1 evaluates everything over the change (Columns, and message fields by path) next to
    # the message's own fields; step 2 evaluates SQL strings there, with the fields in scope.
    sign = F.col("sign") if "sign" in changes.columns else F.lit(1)
    inner: list[Column] = [sign.alias(_SIGN)]
    group_cols: list[Column] = []
    for i, group in enumerate(groups):
        name = _group_name(group, i)
        inner.append(_field(group, message, "by", cast=False).alias(f"__qlayer_by{i}"))
        group_cols.append(F.col(f"__qlayer_by{i}").alias(name))
    values: dict[str, Column] = {}
    for kind, exprs in (("sum", sums), ("avg", avgs)):
        for j, (name, expr) in enumerate(exprs.items()):
            if isinstance(expr, Column) or not isinstance(message, StructType):
                column = _field(expr, message, f"{kind} {name!r}", cast=True)
                inner.append(column.alias(f"__qlayer_{kind}{j}"))
                values[f"{kind}:{name}"] = F.col(f"__qlayer_{kind}{j}")
            else:
                values[f"{kind}:{name}"] = F.expr(expr)
    if isinstance(message, StructType):
        inner.append(F.col("message.*"))
    scope = changes.select(*inner)

    signed = F.col(_SIGN)
    aggregates: list[Column] = []
    if count:
        aggregates.append(F.sum(signed).alias(count))
    for name in sums:
        aggregates.append(F.sum(signed * values[f"sum:{name}"]).alias(name))
    for name in avgs:
        value = values[f"avg:{name}"]
        present = F.sum(F.when(value.isNull(), 0).otherwise(signed))
        aggregates.append(F.try_divide(F.sum(signed * value), present).alias(name))
    if changes.isStreaming and _single_state_partition(changes):
        scope = scope.coalesce(1)
    grouped = scope.groupBy(*group_cols) if group_cols else scope.groupBy()
    return grouped.agg(*aggregates)


def _single_state_partition(changes: DataFrame) -> bool:
    """Whether a streaming aggregate of ``changes`` keeps its state in one partition
    (``spark.sql.shuffle.partitions`` is 1). Then the changes are coalesced into one partition
    first: Spark plans no shuffle (one partition satisfies the aggregate's distribution), so
    each micro-batch runs one stage instead of two, with the same state (a query restarted
    from a checkpoint of N partitions gets its shuffle back: Spark keeps N from the
    checkpoint). A view topic has one partition, so the read loses no parallelism."""
    conf = changes.sparkSession.conf.get("spark.sql.shuffle.partitions")
    return str(conf).strip() == "1"


def _group_name(group: str | Column, index: int) -> str:
    if isinstance(group, str):
        return group.rsplit(".", 1)[-1].strip("`")
    return f"group_{index}" if index else "group"


def _field(expr: str | Column, message: object, what: str, *, cast: bool) -> Column:
    """A Column, or a message field path read from the ``message`` column."""
    if isinstance(expr, Column):
        return expr
    if not isinstance(expr, str):
        raise TypeError(f"live_aggregate {what}: expected a str or a Column, got {expr!r}")
    if message is None:
        raise ConfigError(f"live_aggregate {what}: the changes have no message column")
    if not _FIELD_PATH.match(expr.strip()):
        raise ConfigError(
            f"live_aggregate {what}: {expr!r} is not a field name; SQL expressions over the"
            " message need its fields typed: pass schema= to the view (or use a Column)"
        )
    column = F.col(f"message.{expr.strip()}")
    if cast and isinstance(message, MapType):
        return column.cast("double")
    return column
