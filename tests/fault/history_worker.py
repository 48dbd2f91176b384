"""A consumer process for the history test: behaves at random, records everything it sees.

Usage: python tests/fault/history_worker.py --addr-file F --queue Q --semantics S --log L
       --stop-file S --quiet-file Q --name W --seed N [--backlog B] [--reconnect]

Every line of ``--log`` is a JSON event of the history (see tests/fault/history.py), written and
flushed before the next step, so a SIGKILL keeps everything up to the kill. The address file
holds ``EPOCH HOST:PORT`` (rewritten by the harness on each coordinator start).

What it does with a message (at-least-once): a payload's ``kind`` may ask for it (``poison``:
never acked, so its lease runs out every time; ``cancel``; ``expire``); other messages are mostly
acked, sometimes held until the lease runs out (and then, sometimes, acked late), cancelled, or
extended and then acked. At-most-once messages are acked (which frees the backlog slot). Now and
then it disconnects and subscribes again, unless ``--quiet-file`` exists. It exits once
``--stop-file`` exists and it is idle.

Without ``--reconnect`` a dropped stream ends its subscription (``broken``) and the worker
subscribes again by itself, once the address file names a coordinator. With it, the library
reconnects (``reconnect=True``): the worker records each reconnect (``reconnected``, the old
and the new subscription id) and goes on. The library drops messages of the old connection it
had not handed out, and does not send operations on messages it had (their leases ended with
the connection): such an operation is recorded refused (the client said so before sending) or
lost (the connection dropped while it was in flight), never ok.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layer.client import QueueClient  # noqa: E402
from layer.client._core import Reconnected  # noqa: E402
from layer.client.sync import Message, Subscription  # noqa: E402
from layer.exceptions import ClientError, LeaseError, LeaseLost, QLayerError  # noqa: E402


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
        self.lock = threading.Lock()  # the library's runner thread logs reconnects
        self.session: Session | None = None  # the one open subscription, for on_reconnect

    def log(self, ev: str, **fields: Any) -> None:
        event = {"ev": ev, "t": time.time(), "w": self.args.name, "q": self.args.queue, **fields}
        with self.lock:
            self.out.write(json.dumps(event) + "\n")

    def on_reconnect(self, event: Reconnected) -> None:
        """The library re-subscribed (on its runner thread, before it hands out any message
        of the new connection): a new subscription, the old one's leases are gone."""
        with self.lock:
            session = self.session
        if session is not None:
            session.reconnected(event)

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
            # several addresses, comma-separated: the members of a cluster
            target = addr.split(",") if "," in addr else addr
            try:
                with QueueClient(
                    target, timeout=30, reconnect=self.args.reconnect, reconnect_max_delay=1.0,
                    on_reconnect=self.on_reconnect,
                ) as client:  # fmt: skip
                    self.serve(client)
            except (QLayerError, OSError) as exc:  # connecting failed: the coordinator is gone
                self.log("connect_failed", error=f"{type(exc).__name__}: {exc}"[:200])
                time.sleep(0.1)
        return 0

    def serve(self, client: QueueClient) -> None:
        # The coordinator's epoch is not logged: the checker derives it from the subscription
        # id (which names the coordinator process that made it), also after a reconnect.
        with self.lock:  # on_reconnect waits until the session is known
            sub = client.subscribe(self.args.queue, max_backlog=self.args.backlog)
            self.session = session = Session(self, sub)
        # the member it is on (a cluster's: tells the harness which process made it)
        self.log("subscribed", sub=sub.id, proxied=self.args.reconnect, addr=sub.address)
        try:
            session.serve()
        except Broken as exc:
            self.log("broken", sub=session.current_id, error=str(exc)[:200])
        finally:
            with self.lock:
                self.session = None


class Session:
    """One subscription: consume, act, record; ``serve`` returns on a voluntary disconnect or
    at the stop signal, raises ``Broken`` when the stream fails."""

    def __init__(self, worker: Worker, sub: Subscription) -> None:
        self.w = worker
        self.sub = sub
        # the subscription id of each connection the library made (0: the first); a message
        # knows its connection (``_epoch``: the client's count of dropped connections)
        self.ids = {0: sub.id}
        self.pending: dict[str, tuple[int, int]] = {}  # bookmark -> (op id, connection)
        self.held: list[tuple[float, Message]] = []  # (when to ack it late, message)
        rng = worker.rng
        self.leave_at = time.monotonic() + rng.expovariate(1 / 8.0)

    @property
    def current_id(self) -> str:
        return self.ids[max(self.ids)]

    def reconnected(self, event: Reconnected) -> None:
        """The library re-subscribed; on its runner thread."""
        old = self.current_id
        # the count of reconnects is the new connection's number: each reconnect follows
        # exactly one dropped connection
        self.ids[self.sub.reconnects] = self.sub.id
        lost_at = time.time() - event.downtime_s
        self.w.log("reconnected", sub=old, new=self.sub.id, lost_at=lost_at,
                   error=str(event.error)[:200])  # fmt: skip
        self.w.log("subscribed", sub=self.sub.id, proxied=self.w.args.reconnect,
                   addr=self.sub.address)  # fmt: skip

    def sub_of(self, msg: Message) -> tuple[str, int]:
        """The subscription id a message was leased to, and its connection number."""
        connection = msg._epoch
        return self.ids.get(connection, self.current_id), connection

    def connection(self) -> int:
        """The client's current connection number (what ``Message._epoch`` is compared with:
        the library does not send an operation on a message of an earlier one)."""
        return self.sub._core.epoch

    def serve(self) -> None:
        w, sub, rng = self.w, self.sub, self.w.rng
        while True:
            if time.monotonic() > self.leave_at and not w.quiet.exists():
                self.flush()
                w.log("closing", sub=self.current_id, why="disconnect")
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
                    w.log("closing", sub=self.current_id, why="stop")
                    sub.close(timeout=5)
                    w.log("exit")
                    raise SystemExit(0)
                continue
            holder, _connection = self.sub_of(msg)
            w.log("got", sub=holder, b=msg.bookmark, n=msg.deliveries, c=msg.cancels,
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
        holder, connection = self.sub_of(msg)
        i = next(self.w.ids)
        self.w.log("op", sub=holder, b=msg.bookmark, op=op, id=i, s=delay)
        # connections only move on: a message of an earlier one stays stale, and the library
        # will not send the operation (it counts it in ``unconfirmed_acks``)
        stale = connection != self.connection()
        try:
            if op == "cancel":
                msg.cancel(delay=delay or None)
            else:
                getattr(msg, op)()
        except ClientError:
            self.w.log("op_refused", id=i, error="not_sent")  # the subscription had ended
            return
        if stale:
            self.w.log("op_refused", id=i, error="not_sent: delivered before a reconnect")
            return
        self.pending[msg.bookmark] = (i, connection)

    def extend(self, msg: Message, seconds: float) -> None:
        self.flush()
        holder, _connection = self.sub_of(msg)
        i = next(self.w.ids)
        self.w.log("op", sub=holder, b=msg.bookmark, op="extend", id=i, s=seconds)
        try:
            msg.extend(seconds, wait=True, timeout=30)
        except LeaseLost:  # sent and the connection dropped, or not sent: unknown either way
            self.w.log("op_lost", id=i)
        except LeaseError as exc:
            self.w.log("op_refused", id=i, error=type(exc).__name__)
        except TimeoutError as exc:
            self.w.log("op_lost", id=i)
            if not self.w.args.reconnect:
                self.lost()
                raise Broken(f"extend: {exc}") from exc
        except ClientError as exc:
            self.w.log("op_lost", id=i)
            self.lost()
            raise Broken(f"extend: {exc}") from exc
        else:
            self.w.log("op_ok", id=i)

    def flush(self) -> None:
        """Wait for the answers to every op sent, and record them: confirmed if the connection
        they were sent on is still the client's (a reconnect abandons what was in flight)."""
        if not self.pending:
            return
        try:
            self.sub.flush(timeout=30)
        except LeaseLost:
            pass  # a dropped connection left some unconfirmed: told apart below
        except TimeoutError as exc:
            if not self.w.args.reconnect:
                self.lost()
                raise Broken(f"flush: {exc}") from exc
            self.lost()  # unanswered on a connection that may be stalled: unknown
            return
        except ClientError as exc:
            self.lost()
            raise Broken(f"flush: {exc}") from exc
        if self.sub.closed:  # ended without an error: the answers may be missing
            self.lost()
            raise Broken("the stream ended")
        refused = {f.bookmark: str(f.error) for f in self.sub.ack_failures}
        self.sub.ack_failures.clear()
        now = self.connection()
        for bookmark, (i, connection) in self.pending.items():
            if bookmark in refused:
                self.w.log("op_refused", id=i, error=refused[bookmark])
            elif connection == now:
                self.w.log("op_ok", id=i)
            else:
                self.w.log("op_lost", id=i)
        self.pending.clear()

    def lost(self) -> None:
        for i, _connection in self.pending.values():
            self.w.log("op_lost", id=i)
        self.pending.clear()


def main() -> int:
    p = argparse.ArgumentParser()
    for flag in ("--addr-file", "--queue", "--semantics", "--log", "--stop-file", "--quiet-file"):
        p.add_argument(flag, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--backlog", type=int, default=5)
    p.add_argument("--reconnect", action="store_true", help="let the library reconnect")
    return Worker(p.parse_args()).run()


if __name__ == "__main__":
    raise SystemExit(main())
