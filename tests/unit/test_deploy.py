"""deploy/: the Grafana dashboard and the Prometheus alert rules load, and every metric they
name is one the coordinator's ``/metrics`` serves."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from layer.api.service import QueueStats
from layer.coordinator.health import Health
from layer.coordinator.metrics import Metrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
NAME = re.compile(r"\b((?:qlayer|process)_[a-z0-9_]+)\b")


def served_names() -> set[str]:
    """Every sample and family name of a scrape with one busy queue."""
    metrics = Metrics(Health())
    stats = QueueStats(
        "orders", 3, 1, 0, 2, 1.5, 10, 8, 2,
        {"unread": 4, "ingested_total": 12, "dead_lettered.max_deliveries_total": 2},
    )  # fmt: skip

    async def figures() -> tuple[list[QueueStats], int]:
        return [stats], 7

    metrics.attach(figures)
    metrics.round(0.002)
    metrics.commit(0.001)
    text = asyncio.run(metrics.render()).decode()
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
    return names


def test_every_metric_of_the_dashboard_and_the_alerts_is_served() -> None:
    served = served_names()
    dashboard = json.loads((DEPLOY / "grafana" / "qlayer-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    rules = yaml.safe_load((DEPLOY / "prometheus" / "qlayer-alerts.yml").read_text())
    alerts = [r for g in rules["groups"] for r in g["rules"]]
    exprs += [r["expr"] for r in alerts]
    named = {m for e in exprs for m in NAME.findall(e)}
    assert named - served == set()
    # what the issue asks the alerts to watch
    watched = " ".join(r["expr"] for r in alerts)
    for metric in (
        "qlayer_queue_unread_messages",
        "qlayer_queue_oldest_available_age_seconds",
        "qlayer_queue_dead_lettered_total",
    ):
        assert metric in watched
    assert all({"alert", "expr", "labels", "annotations"} <= set(r) for r in alerts)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_scrape_follows_prometheus_conventions() -> None:
    served = served_names()
    assert "qlayer_queue_dead_lettered_total" in served
    assert "qlayer_round_duration_seconds_bucket" in served
    assert "process_resident_memory_bytes" in served
    for name in served:
        if name.startswith("qlayer_queue_") and "_total" in name:
            assert name.endswith("_total") or name.endswith("_created"), name
    # no counter without _total, no time in other units than seconds
    assert not any(n.endswith(("_ms", "_millis", "_count_total")) for n in served)
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["qlayer-alerts.yml"]
