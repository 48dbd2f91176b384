"""A cluster whose API serves mutual TLS (issue 12): a member forwards stats, browse and publish
of a queue another member serves, and probes the others for ``qlayer cluster``, as a TLS
client of theirs (their certificates verified with ``tls_peer_ca``, else ``tls_client_ca``; its
own ``tls_cert`` presented as its client certificate).

Real coordinator processes with real certificates (``tests/certs.py``) over the embedded broker.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from tests.certs import CertAuthority
from tests.helpers import wait_until
from tests.integration.test_cluster import one_per_partition, served_by

pytestmark = pytest.mark.integration


def test_members_forward_and_probe_over_mutual_tls(
    coordinator_factory: Any, names: Callable[[str], str], tmp_path: Any
) -> None:
    ca = CertAuthority(tmp_path / "ca")
    cluster = names("cluster")
    queues = one_per_partition(names("q"))
    tables = [{"name": q, "underlying_topic": q, "message_type": "bytes"} for q in queues]

    def tls(member: str, peer_ca: bool) -> dict[str, str]:
        cert = ca.issue(f"/CN={member}", server=True)
        options = {
            "tls_cert": str(cert.cert),
            "tls_key": str(cert.key),
            "tls_client_ca": str(ca.cert),  # mutual TLS, the CA the gate
        }
        if peer_ca:
            options["tls_peer_ca"] = str(ca.cert)
        return options

    first = coordinator_factory(tables, cluster=cluster, **tls("member-a", peer_ca=True))
    # the second trusts its peers through tls_client_ca alone (the default)
    second = coordinator_factory([], cluster=cluster, **tls("member-b", peer_ca=False))
    user = ca.issue("/CN=user").pair()

    def client(proc: Any) -> QueueClient:
        return QueueClient(
            str(proc.address), tls_root_cert=ca.cert.read_bytes(), tls_client_cert=user
        )

    a, b = client(first), client(second)
    try:
        ida, idb = a.cluster().member, b.cluster().member

        def split() -> bool:
            mine, theirs = served_by(a, ida, queues), served_by(a, idb, queues)
            return mine | theirs == set(queues) and bool(mine) and bool(theirs)

        wait_until(split, timeout=60, message=lambda: f"no split: {a.cluster()}")
        on_first = served_by(a, ida, queues)
        # each member asks the other over TLS: stats, publish, browse of the other's queues
        for name in queues:
            other = b if name in on_first else a
            wait_until(
                lambda o=other, n=name: _stats_ok(o, n),
                timeout=30,
                message=lambda n=name: f"{n}: stats not forwarded\n{first.log_tail()}",
            )
            bookmark = other.publish(name, f"{name}-1".encode())
            assert bookmark
            wait_until(
                lambda o=other, n=name: [m.value for m in o.browse(n)] == [f"{n}-1".encode()],
                timeout=30,
                message=f"{name}: not browsed through the member that does not serve it",
            )
        # the cluster's stats, asked of either member, miss nothing
        for c in (a, b):
            every = c.cluster_stats()
            assert not every.missing, every.missing
            assert sorted(s.queue for s in every.queues) == sorted(queues)
            assert {s.owner for s in every.queues} == {ida, idb}
        # the probe is a health check over TLS: both up ...
        for c in (a, b):
            assert all(m.alive for m in c.cluster().members), c.cluster()
        # ... and a stopped member (whose port still accepts connections) is not
        assert second.proc is not None
        os.kill(second.proc.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: not {m.id: m for m in a.cluster().members}[idb].alive,
                timeout=30,
                message="a stopped member was probed alive",
            )
        finally:
            second.kill()  # SIGKILL works on a stopped process
    finally:
        a.close()
        b.close()


def _stats_ok(client: QueueClient, queue: str) -> bool:
    try:
        return client.stats(queue)[0].queue == queue
    except Exception:
        return False
