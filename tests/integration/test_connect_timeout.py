"""Connecting on a loaded machine: a server that answers its HTTP/2 greeting late is still
reached, and an address that accepts TCP but never answers (what the kernel does for a
SIGSTOPped coordinator) is left for the next one in bounded time.

The server is the in-process ApiServer of test_api_transport (a real gRPC server over a test
double of the queue service); the delay is a real TCP proxy in front of it, holding back the
server's bytes of each new connection; the silent address is a real listening socket that
nobody accepts on; the last test stops a real coordinator with SIGSTOP.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest

from layer.client import AsyncQueueClient, QueueClient
from layer.exceptions import ConnectFailed, QLayerError
from tests.harness import CoordinatorProcess
from tests.integration.test_api_transport import MemoryService, ServerThread
from tests.integration.test_reconnect import coordinator_on

pytestmark = pytest.mark.integration


class DelayProxy:
    """Forwards each accepted connection to ``upstream``; the server's bytes reach the client
    no earlier than ``delay`` seconds after the connection was accepted (so the server's HTTP/2
    SETTINGS arrive late, as from a coordinator on a loaded machine). Client bytes pass at once."""

    def __init__(self, upstream: str, delay: float) -> None:
        host, port = upstream.rsplit(":", 1)
        self._upstream = (host, int(port))
        self._delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            accepted = time.monotonic()
            server = socket.create_connection(self._upstream)
            self.connections += 1
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, 0.0), daemon=True).start()
            threading.Thread(
                target=self._pump, args=(server, client, accepted + self._delay), daemon=True
            ).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, not_before: float) -> None:
        try:
            while data := src.recv(65536):
                hold = not_before - time.monotonic()
                if hold > 0:
                    time.sleep(hold)  # the injected delay itself, not a wait for a condition
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the other side closed: the connection is over

    def close(self) -> None:
        self._listener.close()
        for s in self._sockets:
            s.close()


class SilentAddress:
    """A port that completes the TCP handshake (the kernel does, from the listen backlog) and
    never says anything: a stopped coordinator, seen from a client."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.target = f"127.0.0.1:{self._listener.getsockname()[1]}"

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def server() -> Iterator[ServerThread]:
    s = ServerThread(MemoryService())
    yield s
    s.stop()


@pytest.fixture
def proxy(server: ServerThread) -> Iterator[Callable[[float], DelayProxy]]:
    proxies: list[DelayProxy] = []

    def factory(delay: float) -> DelayProxy:
        p = DelayProxy(server.target, delay)
        proxies.append(p)
        return p

    yield factory
    for p in proxies:
        p.close()


@pytest.fixture
def silent() -> Iterator[SilentAddress]:
    s = SilentAddress()
    yield s
    s.close()


def test_a_server_greeting_late_is_still_reached(
    server: ServerThread, proxy: Callable[[float], DelayProxy]
) -> None:
    # 400 ms before the server's SETTINGS: a connect attempt given 100 ms (grpc's
    # min_reconnect_backoff_ms is its connect timeout) failed here with "connection attempt
    # timed out before receiving SETTINGS frame", on every retry
    slow = proxy(0.4)
    with QueueClient(slow.target) as client:
        bookmark = client.publish("orders", b"late")
        with client.subscribe("orders", max_backlog=5) as sub:
            msg = sub.next(timeout=10)
            assert msg is not None and msg.bookmark == bookmark and msg.data == b"late"
            msg.ack()
            sub.flush(timeout=10)
            assert sub.acked_count == 1
    assert slow.connections >= 1


def test_the_async_client_reaches_a_server_greeting_late(
    server: ServerThread, proxy: Callable[[float], DelayProxy]
) -> None:
    slow = proxy(0.4)

    async def run() -> None:
        async with AsyncQueueClient(slow.target) as client:
            bookmark = await client.publish("orders", b"late")
            async with client.subscribe("orders", max_backlog=5) as sub:
                msg = await sub.next(timeout=10)
                assert msg is not None and msg.bookmark == bookmark
                await msg.ack()
                await sub.flush(timeout=10)
                assert sub.acked_count == 1

    asyncio.run(run())


def test_a_silent_first_address_is_left_after_the_connect_timeout(
    server: ServerThread, silent: SilentAddress
) -> None:
    with QueueClient(f"{silent.target},{server.target}", connect_timeout=1.0) as client:
        started = time.monotonic()
        # a publish that never connected was not sent: it goes on to the next address
        bookmark = client.publish("orders", b"x")
        took = time.monotonic() - started
        assert 0.9 <= took < 10, took  # waited out the silent address, then moved on
        assert client.queues()[0].name == "orders"  # the next call starts at the live one
    # a fresh client's first subscribe goes through every address at once, too
    both = f"{silent.target},{server.target}"
    with QueueClient(both, connect_timeout=1.0) as client, client.subscribe("orders") as sub:
        msg = sub.next(timeout=15)
        assert msg is not None and msg.bookmark == bookmark
        assert sub.address == server.target


def test_only_silent_addresses_fail_with_connect_failed_in_bounded_time(
    silent: SilentAddress,
) -> None:
    with QueueClient(silent.target, connect_timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(ConnectFailed, match="SETTINGS"):
            client.publish("orders", b"x")
        assert time.monotonic() - started < 10


def test_the_connect_timeout_stays_inside_the_call_timeout(
    server: ServerThread, silent: SilentAddress
) -> None:
    # connect_timeout 5 s (the default) but calls time out after 6 s: connect attempts get
    # 3 s, so the call to the silent address ends as ConnectFailed (not sent, next address),
    # never as DEADLINE_EXCEEDED (a ClientError raised to the caller: it may have been sent)
    with QueueClient(f"{silent.target},{server.target}", timeout=6.0) as client:
        started = time.monotonic()
        client.publish("orders", b"x")
        assert 2.8 <= time.monotonic() - started < 6.0


def listeners(address: str) -> list[str]:
    """The processes listening on ``address``'s port, as "pid name status"."""
    port = int(address.rpartition(":")[2])
    found = []
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
            try:
                proc = psutil.Process(conn.pid) if conn.pid else None
                found.append(f"{conn.pid} {proc.name()} {proc.status()}" if proc else "?")
            except psutil.NoSuchProcess:
                found.append(f"{conn.pid} (gone)")
    return found


def test_a_sigstopped_coordinator_first_in_the_list_is_left_for_the_next(
    broker: Any, coordinator_factory: Callable[..., CoordinatorProcess], names: Any
) -> None:
    # real coordinators: the first one stopped (its kernel still accepts TCP), each serving
    # its own queue so the two never share one
    q = names("orders")
    # each on a port of the kernel's choosing, never one another process may take meanwhile
    stopped = coordinator_on(coordinator_factory, names("elsewhere"), "127.0.0.1:0")
    live = coordinator_on(coordinator_factory, q, "127.0.0.1:0")
    a, b = stopped.address, live.address
    assert stopped.proc is not None
    stopped.proc.send_signal(signal.SIGSTOP)
    try:
        with QueueClient(f"{a},{b}", connect_timeout=1.0) as client:
            started = time.monotonic()
            try:
                bookmark = client.publish(q, b'"x"')  # not sent to a: it goes on to b
            except QLayerError as exc:  # seen once in a full run: say where it went
                raise AssertionError(
                    f"publish failed after {time.monotonic() - started:.1f}s: {exc}; the"
                    f" stopped coordinator at {a}, the live one at {b}; listening on {a}:"
                    f" {listeners(a)}; the live one's log:\n{live.log_tail(40)}"
                ) from exc
            took = time.monotonic() - started
            assert 0.9 <= took < 15, took
        with QueueClient(f"{a},{b}", connect_timeout=1.0) as client, client.subscribe(q) as sub:
            msg = sub.next(timeout=30)
            assert msg is not None and msg.bookmark == bookmark
            assert sub.address == b
    finally:
        stopped.proc.send_signal(signal.SIGCONT)


def test_a_second_coordinator_on_a_taken_address_exits_saying_so(
    broker: Any, coordinator_factory: Callable[..., CoordinatorProcess], names: Any
) -> None:
    # grpc's default SO_REUSEPORT would let both listen, the kernel sending each new client to
    # one or the other: a client of one queue would now and then reach the wrong coordinator
    q, other = names("orders"), names("elsewhere")
    first = coordinator_factory(queues=[{"name": q, "underlying_topic": q}])
    second = coordinator_factory(queues=[{"name": other, "underlying_topic": other}], start=False)
    second.listen = first.address
    with pytest.raises(AssertionError, match="did not start"):
        second.start(timeout=60)
    assert f"cannot listen on {first.address}: Address already in use" in second.log_tail(80)
    for _ in range(5):  # each a new connection: every one reaches the first coordinator
        with QueueClient(first.address) as client:
            assert [info.name for info in client.queues()] == [q]
