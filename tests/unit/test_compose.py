"""docker-compose.yml and deploy/ agree with each other and with the config loader.

No Docker engine runs here: these checks read the files, so a wrong port, a missing mount or a
config the coordinator would refuse fails in CI instead of on a user's machine.
"""

from __future__ import annotations

import re
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml

from layer.config import Config, load

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def kafka(compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"]["kafka"]
    return service


def coordinator_names(compose: dict[str, Any]) -> list[str]:
    return sorted(name for name in compose["services"] if name.startswith("coordinator"))


COORDINATORS = coordinator_names(yaml.safe_load(COMPOSE.read_text()))


@pytest.fixture(scope="module", params=COORDINATORS)
def coordinator(request: pytest.FixtureRequest, compose: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = compose["services"][request.param]
    return service


def environment(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whichever of compose's two spellings it uses."""
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(key): str(value) for key, value in env.items()}


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> host path or volume name, from the short volume syntax."""
    result = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        result[target] = source
    return result


def published_ports(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port."""
    result = {}
    for port in service.get("ports", []):
        host, _, container = str(port).rpartition(":")
        host = host.rpartition(":")[2]  # "127.0.0.1:7071:7071": bound to one host address
        result[int(container)] = int(host or container)
    return result


def listeners(value: str) -> dict[str, str]:
    """'PLAINTEXT://kafka:9092,EXTERNAL://localhost:29092' -> {'PLAINTEXT': 'kafka:9092', ...}."""
    return dict(item.split("://", 1) for item in value.split(","))  # type: ignore[misc]


def command_flags(service: dict[str, Any]) -> dict[str, str]:
    """The ``qlayer coordinator`` command's flags: ``{"--config": path, "--listen": ...}``."""
    command = service["command"]
    assert command[:2] == ["qlayer", "coordinator"]
    rest = command[2:]
    assert len(rest) % 2 == 0 and all(flag.startswith("--") for flag in rest[::2]), command
    return dict(zip(rest[::2], rest[1::2], strict=True))


def config_path_of(service: dict[str, Any]) -> Path:
    container_path = command_flags(service)["--config"]
    host_path = mounts(service)[container_path]
    path = (ROOT / host_path).resolve()
    assert path.is_relative_to(ROOT / "deploy"), "the coordinator's config lives in deploy/"
    return path


def config_of(service: dict[str, Any]) -> Config:
    """Loaded as the coordinator would be: the service's environment and command's flags."""
    flags = command_flags(service)
    overrides = {"listen": flags.get("--listen"), "http": flags.get("--http")}
    return load(config_path_of(service), env=environment(service), overrides=overrides)


@pytest.fixture(scope="module")
def config_path(coordinator: dict[str, Any]) -> Path:
    return config_path_of(coordinator)


@pytest.fixture(scope="module")
def config(coordinator: dict[str, Any]) -> Config:
    return config_of(coordinator)


def test_images_are_pinned(compose: dict[str, Any]):
    for name, service in compose["services"].items():
        if "image" in service:
            image = service["image"]
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
    assert compose["services"]["kafka"]["image"] == "apache/kafka:4.1.0"


def test_kafka_runs_kraft_single_node(kafka: dict[str, Any]):
    env = environment(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node_id}@kafka:9093"
    assert listeners(env["KAFKA_LISTENERS"])["CONTROLLER"] == ":9093"
    assert listeners(env["KAFKA_LISTENERS"])["PLAINTEXT"] == ":9092"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    # One broker: the internal topics cannot be replicated more than once.
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", key


def test_kafka_has_a_healthcheck_the_coordinator_waits_for(
    kafka: dict[str, Any], coordinator: dict[str, Any]
):
    test = " ".join(kafka["healthcheck"]["test"])
    assert "/opt/kafka/bin/kafka-broker-api-versions.sh" in test
    assert coordinator["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_coordinator_bootstrap_is_kafkas_advertised_listener(
    kafka: dict[str, Any], coordinator: dict[str, Any], config: Config
):
    advertised = listeners(environment(kafka)["KAFKA_ADVERTISED_LISTENERS"])["PLAINTEXT"]
    assert environment(coordinator)["QLAYER_BOOTSTRAP_SERVERS"] == advertised == "kafka:9092"
    assert config.broker.bootstrap_servers == advertised


def test_coordinator_is_built_from_deploy_dockerfile(coordinator: dict[str, Any]):
    build = coordinator["build"]
    dockerfile = ROOT / build["context"] / build["dockerfile"]
    assert dockerfile == ROOT / "deploy" / "Dockerfile"
    text = dockerfile.read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "pip install /src" in text


def test_sample_config_loads_and_serves_the_published_port(
    config: Config, coordinator: dict[str, Any]
):
    assert config.coordinator.listen_host == "0.0.0.0"  # reachable from outside the container
    assert config.coordinator.listen_port in published_ports(coordinator)
    assert config.broker.session_timeout_ms == 6000
    orders = config.queue("orders")
    assert orders.underlying_topic == "orders"
    assert orders.dead_letter_topic == "orders.dead-letters"


def test_state_dir_is_a_named_volume(
    compose: dict[str, Any], coordinator: dict[str, Any], config: Config
):
    state_dir = str(config.coordinator.state_dir)
    assert state_dir == "/var/lib/qlayer"
    volume = mounts(coordinator)[state_dir]
    assert volume in compose["volumes"], "the state dir is a named volume, not a bind mount"


def healthcheck_url(coordinator: dict[str, Any]) -> urllib.parse.SplitResult:
    """The URL the coordinator's healthcheck command fetches."""
    test = coordinator["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "-c"], "the image has python, not curl"
    found = re.findall(r'"(http://[^"]+)"', test[3])
    assert len(found) == 1, test[3]
    return urllib.parse.urlsplit(found[0])


def test_healthcheck_asks_readyz_on_the_configured_http_listener(
    config: Config, coordinator: dict[str, Any]
):
    http = config.coordinator.http
    assert http is not None, "deploy/qlayer.toml sets [coordinator] http"
    host, _, port = http.rpartition(":")
    assert host == "0.0.0.0"  # published: probes from outside the container reach it
    url = healthcheck_url(coordinator)
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", int(port), "/readyz")
    assert int(port) in published_ports(coordinator)
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    exposed = re.search(r"^EXPOSE (.+)$", dockerfile, re.MULTILINE)
    assert exposed is not None
    assert {config.coordinator.listen_port, int(port)} <= {int(p) for p in exposed[1].split()}


def test_three_coordinators_of_one_cluster(compose: dict[str, Any]):
    services = compose["services"]
    assert len(COORDINATORS) == 3
    configs = [config_of(services[name]) for name in COORDINATORS]
    ids = [c.coordinator.id for c in configs]
    assert len(set(ids)) == 3, f"each coordinator needs its own id, got {ids}"
    clusters = {c.coordinator.cluster for c in configs}
    assert len(clusters) == 1 and None not in clusters, f"one cluster name, got {clusters}"
    # one file for all: the queues each seeds are the same
    assert len({config_path_of(services[name]) for name in COORDINATORS}) == 1
    # each advertises its hostname (its API listens on 0.0.0.0): distinct, and the service's
    # name, which the compose network resolves
    assert [services[name].get("hostname") for name in COORDINATORS] == COORDINATORS


def test_ports_do_not_clash_and_each_api_is_at_its_own_port_on_the_host(
    compose: dict[str, Any],
):
    seen: dict[int, str] = {}
    for name, service in compose["services"].items():
        for host_port in published_ports(service).values():
            assert host_port not in seen, f"{name} and {seen[host_port]} publish {host_port}"
            seen[host_port] = name
    for name in COORDINATORS:
        service = compose["services"][name]
        c = config_of(service).coordinator
        # the port a member advertises is the one a client on the host dials
        assert published_ports(service)[c.listen_port] == c.listen_port, name
        assert c.http is not None
        http_port = int(c.http.rpartition(":")[2])
        assert f"127.0.0.1:{http_port}:{http_port}" in service["ports"], name
    assert sorted(seen) == [7070, 7071, 7072, 7073, 7074, 7075, 29092]


def test_each_coordinator_has_its_own_state_volume(compose: dict[str, Any]):
    volumes = [mounts(compose["services"][name])["/var/lib/qlayer"] for name in COORDINATORS]
    assert len(set(volumes)) == 3
    assert set(volumes) <= set(compose["volumes"])
