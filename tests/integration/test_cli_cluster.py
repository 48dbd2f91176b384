"""``qlayer cluster`` and ``qlayer stats`` against real coordinator processes of one cluster
over the embedded broker (issue 12): what an operator sees of the members, the queues' owners,
and a member that no longer answers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from connectors.embedded import bound_to_parent
from layer.client import QueueClient
from layer.coordinator.cluster_stats import ASK_TIMEOUT
from layer.coordinator.membership import partition_of
from tests.harness import ROOT, qlayer, serving
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

    # restarted at its address: alive again (the prober's channel does not sit in a backoff)
    second.listen = str(second.address)
    second.start(timeout=90)

    def second_back() -> bool:
        seen = {m["id"]: m for m in cluster_json(str(first.address))["members"]}
        return bool(seen[idb]["alive"] and seen[idb]["address"] == second.address)

    wait_until(second_back, timeout=30, message="the restarted member does not show alive")


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


class WarmCli:
    """``qlayer ARGS`` with its imports done before it is told to run: a run that must start
    within a moment of an event (a member stopped) does not wait for Python to load first."""

    def __init__(self, *args: str) -> None:
        code = (
            "import sys\n"
            "from layer.cli import main\n"
            "print('ready', flush=True)\n"
            "sys.stdin.readline()\n"
            f"sys.exit(main({list(args)!r}))\n"
        )
        self.proc = subprocess.Popen(
            bound_to_parent([sys.executable, "-c", code]),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "ready\n"

    def run(self, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        out, err = self.proc.communicate("go\n", timeout=timeout)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, out, err)


def test_stats_lists_every_queue_of_the_cluster_and_names_members_gone(
    coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    cluster = names("cluster")
    # a session of 8 s (not the embedded broker's 2 s): the group must not move the queues of
    # the members killed and stopped below while the stats call asks them, on a busy machine
    session = {"session_timeout_ms": 8000}
    members = [coordinator_factory([], cluster=cluster, broker=session) for _ in range(3)]
    first, killed, stopped = members
    with QueueClient(str(first.address)) as a:

        def split() -> dict[str, list[int]] | None:
            # settled: the assignor gives three members 4 partitions each
            held = {m.id: m.partitions for m in a.cluster().members}
            return held if sorted(map(len, held.values())) == [4, 4, 4] else None

        held = wait_until(split, timeout=90, message=lambda: f"no split: {a.cluster()}")
        ids = [a.cluster().member]
        for member in (killed, stopped):
            with QueueClient(str(member.address)) as other:
                ids.append(other.cluster().member)
        # two queues served by each member, created through the first
        queues: dict[str, list[str]] = {m: [] for m in ids}
        i = 0
        while min(len(v) for v in queues.values()) < 2:
            name = names(f"q{i}")
            i += 1
            owner = next(m for m in ids if partition_of(name) in held[m])
            if len(queues[owner]) < 2:
                queues[owner].append(name)
        for served in queues.values():
            served.sort()  # as the answers list them ('q18-...' before 'q3-...')
        everything = sorted(q for served in queues.values() for q in served)
        for name in everything:
            a.create_queue({"name": name, "underlying_topic": name, "message_type": "bytes"})
        wait_until(lambda: serving(a, everything), timeout=60, message="queues not served")
        for name in everything:
            a.publish(name, name.encode())

    def stats_of_all() -> dict[str, dict[str, Any]] | None:
        r = qlayer("stats", "--server", str(first.address))
        if r.returncode != 0:
            return None
        found = {s["queue"]: s for s in map(json.loads, r.stdout.splitlines())}
        return found if all(found[q]["available"] == 1 for q in everything) else None

    found = wait_until(stats_of_all, timeout=60, message="stats of every queue")
    assert sorted(found) == everything
    for owner, served in queues.items():
        assert {found[q]["owner"] for q in served} == {owner}
    # a named queue is answered as before, from its owner
    r = qlayer("stats", queues[ids[1]][0], "--server", str(first.address))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["owner"] == ids[1]

    # one member killed, one stopped: asked before the group moves their queues (its session
    # is 8 s here), the first answers for its own
    cli = WarmCli("stats", "--server", str(first.address))
    assert stopped.proc is not None
    killed.kill()
    os.kill(stopped.proc.pid, signal.SIGSTOP)
    try:
        r = cli.run()
    finally:
        stopped.kill()
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert sorted(json.loads(line)["queue"] for line in r.stdout.splitlines()) == queues[ids[0]]
    lines = sorted(r.stderr.strip().splitlines())
    assert len(lines) == 2, lines
    gone = dict(zip(sorted(ids[1:]), lines, strict=True))
    head = f"qlayer stats: member {ids[1]!r} at {killed.address}: unreachable ("
    assert gone[ids[1]].startswith(head), gone
    assert gone[ids[1]].endswith(f"; not shown: {', '.join(queues[ids[1]])}"), gone
    assert gone[ids[2]] == (
        f"qlayer stats: member {ids[2]!r} at {stopped.address}: no answer within"
        f" {ASK_TIMEOUT:g}s; not shown: {', '.join(queues[ids[2]])}"
    ), gone
