"""A member stopped (SIGSTOP) past its session with pushes still queued for a consumer pushes
none of them when it wakes (issue 12, the zombie's send path).

The stopped member's successor restores the leases and owns what happens to those messages
next (they return, are dead-lettered, or are leased again); a push from the woken zombie would
hand a consumer a message that is no longer leased to it. The three-member history run found
it (``delivered_after_dead_letter``): a woken member delivered two leases granted before its
stop after its successor had dead-lettered them.

To have pushes waiting in the member at the stop, every time: a consumer process that reads
slowly, its library reading ahead one frame only, subscribes with a large backlog to the owner;
messages of 2.1 MB are published; the owner leases them all to the subscription and writes
what the stream's flow control lets through, the rest waits. Then the owner is stopped past its
session; the consumer reads what the transport held; once the other member serves the queue and
the consumer has had nothing for 2 s, the owner wakes. Whatever reaches the consumer after that
was written after the wake, or is the frame the owner's writer was in the middle of writing at
its stop (grpc has it, and sends it once the process runs). Before the pushes were held the
woken member wrote on until it exited (9-20 messages came after the wake); with them held, that
one frame still came (1-2 messages). Now the library holds a frame that comes late (its age,
bounded from the member's stamp and the Subscribe round trip, past ``stale_after_s``) and asks
the member, which answers once it knows it lost its queues (or exits): nothing reaches the
consumer after the wake, and the consumer logs what it dropped. The
member exits within seconds (its fenced writer's abort, unanswered on Tansu, held it 30 s
before).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from connectors.embedded import bound_to_parent
from layer.client import QueueClient
from tests.fault.test_cluster_fencing import owner_of
from tests.harness import ROOT, serving
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

MESSAGES = 30
SIZE = 2_100_000  # bytes: a frame carries up to 4 MB of payload, 2 of these
FRAME_MESSAGES = 2

# The consumer: prints "subscribed", then "<monotonic time> <bookmark>" per message, taking one
# every 0.2 s. Its library reads ahead at most one frame (a bounded buffer in place of the
# subscription's unbounded one), so the stream's flow control holds the member's writer back
# and the pushes it has not written yet wait in the member. Its pings (keepalive and window
# probes) are made rare or none: unanswered by the stopped member, they would end the stream
# before the member wakes.
CONSUMER = """
import queue, sys, time
from layer.client import QueueClient, _common
from layer.exceptions import QLayerError
slow = ("grpc.keepalive_time_ms", "grpc.keepalive_timeout_ms", "grpc.http2.ping_timeout_ms")
for i, (name, _value) in enumerate(_common.CHANNEL_OPTIONS):
    if name in slow:
        _common.CHANNEL_OPTIONS[i] = (name, 600_000)
_common.CHANNEL_OPTIONS.append(("grpc.http2.bdp_probe", 0))
client = QueueClient(sys.argv[1], reconnect=False)
try:
    with client.subscribe(sys.argv[2], max_backlog=int(sys.argv[3])) as sub:
        sub._buffer = queue.Queue(maxsize=1)
        print("subscribed", flush=True)
        for msg in sub:
            print(time.monotonic(), msg.bookmark, flush=True)
            time.sleep(0.2)
    print("ended", flush=True)
except QLayerError as exc:
    print("ended", exc, flush=True)
"""


class Receipts:
    """The consumer's lines, read as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.times: list[float] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            first = line.split(" ", 1)[0]
            if first[:1].isdigit():
                self.times.append(float(first))


def test_a_woken_zombie_pushes_nothing_it_queued_before_its_stop(
    coordinator_factory: Any,
    names: Callable[[str], str],
    producer_factory: Callable[..., Any],
) -> None:
    cluster, q = names("cluster"), names("zombiepush")
    table = {
        "name": q,
        "underlying_topic": q,
        "message_type": "bytes",
        "lease_period": "120s",
        "max_per_subscription_backlog": MESSAGES,
    }
    # a 6 s session: a loaded machine's stalls (1-2 s seen at load 30) do not move the queue
    # before the stop; the stop lasts until the other member serves it
    session = {"session_timeout_ms": 6000}
    procs = [
        coordinator_factory([table], cluster=cluster, broker=session),
        coordinator_factory([], cluster=cluster, broker=session),
    ]
    clients = [QueueClient(str(p.address), reconnect=False) for p in procs]
    consumer: subprocess.Popen[str] | None = None
    owner = None
    try:
        ids = [c.cluster().member for c in clients]
        wait_until(
            lambda: all(owner_of(c, q) in ids and serving(c, [q]) for c in clients),
            timeout=60,
            message="no member serves the queue",
        )
        o = ids.index(owner_of(clients[0], q))
        owner, survivor = procs[o], clients[1 - o]
        assert owner.proc is not None
        consumer = subprocess.Popen(
            bound_to_parent([sys.executable, "-c", CONSUMER, str(owner.address), q, str(MESSAGES)]),
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        receipts = Receipts(consumer)
        wait_until(lambda: "subscribed" in receipts.lines, 30, message="the consumer subscribed")
        producer = producer_factory(linger_ms=5, message_max_bytes=4_000_000)
        for i in range(MESSAGES):
            producer.produce(q, bytes([i]) * SIZE)
        assert producer.flush(60) == 0
        wait_until(
            lambda: clients[o].stats(q)[0].leased == MESSAGES and len(receipts.times) >= 2, 60,
            message=lambda: f"every message leased: {clients[o].stats(q)[0]}",
        )  # fmt: skip
        owner.proc.send_signal(signal.SIGSTOP)
        try:
            wait_until(
                lambda: owner_of(survivor, q) == ids[1 - o] and serving(survivor, [q]),
                timeout=60,
                message="the other member did not take the queue over",
            )
            # what the transport held (written before the stop) is read meanwhile; then nothing
            quiet = [len(receipts.times), time.monotonic()]

            def settled() -> bool:
                if len(receipts.times) != quiet[0]:
                    quiet[:] = [len(receipts.times), time.monotonic()]
                return time.monotonic() - quiet[1] > 2.0

            wait_until(settled, 60, message="the consumer to read what the transport held")
            before = len(receipts.times)
        finally:
            woke = time.monotonic()
            owner.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: not owner.running, 120, message="the woken member to exit")
        exited = time.monotonic() - woke
        quiet[:] = [len(receipts.times), time.monotonic()]
        wait_until(settled, 60, message="the consumer to read what came after the wake")
        after = [t for t in receipts.times if t > woke]
        print(
            f"\n{MESSAGES} leased, {before} received before the wake, {len(after)} after it"
            f" (exit code {owner.proc.returncode}, {exited:.1f} s after the wake); consumer:"
            f" {[line for line in receipts.lines if not line[:1].isdigit()]}"
        )
        assert before < MESSAGES - 2 * FRAME_MESSAGES, (
            "the transport held nearly everything: nothing was left queued to test"
        )
        dropped = [line for line in receipts.lines if "of a late frame" in line]
        print(f"consumer dropped: {dropped}")
        assert not after, f"{len(after)} messages leased before the stop reached the consumer"
        # the frame grpc held at the stop came, and was held and dropped (not just absent)
        assert dropped, "no late frame came: nothing was left in the transport to test"
        assert owner.proc.returncode != 0
        # a fenced writer's abort unanswered (Tansu) held the exit 30 s before it was cut short
        assert exited < 20, f"the woken member took {exited:.1f} s to exit"
    finally:
        if consumer is not None:
            consumer.send_signal(signal.SIGCONT)
            consumer.kill()
            consumer.wait(10)
            if consumer.stdout is not None:
                consumer.stdout.close()
        if owner is not None and owner.proc is not None and owner.running:
            owner.proc.send_signal(signal.SIGCONT)
        for c in clients:
            c.close()
