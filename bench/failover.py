"""qlayer cluster failover (issue 12): stop the owner of a queue again and again while a consumer
follows the queue and a publisher feeds it; how long from the stop to the first delivery from
the new owner.

1. ``--members`` coordinator processes of one cluster over the embedded broker (or
   ``--bootstrap``), one queue, default config (``standby_replicas = 1``).
2. A publisher thread publishes ``--rate`` messages a second through the cluster; a consumer
   (``QueueClient`` given every member's address) follows the queue and acks each message,
   waiting for the confirmation.
3. ``--kills`` times: the member owning the queue is stopped (``--how kill``: SIGKILL,
   ``term``: SIGTERM, ``both``: alternately; ``stop``: SIGSTOP, a hung member, woken with
   SIGCONT once another member delivers: it finds itself fenced and exits), the time to the
   first delivery from another member is taken, then the stopped member is started again on
   its state directory and the next round waits until every member holds partitions again.
4. Correctness over the run: acks confirmed twice, and messages delivered again after their
   ack was confirmed (both must be 0); messages delivered again after a stop are counted
   (at-least-once: what the stopped owner had leased).
5. Where the time went: each round's ``stages``, seconds from the stop, read from the members'
   logs (``stage_times``): a SIGKILLed owner ``detected`` (a survivor found its port refusing)
   and ``removed`` from the group; a SIGTERMed one ``revoked`` and ``handed_over`` its queues
   and ``left`` the group (its LeaveGroup sent: the survivors' rebalance starts) and
   ``exited``; then the new owner's ``assigned`` (the group gave it the queue's control
   partition), ``claimed`` (written to the members topic), ``fenced`` (the last owner's
   transactional id, after a kill), ``serving`` (restored, reading), the client's
   ``subscribed`` (its stream to the new owner open) and ``delivered`` (its first message).

``python -m bench.failover [--members 2] [--kills 5] [--how both]``; results in
``bench/results/failover-<time>.json`` with p50 / max per kind of stop and the load average.
Every wait has a deadline.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import loadavg

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


class Member:
    """One ``qlayer coordinator`` process of the cluster."""

    def __init__(self, home: Path, bootstrap: str, cluster: str, queue: str, first: bool) -> None:
        self.home = home
        home.mkdir(parents=True, exist_ok=True)
        self.config = home / "qlayer.toml"
        self.log = home / "coordinator.log"
        self.id = f"bench-{uuid.uuid4().hex[:6]}"
        lines = [
            "[broker]",
            f'bootstrap_servers = "{bootstrap}"',
            "[coordinator]",
            f'id = "{self.id}"',
            f'cluster = "{cluster}"',
        ]
        if first:
            lines += [
                "[[queue]]",
                f'name = "{queue}"',
                f'underlying_topic = "{queue}"',
                'message_type = "bytes"',
                'lease_period = "60s"',
            ]
        self.config.write_text("\n".join(lines) + "\n")
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""
        # a member restarts where its clients know it (as under a supervisor)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.listen = f"127.0.0.1:{s.getsockname()[1]}"

    def start(self, timeout: float = 120.0) -> None:
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                [
                    sys.executable, "-m", "layer.cli", "coordinator", "--config",
                    str(self.config), "--state-dir", str(self.home / "state"),
                    "--listen", self.listen,
                ],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
            )  # fmt: skip
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("qlayer coordinator serving on "):
                self.address = line.rsplit(" ", 1)[1]
                break
            if time.monotonic() > deadline:
                break
        if not self.address:
            raise RuntimeError(f"member in {self.home} did not start")
        out = self.proc.stdout
        threading.Thread(target=lambda: [None for _ in out], daemon=True).start()

    def stop(self, how: str) -> None:
        assert self.proc is not None
        if how == "stop":  # hung: its port still accepts connections, nothing answers
            self.proc.send_signal(signal.SIGSTOP)
            return
        self.proc.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        self.proc.wait(60)
        self.address = ""

    def wake(self, timeout: float = 60.0) -> float | None:
        """SIGCONT a stopped member and wait for it to exit (fenced: its queues moved), at
        most ``timeout`` (then SIGKILL); seconds it took to exit, None if it had to be killed."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGCONT)
        try:
            self.proc.wait(timeout)
            took: float | None = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(60)
            took = None
        self.address = ""
        return took


_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ [\w.]+: (.*)$")
_SERVING = re.compile(
    r"cluster: serving control partitions \[([\d, ]*)\]: claimed in ([\d.]+)s, fenced (\d+) in"
    r" ([\d.]+)s, restored and serving in ([\d.]+)s"
)
_REMOVED = re.compile(r"member '([^']+)' at \S+ refuses connections: .* answered in ([\d.]+)s\)")


def _log_lines(path: Path, start: int) -> list[tuple[float, str]]:
    """(wall time, message) of a coordinator log from byte ``start`` on."""
    out = []
    with open(path, "rb") as f:
        f.seek(start)
        for raw in f:
            m = _LINE.match(raw.decode(errors="replace").rstrip())
            if m is not None:
                at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                out.append((at.timestamp(), m.group(2)))
    return out


def _partitions(text: str) -> set[int]:
    return {int(p) for p in text.split(",") if p.strip()}


def stage_times(
    victim: list[tuple[float, str]],
    survivors: dict[str, list[tuple[float, str]]],
    owner: str,
    victim_id: str,
    partition: int,
    stopped: float,
) -> dict[str, float]:
    """Seconds from ``stopped`` (wall time) to each stage of a failover, from the logs of the
    stopped member (``victim``) and of the others (``survivors``, by id; ``owner`` the new
    owner's id): see the module doc. A stage not found is left out."""
    stages: dict[str, float] = {}

    def mark(name: str, at: float) -> None:
        if at >= stopped - 0.5 and name not in stages:
            stages[name] = round(at - stopped, 3)

    for at, text in victim:
        if " revoked" in text and (m := re.search(r"partitions \[([\d, ]*)\]", text)):
            if partition in _partitions(m.group(1)):
                mark("revoked", at)
        elif text.startswith("cluster: handed over control partitions") and "revoked" in stages:
            mark("handed_over", at)
        elif " left group " in text and "revoked" in stages:
            mark("left", at)
    removals = []
    for lines in survivors.values():
        for at, text in lines:
            m = _REMOVED.search(text)
            if m is not None and m.group(1) == victim_id:
                removals.append((at - float(m.group(2)), at))
    if removals:
        mark("detected", min(r[0] for r in removals))
        mark("removed", min(r[1] for r in removals))
    for at, text in survivors.get(owner, []):
        if at < stopped - 0.5:
            continue
        if (m := re.search(r"control partitions assigned \[([\d, ]*)\]", text)) is not None:
            if partition in _partitions(m.group(1)) and "assigned" not in stages:
                mark("assigned", at)
        elif (
            (m := _SERVING.search(text)) is not None
            and partition in _partitions(m.group(1))
            and "serving" not in stages
        ):
            restore, fence = float(m.group(5)), float(m.group(4))
            mark("claimed", at - restore - fence)
            if int(m.group(3)):
                mark("fenced", at - restore)
            mark("serving", at)
    return stages


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # a member restarting: ask again
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise RuntimeError(f"timed out: {what}")


def run(members: int, kills: int, how: str, rate: float, bootstrap: str | None) -> dict[str, Any]:
    from connectors import start_broker
    from layer.client import QueueClient
    from layer.coordinator.membership import partition_of
    from layer.exceptions import LeaseLost, QLayerError

    broker = start_broker("external", bootstrap) if bootstrap else start_broker("embedded")
    work = Path(tempfile.mkdtemp(prefix="qlayer-failover-"))
    cluster, queue = f"bench-{uuid.uuid4().hex[:6]}", f"failover-{uuid.uuid4().hex[:6]}"
    procs = [
        Member(work / f"m{i}", broker.bootstrap_servers, cluster, queue, i == 0)
        for i in range(members)
    ]
    stop = threading.Event()
    lock = threading.Lock()
    state: dict[str, Any] = {
        "stopped_at": None,
        "owner": None,
        "took": None,
        "new_owner": None,
        "subscribed": None,
    }
    confirmed: set[str] = set()
    events = {
        "acked_twice": 0,
        "redelivered_after_ack": 0,
        "redelivered": 0,
        "lease_lost": 0,
        "exited_on_their_own": 0,
    }
    seen: set[str] = set()
    rounds: list[dict[str, Any]] = []
    try:
        for p in procs:
            p.start()
        admin = QueueClient([p.address for p in procs])

        def settled() -> bool:
            info = admin.cluster()
            # split evenly: a rebalance after a restart is over (cooperative: two rounds)
            up = [m for m in info.members if len(m.partitions) == 12 // members]
            owner = next((o.address for o in info.queues if o.queue == queue), "")
            live = {p.address for p in procs if p.address}
            return len(up) == members and owner in live and bool(admin.stats(queue))

        wait(settled, 120, "the cluster to settle")

        def publish() -> None:
            with QueueClient([p.address for p in procs]) as pub:
                i = 0
                while not stop.is_set():
                    try:
                        pub.publish(queue, f"m{i}".encode())
                        i += 1
                    except QLayerError:
                        pass  # moving: the next one goes through
                    stop.wait(1.0 / rate)

        def reconnected(event: Any) -> None:
            with lock:
                if state["stopped_at"] is not None and state["subscribed"] is None:
                    state["subscribed"] = time.monotonic() - state["stopped_at"]

        def consume() -> None:
            with (
                QueueClient([p.address for p in procs], on_reconnect=reconnected) as client,
                client.subscribe(queue, 5) as sub,
            ):
                while not stop.is_set():
                    msg = sub.next(timeout=1)
                    if msg is None:
                        continue
                    with lock:
                        stopped, owner = state["stopped_at"], state["owner"]
                        if stopped is not None and state["took"] is None and sub.address != owner:
                            state["new_owner"] = sub.address
                            state["took"] = time.monotonic() - stopped
                        if msg.bookmark in confirmed:
                            events["redelivered_after_ack"] += 1
                        elif msg.bookmark in seen:
                            events["redelivered"] += 1
                        seen.add(msg.bookmark)
                    try:
                        msg.ack(wait=True, timeout=60)
                    except LeaseLost:
                        events["lease_lost"] += 1
                        continue
                    except QLayerError:
                        continue
                    with lock:
                        if msg.bookmark in confirmed:
                            events["acked_twice"] += 1
                        confirmed.add(msg.bookmark)

        threads = [threading.Thread(target=f, daemon=True) for f in (publish, consume)]
        for t in threads:
            t.start()
        wait(lambda: len(confirmed) > rate, 60, "the first deliveries")
        for k in range(kills):
            kind = how if how != "both" else ("kill" if k % 2 == 0 else "term")
            for p in procs:
                # a member that exited on its own (its session expired on an overloaded
                # machine: it lost its partitions and stops) is started again, as a
                # supervisor would; counted
                if p.proc is not None and p.proc.poll() is not None:
                    events["exited_on_their_own"] += 1
                    p.start()
            wait(settled, 120, "the cluster to settle")
            time.sleep(2.0)  # the standby catches up with the latest commits
            owner_address = wait(
                lambda: next((o.address for o in admin.cluster().queues if o.queue == queue), None),
                30,
                "the owner",
            )
            victim = next(p for p in procs if p.address == owner_address)
            load = loadavg()
            marks = {p.id: p.log.stat().st_size for p in procs}
            with lock:
                state.update(
                    stopped_at=None, owner=owner_address, took=None, new_owner=None, subscribed=None
                )
            t0, wall = time.monotonic(), time.time()
            with lock:
                # timed from the signal: a SIGTERMed member hands over, and its queue may
                # deliver from the new owner, before it exits (this was set after the exit,
                # which made a later exit the figure)
                state["stopped_at"] = t0
            victim.stop(kind)
            exited = time.monotonic() - t0
            took = wait(lambda: state["took"], 120, "a delivery from the new owner")
            new_owner = next(p for p in procs if p.address == state["new_owner"])
            stages = stage_times(
                _log_lines(victim.log, marks[victim.id]),
                {p.id: _log_lines(p.log, marks[p.id]) for p in procs if p is not victim},
                new_owner.id,
                victim.id,
                partition_of(queue),
                wall,
            )
            if kind == "term":
                stages["exited"] = round(exited, 3)
            if state["subscribed"] is not None:
                stages["subscribed"] = round(state["subscribed"], 3)
            if kind == "stop":  # woken now: it exits (fenced), or is killed after 60 s
                woke = victim.wake()
                stages["woken_exited"] = round(time.monotonic() - t0, 3) if woke else -1.0
            stages["delivered"] = round(took, 3)
            stages = dict(sorted(stages.items(), key=lambda kv: kv[1]))
            rounds.append(
                {"how": kind, "seconds": round(took, 3), "loadavg": load, "stages": stages}
            )
            print(f"{kind}: first delivery from the new owner {took:.2f}s after the stop")
            print("  " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
            victim.start()
        stop.set()
        for t in threads:
            t.join(30)
        admin.close()
    finally:
        stop.set()
        for p in procs:
            if p.proc is not None and p.proc.poll() is None:
                p.stop("term")
        broker.stop()
    summary: dict[str, Any] = {}
    for kind in ("kill", "term", "stop"):
        times = [r["seconds"] for r in rounds if r["how"] == kind]
        if times:
            summary[kind] = {
                "n": len(times),
                "p50": round(statistics.median(times), 3),
                "max": max(times),
                "min": min(times),
                "stages": stage_summary([r["stages"] for r in rounds if r["how"] == kind]),
            }
    return {
        "bench": "failover",
        "members": members,
        "rate": rate,
        "rounds": rounds,
        "summary": summary,
        "confirmed": len(confirmed),
        **events,
        "cpus": os.cpu_count(),
    }


def stage_summary(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per stage: p50 and max of its time from the stop, and p50 and max of the time it
    took after the stage before it in the same round (so the largest step shows)."""
    order: dict[str, list[float]] = {}
    steps: dict[str, list[float]] = {}
    for stages in rounds:
        last = 0.0
        for name, at in stages.items():
            order.setdefault(name, []).append(at)
            steps.setdefault(name, []).append(at - last)
            last = at
    return {
        name: {
            "n": len(ats),
            "p50": round(statistics.median(ats), 3),
            "max": round(max(ats), 3),
            "step_p50": round(statistics.median(steps[name]), 3),
            "step_max": round(max(steps[name]), 3),
        }
        for name, ats in sorted(order.items(), key=lambda kv: statistics.median(kv[1]))
    }


def soak(members: int, seconds: float, burners: int, rate: float) -> dict[str, Any]:
    """No member is taken for dead while the machine is busy: ``members`` members serve a
    followed queue for ``seconds`` next to ``burners`` busy-looping processes; the members'
    logs are searched for removals, fences and partitions revoked or lost."""
    from connectors import start_broker
    from layer.client import QueueClient
    from layer.exceptions import QLayerError

    broker = start_broker("embedded")
    work = Path(tempfile.mkdtemp(prefix="qlayer-soak-"))
    cluster, queue = f"bench-{uuid.uuid4().hex[:6]}", f"soak-{uuid.uuid4().hex[:6]}"
    procs = [
        Member(work / f"m{i}", broker.bootstrap_servers, cluster, queue, i == 0)
        for i in range(members)
    ]
    busy: list[subprocess.Popen[bytes]] = []
    acked = 0
    try:
        for p in procs:
            p.start()
        client = QueueClient([p.address for p in procs])
        wait(
            lambda: (
                all(len(m.partitions) == 12 // members for m in client.cluster().members)
                and len(client.cluster().members) == members
            ),
            120,
            "the cluster to settle",
        )
        marks = {p.home: (p.home / "coordinator.log").stat().st_size for p in procs}
        busy = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(burners)
        ]
        loads = [loadavg()]
        deadline = time.monotonic() + seconds
        with client.subscribe(queue, 5) as sub:
            while time.monotonic() < deadline:
                try:
                    client.publish(queue, b"x")
                    msg = sub.next(timeout=1)
                    if msg is not None:
                        msg.ack(wait=True, timeout=30)
                        acked += 1
                except QLayerError:
                    pass
                time.sleep(1.0 / rate)
            # a live member left by the consumer (its hung-member watch, or a drop) shows here
            reconnects = sub.reconnects
        loads.append(loadavg())
        client.close()
        counts = {"removed": 0, "fenced": 0, "revoked_or_lost": 0}
        for p in procs:
            with open(p.home / "coordinator.log", "rb") as f:
                f.seek(marks[p.home])
                text = f.read().decode(errors="replace")
            counts["removed"] += text.count("refuses connections")
            counts["fenced"] += text.count("fencing the last owner") + text.count(
                "ahead of its takeover"
            )
            counts["revoked_or_lost"] += text.count("] revoked") + text.count("] lost")
    finally:
        for b in busy:
            b.kill()
        for p in procs:
            if p.proc is not None and p.proc.poll() is None:
                p.stop("term")
        broker.stop()
    return {
        "bench": "failover-soak",
        "members": members,
        "seconds": seconds,
        "burners": burners,
        "acked": acked,
        "consumer_reconnects": reconnects,
        "loadavg": loads,
        **counts,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--kills", type=int, default=5, help="stops of the owner")
    parser.add_argument("--how", choices=("kill", "term", "both", "stop"), default="both")
    parser.add_argument("--rate", type=float, default=50.0, help="messages published a second")
    parser.add_argument("--bootstrap", default=None, help="an external broker (default: embedded)")
    parser.add_argument(
        "--soak", type=float, default=0, help="instead: serve this long next to busy processes"
    )
    parser.add_argument("--burners", type=int, default=4, help="busy processes of --soak")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    started = time.strftime("%Y%m%d-%H%M%S")
    if args.soak:
        result = soak(args.members, args.soak, args.burners, args.rate)
        result["date"] = started
        out = RESULTS / f"failover-soak-{args.members}m-{started}.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
        return
    result = run(args.members, args.kills, args.how, args.rate, args.bootstrap)
    result["date"] = started
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"failover-{args.members}m-{started}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"]), f"acked twice {result['acked_twice']},")
    print(f"redelivered after ack {result['redelivered_after_ack']}; results in {out}")


if __name__ == "__main__":
    main()
