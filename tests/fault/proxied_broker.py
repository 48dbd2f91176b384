"""A Tansu broker of a fault test's own, behind a ``TcpProxy``: pausing it (SIGSTOP) or cutting
its connections disturbs no other test."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from connectors.embedded import bound_to_parent, find_tansu_binary
from tests.helpers import wait_until
from tests.proxy import TcpProxy

__all__ = ["Tansu", "free_port"]


class Tansu:
    """A dedicated Tansu broker behind a ``TcpProxy``; clients bootstrap at the proxy, and the
    broker advertises the proxy, so every connection goes through it."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.proxy = TcpProxy(self.port).start()
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://{self.proxy.address}"
        env = {k: v for k, v in os.environ.items() if k not in ("CLUSTER_ID", "LISTENER_URL")}
        env["NO_COLOR"] = "1"
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                bound_to_parent([str(find_tansu_binary()), "broker", "--listener-url", url,
                 "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/"]),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        wait_until(lambda: _answers(admin), 30, message="the dedicated broker did not start")

    @property
    def bootstrap(self) -> str:
        return self.proxy.address

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        self.resume()
        self.proc.send_signal(signal.SIGINT)  # Tansu honours SIGINT (BROKER-NOTES)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proxy.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(admin: AdminClient) -> bool:
    try:
        admin.list_topics(timeout=1)
    except KafkaException:
        return False
    return True
