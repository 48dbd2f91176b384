"""The coordinator's health state (layer.coordinator.health): pure, an injected clock."""

from __future__ import annotations

import logging

import pytest

from layer.coordinator.health import Health


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_not_ready_until_restored_and_serving() -> None:
    health = Health(Clock())
    assert not health.readiness().ready
    health.restoring("queue=orders 10/20")
    assert "restoring state: queue=orders 10/20" in health.readiness().reasons
    health.restored()
    assert health.readiness().reasons == ("API not serving yet",)
    health.serving()
    ready = health.readiness()
    assert ready.ready and ready.reasons == ()
    assert ready.detail["kafka_reachable"] is True
    health.stopping()
    assert health.readiness().reasons == ("stopping",)


def test_an_outage_is_logged_once_each_way_with_its_length(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    health = Health(clock)
    health.restored()
    health.serving()
    caplog.set_level(logging.WARNING, logger="layer.coordinator.health")
    assert health.kafka_up() is None  # reachable already: nothing to say
    assert health.kafka_down("commit failed: transport")
    for _ in range(50):
        assert not health.kafka_down("again")
    clock.now += 31.25
    not_ready = health.readiness()
    assert not not_ready.ready
    assert not_ready.reasons == ("Kafka unreachable for 31.2 s: commit failed: transport",)
    assert health.kafka_up() == pytest.approx(31.25)
    assert health.kafka_up() is None
    assert health.readiness().ready
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Kafka is unreachable: commit failed: transport",
        "Kafka is reachable again after 31.2 s",
    ]
    assert health.outages == 1
