"""Scale-out of a cluster (issue 12): throughput and CPU per message with 1, 2 and 3 coordinators.

For each member count, a fresh cluster over the embedded broker (Tansu) serves --queues queues
(each on a control partition of its own, so the group can spread them). Once the split settled,
--messages messages of 200 B per queue are published as fast as the broker takes them, and one
consumer process per queue (given every member's address: the client follows the owner) drains
its queue, acking each message. Throughput: messages acked per second, from the first delivery
to the last ack confirmed. CPU: what each member spent (psutil) from before the publishing to the
last ack (reading the messages in, leasing, committing acks), per member and per message, with
the queues each member served, so the split is visible; the broker's and the consumers' too.

On this machine (2 cores shared with other work) the members compete for the same cores, so the
throughput does not grow with members here: the figure to read is the CPU per message and its
split. Results: bench/results/scaleout-<date>.json; a summary on stdout.

Usage: python -m bench.scaleout [--members 1,2,3] [--queues 6] [--messages 3000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CONTROL_PARTITIONS = 12  # layer.coordinator.membership.CONTROL_PARTITIONS


def queue_names(n: int, base: str) -> list[str]:
    """``n`` queue names, each on a control partition of its own."""
    names: list[str] = []
    taken: set[int] = set()
    i = 0
    while len(names) < n:
        name = f"{base}-{i}"
        p = zlib.crc32(name.encode()) % CONTROL_PARTITIONS
        if p not in taken:
            taken.add(p)
            names.append(name)
        i += 1
    return names


class Member:
    def __init__(self, workdir: Path, bootstrap: str, cluster: str, slot: int, tables: str):
        workdir.mkdir(parents=True)
        self.config = workdir / "qlayer.toml"
        self.config.write_text(
            f'[broker]\nbootstrap_servers = "{bootstrap}"\n[coordinator]\n'
            f'id = "{cluster}-m{slot}"\ncluster = "{cluster}"\nlisten = "127.0.0.1:0"\n'
            f'state_dir = "{workdir / "state"}"\n{tables}'
        )
        self.log = workdir / "coordinator.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(self.config)],
                cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        assert self.proc.stdout is not None
        deadline = time.monotonic() + 120
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").strip()
            if line.startswith("qlayer coordinator serving on "):
                self.address = line.rsplit(" ", 1)[1]
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"member did not start; see {self.log}")

    def cpu(self) -> float:
        assert self.proc is not None
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def consume(addresses: list[str], queue: str, n: int, window: int, out: Any) -> None:
    """Drain ``n`` messages of ``queue``, acking each; report (first delivery, last ack, cpu)."""
    from layer.client import QueueClient

    got, first = 0, 0.0
    with QueueClient(addresses) as client, client.subscribe(queue, max_backlog=window) as sub:
        while got < n:
            msg = sub.next(timeout=60)
            if msg is None:
                raise RuntimeError(f"{queue}: nothing delivered in 60 s after {got} messages")
            first = first or time.time()
            msg.ack()
            got += 1
        sub.flush(timeout=60)
    t = psutil.Process().cpu_times()
    out.put((queue, first, time.time(), t.user + t.system))


def owners(address: str, queues: list[str]) -> dict[str, str]:
    from layer.client import QueueClient

    with QueueClient(address, reconnect=False) as client:
        info = client.cluster()
    return {q.queue: q.member for q in info.queues if q.queue in queues}


def served(address: str, queues: list[str]) -> bool:
    from layer.client import QueueClient
    from layer.exceptions import QLayerError

    try:
        with QueueClient(address, reconnect=False, timeout=5) as client:
            for q in queues:
                client.stats(q)
    except QLayerError:
        return False
    return True


def run_one(
    bootstrap: str, broker_pid: int | None, members: int, nq: int, per_queue: int, window: int
) -> dict[str, Any]:
    base = f"scale-{uuid.uuid4().hex[:6]}"
    queues = queue_names(nq, base)
    tables = "".join(
        f'\n[[queue]]\nname = "{q}"\nunderlying_topic = "{q}"\nmessage_type = "bytes"\nlease_period = "60s"\n'
        for q in queues
    )
    workdir = Path(tempfile.mkdtemp(prefix=f"{base}-"))
    started = [
        Member(workdir / f"m{i}", bootstrap, base, i, tables if i == 0 else "")
        for i in range(members)
    ]
    try:
        for m in started:
            m.start()
        deadline = time.monotonic() + 180
        while True:  # every queue served, and the split settled (every member owns some)
            own = owners(started[0].address, queues)
            spread = {o for o in own.values() if o}
            if (
                len(own) == nq and all(own.values()) and len(spread) == min(members, nq)
                and served(started[0].address, queues)
            ):  # fmt: skip
                break
            assert time.monotonic() < deadline, f"no settled split: {own}"
            time.sleep(0.5)
        addresses = [m.address for m in started]
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        broker_cpu0 = _cpu(broker_pid)
        cpu0 = [m.cpu() for m in started]
        # published once the split settled: the members' CPU counts reading them in too
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        payload = b"x" * 200
        for q in queues:
            for i in range(per_queue):
                producer.produce(q, payload, str(i).encode())
                if i % 1000 == 0:
                    producer.poll(0)
        assert producer.flush(120) == 0
        procs = [
            ctx.Process(target=consume, args=(addresses, q, per_queue, window, out)) for q in queues
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=300) for _ in procs]
        for p in procs:
            p.join(30)
        cpu1 = [m.cpu() for m in started]
        broker_cpu1 = _cpu(broker_pid)
        first = min(r[1] for r in results)
        last = max(r[2] for r in results)
        total = nq * per_queue
        seconds = last - first
        by_member: dict[str, list[str]] = {}
        for q, o in own.items():
            by_member.setdefault(o, []).append(q)
        ids = [f"{base}-m{i}" for i in range(members)]
        member_cpu = [b - a for a, b in zip(cpu0, cpu1, strict=True)]
        return {
            "members": members,
            "queues": nq,
            "messages": total,
            "seconds": round(seconds, 2),
            "throughput_msg_s": round(total / seconds),
            "member_cpu_s": [round(c, 2) for c in member_cpu],
            "member_queues": [len(by_member.get(i, [])) for i in ids],
            "member_cpu_us_per_msg": [round(1e6 * c / total, 1) for c in member_cpu],
            "coordinators_cpu_us_per_msg": round(1e6 * sum(member_cpu) / total, 1),
            "coordinators_cpu_us_per_msg_of_their_queues": [
                round(1e6 * c / (len(by_member.get(i, [])) * per_queue), 1)
                if by_member.get(i)
                else None
                for c, i in zip(member_cpu, ids, strict=True)
            ],  # fmt: skip
            "broker_cpu_us_per_msg": (
                None if broker_pid is None else round(1e6 * (broker_cpu1 - broker_cpu0) / total, 1)
            ),  # fmt: skip
            "consumers_cpu_us_per_msg": round(1e6 * sum(r[3] for r in results) / total, 1),
            "load_before_after": list(os.getloadavg()),
        }
    finally:
        for m in started:
            m.stop()


def _cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    proc = psutil.Process(pid)
    times = [proc.cpu_times(), *(c.cpu_times() for c in proc.children(recursive=True))]
    return sum(t.user + t.system for t in times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--members", default="1,2,3")
    p.add_argument("--queues", type=int, default=6)
    p.add_argument("--messages", type=int, default=3000, help="per queue")
    p.add_argument("--window", type=int, default=100, help="each consumer's max_backlog")
    args = p.parse_args()
    from connectors.embedded import EmbeddedBroker

    broker = EmbeddedBroker()
    broker.start()
    broker_proc = getattr(broker, "_process", None)
    broker_pid = getattr(broker_proc, "pid", None)
    load = os.getloadavg()
    runs = []
    try:
        for n in (int(x) for x in args.members.split(",")):
            r = run_one(
                broker.bootstrap_servers, broker_pid, n, args.queues, args.messages, args.window
            )
            print(json.dumps(r), flush=True)
            runs.append(r)
    finally:
        broker.stop()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    result = {
        "bench": "scaleout",
        "date_utc": stamp,
        "cpus": os.cpu_count(),
        "load_at_start": list(load),
        "settings": vars(args),
        "runs": runs,
    }
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"scaleout-{stamp}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
