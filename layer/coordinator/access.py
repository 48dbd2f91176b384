"""Who may call an HTTP route: the one hook the router asks (``Router(authorize=...)``).

Every route declares the right it needs (``layer.coordinator.http.RIGHTS``: consume, publish,
browse, admin, or None) and the queue it concerns; ``TokenAccess.authorize`` decides. Today's
rule is the gRPC API's (``layer.api.server``): with no token configured everything is open;
with ``auth_token``, every right needs ``Authorization: Bearer <auth_token>`` (or the admin
token); ``admin`` needs the ``admin_token``, and is refused outright when only an
``auth_token`` is set. ``queue`` is not used yet: per-queue grants replace this body.
"""

from __future__ import annotations

import hmac
from http import HTTPStatus

from layer.coordinator.http import HttpError, Request

__all__ = ["TokenAccess"]

_CHALLENGE = (("WWW-Authenticate", 'Bearer realm="qlayer"'),)


class TokenAccess:
    def __init__(self, auth_token: str | None, admin_token: str | None) -> None:
        self._auth = f"Bearer {auth_token}".encode() if auth_token else None
        self._admin = f"Bearer {admin_token}".encode() if admin_token else None

    def authorize(self, request: Request, right: str | None, queue: str | None) -> None:
        if right is None or (self._auth is None and self._admin is None):
            return
        presented = request.headers.get("authorization", "").encode("latin-1")
        admin = self._admin is not None and hmac.compare_digest(presented, self._admin)
        if right == "admin":
            if admin:
                return
            if self._admin is None:
                raise HttpError(
                    HTTPStatus.FORBIDDEN,
                    "admin actions need [coordinator] admin_token (or QLAYER_ADMIN_TOKEN)",
                )
            if self._auth is not None and hmac.compare_digest(presented, self._auth):
                raise HttpError(
                    HTTPStatus.FORBIDDEN,
                    f"{request.method} {request.path} needs the admin right (the admin token)",
                )
            raise HttpError(HTTPStatus.UNAUTHORIZED, "missing or wrong admin token", _CHALLENGE)
        if admin or self._auth is None:
            return
        if not hmac.compare_digest(presented, self._auth):
            raise HttpError(
                HTTPStatus.UNAUTHORIZED,
                "missing or wrong bearer token (Authorization: Bearer <token>)",
                _CHALLENGE,
            )
