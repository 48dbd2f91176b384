"""Health endpoints of a real coordinator process: HTTP /healthz and /readyz, grpc.health.v1.

The readiness of a restoring coordinator is observed on a changelog made long on purpose (many
records written straight to the changelog topic before the coordinator starts), polled with a
deadline: the HTTP listener is up before the restore starts, so the whole restore is the window.
"""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from connectors import TopicAdmin, TopicSpec
from layer.codec import ChangelogKey, encode_key
from tests.harness import CoordinatorProcess
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def get(address: str, path: str, method: str = "GET") -> tuple[int, dict[str, Any], str]:
    """One request on a new connection: (status, JSON body, Allow header)."""
    host, _, port = address.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        body = response.read()
        return response.status, json.loads(body) if body else {}, response.getheader("Allow", "")
    finally:
        connection.close()


def refused(address: str) -> bool:
    try:
        get(address, "/healthz")
    except ConnectionRefusedError:
        return True
    return False


def test_http_and_grpc_health_of_a_running_coordinator(
    coordinator_factory: Callable[..., CoordinatorProcess], names: Callable[[str], str]
) -> None:
    c = coordinator_factory(
        [{"name": names("q"), "underlying_topic": names("t")}], http="127.0.0.1:0"
    )
    assert c.http_address is not None and c.address is not None
    assert get(c.http_address, "/healthz")[:2] == (200, {"status": "alive"})
    status, body, _ = get(c.http_address, "/readyz")
    assert status == 200, body
    assert body["ready"] is True and body["reasons"] == []
    assert body["restored"] is True and body["kafka_reachable"] is True
    assert get(c.http_address, "/nowhere")[:2] == (404, {"error": "no such path: /nowhere"})
    status, body, allow = get(c.http_address, "/readyz", "POST")
    assert (status, allow) == (405, "GET, HEAD")
    assert get(c.http_address, "/healthz", "HEAD")[:2] == (200, {})

    with grpc.insecure_channel(c.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "qlayer.Queue"):
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert reply.status == SERVING, service
        with pytest.raises(grpc.RpcError) as info:
            stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND

        watch = stub.Watch(health_pb2.HealthCheckRequest(service="qlayer.Queue"), timeout=60)
        assert next(watch).status == SERVING
        # SIGTERM: the watcher is told NOT_SERVING before its stream ends, the process exits
        # cleanly and the HTTP listener goes with it.
        assert c.proc is not None
        c.proc.send_signal(signal.SIGTERM)
        seen = []
        with pytest.raises(grpc.RpcError):
            for update in watch:
                seen.append(update.status)
        assert seen[-1:] == [NOT_SERVING]
    assert c.proc.wait(30) == 0
    assert refused(c.http_address)


def test_readiness_says_restoring_during_a_long_restore(
    coordinator_factory: Callable[..., CoordinatorProcess],
    names: Callable[[str], str],
    topic_admin: TopicAdmin,
    producer_factory: Callable[..., Any],
) -> None:
    queue, topic = names("q"), names("t")
    coordinator_id = f"test-{uuid.uuid4().hex[:8]}"
    c = coordinator_factory(
        [{"name": queue, "underlying_topic": topic}],
        start=False,
        id=coordinator_id,
        http="127.0.0.1:0",
    )
    # A changelog of many records (tombstones of messages of this queue: each one is read,
    # decoded and applied), in large batches so that the broker serves them quickly.
    changelog = f"qlayer.changelog.{coordinator_id}.{queue}"
    topic_admin.ensure_topics(
        [TopicSpec(changelog, partitions=1, config={"cleanup.policy": "compact"})]
    )
    producer = producer_factory(linger_ms=50, batch_num_messages=10_000)
    records = 200_000
    for offset in range(records):
        key = encode_key(ChangelogKey(queue, topic, 0, offset))
        while True:
            try:
                producer.produce(changelog, key=key, value=None)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0

    http_address = c.start(until="http")
    seen: list[tuple[int, dict[str, Any]]] = []
    alive: list[int] = []
    stop_polling = threading.Event()

    def poll() -> None:
        # Until the API serves: every readiness answer, and liveness beside it.
        while not stop_polling.is_set():
            seen.append(get(http_address, "/readyz")[:2])
            alive.append(get(http_address, "/healthz")[0])

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    started = time.monotonic()
    c.wait_serving(180)
    restore_seconds = time.monotonic() - started
    stop_polling.set()
    poller.join(30)

    restoring = [
        body
        for status, body in seen
        if status == 503 and any(r.startswith("restoring state: queue=") for r in body["reasons"])
    ]
    print(
        f"restore of {records} changelog records: {restore_seconds:.1f} s, "
        f"{len(seen)} readiness answers, {len(restoring)} of them 'restoring state: queue=...'"
    )
    assert restoring, f"no 'restoring' readiness seen in {len(seen)} answers: {seen[:3]}"
    assert all(body["ready"] is False and body["restored"] is False for body in restoring)
    assert set(alive) == {200}
    # once serving, ready
    status, body, _ = wait_until(
        lambda: (r := get(http_address, "/readyz"))[0] == 200 and r,
        30,
        message="ready after serving",
    )
    assert body["ready"] is True
    assert c.stop() == 0
    topic_admin.delete_topics([changelog])  # the embedded broker keeps topics in memory
