"""``query.stop()`` while a ``foreachBatch`` function is in a Spark call, on a real session.

Unwrapped, the stream's thread dies of a ``StackOverflowError`` in Spark's regex (its status
stays ``Processing new data``); wrapped in ``spark.foreach_batch``, the query ends as stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark import foreach_batch

pytestmark = pytest.mark.spark


def _stop_during_a_call(spark: Any, wrap: Callable[[Any], Any], checkpoint: Path) -> Any:
    """A stream whose foreachBatch function runs a Spark job that lasts minutes, stopped while
    that job runs; the stopped query."""
    calling = threading.Event()

    def slow(batch: Any, batch_id: int) -> None:
        calling.set()
        batch.sparkSession.range(0, 10**12).selectExpr("sum(id)").collect()

    stream = spark.readStream.format("rate").load().writeStream.foreachBatch(wrap(slow))
    query = stream.option("checkpointLocation", str(checkpoint)).start()
    try:
        assert calling.wait(120), "the first micro-batch did not call the function in 120 s"
        tracker = spark.sparkContext.statusTracker()
        deadline = time.monotonic() + 60
        while not tracker.getActiveJobsIds():  # the long job is running
            assert time.monotonic() < deadline, "the function's job did not start in 60 s"
            assert query.isActive, f"the query ended: {query.exception()}"
            time.sleep(0.05)
    finally:
        query.stop()
    return query


def test_a_query_stopped_during_a_call_of_its_function_ends_as_stopped(
    spark: Any, checkpoint_dir: Path
) -> None:
    query = _stop_during_a_call(spark, foreach_batch, checkpoint_dir)
    assert query.exception() is None
    assert query.status["message"] == "Stopped"
    # the interrupted micro-batch was planned, not committed: a restart runs it again
    assert (checkpoint_dir / "offsets" / "0").exists()
    assert not (checkpoint_dir / "commits" / "0").exists()


def test_without_it_spark_takes_the_stop_for_an_error_it_cannot_read(
    spark: Any, checkpoint_dir: Path
) -> None:
    """Spark's own behaviour, the reason for foreach_batch: if a Spark release fixes its
    pattern, this fails and the wrapper can go."""
    query = _stop_during_a_call(spark, lambda func: func, checkpoint_dir)
    assert query.exception() is None  # the error escaped Spark's handling altogether
    assert query.status["message"] != "Stopped"


def test_a_failing_call_fails_the_query_with_the_jvm_error(spark: Any) -> None:
    def failing(batch: Any, batch_id: int) -> None:
        batch.sparkSession.sparkContext._jvm.java.lang.Class.forName("no.such.Class")

    from pyspark.errors import StreamingQueryException

    query = spark.readStream.format("rate").load().writeStream
    query = query.foreachBatch(foreach_batch(failing)).start()
    try:
        with pytest.raises(StreamingQueryException) as failed:
            query.awaitTermination(120)  # False, not raising, after 120 s
    finally:
        query.stop()
    assert "layer.exceptions.SparkBatchError" in str(failed.value)
    assert "java.lang.ClassNotFoundException: no.such.Class" in str(failed.value)
