"""Views and aggregates over the live contents of qlayer queues, built with PySpark.

A queue with ``view_topic`` set has its coordinator publish every change of its live contents
(what ``browse`` shows) to that topic; these helpers read it with the ``qlayer_view`` data source
and never lease::

    from spark import live_aggregate, queue_contents, queue_contents_stream

    queue_contents(spark, "orders", config="qlayer.toml").show()   # what is available now
    changes = queue_contents_stream(spark, "orders", config="qlayer.toml",
                                    schema="symbol STRING, qty INT, price DOUBLE")
    live_aggregate(changes, by="symbol", sum={"value": "price * qty"})  # stays right, streaming
    queue_leases(spark, "orders", config="qlayer.toml")  # who holds which leases, since when

A ``foreachBatch`` function goes through :func:`foreach_batch`, so that ``query.stop()`` during
a Spark call in it stops the query cleanly (``spark.batches`` says why).
"""

from spark.aggregates import live_aggregate
from spark.batches import foreach_batch
from spark.messages import message_column, spark_type_of
from spark.session import java_problem, local_session, prepare
from spark.settings import ViewSettings, view_settings
from spark.views import (
    CONTENT_COLUMNS,
    LEASE_COLUMNS,
    queue_contents,
    queue_contents_stream,
    queue_leases,
)

__all__ = [
    "CONTENT_COLUMNS",
    "LEASE_COLUMNS",
    "ViewSettings",
    "foreach_batch",
    "java_problem",
    "live_aggregate",
    "local_session",
    "message_column",
    "prepare",
    "queue_contents",
    "queue_contents_stream",
    "queue_leases",
    "spark_type_of",
    "view_settings",
]
