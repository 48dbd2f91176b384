"""Permissions on the HTTP listener's routes: the same principals and rights as the gRPC API.

A route that needs a right is wrapped once where it is added::

    router.add("GET", "/api/browse", guarded(access, browse, right=Right.BROWSE,
                                             queue_param="queue"))

or calls ``authorize`` itself (a route that filters, say, lists only the queues the caller may
browse: ``principal_of`` then ``access.visible``). A router that takes one hook for all its
routes gets it from ``hook(access)``: ``check(request, "browse", queue)`` is None when
allowed, else the response to send. Credentials come from the request's
``Authorization: Bearer <token>`` header (a browser page sends it with ``fetch``; no cookie is
accepted, so a page elsewhere cannot make the browser act for its user). A missing or unknown
token is 401 with ``WWW-Authenticate: Bearer``; a missing right is 403 naming the principal,
the right and the queue, logged once per interval like the API's denials.
"""

from __future__ import annotations

from collections.abc import Callable
from http import HTTPStatus
from urllib.parse import parse_qs

from layer.api.access import Access, Principal, Right
from layer.coordinator.http import Handler, Request, Response
from layer.exceptions import PermissionDenied, Unauthenticated

__all__ = ["AuthorizeHook", "authorize", "guarded", "hook", "principal_of", "query_param"]

_CHALLENGE = ("WWW-Authenticate", 'Bearer realm="qlayer"')


def query_param(request: Request, name: str) -> str | None:
    """The first value of query parameter ``name`` (None if absent)."""
    values = parse_qs(request.query, keep_blank_values=True).get(name)
    return values[0] if values else None


def principal_of(access: Access, request: Request) -> Principal | Response:
    """The caller of ``request``, or the 401 to answer."""
    try:
        return access.authenticate(request.headers.get("authorization"))
    except Unauthenticated as exc:
        body = {"error": str(exc), "code": "unauthenticated"}
        return Response.json(HTTPStatus.UNAUTHORIZED, body, _CHALLENGE)


def authorize(
    access: Access, request: Request, right: Right, queue: str | None
) -> Principal | Response:
    """The caller if it has ``right`` on ``queue`` (``queue`` None: only authenticated, the
    route checks per queue), else the 401 or 403 to answer."""
    principal = principal_of(access, request)
    if isinstance(principal, Response) or queue is None:
        return principal
    try:
        access.authorize(principal, right, queue)
    except PermissionDenied as exc:
        body = {"error": str(exc), "code": "permission_denied"}
        return Response.json(HTTPStatus.FORBIDDEN, body)
    return principal


AuthorizeHook = Callable[[Request, Right | str, str | None], Response | None]


def hook(access: Access) -> AuthorizeHook:
    """``authorize`` bound to ``access``, as one hook for a router: ``(request, right, queue)``
    -> None when the caller may, else the 401/403 response. ``right`` may be its name."""

    def check(request: Request, right: Right | str, queue: str | None) -> Response | None:
        outcome = authorize(access, request, Right(right), queue)
        return outcome if isinstance(outcome, Response) else None

    return check


def guarded(
    access: Access,
    handler: Handler,
    *,
    right: Right,
    queue_param: str | None = None,
    queue_of: Callable[[Request], str | None] | None = None,
) -> Handler:
    """``handler``, answered only for callers with ``right`` on the request's queue: the
    query parameter ``queue_param``, or what ``queue_of`` finds in the request (a path
    segment, say). Neither given, or no queue in the request: only authenticated."""

    async def checked(request: Request) -> Response:
        if queue_of is not None:
            queue = queue_of(request)
        elif queue_param is not None:
            queue = query_param(request, queue_param)
        else:
            queue = None
        outcome = authorize(access, request, right, queue)
        if isinstance(outcome, Response):
            return outcome
        return await handler(request)

    return checked
