r"""``foreachBatch`` functions that let ``query.stop()`` stop the query cleanly.

PySpark runs a ``foreachBatch`` function on the query's own thread (pinned-thread mode), so
``query.stop()``, which interrupts that thread, fails a Spark call the function is making at that
moment (``collect()``, a write...) with a ``Py4JJavaError`` whose text holds the JVM's whole
stack trace (8 KB for ``collect()``). The function's error goes back to the JVM as that text, and
a stopping query tells a stop from a failure by matching it with ``py4j.protocol.Py4JJavaError:
An error occurred while calling((.|\r\n|\r|\n)*)(java.lang.InterruptedException|...)``
(``StreamExecution.PROXY_ERROR``, PySpark 4.3): Java's regex engine recurses for every character
that group takes, and 1-2 KB overflow a thread's default stack. The query's thread then dies of
``java.lang.StackOverflowError`` (a thousand ``java.util.regex`` frames on the driver's stderr)
instead of ending as stopped: ``query.status["message"]`` is not ``Stopped``. A query that is
not stopping never runs the pattern: only ``stop()`` meets this, when it comes during a Spark call
of the function (``bench.spark_bench``'s freshness run: one stop in three).

:func:`foreach_batch` wraps the function so that such an error reaches Spark short: py4j's
prefix, the call and the JVM error's first line, without stack frames, which Spark still
recognises as the stop (the micro-batch is not committed: a restart runs it again). Any other
``Py4JJavaError`` becomes a ``SparkBatchError`` carrying the JVM's whole text under a name
Spark's pattern does not begin with, so a failure that races a stop cannot overflow it either;
the query fails with that text as before. Other errors pass unchanged.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from layer.exceptions import SparkBatchError, SparkBatchStopped

__all__ = ["foreach_batch", "short_java_error"]

#: what Spark's pattern begins with (py4j's ``Py4JJavaError`` as Python prints it)
PROXY_PREFIX = "py4j.protocol.Py4JJavaError: An error occurred while calling"
#: the JVM's errors that Spark takes for an interrupted thread (``IO_EXCEPTION_NAMES``), and a
#: job its stop cancelled (``isCancelledJobGroup``: a ``SparkException`` saying ``cancelled``)
_INTERRUPTED = re.compile(
    r"java\.lang\.InterruptedException|java\.io\.InterruptedIOException"
    r"|java\.nio\.channels\.ClosedByInterruptException"
    r"|org\.apache\.spark\.SparkException\b.*\bcancelled"
)
#: how much of an error line to keep: Java's regex overflows a thread's default stack on 1-2 KB
_LINE_CHARS = 200


def short_java_error(call: str, java_text: str) -> str | None:
    """What to tell Spark of a ``Py4JJavaError`` that ``query.stop()`` caused, or None when
    ``java_text`` (the error's text: ``: java.lang.X: message``, frames, ``Caused by: ...``) is
    not an interruption. ``call`` is py4j's first line (``An error occurred while calling
    o47.collectToPython.``). The result is Spark's prefix, the call, the error's first line and
    the first line that shows the interruption, 200 characters at most each: frames
    (``\\tat ...``) and the rest are left out."""
    heads = [
        line.removeprefix(": ").removeprefix("Caused by: ").strip()[:_LINE_CHARS]
        for line in java_text.splitlines()
        if line.strip() and not line.startswith("\t")
    ]
    why = next((line for line in heads if _INTERRUPTED.search(line)), None)
    if why is None:
        return None
    target = call.strip().removeprefix("An error occurred while calling").strip().rstrip(".")
    # a cancelled job's line names the job group, which Spark's isCancelledJobGroup looks for
    lines = [heads[0]] if heads[0] == why else [heads[0], why]
    return f"{PROXY_PREFIX} {target}: {' / '.join(lines)}"


def foreach_batch(func: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
    """``func`` for ``writeStream.foreachBatch``, stopping cleanly when ``query.stop()``
    interrupts a Spark call it makes (see the module's text)::

        query = totals.writeStream.foreachBatch(foreach_batch(show)).start()
    """
    from py4j.protocol import Py4JJavaError

    @functools.wraps(func)
    def call(batch: Any, batch_id: int) -> None:
        try:
            func(batch, batch_id)
        except Py4JJavaError as exc:
            text = str(exc)  # py4j asks the JVM for its stack trace
            first, _, java_text = text.partition("\n")
            short = short_java_error(first, java_text)
            # ``from None``: Python would print the chained error's whole text first
            if short is not None:
                raise SparkBatchStopped(short) from None
            # (a nested error's text, were it there, without the prefix Spark's pattern begins with)
            nested = PROXY_PREFIX.removeprefix("py4j.protocol.")
            raise SparkBatchError(text.replace(PROXY_PREFIX, nested)) from None

    return call
