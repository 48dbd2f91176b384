"""The HTTP listener's pure parts (layer.coordinator.http): request heads, routing, responses."""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

import pytest

from layer.coordinator.health import Health
from layer.coordinator.http import (
    HttpError,
    Request,
    Response,
    Router,
    health_routes,
    parse_head,
)


def test_parse_head() -> None:
    request = parse_head(
        b"GET /readyz?verbose=1 HTTP/1.1\r\nHost: x\r\nConnection: Close\r\nX-A:  b \r\n\r\n"
    )
    assert (request.method, request.path, request.query) == ("GET", "/readyz", "verbose=1")
    assert request.headers == {"host": "x", "connection": "Close", "x-a": "b"}
    assert not request.keep_alive
    assert parse_head(b"GET / HTTP/1.1\r\n\r\n").keep_alive  # HTTP/1.1 keeps by default
    assert not parse_head(b"GET / HTTP/1.0\r\n\r\n").keep_alive
    assert parse_head(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive


@pytest.mark.parametrize(
    ("head", "status", "reason"),
    [
        (b"GET /\r\n\r\n", HTTPStatus.BAD_REQUEST, "bad request line 'GET /'"),
        (b"GET / HTTP/2.0\r\n\r\n", HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "unsupported version"),
        (b"get / HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST, "bad method 'get'"),
        (b"GET http://x/ HTTP/1.1\r\n\r\n", HTTPStatus.BAD_REQUEST, "must be a path"),
        (b"GET / HTTP/1.1\r\nno colon\r\n\r\n", HTTPStatus.BAD_REQUEST, "bad header line"),
        (b"GET / HTTP/1.1\r\nX :1\r\n\r\n", HTTPStatus.BAD_REQUEST, "bad header line"),
    ],
)
def test_bad_heads_say_what_was_wrong(head: bytes, status: HTTPStatus, reason: str) -> None:
    with pytest.raises(HttpError, match=reason) as info:
        parse_head(head)
    assert info.value.status == status


def test_body_length() -> None:
    def length(headers: dict[str, str]) -> int:
        return Request("POST", "/", "", "HTTP/1.1", headers).body_length

    assert length({}) == 0
    assert length({"content-length": "12"}) == 12
    for headers, status in [
        ({"content-length": "-1"}, HTTPStatus.BAD_REQUEST),
        ({"content-length": "999999999"}, HTTPStatus.REQUEST_ENTITY_TOO_LARGE),
        ({"transfer-encoding": "chunked"}, HTTPStatus.NOT_IMPLEMENTED),
    ]:
        with pytest.raises(HttpError) as info:
            length(headers)
        assert info.value.status == status


def test_response_encoding() -> None:
    response = Response.json(503, {"ready": False}, ("Retry-After", "1"))
    wire = response.encode(keep_alive=False)
    head, body = wire.split(b"\r\n\r\n", 1)
    assert head.split(b"\r\n") == [
        b"HTTP/1.1 503 Service Unavailable",
        b"Content-Type: application/json",
        b"Content-Length: 16",
        b"Cache-Control: no-store",
        b"Connection: close",
        b"Retry-After: 1",
    ]
    assert json.loads(body) == {"ready": False}
    assert response.encode(head_only=True) == response.encode().split(b"\r\n\r\n")[0] + b"\r\n\r\n"


def request(method: str, path: str) -> Request:
    return Request(method, path, "", "HTTP/1.1", {})


def test_router_404_405_head_and_a_failing_handler() -> None:
    router = Router()

    async def ok(_: Request) -> Response:
        return Response(200, b"ok")

    async def broken(_: Request) -> Response:
        raise RuntimeError("boom")

    router.add("GET", "/a", ok)
    router.add("GET", "/broken", broken)
    with pytest.raises(ValueError, match="GET /a is routed already"):
        router.add("GET", "/a", ok)

    def run(method: str, path: str) -> Response:
        return asyncio.run(router.dispatch(request(method, path)))

    assert run("GET", "/a").body == b"ok"
    assert run("HEAD", "/a").status == 200  # the body is left out when encoding
    missing = run("GET", "/b")
    assert (missing.status, json.loads(missing.body)) == (404, {"error": "no such path: /b"})
    refused = run("DELETE", "/a")
    assert refused.status == 405 and ("Allow", "GET, HEAD") in refused.headers
    assert json.loads(refused.body) == {"error": "DELETE is not allowed on /a"}
    assert run("GET", "/broken").status == 500


def test_health_routes_follow_readiness() -> None:
    health = Health()
    router = Router()
    health_routes(router, health)

    def run(path: str) -> tuple[int, dict[str, object]]:
        response = asyncio.run(router.dispatch(request("GET", path)))
        return response.status, json.loads(response.body)

    assert run("/healthz") == (200, {"status": "alive"})
    health.restoring("restoring queue=orders: 10/20 changelog records")
    status, body = run("/readyz")
    assert status == 503 and body["ready"] is False
    assert "restoring state: restoring queue=orders: 10/20 changelog records" in body["reasons"]
    health.restored()
    health.serving()
    assert run("/readyz")[0] == 200
    health.kafka_down("commit failed")
    status, body = run("/readyz")
    assert status == 503 and body["kafka_reachable"] is False
    health.stopping()
    assert run("/readyz")[1]["reasons"][0] == "stopping"
    assert run("/healthz")[0] == 200  # alive as long as it answers


def _get(path: str, method: str = "GET", **headers: str) -> Request:
    return Request(method, path, "", "HTTP/1.1", {k.lower(): v for k, v in headers.items()})


def test_templates_match_one_segment_each_and_the_hook_sees_right_and_queue() -> None:
    seen: list[tuple[str | None, str | None]] = []

    def authorize(request: Request, right: str | None, queue: str | None) -> None:
        seen.append((right, queue))
        if request.headers.get("authorization") == "no":
            raise HttpError(HTTPStatus.FORBIDDEN, f"no {right} on {queue}")

    router = Router(authorize=authorize)

    async def echo(request: Request) -> Response:
        return Response.json(HTTPStatus.OK, dict(request.params))

    router.add("GET", "/api/queues", echo, right="browse")
    router.add("GET", "/api/queues/{queue}/browse", echo, right="browse", queue_param="queue")
    router.add("POST", "/api/queues/{queue}/redrive", echo, right="admin", queue_param="queue")
    with pytest.raises(ValueError, match="unknown right"):
        router.add("GET", "/x", echo, right="root")
    with pytest.raises(ValueError, match="no parameter"):
        router.add("GET", "/y/{q}", echo, queue_param="queue")

    def call(request: Request) -> tuple[int, object]:
        response = asyncio.run(router.dispatch(request))
        return response.status, json.loads(response.body)

    assert call(_get("/api/queues/or%20ders/browse")) == (200, {"queue": "or ders"})
    assert seen[-1] == ("browse", "or ders")
    assert call(_get("/api/queues")) == (200, {})
    assert seen[-1] == ("browse", None)
    assert call(_get("/api/queues/a/b/browse"))[0] == 404  # one segment per parameter
    assert call(_get("/api/queues//browse"))[0] == 404  # never an empty queue name
    assert call(_get("/api/queues/q/redrive"))[0] == 405
    status, body = call(_get("/api/queues/q/redrive", "POST", Authorization="no"))
    assert (status, body) == (403, {"error": "no admin on q"})


def test_http_access_mirrors_the_grpc_api() -> None:
    from layer.api.access import Access
    from layer.coordinator.access import HttpAccess

    def status(
        access: HttpAccess, right: str | None, token: str | None, queue: str | None = "q"
    ) -> int:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        try:
            access.authorize(Request("GET", "/p", "", "HTTP/1.1", headers), right, queue)
        except HttpError as exc:
            return int(exc.status)
        return 200

    def made(auth: str | None, admin: str | None) -> HttpAccess:
        return HttpAccess(Access(auth_token=auth, admin_token=admin))

    open_ = made(None, None)
    assert {status(open_, r, None) for r in ("browse", "admin", None)} == {200}
    both = made("t", "a")
    assert [status(both, "browse", t) for t in (None, "x", "t", "a")] == [401, 401, 200, 200]
    assert [status(both, "admin", t, None) for t in (None, "x", "t", "a")] == [401, 401, 403, 200]
    assert status(both, None, None) == 200  # probes and static files
    only_api = made("t", None)
    assert status(only_api, "admin", "t", None) == 403
    only_admin = made(None, "a")
    assert status(only_admin, "browse", None) == 200
    assert status(only_admin, "admin", "a", None) == 200
    assert status(only_admin, "admin", None, None) in (401, 403)
