"""A consumer process for fault tests. Logs JSON lines: every delivery, every *confirmed* ack.

Usage: python tests/fault/worker.py --addr-file F --queue Q --log L --stop-file S [--backlog N]

It reads the coordinator's address from ``--addr-file`` (rewritten by the test on each restart),
reconnects whenever the stream breaks, and exits when ``--stop-file`` exists and it is idle.
A "got" line is written before the message is processed (with ``dl``, the lease deadline the
coordinator gave it), "sent" when its ack is handed to the client, and "acked" only after the
coordinator confirmed the ack (durable). An ack sent just before a kill may be durable without
its confirmation ever arriving. A stream that breaks ends the subscription; a slow answer (Kafka
away) does not.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from layer.client import QueueClient  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--addr-file", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--backlog", type=int, default=10)
    p.add_argument("--name", default=str(os.getpid()))
    args = p.parse_args()
    out = open(args.log, "a", buffering=1)  # noqa: SIM115 - lives as long as the process

    def log(**event: object) -> None:
        out.write(json.dumps({"w": args.name, "t": time.time(), **event}) + "\n")

    stop = Path(args.stop_file)
    while True:
        if stop.exists():
            return 0
        try:
            addr = Path(args.addr_file).read_text().strip()
        except OSError:
            addr = ""
        if not addr:
            time.sleep(0.05)
            continue
        try:
            with (
                QueueClient(addr, reconnect=False) as client,
                client.subscribe(args.queue, max_backlog=args.backlog) as sub,
            ):
                log(ev="subscribed", addr=addr)
                pending: list[str] = []
                while True:
                    msg = sub.next(timeout=0.2)
                    if msg is not None:
                        # dl: the lease's deadline, set by the coordinator when it handed the
                        # message out (deadline - lease period = when it was leased)
                        log(ev="got", b=msg.bookmark, n=msg.deliveries, dl=msg.lease_deadline)
                        msg.ack()
                        log(ev="sent", b=msg.bookmark)
                        pending.append(msg.bookmark)
                    if pending and (msg is None or len(pending) >= args.backlog):
                        # Kafka away: the answers wait for it, however long. Keep the
                        # subscription (a consumer that gave up here would drop what it was
                        # handed unread, and the check could not see those deliveries)
                        while True:
                            try:
                                sub.flush(timeout=10)
                                break
                            except TimeoutError:
                                log(ev="slow-flush", pending=len(pending))
                        failed = {f.bookmark for f in sub.ack_failures}
                        for b in pending:
                            if b not in failed:
                                log(ev="acked", b=b)
                            else:
                                log(ev="refused", b=b)
                        sub.ack_failures.clear()
                        pending = []
                    if msg is None and stop.exists():
                        return 0
        except Exception as exc:  # the coordinator died or restarted: reconnect
            log(ev="disconnected", error=f"{type(exc).__name__}: {exc}"[:300])
            time.sleep(0.1)


if __name__ == "__main__":
    raise SystemExit(main())
