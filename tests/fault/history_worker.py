"""A consumer process for the history test: behaves at random, records everything it sees.

Usage: python tests/fault/history_worker.py --addr-file F --queue Q --semantics S --log L
       --stop-file S --quiet-file Q --name W --seed N [--backlog B]

Every line of ``--log`` is a JSON event of the history (see tests/fault/history.py), written and
flushed before the next step, so a SIGKILL keeps everything up to the kill. The address file
holds ``EPOCH HOST:PORT`` (rewritten by the harness on each coordinator start).

What it does with a message (at-least-once): a payload's ``kind`` may ask for it (``poison``:
never acked, so its lease runs out every time; ``cancel``; ``expire``); other messages are mostly
acked, sometimes held until the lease runs out (and then, sometimes, acked late), cancelled, or
extended and then acked. At-most-once messages are acked (which frees the backlog slot). Now and
then it disconnects and subscribes again, unless ``--quiet-file`` exists. It exits once
``--stop-file`` exists and it is idle.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layer.client import QueueClient  # noqa: E402
from layer.client.sync import Message, Subscription  # noqa: E402
from layer.exceptions import ClientError, LeaseError, QLayerError  # noqa: E402


class Broken(Exception):
    """The subscription's stream ended under us."""


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.out = open(args.log, "a", buffering=1)  # noqa: SIM115 - lives as long as the process
        self.ids = itertools.count(1)
        self.stop = Path(args.stop_file)
        self.quiet = Path(args.quiet_file)
        self.alo = args.semantics == "at-least-once"

    def log(self, ev: str, **fields: Any) -> None:
        event = {"ev": ev, "t": time.time(), "w": self.args.name, "q": self.args.queue, **fields}
        self.out.write(json.dumps(event) + "\n")

    def address(self) -> tuple[int, str] | None:
        try:
            text = Path(self.args.addr_file).read_text().split()
        except OSError:
            return None
        return (int(text[0]), text[1]) if len(text) == 2 else None

    def run(self) -> int:
        while not self.stop.exists():
            found = self.address()
            if found is None:
                time.sleep(0.05)
                continue
            epoch, addr = found
            try:
                with QueueClient(addr, timeout=30) as client:
                    self.session(client, epoch)
            except (QLayerError, OSError) as exc:  # connecting failed: the coordinator is gone
                self.log("connect_failed", error=f"{type(exc).__name__}: {exc}"[:200])
                time.sleep(0.1)
        return 0

    def session(self, client: QueueClient, epoch: int) -> None:
        sub = client.subscribe(self.args.queue, max_backlog=self.args.backlog)
        if self.address() != (epoch, client.target):  # restarted meanwhile: epoch unknown
            self.log("closing", sub=sub.id, why="restarted while subscribing")
            sub.close(timeout=1)
            return
        self.log("subscribed", sub=sub.id, epoch=epoch)
        session = Session(self, sub)
        try:
            session.serve()
        except Broken as exc:
            self.log("broken", sub=sub.id, error=str(exc)[:200])


class Session:
    """One subscription: consume, act, record; ``serve`` returns on a voluntary disconnect or
    at the stop signal, raises ``Broken`` when the stream fails."""

    def __init__(self, worker: Worker, sub: Subscription) -> None:
        self.w = worker
        self.sub = sub
        self.pending: dict[str, int] = {}  # bookmark -> id of its op not answered yet
        self.held: list[tuple[float, Message]] = []  # (when to ack it late, message)
        rng = worker.rng
        self.leave_at = time.monotonic() + rng.expovariate(1 / 8.0)

    def serve(self) -> None:
        w, sub, rng = self.w, self.sub, self.w.rng
        while True:
            if time.monotonic() > self.leave_at and not w.quiet.exists():
                self.flush()
                w.log("closing", sub=sub.id, why="disconnect")
                sub.close(timeout=5)
                return
            try:
                msg = sub.next(timeout=0.1)
            except ClientError as exc:
                self.lost()
                raise Broken(str(exc)) from exc
            now = time.time()
            for due, old in [h for h in self.held if h[0] <= now]:
                self.held.remove((due, old))
                if rng.random() < 0.6:
                    self.op(old, "ack")  # late: refused unless the lease is still ours
            if msg is None:
                self.flush()
                if w.stop.exists():
                    w.log("closing", sub=sub.id, why="stop")
                    sub.close(timeout=5)
                    w.log("exit")
                    raise SystemExit(0)
                continue
            w.log("got", sub=sub.id, b=msg.bookmark, n=msg.deliveries, c=msg.cancels,
                  dl=msg.lease_deadline)  # fmt: skip
            self.handle(msg)
            if len(self.pending) >= self.sub.backlog:
                self.flush()

    def handle(self, msg: Message) -> None:
        if not self.w.alo:
            self.op(msg, "ack")
            return
        try:
            kind = json.loads(msg.data).get("kind", "ok")
        except ValueError:
            kind = "ok"
        roll = self.w.rng.random()
        if kind == "poison" or (kind == "ok" and roll < 0.03):
            if kind == "ok" and msg.lease_deadline is not None:
                self.held.append((msg.lease_deadline + 0.2, msg))
        elif kind == "cancel" or (kind == "ok" and roll < 0.05):
            self.op(msg, "cancel", delay=0.5 if kind == "cancel" else 0.0)
        elif kind == "expire":
            self.op(msg, "expire")
        elif roll < 0.07:
            self.extend(msg, 2 * self.sub.lease_period_s)
            self.op(msg, "ack")
        else:
            self.op(msg, "ack")

    def op(self, msg: Message, op: str, delay: float = 0.0) -> None:
        if msg.bookmark in self.pending:
            self.flush()  # one op per message in flight: an answer names only the bookmark
        i = next(self.w.ids)
        self.w.log("op", sub=self.sub.id, b=msg.bookmark, op=op, id=i, s=delay)
        try:
            if op == "cancel":
                msg.cancel(delay=delay or None)
            else:
                getattr(msg, op)()
        except ClientError:
            self.w.log("op_refused", id=i, error="not_sent")  # the subscription had ended
            return
        self.pending[msg.bookmark] = i

    def extend(self, msg: Message, seconds: float) -> None:
        self.flush()
        i = next(self.w.ids)
        self.w.log("op", sub=self.sub.id, b=msg.bookmark, op="extend", id=i, s=seconds)
        try:
            msg.extend(seconds, wait=True, timeout=30)
        except LeaseError as exc:
            self.w.log("op_refused", id=i, error=type(exc).__name__)
        except (ClientError, TimeoutError) as exc:
            self.w.log("op_lost", id=i)
            self.lost()
            raise Broken(f"extend: {exc}") from exc
        else:
            self.w.log("op_ok", id=i)

    def flush(self) -> None:
        """Wait for the answers to every op sent, and record them."""
        if not self.pending:
            return
        try:
            self.sub.flush(timeout=30)
        except (ClientError, TimeoutError) as exc:
            self.lost()
            raise Broken(f"flush: {exc}") from exc
        if self.sub.closed:  # ended without an error: the answers may be missing
            self.lost()
            raise Broken("the stream ended")
        refused = {f.bookmark: str(f.error) for f in self.sub.ack_failures}
        self.sub.ack_failures.clear()
        for bookmark, i in self.pending.items():
            if bookmark in refused:
                self.w.log("op_refused", id=i, error=refused[bookmark])
            else:
                self.w.log("op_ok", id=i)
        self.pending.clear()

    def lost(self) -> None:
        for i in self.pending.values():
            self.w.log("op_lost", id=i)
        self.pending.clear()


def main() -> int:
    p = argparse.ArgumentParser()
    for flag in ("--addr-file", "--queue", "--semantics", "--log", "--stop-file", "--quiet-file"):
        p.add_argument(flag, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--backlog", type=int, default=5)
    return Worker(p.parse_args()).run()


if __name__ == "__main__":
    raise SystemExit(main())
