"""A loopback TCP proxy for fault tests: forwards to a target and can cut, stall or refuse.

Put it between a Kafka client and a broker (start the broker with the proxy's address as its
advertised listener: Kafka clients reconnect to the address the metadata names) or between an
API client and a coordinator. It is a real socket path, so every client library reacts to it
as to a real network fault:

- ``drop()``: close every open connection at once (the peers see a reset); new connections are
  still accepted, so a client that reconnects gets through.
- ``stall()``: stop forwarding in both directions and keep every socket open (a partition, or a
  peer that stopped answering); new connections are accepted and stall too.
- ``refuse()``: new connections are reset as soon as they are accepted; open ones carry on.
- ``heal()``: forward again (stalled bytes flow on) and accept new connections.
- ``hold(pids)``: the connections of these client processes (new ones too) stay stalled after
  ``heal()``, until ``release()``: a partition between one client and the target, the others
  through.

Threads: one accepting, two per connection (one each way). Everything is closed by ``close()``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Iterable
from types import TracebackType

import psutil

log = logging.getLogger(__name__)

_CHUNK = 65536


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (linger 0), as a refused or cut connection looks to its peer."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class _Link:
    """One proxied connection: the client's socket and the target's."""

    def __init__(
        self, client: socket.socket, upstream: socket.socket, peer: tuple[str, int]
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.peer = peer  # the client's end of the connection
        self.pid: int | None = None  # the client's process, once asked (``TcpProxy.hold``)
        self.asked = False
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def close(self, reset: bool = False) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
        for sock in (self.client, self.upstream):
            if reset:
                _reset(sock)
            else:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()


class TcpProxy:
    """``TcpProxy(target_port).start()``; ``address`` is ``127.0.0.1:PORT`` to connect to."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(128)
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self._held: frozenset[int] = frozenset()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._thread = threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True)
        self.accepted = 0  # connections forwarded since start
        self.refused = 0  # connections reset by refuse()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open now."""
        with self._lock:
            return len(self._links)

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    # -- faults ---------------------------------------------------------------------------------

    def drop(self) -> int:
        """Reset every open connection; returns how many."""
        with self._lock:
            links, self._links = self._links, set()
        for link in links:
            link.close(reset=True)
        log.info("proxy port=%d dropped connections=%d", self.port, len(links))
        return len(links)

    def stall(self) -> None:
        self._flowing.clear()
        log.info("proxy port=%d stalled", self.port)

    def refuse(self) -> None:
        self._refusing = True
        log.info("proxy port=%d refusing new connections", self.port)

    def hold(self, pids: Iterable[int]) -> None:
        self._held = frozenset(pids)
        log.info("proxy port=%d holding the connections of pids %s", self.port, sorted(self._held))

    def release(self) -> None:
        self._held = frozenset()
        log.info("proxy port=%d released its held connections", self.port)

    def heal(self) -> None:
        self._refusing = False
        self._flowing.set()
        log.info("proxy port=%d healed", self.port)

    # -- life cycle -----------------------------------------------------------------------------

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()  # lets stalled pumps see the end
        self._thread.join(5)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.drop()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the threads ----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, addr = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._refusing:
                self.refused += 1
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError as exc:
                log.info("proxy port=%d target %s unreachable: %s", self.port, self._target, exc)
                _reset(client)
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            link = _Link(client, upstream, addr)
            with self._lock:
                self._links.add(link)
            self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(
                    target=self._pump, args=(link, src, dst), name="proxy-pump", daemon=True
                ).start()

    def _flows(self, link: _Link) -> bool:
        """Whether ``link`` may forward now (else it waits a little first)."""
        if not self._flowing.wait(0.05):
            return False
        held = self._held
        if not held:
            return True
        if not link.asked:
            link.pid = _pid_of(link.peer, self.port)
            link.asked = True
        if link.pid in held:
            time.sleep(0.05)
            return False
        return True

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not link.closed.is_set():
                data = src.recv(_CHUNK)
                if not data:
                    break
                # stalled: hold the bytes (and, through TCP's window, the sender) until healed
                while not self._flows(link):
                    if link.closed.is_set():
                        return
                if link.closed.is_set():
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._links.discard(link)
            link.close()


def _pid_of(peer: tuple[str, int], port: int) -> int | None:
    """The process whose socket is the client end ``peer`` of a connection to ``port``."""
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.raddr and tuple(conn.laddr) == peer and conn.raddr.port == port:
            return conn.pid
    return None
