"""A data engineer's notebook, as a script: what is waiting in the ``orders`` queue, live.

Cells (``# %%``) run top to bottom in Jupyter/VS Code or as ``python examples/orders_dashboard.py``.
With no arguments it starts everything it needs on this machine (an embedded broker and a
coordinator, in a temporary directory), publishes a few hundred orders and consumes some of
them, so the numbers move; point it at your own with ``--config qlayer.toml`` (the coordinator's
config; the queue needs ``view_topic`` set) and ``--queue``.

It shows:

1. the total value (price x qty) of the unprocessed orders per symbol, refreshed live: a
   streaming ``live_aggregate`` over the queue's view, printed after every micro-batch;
2. a batch view of what is waiting right now (``queue_contents``, the same rows as ``browse``),
   and how many times each waiting order was delivered already (``deliveries``): a sign of
   consumers that took orders and gave them back;
3. a per-consumer lease view (``queue_leases``): which consumer (subscription) holds how many
   orders, their value, and how long it has held the oldest: a stuck consumer stands out.

Needs the ``spark`` extra (PySpark 4.3) and Java 17.
"""

# %% setup
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pyspark.sql import functions as F  # noqa: E402

from layer.client import QueueClient  # noqa: E402
from spark import (  # noqa: E402
    foreach_batch,
    live_aggregate,
    local_session,
    queue_contents,
    queue_contents_stream,
    queue_leases,
)

SCHEMA = "id INT, symbol STRING, qty INT, price DOUBLE"
SYMBOLS = ("ACME", "INIT", "TECH")


def local_setup(stack: ExitStack, workdir: Path) -> tuple[Path, str, str]:
    """An embedded broker and a coordinator with an ``orders`` queue that has a view topic."""
    from connectors.embedded import EmbeddedBroker
    from tests.harness import CoordinatorProcess, write_config

    broker = stack.enter_context(EmbeddedBroker())
    queue = {"name": "orders", "underlying_topic": "orders", "view_topic": "orders.view"}
    config = write_config(workdir / "qlayer.toml", broker.bootstrap_servers, [queue], {})
    coordinator = CoordinatorProcess(config, workdir / "state", workdir / "coordinator.log")
    coordinator.start()
    stack.callback(coordinator.stop)
    return config, "orders", coordinator.address


def trade(address: str, queue: str, seconds: float, stop: threading.Event) -> None:
    """Publish orders and have a consumer work through some of them (acks, a few cancels),
    while a second, stuck consumer holds the orders it took without acking them."""
    rng = random.Random(1)
    with QueueClient(address) as client:
        for i in range(300):
            order = {"id": i, "symbol": SYMBOLS[i % 3], "qty": 1 + i % 5, "price": 100 + i % 7}
            client.publish(queue, json.dumps(order).encode())
        worker = client.subscribe(queue, max_backlog=5)
        stuck = client.subscribe(queue, max_backlog=3)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stop.is_set():
            msg = worker.next(timeout=0.2)
            if msg is not None:
                msg.ack() if rng.random() < 0.8 else msg.cancel()
            time.sleep(0.05)
        stop.wait()  # both keep what they hold until the notebook is done
        worker.close()
        stuck.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, help="the coordinator's config (default: local)")
    parser.add_argument("--queue", default="orders")
    parser.add_argument("--seconds", type=float, default=15.0, help="how long to watch")
    args = parser.parse_args(argv)

    with ExitStack() as stack:
        # %% a Spark session (it says in one line if Java is missing)
        # (one shuffle partition, as local_session sets: each micro-batch is one Spark stage)
        spark = local_session("local[2]", "orders-dashboard")
        stack.callback(spark.stop)
        stop = threading.Event()
        if args.config is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            config, queue, address = local_setup(stack, workdir)
            traffic = threading.Thread(
                target=trade, args=(address, queue, args.seconds, stop), daemon=True
            )
            traffic.start()
            stack.callback(stop.set)
        else:
            config, queue = args.config, args.queue

        # %% 1. total value of unprocessed orders per symbol, live
        changes = queue_contents_stream(spark, queue, config=config, schema=SCHEMA)
        totals = live_aggregate(changes, by="symbol", sum={"value": "price * qty"})

        def show(batch, batch_id: int) -> None:
            rows = sorted((r.symbol, r["count"], r.value) for r in batch.collect())
            line = ", ".join(f"{s}: {n} orders, {v:,.0f}" for s, n, v in rows)
            print(f"[batch {batch_id}] unprocessed: {line or 'no change'}", flush=True)

        query = (
            totals.writeStream.outputMode("update")
            .foreachBatch(foreach_batch(show))  # query.stop() during show() stops it cleanly
            .trigger(processingTime="1 second")
            .start()
        )
        stack.callback(query.stop)
        query.awaitTermination(args.seconds)

        # %% 2. what is waiting right now, and how often it was delivered already
        waiting = queue_contents(spark, queue, config=config, schema=SCHEMA)
        print("waiting now, by symbol and times delivered:")
        waiting.groupBy("message.symbol", "deliveries").count().orderBy(
            "symbol", "deliveries"
        ).show()

        # %% 3. who holds which orders: per consumer, how many, their value, the oldest lease
        leases = queue_leases(spark, queue, config=config, schema=SCHEMA)
        print("leased now, by consumer:")
        leases.groupBy("lease_holder").agg(
            F.count("*").alias("orders"),
            F.sum(F.col("message.price") * F.col("message.qty")).alias("value"),
            F.round(
                F.current_timestamp().cast("double") - F.min("leased_at").cast("double"), 1
            ).alias("oldest_lease_s"),
        ).orderBy("lease_holder").show(truncate=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
