"""Permissions on the HTTP listener's routes (layer.coordinator.access.HttpAccess): the one
hook the router asks, with the gRPC API's principals and grants."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from layer.api.access import Access, token_hash
from layer.coordinator.access import HttpAccess
from layer.coordinator.http import HttpError, Request, Response, Router


def access(tmp_path: Path) -> Access:
    path = tmp_path / "tokens.toml"
    path.write_text(
        "[[principal]]\n"
        f'name = "viewer"\ntoken_sha256 = "{token_hash("viewer-token")}"\n'
        '[[principal.grant]]\nqueues = "orders-*"\nrights = ["browse"]\n'
    )
    return Access(tokens_file=path, admin_token="adm")


def request(path: str, token: str | None = None, method: str = "GET") -> Request:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return Request(method, path, "", "HTTP/1.1", headers)


async def ok(_request: Request) -> Response:
    return Response.json(200, {"ok": True})


def test_a_route_answers_401_403_or_the_handler(tmp_path: Path) -> None:
    router = Router(authorize=HttpAccess(access(tmp_path)).authorize)
    router.add("GET", "/api/queues/{queue}/browse", ok, right="browse", queue_param="queue")
    router.add("POST", "/api/reload", ok, right="admin")
    router.add("GET", "/healthz", ok)

    def call(req: Request) -> tuple[int, dict[str, str], dict[str, str]]:
        response = asyncio.run(router.dispatch(req))
        return response.status, json.loads(response.body), dict(response.headers)

    status, body, headers = call(request("/api/queues/orders-eu/browse"))
    assert status == 401 and body["error"].startswith("missing bearer token")
    assert headers["WWW-Authenticate"] == 'Bearer realm="qlayer"'
    status, body, _ = call(request("/api/queues/orders-eu/browse", "wrong"))
    assert (status, body["error"]) == (401, "unknown bearer token")
    status, body, _ = call(request("/api/queues/payments/browse", "viewer-token"))
    assert (status, body) == (
        403,
        {"error": "principal 'viewer' lacks 'browse' on queue 'payments'"},
    )
    assert call(request("/api/queues/orders-eu/browse", "viewer-token"))[:2] == (200, {"ok": True})
    assert call(request("/api/queues/payments/browse", "adm"))[0] == 200  # legacy admin token
    # a route without a queue covers every queue: admin on "*" for a reload
    status, body, _ = call(request("/api/reload", "viewer-token", "POST"))
    assert status == 403 and "lacks 'admin' on every queue" in body["error"]
    assert call(request("/api/reload", "adm", "POST"))[0] == 200
    assert call(request("/healthz"))[0] == 200  # a route without a right needs no token


def test_the_overview_lists_only_what_the_caller_may_browse(tmp_path: Path) -> None:
    http = HttpAccess(access(tmp_path))
    overview = request("/api/queues", "viewer-token")
    http.authorize(overview, "browse", None)  # authenticated is enough: the list is filtered
    assert http.visible(overview, ["orders-eu", "payments"]) == {"orders-eu"}
    open_ = HttpAccess(Access())  # nothing configured: the listener stays open, as before
    open_.authorize(request("/api/reload"), "admin", None)
    assert open_.visible(request("/api/queues"), ["a", "b"]) == {"a", "b"}


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(st.text(max_size=200), st.text(max_size=20).map(lambda t: f"Bearer {t}")),
    queue=st.text(max_size=60),
)
@example(value=" bearer   user ", queue="q")
def test_any_authorization_header_is_401_or_allowed(value: str, queue: str) -> None:
    """Whatever the header (parse_head hands over any latin-1 text), the check answers 401
    with a reason or lets a valid token's principal through; it never fails otherwise."""
    http = HttpAccess(Access(tokens_file=None, auth_token="user"))
    req = Request("GET", "/api", "", "HTTP/1.1", {"authorization": value})
    try:
        http.authorize(req, "browse", queue)
    except HttpError as exc:
        assert exc.status == 401 and str(exc)
    else:
        scheme, _, token = value.strip().partition(" ")
        assert (scheme.lower(), token.strip()) == ("bearer", "user")
