"""Who is calling and what they may do: principals, per-queue grants, and the one check.

A *principal* is a name with grants. A *grant* gives rights on the queues whose names match a
glob pattern (``orders-*``; ``*`` is every queue). The four rights, and the calls they open:

- ``consume``: Subscribe and Replace, and with them Ack/Cancel/Extend/Expire of the messages
  the stream was given;
- ``publish``: Publish;
- ``browse``: Browse, Stats, ListQueues (both list only the queues the principal may browse);
- ``admin``: AckWhere, Redrive; Reload needs ``admin`` on *every* queue (a grant on ``*``),
  since it can change any queue's definition.

A caller is identified by a bearer token (metadata ``authorization: Bearer <token>``), looked
up by its SHA-256 in the tokens file (``layer.api.tokens``), or, without a token and with
mutual TLS, by its client certificate's subject. The old single tokens stay: ``auth_token`` is
the principal ``auth_token`` with every right on every queue but Reload, ``admin_token`` the
principal ``admin_token`` with everything; with an ``admin_token`` alone, as before, a caller
without a token is ``anonymous`` with every right but Reload. With no token, no tokens file and
no client CA configured the API is open: every caller is ``anonymous`` with every right. With
only a client CA (no tokens file, no token), the CA is the gate: a caller with a certificate it
signed is the principal named by its subject, with every right.

``RPC_RIGHTS`` is the table from each call of ``qlayer.v1.QueueService`` to the right it
needs; the server checks every call against it in one place (a test keeps it complete), and
the HTTP listener's routes call ``Access.authorize`` the same way.
"""

from __future__ import annotations

import enum
import fnmatch
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from layer.config.model import queue_of
from layer.exceptions import ConfigError, PermissionDenied, Unauthenticated

__all__ = [
    "ANONYMOUS",
    "RPC_RIGHTS",
    "Access",
    "Grant",
    "Policy",
    "Principal",
    "Right",
    "normalize_subject",
    "token_hash",
]

log = logging.getLogger(__name__)


class Right(enum.StrEnum):
    CONSUME = "consume"
    PUBLISH = "publish"
    BROWSE = "browse"
    ADMIN = "admin"


ALL_RIGHTS = frozenset(Right)
EVERY_QUEUE = "*"

# Every call of qlayer.v1.QueueService and the right it needs on the queue it names. Stats
# without a queue and ListQueues answer only the queues the caller may browse; Reload needs
# the right on every queue (a grant on "*").
RPC_RIGHTS: Mapping[str, Right] = {
    "Subscribe": Right.CONSUME,
    "Publish": Right.PUBLISH,
    "Stats": Right.BROWSE,
    "ListQueues": Right.BROWSE,
    "Browse": Right.BROWSE,
    "AckWhere": Right.ADMIN,
    "DeadLetters": Right.BROWSE,
    "Redrive": Right.ADMIN,
    "Reload": Right.ADMIN,
    # the cluster's queue definitions: admin on every queue, as Reload (they change the
    # cluster); the list answers only the queues the caller may browse
    "CreateQueue": Right.ADMIN,
    "AlterQueue": Right.ADMIN,
    "DeleteQueue": Right.ADMIN,
    "ListDefinitions": Right.BROWSE,
    # the cluster's members and queue owners: the list answers only the queues the caller
    # may browse
    "Cluster": Right.BROWSE,
    # a temporary queue (for a client's replies): consume on its name is enough
    "CreateTemporaryQueue": Right.CONSUME,
    "Replay": Right.BROWSE,
}


def token_hash(token: str) -> str:
    """What the tokens file stores for a token: its SHA-256, hex.

    A fast hash is the right one here: the tokens are 256-bit random strings made by
    ``qlayer token new`` (nothing to guess, so nothing a slow hash would protect), and the
    hash is computed on every call, where scrypt's deliberate ~50 ms would make each
    connection a denial-of-service lever."""
    return hashlib.sha256(token.encode()).hexdigest()


def normalize_subject(subject: str) -> str:
    """A certificate subject in one spelling: ``CN=a,O=b`` whatever the order and spacing of
    its parts (gRPC reports RFC 2253 order, people write either)."""
    parts: list[str] = []
    current = ""
    escaped = False
    for char in subject:
        if escaped:
            current += char
            escaped = False
        elif char == "\\":
            current += char
            escaped = True
        elif char in ",/":
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    pairs = []
    for part in parts:
        key, eq, value = part.strip().partition("=")
        if part.strip() and eq:
            pairs.append(f"{key.strip().upper()}={value.strip()}")
    return ",".join(sorted(pairs))


@dataclass(frozen=True, slots=True)
class Grant:
    pattern: str  # a glob of queue names: fnmatch's * ? [seq], case-sensitive
    rights: frozenset[Right]

    def covers(self, right: Right, queue: str) -> bool:
        # a shard of a partitioned queue (``q#3``) is covered by its queue's grants
        return right in self.rights and fnmatch.fnmatchcase(queue_of(queue), self.pattern)


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    grants: tuple[Grant, ...] = ()
    # Why the admin calls (reload, queue create/alter/delete) are refused although the grants
    # would allow them (the legacy auth_token, where an admin_token exists or none does; an
    # anonymous caller where only an admin_token is set), as what to do; None: the grants decide.
    reload_refusal: str | None = None
    # From the tokens file: a reload may change or remove it (see Access.current)
    from_file: bool = False

    def allows(self, right: Right, queue: str) -> bool:
        return any(grant.covers(right, queue) for grant in self.grants)

    def allows_everywhere(self, right: Right) -> bool:
        """The right on every queue, present and future: a grant on ``*``."""
        return any(g.pattern == EVERY_QUEUE and right in g.rights for g in self.grants)


ANONYMOUS = Principal("anonymous", (Grant(EVERY_QUEUE, ALL_RIGHTS),))


@dataclass(frozen=True, slots=True)
class Policy:
    """The principals of one tokens file: by token hash and by certificate subject."""

    source: str
    by_hash: Mapping[str, Principal] = field(default_factory=dict)
    by_subject: Mapping[str, Principal] = field(default_factory=dict)  # normalized subjects

    @property
    def principals(self) -> list[Principal]:
        seen = {p.name: p for p in (*self.by_hash.values(), *self.by_subject.values())}
        return list(seen.values())


EMPTY_POLICY = Policy("(no tokens file)")


class _DenialLog:
    """Logs each (principal, right, queue) denial once per ``interval`` seconds: a client
    retrying in a loop must not flood the log. Bounded: forgets everything past ``limit``."""

    def __init__(self, interval: float = 60.0, limit: int = 10_000) -> None:
        self._interval = interval
        self._limit = limit
        self._last: dict[tuple[str, ...], float] = {}

    def due(self, key: tuple[str, ...]) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            return False
        if len(self._last) >= self._limit:
            self._last.clear()
        self._last[key] = now
        return True


class Access:
    """The API's access control: identifies callers and checks their rights.

    ``tokens_file`` is read now (a ``ConfigError`` if it does not load), again by ``reload``,
    and when it changes (looked at, by its modification time and size, at most every
    ``watch_interval`` seconds as calls come in; None: only by ``reload``).
    ``auth_token``/``admin_token`` are the single tokens of older configs;
    ``mutual_tls`` says the server verifies client certificates, whose subjects then identify
    callers that send no token.
    """

    def __init__(
        self,
        *,
        tokens_file: Path | None = None,
        auth_token: str | None = None,
        admin_token: str | None = None,
        mutual_tls: bool = False,
        log_interval: float = 60.0,
        watch_interval: float | None = 2.0,
    ) -> None:
        self._tokens_file = tokens_file
        self._watch_interval = watch_interval
        self._next_look = 0.0
        self._stamp: tuple[int, int] | None = None
        self._mutual_tls = mutual_tls
        self._legacy: dict[str, Principal] = {}
        if admin_token:
            self._legacy[token_hash(admin_token)] = Principal(
                "admin_token", (Grant(EVERY_QUEUE, ALL_RIGHTS),)
            )
        if auth_token:
            refusal = (
                "it needs the admin token, not the API token"
                if admin_token
                else "set [coordinator] admin_token (or QLAYER_ADMIN_TOKEN) and call with that"
                " token{or_sighup}"
            )
            self._legacy[token_hash(auth_token)] = Principal(
                "auth_token", (Grant(EVERY_QUEUE, ALL_RIGHTS),), reload_refusal=refusal
            )
        self._open = not (tokens_file or auth_token or admin_token or mutual_tls)
        # admin_token alone (older configs): only Reload needs a token, as it always did
        self._anonymous: Principal | None = None
        if admin_token and not (tokens_file or auth_token or mutual_tls):
            self._anonymous = Principal(
                "anonymous",
                (Grant(EVERY_QUEUE, ALL_RIGHTS),),
                reload_refusal="call with the admin token"
                " (metadata authorization: Bearer <admin_token>)",
            )
        # mutual TLS alone: any certificate the CA signed has every right
        self._ca_is_gate = mutual_tls and not (tokens_file or auth_token or admin_token)
        self._policy = EMPTY_POLICY
        if tokens_file is not None:
            from layer.api.tokens import read_tokens_file

            self._stamp = self._file_stamp()
            self._policy = read_tokens_file(tokens_file)
        self._listeners: list[Callable[[], None]] = []
        self._denials = _DenialLog(log_interval)
        self._rejections = _DenialLog(log_interval)

    @property
    def open(self) -> bool:
        """No credentials configured at all: every caller is ``anonymous`` with every right."""
        return self._open

    @property
    def policy(self) -> Policy:
        return self._policy

    def read(self) -> Policy | None:
        """The tokens file read again, not applied yet (``apply`` does); None without one.
        ``ConfigError`` if it does not load."""
        if self._tokens_file is None:
            return None
        from layer.api.tokens import read_tokens_file

        self._stamp = self._file_stamp()  # a broken file is not read again until it changes
        return read_tokens_file(self._tokens_file)

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after each newly applied tokens file (the API server ends the
        streams of principals that lost their right)."""
        self._listeners.append(listener)

    def current(self, principal: Principal) -> Principal | None:
        """``principal`` as the tokens file now has it (None: removed from it); principals
        not from the file (the single tokens, anonymous, a CA's subjects) never change."""
        if not principal.from_file:
            return principal
        for candidate in self._policy.principals:
            if candidate.name == principal.name:
                return candidate
        return None

    def apply(self, policy: Policy | None) -> None:
        if policy is None:
            return
        self._policy = policy
        for listener in list(self._listeners):
            listener()
        log.info(
            "tokens file loaded source=%s principals=%d",
            policy.source,
            len(policy.principals),
            extra={"source": policy.source, "principals": len(policy.principals)},
        )

    def reload(self) -> None:
        """Read the tokens file again; on a ``ConfigError`` the old principals stay."""
        self.apply(self.read())

    def _file_stamp(self) -> tuple[int, int] | None:
        assert self._tokens_file is not None
        try:
            stat = self._tokens_file.stat()
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size

    def _follow_file(self) -> None:
        """Reload the tokens file if it changed since it was read (checked at most every
        ``watch_interval`` seconds: a stat, no read, while it is unchanged)."""
        if self._tokens_file is None or self._watch_interval is None:
            return
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + self._watch_interval
        if self._file_stamp() == self._stamp:
            return
        try:
            self.reload()
        except ConfigError as exc:
            log.error("tokens file changed but not loaded, its principals stay: %s", exc)

    # --- who is calling -----------------------------------------------------------------------

    def authenticate(self, authorization: str | None, subject: str | None = None) -> Principal:
        """The principal of a call: from its ``authorization`` header value (``Bearer
        <token>``), else from its verified client certificate's ``subject``. Raises
        ``Unauthenticated`` with a message that never repeats the token."""
        if self._open:
            return ANONYMOUS
        self._follow_file()
        if authorization is not None:
            scheme, _, token = authorization.strip().partition(" ")
            token = token.strip()
            if scheme.lower() != "bearer" or not token:
                raise self._reject(
                    "malformed", "malformed authorization (expected 'Bearer <token>')"
                )
            digest = token_hash(token)
            principal = self._legacy.get(digest) or self._policy.by_hash.get(digest)
            if principal is None:
                raise self._reject("unknown token", "unknown bearer token")
            return principal
        if subject is not None:
            if self._ca_is_gate:
                return Principal(subject, (Grant(EVERY_QUEUE, ALL_RIGHTS),))
            principal = self._policy.by_subject.get(normalize_subject(subject))
            if principal is None:
                raise self._reject(
                    "unknown subject",
                    f"client certificate subject {subject!r} is not a principal of"
                    f" {self._policy.source}",
                )
            return principal
        if self._anonymous is not None:
            return self._anonymous
        how = "metadata authorization: Bearer <token>"
        if self._mutual_tls:
            how += ", or a client certificate"
        raise self._reject("missing", f"missing bearer token ({how})")

    def _reject(self, kind: str, message: str) -> Unauthenticated:
        if self._rejections.due((kind,)):
            log.warning("call refused: %s", message, extra={"reason": kind})
        return Unauthenticated(message)

    # --- what they may do ---------------------------------------------------------------------

    def authorize(self, principal: Principal, right: Right, queue: str) -> None:
        """Raise ``PermissionDenied`` naming the missing right and the queue unless
        ``principal`` has ``right`` on ``queue``; a denial is logged once per interval."""
        if not principal.allows(right, queue):
            raise self._deny(
                principal,
                right,
                queue,
                f"principal {principal.name!r} lacks {str(right)!r} on queue {queue!r}",
            )

    def authorize_everywhere(self, principal: Principal, right: Right, call: str) -> None:
        """``right`` on every queue (a grant on ``*``): what Reload needs. ``call`` names the
        call in the refusal (``reload``, ``queue create``, an HTTP route)."""
        if right is Right.ADMIN and principal.reload_refusal is not None:
            hint = ", or send the coordinator SIGHUP" if call == "reload" else ""
            message = f"{call} is an admin call: " + principal.reload_refusal.format(or_sighup=hint)
            raise self._deny(principal, right, EVERY_QUEUE, message)
        if not principal.allows_everywhere(right):
            raise self._deny(
                principal,
                right,
                EVERY_QUEUE,
                f"principal {principal.name!r} lacks {str(right)!r} on every queue"
                f' (a grant on "*"), which {call} needs',
            )

    def visible(self, principal: Principal, right: Right, queues: Iterable[str]) -> set[str]:
        """The queues among ``queues`` on which ``principal`` has ``right``."""
        return {q for q in queues if principal.allows(right, q)}

    def _deny(
        self, principal: Principal, right: Right, queue: str, message: str
    ) -> PermissionDenied:
        if self._denials.due((principal.name, str(right), queue)):
            log.warning(
                "permission denied: %s",
                message,
                extra={"principal": principal.name, "right": str(right), "queue": queue},
            )
        return PermissionDenied(message)
