"""``GET /metrics`` and the console's JSON API on a real coordinator: the figures follow what
happens to a queue, names follow Prometheus' conventions, and every route asks for its right
(bearer tokens: the API token reads, only the admin token acts)."""

from __future__ import annotations

import http.client
import json
import re
from typing import Any

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from layer.client import QueueClient
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

TOKEN, ADMIN = "reader-token", "admin-token"


def request(
    address: str, path: str, method: str = "GET", token: str | None = None, body: Any = None
) -> tuple[int, bytes, dict[str, str]]:
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    data = None if body is None else json.dumps(body).encode()
    try:
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, body, headers = request(address, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def metric(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_follow_a_queue(broker, coordinator_factory, names) -> None:
    topic, q, dlq = names("m"), names("m"), names("m-dlq")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": topic, "dead_letter_topic": dlq}], http="127.0.0.1:0"
    )
    http_address = c.http_address
    assert http_address is not None
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 5})
    for i in range(10):
        p.produce(topic, json.dumps({"i": i}).encode())
    assert p.flush(10) == 0

    wait_until(
        lambda: metric(scrape(http_address), "qlayer_queue_available_messages", queue=q) == 10,
        30,
        message="10 available in /metrics",
    )
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=2) as sub:
        for n in range(6):
            msg = sub.next(timeout=10)
            assert msg is not None
            if n < 2:
                msg.expire(wait=True)
            else:
                msg.ack(wait=True)
        held = [sub.next(timeout=10) for _ in range(2)]  # leased, not acked
        assert all(m is not None for m in held)
        wait_until(
            lambda: metric(scrape(http_address), "qlayer_queue_leased_messages", queue=q) == 2,
            15,
            message="2 leased",
        )
        s = scrape(http_address)
    assert metric(s, "qlayer_queue_available_messages", queue=q) == 2
    assert metric(s, "qlayer_queue_ingested_total", queue=q) == 10
    assert metric(s, "qlayer_queue_acked_total", queue=q) == 4
    assert metric(s, "qlayer_queue_delivered_total", queue=q) == 8
    assert metric(s, "qlayer_queue_dead_lettered_total", queue=q, reason="consumer_expire") == 2
    assert metric(s, "qlayer_queue_subscriptions", queue=q) == 1
    assert metric(s, "qlayer_queue_oldest_available_age_seconds", queue=q) > 0
    assert metric(s, "qlayer_queue_unread_messages", queue=q) == 0
    assert metric(s, "qlayer_kafka_reachable") == 1 and metric(s, "qlayer_restored") == 1
    assert metric(s, "qlayer_round_duration_seconds_count") > 0
    assert metric(s, "qlayer_changelog_commit_seconds_count") > 0
    assert metric(s, "process_resident_memory_bytes") > 10_000_000
    for name, _labels in s:
        assert re.fullmatch(r"[a-z_:][a-z0-9_:]*", name), name
        assert name.startswith(("qlayer_", "process_")), name

    # the console's JSON API reads the same
    status, body, _ = request(http_address, "/api/queues")
    assert status == 200
    (overview,) = [x for x in json.loads(body) if x["queue"] == q]
    assert overview["acked_total"] == 4 and overview["extra"]["ingested_total"] == 10
    status, body, _ = request(http_address, f"/api/queues/{q}")
    detail = json.loads(body)
    assert status == 200 and detail["config"]["dead_letter_topic"] == dlq
    status, body, _ = request(http_address, f"/api/queues/{q}/browse?limit=1")
    assert status == 200 and len(json.loads(body)) == 1
    status, body, _ = request(http_address, f"/api/queues/{q}/dead-letters")
    assert status == 200 and {d["reason"] for d in json.loads(body)} == {"consumer_expire"}
    status, body, _ = request(http_address, "/api/queues/nope")
    assert status == 404 and "nope" in json.loads(body)["error"]
    status, body, _ = request(http_address, f"/api/queues/{q}/browse?filter=%2Fi%20%3D")
    assert status == 400 and json.loads(body)["error"]
    status, body, _ = request(http_address, f"/api/queues/{q}/ack-where", "POST", body={})
    assert status == 400 and "filter" in json.loads(body)["error"]
    # a form of another site cannot post here: JSON only (a CORS preflight is never granted)
    host, _, port = http_address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request(
        "POST", f"/api/queues/{q}/ack-where", body=b"filter=/i >= 0",
        headers={"Content-Type": "text/plain"},
    )  # fmt: skip
    assert connection.getresponse().status == 415
    connection.close()
    status, body, _ = request(
        http_address, f"/api/queues/{q}/ack-where", "POST", body={"filter": "/i >= 0"}
    )
    assert status == 200 and json.loads(body)["acked"] == 4  # the 2 leased came back


def test_every_route_asks_for_its_right(broker, coordinator_factory, names) -> None:
    q = names("auth")
    c = coordinator_factory(
        [{"name": q, "underlying_topic": names("auth-t"), "dead_letter_topic": names("dlq")}],
        http="127.0.0.1:0",
        auth_token=TOKEN,
        admin_token=ADMIN,
    )
    a = c.http_address
    assert a is not None
    # open: probes, the scrape (metrics_right unset), the static pages
    for path in ("/healthz", "/metrics", "/console/", "/console/app.js"):
        assert request(a, path)[0] == 200, path
    assert request(a, "/console/../../etc/passwd")[0] == 404
    reads = ["/api/queues", f"/api/queues/{q}", f"/api/queues/{q}/browse"]
    for path in reads:
        status, _, headers = request(a, path)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), path
        assert request(a, path, token="wrong")[0] == 401
        assert request(a, path, token=TOKEN)[0] == 200
        assert request(a, path, token=ADMIN)[0] == 200
    actions = [f"/api/queues/{q}/ack-where", f"/api/queues/{q}/redrive", "/api/reload"]
    for path in actions:
        assert request(a, path, "POST", body={"filter": "/x = 1"})[0] == 401, path
        status, body, _ = request(a, path, "POST", token=TOKEN, body={"filter": "/x = 1"})
        # the legacy auth_token may do what it may through the API: all but a reload
        if path == "/api/reload":
            assert status == 403 and "admin token" in json.loads(body)["error"], (path, body)
        else:
            assert status == 200, (path, body)
        status, body, _ = request(a, path, "POST", token=ADMIN, body={"filter": "/x = 1"})
        assert status == 200, (path, body)
