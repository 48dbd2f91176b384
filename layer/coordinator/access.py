"""Who may call an HTTP route: the one hook the router asks (``Router(authorize=...)``).

Every route declares the right it needs (``layer.coordinator.http.RIGHTS``: consume, publish,
browse, admin, or None) and the queue it concerns; ``HttpAccess.authorize`` decides with the
same principals and grants as the gRPC API (``layer.api.access.Access``: the tokens file, the
legacy ``auth_token``/``admin_token``, or open when none is configured). A missing or unknown
token is 401 with ``WWW-Authenticate: Bearer``; a missing right is 403 naming the principal,
the right and the queue. A route that names no queue covers every queue, so it needs the right
on all of them (a grant on ``*``), except the routes that list queues: they only need the
caller authenticated and answer just the queues it may see (``HttpAccess.visible``).
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus

from layer.api.access import Access, Principal, Right
from layer.coordinator.http import HttpError, Request
from layer.exceptions import PermissionDenied, Unauthenticated

__all__ = ["LISTING_ROUTES", "HttpAccess"]

_CHALLENGE = (("WWW-Authenticate", 'Bearer realm="qlayer"'),)

#: Routes that list queues: answered with the queues the caller may browse.
LISTING_ROUTES = frozenset({"/api/queues"})


class HttpAccess:
    def __init__(self, access: Access) -> None:
        self._access = access

    def principal(self, request: Request) -> Principal:
        """The caller of ``request``; ``HttpError`` 401 when it has no valid credentials."""
        try:
            return self._access.authenticate(request.headers.get("authorization"))
        except Unauthenticated as exc:
            raise HttpError(HTTPStatus.UNAUTHORIZED, str(exc), _CHALLENGE) from exc

    def authorize(self, request: Request, right: str | None, queue: str | None) -> None:
        if right is None:
            return
        principal = self.principal(request)
        needed = Right(right)
        try:
            if queue is not None:
                self._access.authorize(principal, needed, queue)
            elif not (request.path in LISTING_ROUTES and needed is Right.BROWSE):
                self._access.authorize_everywhere(principal, needed, request.path)
        except PermissionDenied as exc:
            raise HttpError(HTTPStatus.FORBIDDEN, str(exc)) from exc

    def visible(self, request: Request, queues: Iterable[str]) -> set[str]:
        """The queues among ``queues`` the caller of ``request`` may browse."""
        return self._access.visible(self.principal(request), Right.BROWSE, queues)
