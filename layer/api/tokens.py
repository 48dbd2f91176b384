"""The tokens file: principals, their token hashes or certificate subjects, and their grants.

TOML, one ``[[principal]]`` table per principal::

    [[principal]]
    name = "orders-worker"
    token_sha256 = ["9f2c...e1"]        # hashes of its tokens (several: rotate without a gap)
    certificate_subject = "CN=orders-worker,O=Acme"   # optional: mutual TLS
    [[principal.grant]]
    queues = "orders-*"                 # a glob of queue names
    rights = ["consume", "browse"]      # consume, publish, browse, admin

``qlayer token new NAME`` makes a token and prints its table, so nobody hashes by hand. Only
hashes are stored: a leaked tokens file opens nothing. The coordinator reads the file at start
and again on SIGHUP or ``qlayer reload``; a file that does not load is refused with a
``ConfigError`` naming it and what is wrong, and the principals before it stay in force.
"""

from __future__ import annotations

import re
import secrets
import tomllib
from pathlib import Path
from typing import Any

from layer.api.access import Grant, Policy, Principal, Right, normalize_subject, token_hash
from layer.exceptions import ConfigError

__all__ = ["new_token", "parse_tokens", "principal_table", "read_tokens_file"]

_NAME_RE = re.compile(r"[A-Za-z0-9._@:-]{1,200}")
_HASH_RE = re.compile(r"[0-9a-f]{64}")
_PRINCIPAL_KEYS = {"name", "token_sha256", "certificate_subject", "grant"}
_GRANT_KEYS = {"queues", "rights"}
_RIGHTS = ", ".join(r.value for r in Right)


def read_tokens_file(path: Path) -> Policy:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"tokens file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"tokens file {path}: not UTF-8 text ({exc.reason})") from exc
    return parse_tokens(text, str(path))


def parse_tokens(text: str, source: str = "<string>") -> Policy:
    """The principals of a tokens file's text; ``ConfigError`` naming ``source``, the
    principal and the key for anything wrong."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"tokens file {source}: not valid TOML: {exc}") from exc
    unknown = set(data) - {"principal"}
    if unknown:
        raise ConfigError(
            f"tokens file {source}: unknown key {sorted(unknown)[0]!r}"
            " (the file holds [[principal]] tables only)"
        )
    tables = data.get("principal", [])
    if not isinstance(tables, list):
        raise ConfigError(f"tokens file {source}: 'principal' must be [[principal]] tables")
    by_hash: dict[str, Principal] = {}
    by_subject: dict[str, Principal] = {}
    names: set[str] = set()
    for n, table in enumerate(tables, 1):
        principal, hashes, subject = _principal(table, f"tokens file {source}: principal #{n}")
        where = f"tokens file {source}: principal {principal.name!r}"
        if principal.name in names:
            raise ConfigError(f"{where}: the name is used twice")
        names.add(principal.name)
        for digest in hashes:
            if digest in by_hash:
                raise ConfigError(
                    f"{where}: token_sha256 {digest[:12]}... already names principal"
                    f" {by_hash[digest].name!r} (a token names one principal)"
                )
            by_hash[digest] = principal
        if subject is not None:
            if subject in by_subject:
                raise ConfigError(
                    f"{where}: certificate_subject already names {by_subject[subject].name!r}"
                )
            by_subject[subject] = principal
    return Policy(source, by_hash, by_subject)


def _principal(table: Any, where: str) -> tuple[Principal, list[str], str | None]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table")
    name = table.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ConfigError(f"{where}: name must be 1-200 characters of A-Z a-z 0-9 . _ @ : -")
    where = where.rsplit(": ", 1)[0] + f": principal {name!r}"
    unknown = set(table) - _PRINCIPAL_KEYS
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {sorted(unknown)[0]!r}"
            f" (known: {', '.join(sorted(_PRINCIPAL_KEYS))})"
        )
    hashes = table.get("token_sha256", [])
    if isinstance(hashes, str):
        hashes = [hashes]
    if not isinstance(hashes, list) or not all(isinstance(h, str) for h in hashes):
        raise ConfigError(f"{where}: token_sha256 must be a string or a list of strings")
    for digest in hashes:
        if not _HASH_RE.fullmatch(digest):
            raise ConfigError(
                f"{where}: token_sha256 {digest[:16]!r} is not 64 lower-case hex digits"
                " (store the hash, not the token: qlayer token new NAME prints it)"
            )
    subject = table.get("certificate_subject")
    if subject is not None:
        if not isinstance(subject, str) or not normalize_subject(subject):
            raise ConfigError(
                f"{where}: certificate_subject must be a subject like 'CN=name,O=org'"
            )
        subject = normalize_subject(subject)
    if not hashes and subject is None:
        raise ConfigError(f"{where}: needs token_sha256 or certificate_subject (or both)")
    grants = table.get("grant", [])
    if not isinstance(grants, list):
        raise ConfigError(f"{where}: grant must be [[principal.grant]] tables")
    return (
        Principal(
            name,
            tuple(_grant(g, f"{where}: grant #{i}") for i, g in enumerate(grants, 1)),
            from_file=True,
        ),
        list(hashes),
        subject,
    )


def _grant(table: Any, where: str) -> Grant:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: must be a table with queues and rights")
    unknown = set(table) - _GRANT_KEYS
    if unknown:
        raise ConfigError(f"{where}: unknown key {sorted(unknown)[0]!r} (known: queues, rights)")
    pattern = table.get("queues")
    if not isinstance(pattern, str) or not pattern:
        raise ConfigError(f"{where}: queues must be a glob of queue names, e.g. 'orders-*'")
    rights = table.get("rights")
    if not isinstance(rights, list) or not rights:
        raise ConfigError(f"{where}: rights must be a non-empty list of: {_RIGHTS}")
    parsed: set[Right] = set()
    for right in rights:
        try:
            parsed.add(Right(right))
        except ValueError:
            raise ConfigError(f"{where}: unknown right {right!r} (rights: {_RIGHTS})") from None
    return Grant(pattern, frozenset(parsed))


def new_token() -> str:
    """A fresh bearer token: 256 random bits, URL-safe text."""
    return secrets.token_urlsafe(32)


def principal_table(
    name: str, token: str, queues: str = "*", rights: tuple[str, ...] = ("consume",)
) -> str:
    """The ``[[principal]]`` table to paste into the tokens file for ``token``."""
    if not _NAME_RE.fullmatch(name):
        raise ConfigError(f"principal name {name!r}: 1-200 characters of A-Z a-z 0-9 . _ @ : -")
    for right in rights:
        if right not in {r.value for r in Right}:
            raise ConfigError(f"unknown right {right!r} (rights: {_RIGHTS})")
    listed = ", ".join(f'"{r}"' for r in rights)
    return (
        "[[principal]]\n"
        f'name = "{name}"\n'
        f'token_sha256 = ["{token_hash(token)}"]\n'
        "[[principal.grant]]\n"
        f"queues = {_toml_string(queues)}\n"
        f"rights = [{listed}]\n"
    )


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
