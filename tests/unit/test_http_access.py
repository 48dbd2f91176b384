"""Permissions on HTTP routes (layer.coordinator.http_access): the hook routes call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from layer.api.access import Access, Right, token_hash
from layer.coordinator.http import Request, Response, Router
from layer.coordinator.http_access import authorize, guarded, hook, principal_of, query_param


def access(tmp_path: Path) -> Access:
    path = tmp_path / "tokens.toml"
    path.write_text(
        "[[principal]]\n"
        f'name = "viewer"\ntoken_sha256 = "{token_hash("viewer-token")}"\n'
        '[[principal.grant]]\nqueues = "orders-*"\nrights = ["browse"]\n'
    )
    return Access(tokens_file=path, admin_token="adm")


def request(query: str = "", token: str | None = None) -> Request:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    return Request("GET", "/api/browse", query, "HTTP/1.1", headers)


async def ok(_request: Request) -> Response:
    return Response.json(200, {"ok": True})


def test_a_guarded_route_answers_401_403_or_the_handler(tmp_path: Path) -> None:
    router = Router()
    route = guarded(access(tmp_path), ok, right=Right.BROWSE, queue_param="queue")
    router.add("GET", "/api/browse", route)

    def get(query: str, token: str | None) -> tuple[int, dict[str, str], dict[str, str]]:
        response = asyncio.run(router.dispatch(request(query, token)))
        return response.status, json.loads(response.body), dict(response.headers)

    status, body, headers = get("queue=orders-eu", None)
    assert status == 401 and body["error"].startswith("missing bearer token")
    assert headers["WWW-Authenticate"] == 'Bearer realm="qlayer"'
    status, body, _ = get("queue=orders-eu", "wrong")
    assert (status, body["error"]) == (401, "unknown bearer token")
    status, body, _ = get("queue=payments", "viewer-token")
    assert status == 403
    assert body == {
        "error": "principal 'viewer' lacks 'browse' on queue 'payments'",
        "code": "permission_denied",
    }
    assert get("queue=orders-eu", "viewer-token")[:2] == (200, {"ok": True})
    assert get("queue=payments", "adm")[0] == 200  # the legacy admin token: every right


def test_authorize_and_principal_of_for_routes_that_check_themselves(tmp_path: Path) -> None:
    acl = access(tmp_path)
    viewer = principal_of(acl, request(token="viewer-token"))
    assert not isinstance(viewer, Response) and viewer.name == "viewer"
    assert acl.visible(viewer, Right.BROWSE, ["orders-eu", "payments"]) == {"orders-eu"}
    denied = authorize(acl, request(token="viewer-token"), Right.ADMIN, "orders-eu")
    assert isinstance(denied, Response) and denied.status == 403
    assert query_param(request("queue=a%20b&x=1"), "queue") == "a b"
    assert query_param(request("x=1"), "queue") is None
    open_ = Access()  # nothing configured: the listener stays open, as before
    assert principal_of(open_, request()) == authorize(open_, request(), Right.ADMIN, "q")


def test_one_hook_for_a_router(tmp_path: Path) -> None:
    check = hook(access(tmp_path))
    assert check(request(token="viewer-token"), "browse", "orders-eu") is None
    assert check(request(token="viewer-token"), Right.BROWSE, None) is None  # authenticated
    denied = check(request(token="viewer-token"), "publish", "orders-eu")
    assert denied is not None and denied.status == 403
    assert json.loads(denied.body)["error"] == (
        "principal 'viewer' lacks 'publish' on queue 'orders-eu'"
    )
    missing = check(request(), "browse", "orders-eu")
    assert missing is not None and missing.status == 401


@settings(max_examples=300, deadline=None)
@given(
    value=st.one_of(st.text(max_size=200), st.text(max_size=20).map(lambda t: f"Bearer {t}")),
    queue=st.text(max_size=60),
)
@example(value=" bearer   user ", queue="q")
def test_any_authorization_header_is_401_or_allowed(value: str, queue: str) -> None:
    """Whatever the header (parse_head hands over any latin-1 text), the check answers 401
    with a reason or lets a valid token's principal through; it never fails."""
    acl = Access(tokens_file=None, auth_token="user")
    headers = {"authorization": value}
    outcome = authorize(acl, Request("GET", "/api", "", "HTTP/1.1", headers), Right.BROWSE, queue)
    if isinstance(outcome, Response):
        assert outcome.status == 401
        assert json.loads(outcome.body)["code"] == "unauthenticated"
    else:
        scheme, _, token = value.strip().partition(" ")
        assert (scheme.lower(), token.strip()) == ("bearer", "user")
