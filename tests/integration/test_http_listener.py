"""The HTTP listener on real loopback sockets: keep-alive, bad clients, limits, stop.

No broker: the listener serves a router of its own here; the coordinator's health routes over it
are tested in test_health_endpoints.py.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import yaml

from layer.coordinator.http import HttpListener, Request, Response, Router
from layer.exceptions import ConfigError
from tests.harness import ROOT
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

T = TypeVar("T")


class ListenerThread:
    """An ``HttpListener`` on an event loop of its own thread."""

    def __init__(self, router: Router, **kwargs: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.listener = HttpListener("127.0.0.1:0", router, **kwargs)
        self.port = self.run(self.listener.start())

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def close(self) -> None:
        self.run(self.listener.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


def router() -> Router:
    router = Router()

    async def hello(request: Request) -> Response:
        return Response.json(200, {"path": request.path, "query": request.query})

    router.add("GET", "/hello", hello)
    return router


@pytest.fixture
def listen() -> Iterator[Callable[..., ListenerThread]]:
    started: list[ListenerThread] = []

    def make(**kwargs: Any) -> ListenerThread:
        started.append(ListenerThread(router(), **kwargs))
        return started[-1]

    yield make
    for item in started:
        if item.loop.is_running():
            item.close()


def read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_keep_alive_serves_several_requests_on_one_connection(
    listen: Callable[..., ListenerThread],
) -> None:
    server = listen()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        for n in range(3):
            connection.request("GET", f"/hello?n={n}")
            response = connection.getresponse()
            assert response.status == 200
            assert response.read() == f'{{"path":"/hello","query":"n={n}"}}\n'.encode()
            assert response.getheader("Connection") == "keep-alive"
        first_socket = connection.sock
        connection.request("GET", "/hello")
        connection.getresponse().read()
        assert connection.sock is first_socket  # not reconnected
    finally:
        connection.close()


def test_bad_requests_get_a_one_line_error_and_others_are_served(
    listen: Callable[..., ListenerThread],
) -> None:
    server = listen()
    with server.connect() as sock:
        sock.sendall(b"HELLO\r\n\r\n")
        answer = read_all(sock)
    assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert answer.endswith(b'{"error":"bad request line \'HELLO\'"}\n')
    with server.connect() as sock:
        sock.sendall(b"GET /hello HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    with server.connect() as sock:
        sock.sendall(b"GET /hello HTTP/1.0\r\n\r\n")
        assert read_all(sock).startswith(b"HTTP/1.1 200 OK\r\n")  # HTTP/1.0: closed after


def test_a_silent_client_blocks_nobody_and_is_dropped_after_the_idle_timeout(
    listen: Callable[..., ListenerThread],
) -> None:
    server = listen(idle_timeout=0.5)
    with server.connect() as silent:
        silent.sendall(b"GET /hel")  # and nothing more
        with server.connect() as other:
            other.sendall(b"GET /hello HTTP/1.1\r\nConnection: close\r\n\r\n")
            assert read_all(other).startswith(b"HTTP/1.1 200 OK\r\n")
        silent.settimeout(30)
        assert read_all(silent) == b""  # closed by the server, without an answer


def test_stop_closes_open_connections_and_refuses_new_ones(
    listen: Callable[..., ListenerThread],
) -> None:
    server = listen()
    with server.connect() as sock:
        sock.sendall(b"GET /hello HTTP/1.1\r\n\r\n")
        wait_until(lambda: sock.recv(65536, socket.MSG_PEEK), 10, message="an answer")
        sock.recv(65536)
        server.close()
        assert read_all(sock) == b""  # the kept-alive connection was closed
    with pytest.raises(ConnectionRefusedError):
        server.connect()


def test_an_address_in_use_is_one_clear_error(listen: Callable[..., ListenerThread]) -> None:
    server = listen()
    taken = f"127.0.0.1:{server.port}"

    async def start_second() -> None:
        await HttpListener(taken, Router()).start()

    with pytest.raises(ConfigError) as info:
        asyncio.run(start_second())
    assert str(info.value) == f"cannot listen for HTTP on {taken}: Address already in use"


def test_the_compose_healthcheck_command_passes_on_200_and_fails_on_503(
    listen: Callable[..., ListenerThread],
) -> None:
    # docker-compose.yml's healthcheck, run as the container would run it, against a listener
    # whose /readyz we switch: the check must fail while not ready, not only when unreachable.
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    commands = [
        service["healthcheck"]["test"]
        for name, service in sorted(compose["services"].items())
        if name.startswith("coordinator")
    ]
    assert len(commands) == 3  # each member of the compose file's cluster
    ready = [False]
    readyz = Router()

    async def answer(_: Request) -> Response:
        return Response.json(200 if ready[0] else 503, {"ready": ready[0]})

    readyz.add("GET", "/readyz", answer)
    server = ListenerThread(readyz)
    try:
        for command in commands:
            assert command[:3] == ["CMD", "python", "-c"]
            script = re.sub(r":\d+/readyz", f":{server.port}/readyz", command[3])
            assert script != command[3]

            def check(script: str = script) -> int:
                run = subprocess.run([sys.executable, "-c", script], capture_output=True)
                return run.returncode

            ready[0] = False
            assert check() != 0
            ready[0] = True
            assert check() == 0
    finally:
        server.close()
