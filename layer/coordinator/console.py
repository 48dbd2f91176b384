"""The web console: static pages (``layer/console/static``, no build step) and the JSON API
under ``/api/`` that they call, on the coordinator's HTTP listener.

Each route declares the right it needs and the queue it concerns where it is added (see
``layer.coordinator.http``): reading needs ``browse``, the actions (ack-where, redrive,
reload) need ``admin``. The pages send the token the operator typed as
``Authorization: Bearer ...``; the static files themselves hold no data and need none.

The JSON mirrors the gRPC API's answers (``layer.api.service``); errors are
``{"error": "..."}`` with the status of the error's kind (404 unknown queue, 400 bad request,
503 not serving yet).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from layer.api.service import DeadLetter, DeliveredMessage, QueueService, QueueStats, bytes_json
from layer.config import QueueConfig
from layer.coordinator.http import HttpError, Request, Response, Router
from layer.coordinator.partitioned import sum_stats
from layer.exceptions import InvalidRequest, QLayerError, UnknownQueue
from layer.shards import shards_in

__all__ = ["ConsoleService", "console_routes"]

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
MAX_LIMIT = 1000  # browse and dead letters answer at most this many per call


class ConsoleService(QueueService, Protocol):
    """What the console reads beyond the API: subscriptions with their leases, the queue's
    full configuration."""

    def subscriptions_of(self, queue: str, leases: int = 100) -> list[dict[str, object]]: ...

    def queue_config(self, queue: str) -> QueueConfig: ...

    def subscribers_elsewhere(self, queue: str) -> list[str]: ...


def _static_files() -> dict[str, tuple[bytes, str]]:
    """The console's files, read once (package data: shipped in the wheel)."""
    root = resources.files("layer.console") / "static"
    files: dict[str, tuple[bytes, str]] = {}
    for entry in root.iterdir():
        suffix = Path(entry.name).suffix
        if entry.is_file() and suffix in _TYPES:
            files[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return files


def _plain(value: Any) -> Any:
    """A config value as JSON (enums by value, paths as text, tuples as lists)."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def _stats(s: QueueStats) -> dict[str, Any]:
    return dataclasses.asdict(s)


def _message(m: DeliveredMessage) -> dict[str, Any]:
    return {
        "bookmark": str(m.bookmark),
        "key": bytes_json(m.key),
        "value": bytes_json(m.value),
        "headers": [[k, bytes_json(v)] for k, v in m.headers],
        "deliveries": m.deliveries,
        "cancels": m.cancels,
        "timestamp_ms": m.timestamp_ms,
        "barrier": m.barrier,
    }


def _letter(d: DeadLetter) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    out["key"], out["payload"] = bytes_json(d.key), bytes_json(d.payload)
    out["headers"] = [[k, bytes_json(v)] for k, v in d.headers]
    return out


def _limit(request: Request, default: int) -> int:
    text = request.arg("limit")
    if text is None or text == "":
        return default
    if not text.isdigit():
        raise HttpError(HTTPStatus.BAD_REQUEST, f"limit must be a whole number >= 0, got {text!r}")
    return min(int(text), MAX_LIMIT)


def _filter(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise HttpError(HTTPStatus.BAD_REQUEST, "filter must be a string")
    return value


Handler = Callable[[Request], Awaitable[Response]]


def _answering(call: Callable[[Request], Awaitable[object]]) -> Handler:
    """A JSON handler: its result as 200, the service's errors as their status."""

    async def handler(request: Request) -> Response:
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if request.method == "POST" and content_type != "application/json":
            # a cross-site form can POST text/plain without asking; JSON needs a CORS preflight,
            # which this listener never grants: an open console cannot be driven by another page
            return Response.json(
                HTTPStatus.UNSUPPORTED_MEDIA_TYPE, {"error": "send Content-Type: application/json"}
            )
        try:
            return Response.json(HTTPStatus.OK, await call(request))
        except UnknownQueue as exc:
            return Response.json(HTTPStatus.NOT_FOUND, {"error": str(exc)})
        except InvalidRequest as exc:
            return Response.json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except QLayerError as exc:
            return Response.json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)})

    return handler


def console_routes(
    router: Router,
    service: Callable[[], ConsoleService | None],
    visible: Callable[[Request, Iterable[str]], set[str]] | None = None,
) -> None:
    """The console's pages and API; ``service()`` is the coordinator once it serves (None
    before: the API answers 503, the pages say so). ``visible(request, names)``: the queues
    the caller may browse (the overview lists only those); None: all of them."""
    files = _static_files()

    def coordinator() -> ConsoleService:
        found = service()
        if found is None:
            raise HttpError(HTTPStatus.SERVICE_UNAVAILABLE, "the coordinator is not serving yet")
        return found

    async def page(request: Request) -> Response:
        name = request.params.get("file", "index.html")
        found = files.get(name)
        if found is None:
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such console file: {name}")
        body, content_type = found
        return Response(HTTPStatus.OK, body, content_type)

    async def root(_request: Request) -> Response:
        return Response(HTTPStatus.FOUND, b"", headers=(("Location", "/console/"),))

    async def queues(request: Request) -> object:
        svc = coordinator()
        # every queue of the cluster, each from its owner (alone: those served here); a
        # partitioned queue as one line summed over its shards
        lines = {s.queue: s for s in (await svc.cluster_stats()).queues}
        stats: dict[str, QueueStats] = {}
        for info in svc.queues():
            if info.name in lines:
                stats[info.name] = lines[info.name]
            elif parts := [lines[s] for s in shards_in(info.name, list(lines))]:
                stats[info.name] = sum_stats(info.name, parts)
        shown = set(stats) if visible is None else visible(request, stats)
        return [
            {**_stats(stats[info.name]), "config": dataclasses.asdict(info)}
            for info in svc.queues()
            if info.name in shown
        ]

    async def queue(request: Request) -> object:
        svc = coordinator()
        name = request.params["queue"]
        (stats,) = await svc.stats(name)
        config = svc.queue_config(name)
        return {
            **_stats(stats),
            "config": {f.name: _plain(getattr(config, f.name)) for f in dataclasses.fields(config)},
            "subscribers": svc.subscriptions_of(name),  # "subscriptions" is their count
            # in a cluster: members serving the queue (or shards of it) whose subscribers are
            # listed by their own console
            "subscribers_elsewhere": svc.subscribers_elsewhere(name),
        }

    async def browse(request: Request) -> object:
        name = request.params["queue"]
        messages = await coordinator().browse(
            name, _filter(request.arg("filter")), _limit(request, 100)
        )
        return [_message(m) for m in messages]

    async def dead_letters(request: Request) -> object:
        name = request.params["queue"]
        letters = await coordinator().dead_letters(
            name, _filter(request.arg("filter")), _limit(request, 100)
        )
        return [_letter(d) for d in letters]

    async def ack_where(request: Request) -> object:
        body = request.json()
        expression = _filter(body.get("filter"))
        if expression is None:
            raise HttpError(HTTPStatus.BAD_REQUEST, "ack-where needs a filter")
        expire = body.get("expire", False)
        if not isinstance(expire, bool):
            raise HttpError(HTTPStatus.BAD_REQUEST, "expire must be true or false")
        result = await coordinator().ack_where(request.params["queue"], expression, expire)
        return dataclasses.asdict(result)

    async def redrive(request: Request) -> object:
        body = request.json()
        limit = body.get("limit")
        if limit is not None and (not isinstance(limit, int) or limit < 0):
            raise HttpError(HTTPStatus.BAD_REQUEST, "limit must be a whole number >= 0")
        result = await coordinator().redrive(
            request.params["queue"], _filter(body.get("filter")), limit
        )
        return dataclasses.asdict(result)

    async def reload(_request: Request) -> object:
        result = await coordinator().reload()
        return {**dataclasses.asdict(result), "lines": result.lines()}

    router.add("GET", "/", root)
    router.add("GET", "/console/", page)
    router.add("GET", "/console/{file}", page)
    router.add("GET", "/api/queues", _answering(queues), right="browse")
    q = "/api/queues/{queue}"
    router.add("GET", q, _answering(queue), right="browse", queue_param="queue")
    router.add("GET", q + "/browse", _answering(browse), right="browse", queue_param="queue")
    router.add(
        "GET", q + "/dead-letters", _answering(dead_letters), right="browse", queue_param="queue"
    )
    router.add("POST", q + "/ack-where", _answering(ack_where), right="admin", queue_param="queue")
    router.add("POST", q + "/redrive", _answering(redrive), right="admin", queue_param="queue")
    router.add("POST", "/api/reload", _answering(reload), right="admin")
