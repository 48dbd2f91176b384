"""The peer brokers of the benchmark, each through its standard Python client, on loopback.

RabbitMQ (a quorum queue), NATS JetStream (a work-queue stream) and Redis Streams (a consumer
group). Each module holds a ``System`` for ``bench.harness``, its ``check_available`` and the
``consume`` function its consumer processes run. ``python -m bench.run`` drives them.
"""
