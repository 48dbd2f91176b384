"""Principals, grants and the tokens file (layer.api.access, layer.api.tokens): no I/O."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from layer.api.access import (
    RPC_RIGHTS,
    Access,
    Grant,
    Principal,
    Right,
    normalize_subject,
    token_hash,
)
from layer.api.proto.qlayer.v1 import queue_pb2
from layer.api.server import ApiServer
from layer.api.tokens import new_token, parse_tokens, principal_table
from layer.cli import main
from layer.exceptions import ConfigError, PermissionDenied, Unauthenticated

WORKER, AUDITOR = new_token(), new_token()
FILE = f"""
[[principal]]
name = "orders-worker"
token_sha256 = "{token_hash(WORKER)}"
[[principal.grant]]
queues = "orders-*"
rights = ["consume", "publish"]

[[principal]]
name = "auditor"
token_sha256 = ["{token_hash(AUDITOR)}"]
certificate_subject = "O=Acme, CN=auditor"
grant = [{{ queues = "*", rights = ["browse"] }}]
"""


def access_of(text: str, tmp_path: Path, **kwargs: object) -> Access:
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    return Access(tokens_file=path, **kwargs)  # type: ignore[arg-type]


def test_every_call_of_queue_proto_has_a_right_and_a_handler() -> None:
    """The table is complete: a call added to queue.proto without a right fails here."""
    service = queue_pb2.DESCRIPTOR.services_by_name["QueueService"]
    methods = {m.name for m in service.methods}
    assert set(RPC_RIGHTS) == methods
    assert set(ApiServer._METHODS) == methods


def test_tokens_file_principals_by_hash_and_subject(tmp_path: Path) -> None:
    access = access_of(FILE, tmp_path)
    worker = access.authenticate(f"Bearer {WORKER}")
    assert worker.name == "orders-worker"
    assert worker.allows(Right.CONSUME, "orders-eu") and worker.allows(Right.PUBLISH, "orders-x")
    assert not worker.allows(Right.BROWSE, "orders-eu")
    assert not worker.allows(Right.CONSUME, "payments")
    assert access.authenticate(f"bearer  {AUDITOR} ").name == "auditor"  # scheme any case
    # the subject in gRPC's order (RFC 2253) or the file's: the same principal
    assert access.authenticate(None, "CN=auditor,O=Acme").name == "auditor"
    with pytest.raises(Unauthenticated, match="subject 'CN=other' is not a principal"):
        access.authenticate(None, "CN=other")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing bearer token"),
        ("", "malformed authorization"),
        ("Bearer", "malformed authorization"),
        ("Bearer ", "malformed authorization"),
        ("Basic dXNlcjpwdw==", "malformed authorization"),
        ("Bearer not-a-token", "unknown bearer token"),
    ],
)
def test_bad_credentials_are_unauthenticated_without_the_token(
    header: str | None, message: str, tmp_path: Path
) -> None:
    access = access_of(FILE, tmp_path)
    with pytest.raises(Unauthenticated, match=message) as info:
        access.authenticate(header)
    assert "not-a-token" not in str(info.value)


def test_denial_names_principal_right_and_queue_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    access = access_of(FILE, tmp_path)
    worker = access.authenticate(f"Bearer {WORKER}")
    caplog.set_level(logging.WARNING, logger="layer.api.access")
    for _ in range(3):
        with pytest.raises(PermissionDenied) as info:
            access.authorize(worker, Right.BROWSE, "orders-eu")
        assert str(info.value) == "principal 'orders-worker' lacks 'browse' on queue 'orders-eu'"
    with pytest.raises(PermissionDenied):
        access.authorize(worker, Right.BROWSE, "orders-us")  # another queue: logged too
    denials = [r for r in caplog.records if "permission denied" in r.getMessage()]
    assert len(denials) == 2
    assert all(WORKER not in r.getMessage() for r in caplog.records)
    assert denials[0].__dict__["principal"] == "orders-worker"


def test_reload_needs_admin_on_every_queue(tmp_path: Path) -> None:
    access = access_of(FILE, tmp_path)
    scoped = Principal("ops-eu", (Grant("orders-*", frozenset(Right)),))
    with pytest.raises(PermissionDenied, match=r"lacks 'admin' on every queue .*reload"):
        access.authorize_everywhere(scoped, Right.ADMIN, "reload")
    root = Principal("root", (Grant("*", frozenset({Right.ADMIN})),))
    access.authorize_everywhere(root, Right.ADMIN, "reload")


def test_legacy_tokens_keep_their_meaning() -> None:
    both = Access(auth_token="user", admin_token="adm")
    user, admin = both.authenticate("Bearer user"), both.authenticate("Bearer adm")
    for right in Right:
        both.authorize(user, right, "any-queue")
        both.authorize(admin, right, "any-queue")
    both.authorize_everywhere(admin, Right.ADMIN, "reload")
    with pytest.raises(
        PermissionDenied,
        match="^reload is an admin call: it needs the admin token, not the API token$",
    ):
        both.authorize_everywhere(user, Right.ADMIN, "reload")
    only_user = Access(auth_token="user")
    with pytest.raises(PermissionDenied, match="set \\[coordinator\\] admin_token.*SIGHUP"):
        only_user.authorize_everywhere(only_user.authenticate("Bearer user"), Right.ADMIN, "reload")
    # the other admin calls are named as themselves, without reload's SIGHUP way out
    with pytest.raises(
        PermissionDenied, match="^queue create is an admin call: it needs"
    ) as refused:
        both.authorize_everywhere(user, Right.ADMIN, "queue create")
    assert "reload" not in str(refused.value)
    with pytest.raises(PermissionDenied, match="^queue delete is an admin call: set") as refused:
        only_user.authorize_everywhere(
            only_user.authenticate("Bearer user"), Right.ADMIN, "queue delete"
        )
    assert "SIGHUP" not in str(refused.value)
    assert Access().open and Access().authenticate(None).name == "anonymous"
    # admin_token alone: as before, only Reload needs a token
    admin_only = Access(admin_token="adm")
    anonymous = admin_only.authenticate(None)
    admin_only.authorize(anonymous, Right.ADMIN, "q")
    with pytest.raises(PermissionDenied, match="call with the admin token"):
        admin_only.authorize_everywhere(anonymous, Right.ADMIN, "reload")
    admin_only.authorize_everywhere(admin_only.authenticate("Bearer adm"), Right.ADMIN, "r")
    # a client CA alone: the CA is the gate, the subject names the principal
    gate = Access(mutual_tls=True)
    assert not gate.open
    gate.authorize(gate.authenticate(None, "CN=any,O=Acme"), Right.ADMIN, "q")
    with pytest.raises(Unauthenticated, match="or a client certificate"):
        gate.authenticate(None)
    with pytest.raises(Unauthenticated, match="not a principal"):  # a token too: it decides
        Access(mutual_tls=True, auth_token="t").authenticate(None, "CN=any")


def test_config_options_tokens_file_and_tls_client_ca(tmp_path: Path) -> None:
    from layer.config import load

    for name in ("c.pem", "k.pem", "ca.pem"):
        (tmp_path / name).write_text("pem")
    (tmp_path / "tokens.toml").write_text(FILE)
    queue = '[[queue]]\nname = "q"\nunderlying_topic = "t"\n'
    cfg = tmp_path / "qlayer.toml"

    def load_with(coordinator: str) -> object:
        cfg.write_text(f"[coordinator]\n{coordinator}\n{queue}")
        return load(cfg, env={})

    tls = 'tls_cert = "c.pem"\ntls_key = "k.pem"\n'
    config = load_with(f'{tls}tls_client_ca = "ca.pem"\ntokens_file = "tokens.toml"')
    assert config.coordinator.tls_client_ca == tmp_path / "ca.pem"  # type: ignore[attr-defined]
    assert config.coordinator.tokens_file == tmp_path / "tokens.toml"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="option 'tls_client_ca': needs tls_cert and tls_key"):
        load_with('tls_client_ca = "ca.pem"')
    with pytest.raises(ConfigError, match="option 'tls_client_ca': no such file"):
        load_with(f'{tls}tls_client_ca = "nope.pem"')
    with pytest.raises(ConfigError, match="option 'tokens_file': no such file"):
        load_with('tokens_file = "nope.toml"')
    (tmp_path / "tokens.toml").write_text("[[principal]]\nname = 'x'\n")
    with pytest.raises(ConfigError, match=r"tokens file .*tokens.toml: principal 'x': needs"):
        load_with('tokens_file = "tokens.toml"')


def test_reload_replaces_principals_and_a_bad_file_keeps_the_old(tmp_path: Path) -> None:
    access = access_of(FILE, tmp_path)
    path = tmp_path / "tokens.toml"
    path.write_text(FILE.replace('"orders-worker"', '"renamed"'))
    access.reload()
    assert access.authenticate(f"Bearer {WORKER}").name == "renamed"
    path.write_text("[[principal]]\nname = 'x'\n")
    with pytest.raises(ConfigError, match="needs token_sha256 or certificate_subject"):
        access.reload()
    assert access.authenticate(f"Bearer {WORKER}").name == "renamed"


def test_a_changed_tokens_file_is_followed(tmp_path: Path) -> None:
    access = access_of(FILE, tmp_path, watch_interval=0.0)
    path = tmp_path / "tokens.toml"
    late = new_token()
    path.write_text(FILE + f'[[principal]]\nname = "late"\ntoken_sha256 = "{token_hash(late)}"\n')
    assert access.authenticate(f"Bearer {late}").name == "late"
    path.write_text("not toml [")  # broken: logged, the principals before it stay
    assert access.authenticate(f"Bearer {late}").name == "late"
    unwatched = access_of(FILE, tmp_path, watch_interval=None)
    path.write_text(FILE.replace('"auditor"', '"renamed"'))
    assert unwatched.authenticate(f"Bearer {AUDITOR}").name == "auditor"
    assert access.authenticate(f"Bearer {AUDITOR}").name == "renamed"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[principal]\n", "not valid TOML"),
        ("users = 1\n", "unknown key 'users'"),
        ("[[principal]]\nname = 'a b'\ntoken_sha256 = 'x'\n", "principal #1: name must be"),
        ("[[principal]]\nname = 'a'\ntoken_sha256 = 'secret'\n", "not 64 lower-case hex"),
        ("[[principal]]\nname = 'a'\ntoken_sha256 = 3\n", "a string or a list"),
        ("[[principal]]\nname = 'a'\nrole = 'x'\n", "unknown key 'role'"),
        (
            f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\n"
            "[[principal.grant]]\nqueues = '*'\nrights = ['eat']\n",
            "principal 'a': grant #1: unknown right 'eat'",
        ),
        (
            f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\n"
            "[[principal.grant]]\nrights = ['consume']\n",
            "queues must be a glob",
        ),
        (
            f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\n"
            f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'1' * 64}'\n",
            "principal 'a': the name is used twice",
        ),
        (
            f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\n"
            f"[[principal]]\nname = 'b'\ntoken_sha256 = '{'0' * 64}'\n",
            "already names principal 'a'",
        ),
    ],
)
def test_bad_tokens_files_name_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_tokens(text, "/etc/qlayer/tokens.toml")
    assert str(info.value).startswith("tokens file /etc/qlayer/tokens.toml: ")


def test_normalize_subject() -> None:
    assert normalize_subject("CN=a,O=b") == normalize_subject(" o = b , cn=a") == "CN=a,O=b"
    assert normalize_subject("/O=b/CN=a") == "CN=a,O=b"  # openssl's -subj spelling
    assert normalize_subject(r"CN=a\,b") == r"CN=a\,b"


def test_token_new_prints_a_table_that_loads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["token", "new", "svc", "--queues", "orders-*", "--rights", "consume,browse"]) == 0
    out = capsys.readouterr().out
    token = out.splitlines()[1].strip()
    table = out[out.index("[[principal]]") :]
    principal = parse_tokens(table).by_hash[token_hash(token)]
    assert principal.name == "svc" and principal.allows(Right.BROWSE, "orders-1")
    assert main(["token", "new", "svc", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["token_sha256"] == token_hash(record["token"])
    assert main(["token", "new", "svc", "--rights", "eat"]) == 2
    assert "unknown right 'eat'" in capsys.readouterr().err
    assert principal_table("a", "t").count("[[principal") == 2


def test_current_follows_the_file_and_listeners_hear_of_changes(tmp_path: Path) -> None:
    access = access_of(FILE, tmp_path)
    heard: list[int] = []
    access.on_change(lambda: heard.append(1))
    worker = access.authenticate(f"Bearer {WORKER}")
    assert access.current(worker) == worker
    (tmp_path / "tokens.toml").write_text(FILE.split('[[principal]]\nname = "auditor"')[0])
    access.reload()
    assert heard == [1]
    assert access.current(worker) == worker  # still there, same grants
    (tmp_path / "tokens.toml").write_text(FILE.replace('"orders-worker"', '"other"'))
    access.reload()
    assert access.current(worker) is None  # gone from the file
    legacy = Access(auth_token="t")
    user = legacy.authenticate("Bearer t")
    assert legacy.current(user) is user  # not from a file: never changes
