"""``GET /metrics``: the coordinator's figures in the Prometheus text format.

Per queue (label ``queue``): depths (available, leased, inactive, delayed, held), the unread
lag behind its topics, the oldest available message's age, subscriptions and stalled ones, and
the counters of ``qlayer stats`` (``qlayer_queue_<name>_total``; dead letters by ``reason``),
which survive restarts (``layer.coordinator.counters``). Per coordinator: round duration and
changelog commit latency histograms, restore progress, Kafka reachability, rounds, and the
process's RSS (``process_resident_memory_bytes``, prometheus-client's process collector).

Queue figures are read when scraped, from the same ``stats`` the API serves: nothing is
counted per message for metrics. The histograms are observed once per round (``RoundTimings``).
The registry is this object's own, never the library's global one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from http import HTTPStatus

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from layer.api.service import QueueStats
from layer.coordinator.health import Health
from layer.coordinator.http import Request, Response, Router

__all__ = ["CONTENT_TYPE", "DEPTHS", "Metrics", "metrics_routes"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: gauge name suffix -> (QueueStats field or extra key, help)
DEPTHS = {
    "available_messages": ("available", "Messages available for delivery"),
    "leased_messages": ("leased", "Messages leased to a subscription, not acked yet"),
    "inactive_messages": ("inactive", "Messages in the queue not deliverable now"),
    "delayed_messages": ("delayed", "Messages waiting for their delivery time"),
    "held_messages": ("held", "Messages held back (message groups, barriers, target depth)"),
    "unread_messages": ("unread", "Lag: messages in the underlying topics not read yet"),
    "subscriptions": ("subscriptions", "Open subscriptions"),
    "stalled_subscriptions": ("stalled_subscriptions", "Subscriptions whose stream is full"),
}
_COUNTER_HELP = {
    "ingested": "Messages admitted into the queue from its topics",
    "delivered": "Messages handed to subscriptions (leases granted)",
    "acked": "Messages acknowledged",
    "cancelled": "Leases returned by a cancel",
    "lease_timeouts": "Leases that ran out without an ack",
    "disconnect_returns": "Leases returned because the consumer's connection closed",
    "redriven": "Dead letters published into the queue again",
    "routed": "Messages published to the queue's name, copied to its publish target",
    "unparseable": "Messages whose payload did not parse",
    "filtered": "Messages read from the topics that the queue's filter left out",
    "conflated": "Messages replaced by a newer one (conflate_key, last_value)",
    "discarded": "Messages that expired or reached a limit, discarded by dead_letter_if",
}
_DEAD = "dead_lettered."
_ROUND_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class _Coordinator(Collector):
    """Everything read at scrape time: the queues' stats (set by ``Metrics.render``) and the
    coordinator's health."""

    def __init__(self, health: Health) -> None:
        self.health = health
        self.stats: Sequence[QueueStats] = ()
        self.rounds = 0

    def collect(self) -> Iterator[Metric]:
        health = self.health
        reachable = GaugeMetricFamily("qlayer_kafka_reachable", "1 while Kafka answers")
        reachable.add_metric([], 1.0 if health.kafka_reachable else 0.0)
        yield reachable
        yield CounterMetricFamily(
            "qlayer_kafka_outages", "Times Kafka became unreachable", value=health.outages
        )
        done, total = health.restore_progress
        restored = GaugeMetricFamily("qlayer_restored", "1 once every queue is restored")
        restored.add_metric([], 1.0 if health.is_restored else 0.0)
        yield restored
        yield GaugeMetricFamily(
            "qlayer_restore_records_applied",
            "Changelog records applied by the restore under way (or the last one)",
            value=done,
        )
        yield GaugeMetricFamily(
            "qlayer_restore_records", "Changelog records the restore has to apply", value=total
        )
        yield CounterMetricFamily(
            "qlayer_rounds", "Coordinator rounds completed", value=self.rounds
        )
        yield from self._queues()

    def _queues(self) -> Iterator[Metric]:
        stats = self.stats
        for suffix, (source, help_text) in DEPTHS.items():
            family = GaugeMetricFamily(f"qlayer_queue_{suffix}", help_text, labels=["queue"])
            for s in stats:
                value = getattr(s, source) if hasattr(s, source) else s.extra.get(source, 0)
                family.add_metric([s.queue], float(value))
            yield family
        age = GaugeMetricFamily(
            "qlayer_queue_oldest_available_age_seconds",
            "Age of the oldest available message (0 when none)",
            labels=["queue"],
        )
        for s in stats:
            age.add_metric([s.queue], s.oldest_available_age_s or 0.0)
        yield age
        for name, help_text in _COUNTER_HELP.items():
            counter = CounterMetricFamily(f"qlayer_queue_{name}", help_text, labels=["queue"])
            for s in stats:
                counter.add_metric([s.queue], float(s.extra.get(f"{name}_total", 0)))
            yield counter
        dead = CounterMetricFamily(
            "qlayer_queue_dead_lettered",
            "Messages that left the queue without an ack, by reason",
            labels=["queue", "reason"],
        )
        for s in stats:
            for key, value in sorted(s.extra.items()):
                if key.startswith(_DEAD) and key.endswith("_total"):
                    dead.add_metric([s.queue, key[len(_DEAD) : -len("_total")]], float(value))
        yield dead


class Metrics:
    """The coordinator's registry; ``RoundTimings`` for its rounds (``layer.coordinator.round``)."""

    def __init__(self, health: Health) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._collector = _Coordinator(health)
        self.registry.register(self._collector)
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and others
        self._round = Histogram(
            "qlayer_round_duration_seconds",
            "Duration of a coordinator round that committed (admit to hand-out)",
            buckets=_ROUND_BUCKETS,
            registry=self.registry,
        )
        self._commit = Histogram(
            "qlayer_changelog_commit_seconds",
            "Latency of a round's changelog transaction (until durable)",
            buckets=_ROUND_BUCKETS,
            registry=self.registry,
        )
        self._source: Callable[[], Awaitable[tuple[Sequence[QueueStats], int]]] | None = None

    # RoundTimings
    def round(self, seconds: float) -> None:
        self._round.observe(seconds)

    def commit(self, seconds: float) -> None:
        self._commit.observe(seconds)

    def attach(self, source: Callable[[], Awaitable[tuple[Sequence[QueueStats], int]]]) -> None:
        """Where the queues' figures come from once the coordinator serves: (stats, rounds)."""
        self._source = source

    async def render(self) -> bytes:
        if self._source is not None:
            self._collector.stats, self._collector.rounds = await self._source()
        return generate_latest(self.registry)


def metrics_routes(router: Router, metrics: Metrics, right: str | None = None) -> None:
    """``GET /metrics``; ``right``: what a scraper must hold (None: open, the default)."""

    async def scrape(_request: Request) -> Response:
        return Response(HTTPStatus.OK, await metrics.render(), CONTENT_TYPE)

    router.add("GET", "/metrics", scrape, right=right)
