"""What ``spark.foreach_batch`` tells Spark of a Spark call that ``query.stop()`` interrupted:
short enough for Spark's regex, and still what Spark takes for a stop (pure text, no Spark)."""

from __future__ import annotations

import re

from spark.batches import PROXY_PREFIX, short_java_error

CALL = "An error occurred while calling o47.collectToPython."
FRAMES = "".join(
    f"\tat org.apache.spark.sql.execution.SomeClass{i}.method(SomeClass{i}.scala:{i})\n"
    for i in range(120)
)
#: Spark's StreamExecution.PROXY_ERROR, and isCancelledJobGroup's test
SPARK_PATTERN = re.compile(
    re.escape(PROXY_PREFIX) + r"((.|\r\n|\r|\n)*)(java.lang.InterruptedException"
    r"|java.io.InterruptedIOException|java.nio.channels.ClosedByInterruptException)"
)
GROUP = "599e8e9f-fbd9-4761-9ba2-8ce94caaec84"


def test_an_interrupted_call_is_told_in_one_short_line_that_spark_matches() -> None:
    # what collect() raised in a foreachBatch function as the query stopped (8 KB of frames)
    text = ": java.lang.InterruptedException\n" + FRAMES
    assert len(text) > 8000
    short = short_java_error(CALL, text)
    assert short == f"{PROXY_PREFIX} o47.collectToPython: java.lang.InterruptedException"
    assert SPARK_PATTERN.search(short)


def test_a_cancelled_job_keeps_the_line_that_names_its_group() -> None:
    cancelled = (
        f"org.apache.spark.SparkException: [SPARK_JOB_CANCELLED] Job 3 cancelled part of"
        f" cancelled job group {GROUP} SQLSTATE: XXKDA"
    )
    text = (
        ": org.apache.spark.SparkException: Job aborted.\n"
        + FRAMES
        + f"Caused by: {cancelled}\n"
        + FRAMES
    )
    short = short_java_error(CALL, text)
    assert short is not None
    assert short.startswith(PROXY_PREFIX)
    # isCancelledJobGroup: the text names SparkException, says cancelled and names the group
    assert "org.apache.spark.SparkException" in short
    assert "cancelled" in short and GROUP in short
    assert "\tat " not in short and len(short) < 600


def test_a_long_message_is_cut() -> None:
    text = ": java.io.InterruptedIOException: " + "y" * 5000 + "\n" + FRAMES
    short = short_java_error(CALL, text)
    assert short is not None and len(short) < len(PROXY_PREFIX) + 250


def test_any_other_error_is_not_a_stop() -> None:
    text = ': java.lang.NumberFormatException: For input string: "x"\n' + FRAMES
    assert short_java_error(CALL, text) is None
    # an interruption named only in a frame is not the error's
    framed = text + "\tat java.lang.InterruptedException.x(X.java:1)\n"
    assert short_java_error(CALL, framed) is None
