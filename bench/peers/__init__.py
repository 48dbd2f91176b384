"""The queue workload of ``bench/queue_bench.py`` run on peer brokers on this machine.

RabbitMQ (a quorum queue), NATS JetStream (a work-queue stream) and Redis Streams (a consumer
group), each through its standard Python client. Run ``python -m bench.peers.run --help``.
"""

from bench.peers.common import PeerUnavailable

__all__ = ["PeerUnavailable"]
