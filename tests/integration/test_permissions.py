"""Per-queue permissions against real coordinators: every call with its right missing, a fuzz
of malformed credentials, the tokens file reloaded, and mutual TLS (expired, wrong-CA and
unknown-subject client certificates refused; a known subject is its principal)."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from layer.api.access import RPC_RIGHTS, Right, token_hash
from layer.api.errors import CODE_METADATA_KEY
from layer.api.frames import BROWSE_CODEC, CLIENT_FRAME_CODEC, Browse, Subscribe
from layer.api.tokens import new_token
from layer.client import QueueClient
from layer.exceptions import (
    ConfigError,
    ConnectFailed,
    PermissionDenied,
    QueueExists,
    Unauthenticated,
)
from tests.certs import CertAuthority
from tests.harness import CoordinatorProcess, toml_value, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.integration

RIGHTS = [str(r) for r in Right]


Entry = tuple[str | None, str | None, list[tuple[str, list[str]]]]


def tokens_file(principals: dict[str, Entry]) -> str:
    """name -> (token, certificate subject, [(queue glob, rights)])."""
    lines = []
    for name, (token, subject, grants) in principals.items():
        lines += ["[[principal]]", f"name = {toml_value(name)}"]
        if token is not None:
            lines.append(f"token_sha256 = [{toml_value(token_hash(token))}]")
        if subject is not None:
            lines.append(f"certificate_subject = {toml_value(subject)}")
        for pattern, rights in grants:
            lines += ["[[principal.grant]]", f"queues = {toml_value(pattern)}"]
            lines.append(f"rights = [{', '.join(toml_value(r) for r in rights)}]")
        lines.append("")
    return "\n".join(lines)


@dataclass
class Served:
    proc: CoordinatorProcess
    queue: str  # the queue the grants are about
    other: str  # a queue nobody but root has rights on
    tokens: dict[str, str]
    tokens_path: Path

    def client(self, principal: str, **options: Any) -> QueueClient:
        return QueueClient(
            str(self.proc.address), token=self.tokens[principal], reconnect=False, **options
        )


def _queues(queue: str, other: str) -> list[dict[str, Any]]:
    return [
        {"name": queue, "underlying_topic": queue, "dead_letter_topic": f"{queue}.dlq",
         "message_type": "json", "lease_period": 30},
        {"name": other, "underlying_topic": other},
    ]  # fmt: skip


@pytest.fixture(scope="module")
def served(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One coordinator with a tokens file: per right, ``no-R`` (every right on the queue but
    R) and ``only-R`` (R alone; ``only-admin`` on every queue, as Reload needs); ``root``."""
    home = tmp_path_factory.mktemp("permissions")
    suffix = uuid.uuid4().hex[:8]
    queue, other = f"perm-{suffix}", f"perm-other-{suffix}"
    tokens = {"root": new_token()}
    principals: dict[str, Any] = {"root": (tokens["root"], None, [("*", RIGHTS)])}
    for right in RIGHTS:
        tokens[f"no-{right}"] = tokens[f"only-{right}"] = ""
        tokens[f"no-{right}"], tokens[f"only-{right}"] = new_token(), new_token()
        rest = [r for r in RIGHTS if r != right]
        principals[f"no-{right}"] = (tokens[f"no-{right}"], None, [(queue, rest)])
        pattern = "*" if right == "admin" else f"{queue[:-4]}*"  # a glob that covers queue
        principals[f"only-{right}"] = (tokens[f"only-{right}"], None, [(pattern, [right])])
    # the glob of only-R must not cover `other`
    assert not other.startswith(queue[:-4])
    path = home / "tokens.toml"
    path.write_text(tokens_file(principals))
    cfg = write_config(
        home / "qlayer.toml",
        broker.bootstrap_servers,
        _queues(queue, other),
        {"id": f"perm-{suffix}", "tokens_file": str(path), "http": "127.0.0.1:0"},
    )
    proc = CoordinatorProcess(cfg, home / "state", home / "coordinator.log")
    proc.start()
    try:
        yield Served(proc, queue, other, tokens, path)
    finally:
        proc.stop()


# One call per RPC of queue.proto, as a client makes it; each returns something to check.
CALLS: dict[str, Callable[[QueueClient, str], object]] = {
    "Subscribe": lambda c, q: c.subscribe(q).backlog,
    "Publish": lambda c, q: c.publish(q, b'{"n": 1}'),
    "Stats": lambda c, q: c.stats(q),
    "ListQueues": lambda c, q: [info.name for info in c.queues()],
    "Browse": lambda c, q: c.browse(q),
    "DeadLetters": lambda c, q: c.dead_letters(q),
    "AckWhere": lambda c, q: c.ack_where(q, "/n = -1"),
    "Redrive": lambda c, q: c.redrive(q),
    "Reload": lambda c, q: c.reload().applied,
    "Replay": lambda c, q: list(c.replay(q)),
    # a name no only-R glob covers: the lists of only-browse stay [queue]
    "CreateQueue": lambda c, q: (
        c.create_queue({"name": f"created-{uuid.uuid4().hex[:8]}", "underlying_topic": q}).name
    ),
    "AlterQueue": lambda c, q: c.alter_queue(q, {"lease_period": 30}).name,
    "DeleteQueue": lambda c, q: (
        c.create_queue({"name": f"{q}-gone", "underlying_topic": q}),
        c.delete_queue(f"{q}-gone"),
    ),
    "ListDefinitions": lambda c, q: [d.name for d in c.queue_definitions()],
    "Cluster": lambda c, q: [owned.queue for owned in c.cluster().queues],
    # consume on the new queue's name (here the queue's own: it exists, so the allowed call
    # is answered queue_exists, after the right was checked)
    "CreateTemporaryQueue": lambda c, q: _temporary(c, q),
}


def _temporary(client: QueueClient, queue: str) -> str:
    try:
        return client.create_temporary_queue(queue, queue).name
    except QueueExists:
        return queue


# calls that need their right on every queue (a grant on "*")
EVERYWHERE = {"Reload", "CreateQueue", "AlterQueue", "DeleteQueue"}
# calls that list only what the principal may browse, never refused
LISTS = {"ListQueues", "ListDefinitions", "Cluster"}


def test_calls_cover_every_rpc() -> None:
    assert set(CALLS) == set(RPC_RIGHTS)


@pytest.mark.parametrize("rpc", sorted(RPC_RIGHTS))
def test_every_call_with_its_right_missing(served: Served, rpc: str) -> None:
    right = str(RPC_RIGHTS[rpc])
    call = CALLS[rpc]
    with served.client(f"no-{right}") as client:
        if rpc in LISTS:  # lists only what the principal may browse: nothing here
            assert call(client, served.queue) == []
        else:
            with pytest.raises(PermissionDenied) as info:
                call(client, served.queue)
            if rpc in EVERYWHERE:
                expected = f"principal 'no-{right}' lacks 'admin' on every queue"
            else:
                expected = f"principal 'no-{right}' lacks '{right}' on queue '{served.queue}'"
            assert expected in str(info.value)
    with served.client(f"only-{right}") as client:
        answer = call(client, served.queue)  # allowed: no PermissionDenied
        if rpc in LISTS:
            assert answer == [served.queue]  # not the other queue
        if rpc == "Reload":
            assert answer is True
        if right != "admin" and rpc not in LISTS:  # only-admin has admin on every queue
            with pytest.raises(PermissionDenied, match=f"on queue '{served.other}'"):
                call(client, served.other)


def test_a_denied_call_changes_nothing_and_the_allowed_one_works(served: Served) -> None:
    with served.client("root") as root:
        before = root.stats(served.queue)[0].available
    with served.client("no-publish") as client, pytest.raises(PermissionDenied):
        client.publish(served.queue, b'{"n": 2}')
    with served.client("root") as root:
        assert root.stats(served.queue)[0].available == before
    with served.client("only-publish") as client:
        client.publish(served.queue, b'{"n": 3}')
    with served.client("only-consume") as client, client.subscribe(served.queue, 10) as sub:
        # consume covers the stream's acks, cancels and extends
        first = sub.next(timeout=30)
        assert first is not None
        first.extend(60, wait=True, timeout=30)
        first.cancel(wait=True, timeout=30)
        again = wait_until(lambda: sub.next(timeout=1), timeout=30)
        again.ack(wait=True, timeout=30)
        # Replace onto a queue it may not consume: refused, the subscription stays as it was
        with pytest.raises(PermissionDenied, match=f"lacks 'consume' on queue '{served.other}'"):
            sub.replace(served.other)
        assert sub.queue == served.queue


def test_stats_of_all_queues_lists_only_browsable_ones(served: Served) -> None:
    with served.client("only-browse") as client:
        assert [s.queue for s in client.stats()] == [served.queue]
    with served.client("root") as client:
        assert {s.queue for s in client.stats()} >= {served.queue, served.other}


def test_denials_are_logged_once_and_never_with_the_token(served: Served) -> None:
    with served.client("no-browse") as client:
        for _ in range(5):
            with pytest.raises(PermissionDenied):
                client.browse(served.other)
    message = f"principal 'no-browse' lacks 'browse' on queue '{served.other}'"
    log = wait_until(
        lambda: (text := served.proc.log_path.read_text()) and message in text and text,
        timeout=10,
    )
    assert log.count(message) == 1
    for token in served.tokens.values():
        assert token not in log


# --- malformed credentials --------------------------------------------------------------------

_ASCII = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=300)
_KEYS = st.from_regex(r"[a-z][a-z0-9_.-]{0,20}", fullmatch=True).filter(
    lambda k: not k.startswith("grpc-") and k not in ("te", "content-type", "user-agent")
)
_ACCEPTED = (
    "malformed authorization",
    "unknown bearer token",
    "missing bearer token",
    "more than one authorization",
)


def test_malformed_tokens_and_headers_are_unauthenticated(served: Served) -> None:
    """Whatever metadata a caller sends, it gets UNAUTHENTICATED with a message saying what
    was wrong, never a crash; a good caller goes on being served meanwhile."""
    assert served.proc.address is not None
    channel = grpc.insecure_channel(served.proc.address)
    list_queues = channel.unary_unary("/qlayer.v1.QueueService/ListQueues")
    subscribe = channel.stream_stream("/qlayer.v1.QueueService/Subscribe")
    first = CLIENT_FRAME_CODEC.encode(Subscribe(served.queue, 1))
    outcomes: dict[str, int] = {}

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        authorization=st.lists(
            st.one_of(
                _ASCII,
                _ASCII.map(lambda t: f"Bearer {t}"),
                _ASCII.map(lambda t: f"bearer{t}"),
                st.sampled_from(["", "Bearer", "Bearer ", " Bearer  ", "Basic Zm9vOmJhcg=="]),
            ),
            max_size=2,
        ),
        extra=st.lists(st.tuples(_KEYS, _ASCII), max_size=3),
        binary=st.lists(st.binary(max_size=64), max_size=2),
        stream=st.booleans(),
    )
    # one of each refusal, whatever the random draw
    @example(authorization=["Bearer abcdefgh"], extra=[], binary=[], stream=False)
    @example(authorization=[], extra=[("x-token", "abc")], binary=[b"\x00"], stream=False)
    @example(authorization=["Basic Zm9vOmJhcg=="], extra=[], binary=[], stream=False)
    @example(authorization=["Bearer a1b2c3d4", "Bearer e5f6g7h8"], extra=[], binary=[], stream=True)
    def call(
        authorization: list[str], extra: list[tuple[str, str]], binary: list[bytes], stream: bool
    ) -> None:
        metadata = [("authorization", value) for value in authorization]
        metadata += [(k, v) for k, v in extra if k != "authorization"]
        metadata += [("authorization-bin", value) for value in binary]
        with pytest.raises(grpc.RpcError) as info:
            if stream:  # the subscription stream authenticates after its first frame
                next(subscribe(iter([first]), metadata=metadata, timeout=30))
            else:
                list_queues(b"", metadata=metadata, timeout=30)
        error = info.value
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
        details = error.details() or ""
        reason = next(r for r in _ACCEPTED if details.startswith(r))
        outcomes[reason] = outcomes.get(reason, 0) + 1
        for value in authorization:
            token = value.strip().partition(" ")[2].strip()
            if len(token) > 3:
                assert token not in details

    try:
        call()
        with served.client("root") as client:  # still serving everyone else
            assert served.queue in [info.name for info in client.queues()]
        answer = list_queues.with_call(
            b"", metadata=[("authorization", f"Bearer {served.tokens['root']}")], timeout=30
        )
        assert answer[1].code() == grpc.StatusCode.OK
    finally:
        channel.close()
    assert served.proc.proc is not None and served.proc.proc.poll() is None
    # every kind of refusal was reached (the examples make sure of it)
    assert set(outcomes) == set(_ACCEPTED), outcomes


def test_unauthenticated_carries_its_code(served: Served) -> None:
    assert served.proc.address is not None
    with grpc.insecure_channel(served.proc.address) as channel:
        stats = channel.unary_unary("/qlayer.v1.QueueService/Stats")
        with pytest.raises(grpc.RpcError) as info:
            stats(b"", metadata=[("authorization", "Bearer nope")], timeout=30)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with served.client("no-browse") as client, pytest.raises(PermissionDenied):
        client.stats(served.queue)
    with grpc.insecure_channel(served.proc.address) as channel:
        browse = channel.unary_unary("/qlayer.v1.QueueService/Browse")
        request = BROWSE_CODEC.encode(Browse(served.queue, None, None))
        metadata = [("authorization", f"Bearer {served.tokens['no-browse']}")]
        with pytest.raises(grpc.RpcError) as info:
            browse(request, metadata=metadata, timeout=30)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert (CODE_METADATA_KEY, "permission_denied") in list(info.value.trailing_metadata())


# --- the tokens file reloaded -----------------------------------------------------------------


def test_tokens_file_reloads_on_sighup_and_qlayer_reload(
    coordinator_factory: Callable[..., CoordinatorProcess], names: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    q = names("q")
    admin, late = new_token(), new_token()
    path = tmp_path / "tokens.toml"
    path.write_text(tokens_file({"admin": (admin, None, [("*", RIGHTS)])}))
    proc = coordinator_factory([{"name": q, "underlying_topic": q}], tokens_file=str(path))
    target = str(proc.address)
    with (
        QueueClient(target, token=late, reconnect=False) as client,
        pytest.raises(Unauthenticated, match="unknown bearer token"),
    ):
        client.queues()
    principals = {
        "admin": (admin, None, [("*", RIGHTS)]),
        "late": (late, None, [(q, ["browse"])]),
    }
    path.write_text(tokens_file(principals))
    assert proc.proc is not None
    proc.proc.send_signal(signal.SIGHUP)

    def late_works() -> bool:
        with QueueClient(target, token=late, reconnect=False) as client:
            try:
                return [i.name for i in client.queues()] == [q]
            except Unauthenticated:
                return False

    wait_until(late_works, timeout=30, message="the SIGHUP did not load the new principal")
    # a file that does not load: refused, the principals before it stay
    path.write_text("[[principal]]\nname = 'broken'\n")
    with (
        QueueClient(target, token=admin, reconnect=False) as client,
        pytest.raises(ConfigError, match="needs token_sha256 or certificate_subject"),
    ):
        client.reload()
    proc.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "tokens file not reloaded" in proc.log_path.read_text(), timeout=30)
    assert late_works()
    # qlayer reload applies a good one: late loses its grant
    principals["late"] = (late, None, [("nothing-*", ["browse"])])
    path.write_text(tokens_file(principals))
    with QueueClient(target, token=admin, reconnect=False) as client:
        assert client.reload().applied
    with QueueClient(target, token=late, reconnect=False) as client:
        assert client.queues() == []


# --- mutual TLS -------------------------------------------------------------------------------


@dataclass
class MutualTls:
    proc: CoordinatorProcess
    queue: str
    ca: CertAuthority
    root_token: str

    def client(self, cert: tuple[bytes, bytes] | None, token: str | None = None) -> QueueClient:
        return QueueClient(
            str(self.proc.address),
            token=token,
            tls_root_cert=self.ca.cert.read_bytes(),
            tls_client_cert=cert,
            reconnect=False,
            timeout=30,
        )


@pytest.fixture(scope="module")
def mutual_tls(broker: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[MutualTls]:
    home = tmp_path_factory.mktemp("mtls")
    ca = CertAuthority(home / "ca")
    server = ca.issue("/CN=localhost", server=True)
    queue = f"mtls-{uuid.uuid4().hex[:8]}"
    root = new_token()
    path = home / "tokens.toml"
    path.write_text(
        tokens_file({
            "auditor": (None, "CN=auditor,O=Acme", [("*", ["browse"])]),
            "root": (root, None, [("*", RIGHTS)]),
        })
    )  # fmt: skip
    cfg = write_config(
        home / "qlayer.toml",
        broker.bootstrap_servers,
        [{"name": queue, "underlying_topic": queue}],
        {
            "id": f"mtls-{uuid.uuid4().hex[:8]}",
            "tokens_file": str(path),
            "tls_cert": str(server.cert),
            "tls_key": str(server.key),
            "tls_client_ca": str(ca.cert),
        },
    )
    proc = CoordinatorProcess(cfg, home / "state", home / "coordinator.log")
    proc.start()
    try:
        yield MutualTls(proc, queue, ca, root)
    finally:
        proc.stop()


def test_client_certificate_subject_is_the_principal(mutual_tls: MutualTls) -> None:
    auditor = mutual_tls.ca.issue("/O=Acme/CN=auditor").pair()
    with mutual_tls.client(auditor) as client:
        assert [s.queue for s in client.stats(mutual_tls.queue)] == [mutual_tls.queue]
        with pytest.raises(PermissionDenied) as info:
            client.publish(mutual_tls.queue, b"{}")
        assert f"principal 'auditor' lacks 'publish' on queue '{mutual_tls.queue}'" in str(
            info.value
        )
    # a token, when sent, names the principal (the certificate only opens the connection)
    with mutual_tls.client(auditor, token=mutual_tls.root_token) as client:
        client.publish(mutual_tls.queue, b"{}")
    stranger = mutual_tls.ca.issue("/CN=stranger").pair()
    with mutual_tls.client(stranger) as client, pytest.raises(Unauthenticated) as refused:
        client.queues()
    assert "client certificate subject 'CN=stranger' is not a principal" in str(refused.value)


@pytest.mark.parametrize("case", ["expired", "wrong-ca", "none"])
def test_bad_client_certificates_are_refused(
    mutual_tls: MutualTls, case: str, tmp_path: Path
) -> None:
    if case == "expired":
        cert: tuple[bytes, bytes] | None = mutual_tls.ca.issue(
            "/CN=auditor/O=Acme", start="20200101000000Z", end="20200102000000Z"
        ).pair()
        reason = "certificate has expired"
    elif case == "wrong-ca":
        cert = CertAuthority(tmp_path / "rogue", "rogue-ca").issue("/O=Acme/CN=auditor").pair()
        reason = "unable to get local issuer certificate"
    else:
        cert, reason = None, "PEER_DID_NOT_RETURN_A_CERTIFICATE"
    with mutual_tls.client(cert) as client, pytest.raises(ConnectFailed) as info:
        client.queues()
    assert "refuses a client certificate that is missing, expired or not signed" in str(info.value)
    # the coordinator says why in its log (gRPC's TLS layer reports the handshake failure)
    wait_until(lambda: reason in mutual_tls.proc.log_path.read_text(), timeout=10)
    good = mutual_tls.ca.issue("/O=Acme/CN=auditor").pair()
    with mutual_tls.client(good) as client:  # and goes on serving the others
        assert [i.name for i in client.queues()] == [mutual_tls.queue]


def test_revoking_consume_ends_open_streams_and_returns_their_leases(
    coordinator_factory: Callable[..., CoordinatorProcess], names: Callable[[str], str],
    tmp_path: Path,
) -> None:  # fmt: skip
    q = names("q")
    admin, worker, bystander = new_token(), new_token(), new_token()
    principals: dict[str, Entry] = {
        "admin": (admin, None, [("*", RIGHTS)]),
        "worker": (worker, None, [(q, ["consume"])]),
        "bystander": (bystander, None, [(q, ["consume"])]),
    }
    path = tmp_path / "tokens.toml"
    path.write_text(tokens_file(principals))
    proc = coordinator_factory([{"name": q, "underlying_topic": q}], tokens_file=str(path))
    target = str(proc.address)
    with QueueClient(target, token=admin) as client:
        published = {str(client.publish(q, b"{}")) for _ in range(2)}
    with (
        QueueClient(target, token=worker) as worker_client,
        QueueClient(target, token=bystander) as bystander_client,
        worker_client.subscribe(q, max_backlog=2) as held,
    ):
        got = [wait_until(lambda: held.next(timeout=1), timeout=30) for _ in range(2)]
        assert {m.bookmark for m in got} == published  # the worker holds both
        with bystander_client.subscribe(q, max_backlog=5) as other:
            assert other.next(timeout=0.5) is None
            principals["worker"] = (worker, None, [(q, ["browse"])])  # consume revoked
            path.write_text(tokens_file(principals))
            with QueueClient(target, token=admin) as client:
                client.reload()
            with pytest.raises(
                PermissionDenied, match=f"principal 'worker' lacks 'consume' on queue '{q}'"
            ):
                wait_until(lambda: held.next(timeout=1), timeout=30)
            # its leases came back: the bystander, untouched, gets both
            again = {
                wait_until(lambda: other.next(timeout=1), timeout=30).bookmark for _ in range(2)
            }
            assert again == published


def _http(served: Served, method: str, path: str, principal: str | None) -> tuple[int, Any]:
    """``method path`` on the coordinator's HTTP listener as ``principal`` (None: no token)."""
    headers = {"Content-Type": "application/json"}
    if principal is not None:
        headers["Authorization"] = f"Bearer {served.tokens[principal]}"
    assert served.proc.http_address is not None
    request = urllib.request.Request(
        f"http://{served.proc.http_address}{path}",
        data=b"{}" if method == "POST" else None,
        headers=headers,
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_the_console_api_asks_the_same_grants(served: Served) -> None:
    q, other = served.queue, served.other
    # the overview lists the queues the caller may browse, nothing else
    status, listed = _http(served, "GET", "/api/queues", "only-browse")
    assert status == 200 and [entry["queue"] for entry in listed] == [q]
    status, listed = _http(served, "GET", "/api/queues", "no-browse")
    assert status == 200 and listed == []
    assert _http(served, "GET", "/api/queues", None)[0] == 401
    # a queue's page and browse need browse on that queue
    assert _http(served, "GET", f"/api/queues/{q}", "only-browse")[0] == 200
    status, body = _http(served, "GET", f"/api/queues/{other}", "only-browse")
    assert status == 403 and f"lacks 'browse' on queue '{other}'" in body["error"]
    status, body = _http(served, "GET", f"/api/queues/{q}/browse", "no-browse")
    assert status == 403 and f"principal 'no-browse' lacks 'browse' on queue '{q}'" in body["error"]
    # the actions need admin: on the queue, and on every queue for a reload
    status, body = _http(served, "POST", f"/api/queues/{q}/redrive", "no-admin")
    assert status == 403 and "lacks 'admin'" in body["error"]
    status, body = _http(served, "POST", "/api/reload", "only-browse")
    assert status == 403 and "lacks 'admin' on every queue" in body["error"]
    assert _http(served, "POST", "/api/reload", "only-admin")[0] == 200
