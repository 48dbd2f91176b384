"""``qlayer cluster`` and ``qlayer stats`` against real coordinator processes of one cluster
over the embedded broker (issue 12): what an operator sees of the members, the queues' owners,
and a member that no longer answers."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from tests.harness import qlayer, serving
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def cluster_json(address: str) -> dict[str, Any]:
    r = qlayer("cluster", "--json", "--server", address)
    assert r.returncode == 0, r.stderr
    info: dict[str, Any] = json.loads(r.stdout)
    return info


def test_cluster_shows_members_liveness_and_owners(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster = names("cluster")
    queues = [names(f"q{i}") for i in range(3)]
    tables = [{"name": q, "underlying_topic": q, "message_type": "bytes"} for q in queues]
    first = coordinator_factory(tables, cluster=cluster)
    second = coordinator_factory([], cluster=cluster)
    with QueueClient(str(first.address)) as a:

        def both_own_some() -> bool:
            members = a.cluster().members
            return len(members) == 2 and all(m.partitions for m in members) and serving(a, queues)

        wait_until(both_own_some, timeout=60, message=lambda: f"no split: {a.cluster()}")
        ida = a.cluster().member
    info = cluster_json(str(first.address))
    assert (info["cluster"], info["member"], info["standalone"]) == (cluster, ida, False)
    members = {m["id"]: m for m in info["members"]}
    assert {m["address"] for m in members.values()} == {first.address, second.address}
    assert all(m["alive"] for m in members.values())
    assert sorted(p for m in members.values() for p in m["partitions"]) == list(range(12))
    owners = {q["queue"]: q for q in info["queues"]}
    assert set(owners) == set(queues)
    for q in owners.values():  # each queue's owner is the member holding its partition
        assert q["partition"] in members[q["member"]]["partitions"]
        assert q["address"] == members[q["member"]]["address"]

    idb = next(m for m in members if m != ida)
    table = qlayer("cluster", "--server", str(second.address))
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0] == f"cluster {cluster!r} (as member {idb!r} sees it)"
    assert lines[1].split() == ["MEMBER", "ADDRESS", "ALIVE", "PARTITIONS"]
    assert sum(1 for line in lines if " yes " in line) == 2
    for q in queues:
        (row,) = [line.split() for line in lines if line.startswith(q + " ")]
        assert row == [q, str(owners[q]["partition"]), owners[q]["member"], owners[q]["address"]]

    # a member killed stays in the host map, not alive, until it comes back
    second.kill()

    def second_dead() -> dict[str, Any] | None:
        seen = cluster_json(str(first.address))
        dead = {m["id"]: m for m in seen["members"]}[idb]
        return seen if not dead["alive"] else None

    seen = wait_until(second_dead, timeout=30, message="the killed member still shows alive")
    assert {m["id"]: m for m in seen["members"]}[ida]["alive"]
    table = qlayer("cluster", "--server", str(first.address))
    assert table.returncode == 0, table.stderr
    (row,) = [line.split() for line in table.stdout.splitlines() if line.startswith(idb + " ")]
    assert row[2] == "NO"


def test_cluster_of_a_coordinator_alone_says_so(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    q = names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": q}])
    r = qlayer("cluster", "--server", str(c.address))
    assert r.returncode == 0, r.stderr
    assert "is not in a cluster" in r.stdout.splitlines()[0]
    assert any(line.split()[:1] == [q] for line in r.stdout.splitlines())
    info = cluster_json(str(c.address))
    assert info["standalone"] is True and [m["address"] for m in info["members"]] == [c.address]
    assert [q_["queue"] for q_ in info["queues"]] == [q]


def test_cluster_without_a_coordinator_exits_1_with_one_line() -> None:
    r = qlayer("cluster", "--server", "127.0.0.1:1")
    assert r.returncode == 1
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("qlayer cluster:")
