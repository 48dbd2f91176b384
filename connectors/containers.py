"""A throwaway Apache Kafka (KRaft) in a Docker container, through testcontainers.

testcontainers and the Docker SDK are test dependencies: they are imported only when a container
broker is started, and a missing package or an unreachable Docker engine is a :class:`BrokerError`.
"""

from __future__ import annotations

import logging
import socket
import urllib.parse
from types import TracebackType
from typing import Any

from layer.exceptions import BrokerError

logger = logging.getLogger(__name__)

# Confluent Platform 7.6 is Apache Kafka 3.6; testcontainers' KafkaContainer drives this image's
# start scripts, so an apache/kafka image does not fit it.
DEFAULT_IMAGE = "confluentinc/cp-kafka:7.6.0"
DEFAULT_START_TIMEOUT = 120


_DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


def _unreachable(docker_host: str) -> str | None:
    """Why the Docker engine at ``docker_host`` cannot be reached, or None if a socket connects.

    A plain socket rather than the Docker SDK: docker-py leaves its socket open when the engine is
    missing, which is a ResourceWarning (an error in the test suite) on top of the real problem.
    Hosts other than unix:// and tcp:// (ssh://, npipe://) are left to testcontainers.
    """
    parsed = urllib.parse.urlparse(docker_host)
    try:
        if parsed.scheme == "unix":
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(5)
                sock.connect(parsed.path)
        elif parsed.scheme in ("tcp", "http", "https"):
            with socket.create_connection((parsed.hostname, parsed.port or 2375), timeout=5):
                pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


class KafkaContainerBroker:
    """A single-node Kafka in KRaft mode: :meth:`start`, ``bootstrap_servers``, :meth:`stop`."""

    def __init__(
        self, *, image: str = DEFAULT_IMAGE, start_timeout: int = DEFAULT_START_TIMEOUT
    ) -> None:
        self._image = image
        self._start_timeout = start_timeout
        self._container: Any = None
        self._bootstrap_servers: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        if self._bootstrap_servers is None:
            raise BrokerError("the Kafka container is not started")
        return self._bootstrap_servers

    def start(self) -> KafkaContainerBroker:
        if self._container is not None:
            raise BrokerError("the Kafka container is already started")
        try:
            from testcontainers.community.kafka import KafkaContainer
            from testcontainers.core.docker_client import get_docker_host
        except ImportError as exc:
            raise BrokerError(
                "the testcontainers broker needs the test extra: pip install 'qlayer[test]'"
            ) from exc
        host = get_docker_host() or _DEFAULT_DOCKER_HOST
        reason = _unreachable(host)
        if reason is not None:
            raise BrokerError(
                f"no Docker engine is reachable at {host} ({reason});"
                " use --broker=embedded or --broker=external instead"
            )
        container = KafkaContainer(image=self._image).with_kraft()
        try:
            container.start(timeout=self._start_timeout)
        except Exception as exc:  # testcontainers raises plain exceptions on start-up failures
            if container.get_wrapped_container() is not None:
                try:
                    container.stop()
                except Exception:
                    logger.exception("cannot remove failed Kafka container image=%s", self._image)
            raise BrokerError(f"the Kafka container ({self._image}) did not start: {exc}") from exc
        self._container = container
        self._bootstrap_servers = container.get_bootstrap_server()
        logger.info(
            "kafka container ready image=%s bootstrap=%s", self._image, self._bootstrap_servers
        )
        return self

    def stop(self) -> None:
        """Stop and remove the container; stopping twice is harmless."""
        container, self._container = self._container, None
        self._bootstrap_servers = None
        if container is not None:
            container.stop()
            logger.info("kafka container stopped image=%s", self._image)

    def __enter__(self) -> KafkaContainerBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
