"""The coordinator's HTTP listener: health, metrics, the web console and its JSON API.

A plain asyncio HTTP/1.1 server rather than a web framework: it answers small routes for
probes, scrapers and the console, and needs no dependency for that. The request head is parsed
by a pure function (``parse_head``), routing is a table (``Router``), and ``HttpListener`` only
moves bytes: keep-alive, size limits and timeouts, so that a slow or broken client holds one
connection and nothing else.

Every route declares, where it is added, the right it needs (``consume``, ``publish``,
``browse``, ``admin``, or None) and which path parameter names its queue; the router asks one
hook, ``authorize(request, right, queue)``, before the handler runs (``layer.coordinator.access``
holds today's rule). Paths are templates whose ``{name}`` segments match one path segment.

Routes answer ``Response`` objects; an unknown path is 404, a known path with another method 405
(with ``Allow``), and ``HEAD`` is served wherever ``GET`` is (without the body), as HTTP/1.1
requires of every server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from urllib.parse import parse_qs, unquote

from layer.coordinator.health import Health
from layer.exceptions import ConfigError

__all__ = [
    "HttpError",
    "RIGHTS",
    "Authorize",
    "HttpListener",
    "Request",
    "Response",
    "Route",
    "Router",
    "health_routes",
    "parse_head",
]

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024  # request line and headers; beyond this: 431
MAX_BODY_BYTES = 64 * 1024  # the console's admin actions send small JSON bodies


class HttpError(Exception):
    """A request that cannot be served; answered with ``status`` and the connection closed."""

    def __init__(
        self, status: HTTPStatus, reason: str, headers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(reason)
        self.status = status
        self.headers = headers


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: str
    version: str  # "HTTP/1.1" or "HTTP/1.0"
    headers: Mapping[str, str] = field(default_factory=dict)  # names lower-case
    params: Mapping[str, str] = field(default_factory=dict)  # the path's {name} segments
    body: bytes = b""

    def arg(self, name: str) -> str | None:
        """A query-string argument (the last one of that name), or None."""
        values = parse_qs(self.query, keep_blank_values=True).get(name)
        return values[-1] if values else None

    def json(self) -> dict[str, object]:
        """The body as a JSON object (an empty body is ``{}``); 400 when it is not one."""
        if not self.body:
            return {}
        try:
            payload = json.loads(self.body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, f"the body is not JSON: {exc}") from None
        if not isinstance(payload, dict):
            raise HttpError(HTTPStatus.BAD_REQUEST, "the body must be a JSON object")
        return payload

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection

    @property
    def body_length(self) -> int:
        if "transfer-encoding" in self.headers:
            raise HttpError(HTTPStatus.NOT_IMPLEMENTED, "chunked request bodies are not accepted")
        text = self.headers.get("content-length", "0").strip()
        if not text.isdigit():
            raise HttpError(HTTPStatus.BAD_REQUEST, f"bad Content-Length {text!r}")
        length = int(text)
        if length > MAX_BODY_BYTES:
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "request body too large")
        return length


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, status: int, payload: object, *headers: tuple[str, str]) -> Response:
        body = json.dumps(payload, separators=(",", ":")).encode() + b"\n"
        return cls(status, body, "application/json", headers)

    def encode(self, *, head_only: bool = False, keep_alive: bool = True) -> bytes:
        """The response as bytes on the wire (``head_only``: the answer to a HEAD request)."""
        try:
            phrase = HTTPStatus(self.status).phrase
        except ValueError:
            phrase = ""
        lines = [
            f"HTTP/1.1 {self.status} {phrase}",
            f"Content-Type: {self.content_type}",
            f"Content-Length: {len(self.body)}",
            # every answer here describes the process now: never serve it from a cache
            "Cache-Control: no-store",
            f"Connection: {'keep-alive' if keep_alive else 'close'}",
        ]
        lines.extend(f"{name}: {value}" for name, value in self.headers)
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return head if head_only else head + self.body


def _error(status: HTTPStatus, reason: str, *headers: tuple[str, str]) -> Response:
    return Response.json(status, {"error": reason}, *headers)


def parse_head(data: bytes) -> Request:
    """Parse a request line and headers (everything up to and including the blank line)."""
    # latin-1 maps every byte to a character: a strange byte is a bad header, not a crash
    lines = data.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"bad request line {lines[0][:100]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"unsupported version {version!r}")
    if not method.isalpha() or not method.isupper():
        raise HttpError(HTTPStatus.BAD_REQUEST, f"bad method {method[:20]!r}")
    if not target.startswith("/"):
        raise HttpError(HTTPStatus.BAD_REQUEST, "the request target must be a path")
    path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(HTTPStatus.BAD_REQUEST, f"bad header line {line[:100]!r}")
        headers[name.lower()] = value.strip()
    return Request(method, path, query, version, headers)


Handler = Callable[[Request], Awaitable[Response]]
#: ``authorize(request, right, queue)``: returns when allowed, raises ``HttpError`` (401, 403)
Authorize = Callable[[Request, "str | None", "str | None"], None]

RIGHTS = ("consume", "publish", "browse", "admin")


@dataclass(frozen=True, slots=True)
class Route:
    handler: Handler
    right: str | None  # one of RIGHTS, or None: anyone may call it
    queue_param: str | None  # the path parameter that names the queue concerned


def _allow_all(_request: Request, _right: str | None, _queue: str | None) -> None:
    return None


class Router:
    """Path templates to handlers per method; each route with the right it needs."""

    def __init__(self, authorize: Authorize = _allow_all) -> None:
        self._routes: dict[tuple[str, ...], dict[str, Route]] = {}
        self._authorize = authorize

    def add(
        self,
        method: str,
        path: str,
        handler: Handler,
        *,
        right: str | None = None,
        queue_param: str | None = None,
    ) -> None:
        if right is not None and right not in RIGHTS:
            raise ValueError(f"unknown right {right!r} (one of {', '.join(RIGHTS)})")
        template = tuple(path.strip("/").split("/"))
        if queue_param is not None and "{" + queue_param + "}" not in template:
            raise ValueError(f"{path} has no parameter {{{queue_param}}}")
        methods = self._routes.setdefault(template, {})
        if method in methods:
            raise ValueError(f"{method} {path} is routed already")
        methods[method] = Route(handler, right, queue_param)

    def _match(self, path: str) -> tuple[dict[str, Route], dict[str, str]] | None:
        segments = [unquote(s) for s in path.strip("/").split("/")]
        exact = self._routes.get(tuple(segments))
        if exact is not None:
            return exact, {}
        for template, methods in self._routes.items():
            if len(template) != len(segments):
                continue
            params: dict[str, str] = {}
            for want, got in zip(template, segments, strict=True):
                if want.startswith("{") and want.endswith("}") and got:
                    params[want[1:-1]] = got
                elif want != got:
                    break
            else:
                return methods, params
        return None

    async def dispatch(self, request: Request) -> Response:
        found = self._match(request.path)
        if found is None:
            return _error(HTTPStatus.NOT_FOUND, f"no such path: {request.path}")
        methods, params = found
        route = methods.get(request.method)
        if route is None and request.method == "HEAD":
            route = methods.get("GET")
        if route is None:
            allowed = sorted(set(methods) | ({"HEAD"} if "GET" in methods else set()))
            return _error(
                HTTPStatus.METHOD_NOT_ALLOWED,
                f"{request.method} is not allowed on {request.path}",
                ("Allow", ", ".join(allowed)),
            )
        request = dataclasses.replace(request, params=params)
        try:
            queue = params.get(route.queue_param) if route.queue_param else None
            self._authorize(request, route.right, queue)
            return await route.handler(request)
        except HttpError as exc:
            return _error(exc.status, str(exc), *exc.headers)
        except Exception:
            log.exception(
                "http handler failed", extra={"method": request.method, "path": request.path}
            )
            return _error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error")


def health_routes(router: Router, health: Health) -> None:
    """``/healthz``: the process is alive (it answers at all). ``/readyz``: 200 when ready to
    serve, else 503; the body says why (``Readiness.detail``)."""

    async def healthz(_request: Request) -> Response:
        return Response.json(HTTPStatus.OK, {"status": "alive"})

    async def readyz(_request: Request) -> Response:
        readiness = health.readiness()
        status = HTTPStatus.OK if readiness.ready else HTTPStatus.SERVICE_UNAVAILABLE
        return Response.json(status, readiness.detail)

    router.add("GET", "/healthz", healthz)
    router.add("GET", "/readyz", readyz)


class HttpListener:
    """Serves a ``Router`` on ``address`` (``host:port``; port 0 picks a free one)."""

    def __init__(self, address: str, router: Router, *, idle_timeout: float = 30.0) -> None:
        self._address = address
        self._router = router
        # a connection that sends no complete request head for this long is closed
        self._idle_timeout = idle_timeout
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.port: int | None = None

    @property
    def host(self) -> str:
        """The host as configured (an IPv6 address keeps its brackets, to print host:port)."""
        return self._address.rpartition(":")[0]

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        if self._server is not None:
            raise RuntimeError("HttpListener already started")
        host, _, port = self._address.rpartition(":")
        try:
            server = await asyncio.start_server(
                self._serve, host.strip("[]"), int(port), limit=MAX_HEAD_BYTES
            )
        except OSError as exc:
            # asyncio rewords bind errors at length; the errno's own words are enough
            errno = exc.errno or 0
            reason = os.strerror(errno) if errno > 0 else exc.strerror or str(exc)
            raise ConfigError(f"cannot listen for HTTP on {self._address}: {reason}") from exc
        self._server = server
        self.port = int(server.sockets[0].getsockname()[1])
        log.info(
            "http listener started address=%s port=%d",
            self._address,
            self.port,
            extra={"address": self._address, "port": self.port},
        )
        return self.port

    async def stop(self) -> None:
        """Stop listening and close every connection (a request being answered is cut)."""
        if self._server is None:
            return
        server, self._server = self._server, None
        server.close()
        for writer in list(self._connections):
            writer.close()
        if self._handlers:
            await asyncio.wait(list(self._handlers), timeout=5.0)
        await server.wait_closed()
        log.info("http listener stopped port=%s", self.port, extra={"port": self.port})

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self._connections.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass  # the client went away, or stopped sending in the middle of a body
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            if task is not None:
                self._handlers.discard(task)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Read and answer one request; False when the connection should close."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._idle_timeout)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                log.debug("http client closed mid-request", extra={"bytes": len(exc.partial)})
            return False
        except TimeoutError:
            return False
        except asyncio.LimitOverrunError:
            too_large = HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE
            await self._send(writer, _error(too_large, "request head too large"))
            return False
        try:
            request = parse_head(head)
            length = request.body_length
        except HttpError as exc:
            await self._send(writer, _error(exc.status, str(exc)))
            return False
        if length:
            body = await asyncio.wait_for(reader.readexactly(length), self._idle_timeout)
            request = dataclasses.replace(request, body=body)
        response = await self._router.dispatch(request)
        keep_alive = request.keep_alive
        await self._send(writer, response, request.method == "HEAD", keep_alive)
        return keep_alive

    @staticmethod
    async def _send(
        writer: asyncio.StreamWriter,
        response: Response,
        head_only: bool = False,
        keep_alive: bool = False,
    ) -> None:
        writer.write(response.encode(head_only=head_only, keep_alive=keep_alive))
        await writer.drain()
