"""Live configuration against a real coordinator process: ``qlayer reload`` and ``kill -HUP``.

While a consumer of queue A receives and acks a steady stream (one subscription, never
reconnected), the config file is edited and reloaded: queue B is added (and serves), A's
lease_period changes (seen in the lease deadlines delivered), queue C is removed (its consumer
gets an error naming it; a later re-add resumes its kept state), a bad file and a refused option
change nothing. The same story runs once through the CLI and once through SIGHUP.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from layer.client import QueueClient
from layer.exceptions import QLayerError, QueueRemoved
from tests.harness import CoordinatorProcess, qlayer, write_config
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


class Consumer(threading.Thread):
    """Consumes a queue on one subscription, acking each message; notes how long each lease had
    left when it arrived, and any message delivered twice."""

    def __init__(self, address: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.client = QueueClient(address)
        self.sub = self.client.subscribe(queue, max_backlog=10)
        self.first_id = self.sub.id
        self.lease_left: dict[bytes, float] = {}
        self.duplicates: list[bytes] = []
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            while not self.done.is_set():
                msg = self.sub.next(timeout=0.2)
                if msg is None:
                    continue
                if msg.data in self.lease_left:
                    self.duplicates.append(msg.data)
                assert msg.lease_deadline is not None
                self.lease_left[msg.data] = msg.lease_deadline - time.time()
                msg.ack()
        except BaseException as exc:  # the test reports it
            self.error = exc

    def stop(self) -> None:
        self.done.set()
        self.join(10)
        self.sub.close()
        self.client.close()


class Publisher(threading.Thread):
    """Publishes a numbered message to a queue every 20 ms until stopped."""

    def __init__(self, address: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.client = QueueClient(address)
        self.queue = queue
        self.published: list[bytes] = []
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        n = 0
        try:
            while not self.done.wait(0.02):
                data = f"steady-{n}".encode()
                self.client.publish(self.queue, data)
                self.published.append(data)
                n += 1
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.done.set()
        self.join(30)
        self.client.close()


HEADS = {
    0: ": reloaded ",
    2: ": reload failed, nothing changed: ",
    3: " refused, nothing changed: ",
}


def reloader(how: str, proc: CoordinatorProcess) -> Callable[..., str]:
    """A function that reloads ``proc`` the ``how`` way, checks the outcome (an exit code, or
    for SIGHUP the log's summary that stands for it) and the summary's lines, and returns the
    text."""

    def by_cli(code: int, *expected: str) -> str:
        r = qlayer("reload", "--server", str(proc.address))
        text = r.stdout + r.stderr
        assert r.returncode == code, text
        for line in expected:
            assert line in text, text
        return text

    def by_signal(code: int, *expected: str) -> str:
        mark = len(proc.log_path.read_text(errors="replace"))
        assert proc.proc is not None
        proc.proc.send_signal(signal.SIGHUP)

        def logged() -> str:
            return proc.log_path.read_text(errors="replace")[mark:]

        wait_until(
            lambda: HEADS[code] in logged() and all(line in logged() for line in expected),
            timeout=60,
            message=lambda: f"no reload summary with {expected!r} in the log:\n{logged()}",
        )
        others = [head for c, head in HEADS.items() if c != code and head in logged()]
        assert not others, logged()
        return logged()

    return by_cli if how == "cli" else by_signal


@pytest.mark.parametrize("how", ["cli", "sighup"])
def test_reload_while_a_consumer_keeps_receiving(
    how: str, broker: Any, coordinator_factory: Any, names: Callable[[str], str]
) -> None:
    a, b, c, d = names("a"), names("b"), names("c"), names("d")
    coordinator = {"id": names("reload")}
    # bytes: the test publishes plain text through the API (a json queue refuses it)
    qa = {"name": a, "underlying_topic": a, "message_type": "bytes"}  # lease_period 60 s
    qb = {"name": b, "underlying_topic": b, "message_type": "bytes"}
    qc = {"name": c, "underlying_topic": c, "message_type": "bytes"}
    qd = {"name": d, "underlying_topic": d, "message_type": "bytes"}
    proc = coordinator_factory([qa, qc], **coordinator)
    address = str(proc.address)
    source = str(proc.config_path)
    reload = reloader(how, proc)

    def edit(*queues: dict[str, Any]) -> None:
        write_config(proc.config_path, broker.bootstrap_servers, queues, coordinator)

    consumer = Consumer(address, a)
    consumer.start()
    publisher = Publisher(address, a)
    publisher.start()
    admin = QueueClient(address)
    try:
        # C: one message acked, then one leased and held when C is removed, one never sent
        sub_c = admin.subscribe(c, max_backlog=1)
        admin.publish(c, b"c1")
        first = sub_c.next(timeout=30)
        assert first is not None and first.data == b"c1"
        first.ack(wait=True, timeout=30)
        admin.publish(c, b"c2")
        admin.publish(c, b"c3")
        held = sub_c.next(timeout=30)
        assert held is not None and held.data == b"c2"

        admin.publish(a, b"marker-before")
        wait_until(lambda: b"marker-before" in consumer.lease_left, timeout=30)
        assert 40 < consumer.lease_left[b"marker-before"] <= 60.5

        # 1. add B, change A's lease_period, remove C
        edit({**qa, "lease_period": 20}, qb)
        reload(
            0,
            f"reloaded {source}: added 1, removed 1, changed 1",
            f"added queue {b!r}",
            f"removed queue {c!r}",
            f"changed queue {a!r}: lease_period 60.0 -> 20.0",
        )
        with pytest.raises(QueueRemoved) as ended:  # for good: no reconnect to a removed queue
            while sub_c.next(timeout=30) is not None:
                pass
        assert f"queue {c!r} was removed by reload" in str(ended.value)
        assert sorted(q.name for q in admin.queues()) == sorted([a, b])
        admin.publish(b, b"b1")
        with admin.subscribe(b) as sub_b:
            got = sub_b.next(timeout=30)
            assert got is not None and got.data == b"b1"
            got.ack(wait=True, timeout=30)
        admin.publish(a, b"marker-after")
        wait_until(lambda: b"marker-after" in consumer.lease_left, timeout=30)
        assert 5 < consumer.lease_left[b"marker-after"] <= 20.5

        # 2. a file that does not load changes nothing and says what is wrong
        edit({**qa, "lease_period": 20}, {**qb, "lease_period": -1})
        reload(2, source, f"queue {b!r}", "lease_period")
        infos = {q.name: q for q in admin.queues()}
        assert sorted(infos) == sorted([a, b]) and infos[a].lease_period_s == 20.0

        # 3. a refused option refuses the whole reload: D is not added either
        edit({**qa, "lease_period": 20, "semantics": "at-most-once"}, qb, qd)
        reload(3, f"refused queue {a!r}: option 'semantics'", "restart it to apply them")
        assert sorted(q.name for q in admin.queues()) == sorted([a, b])
        with pytest.raises(QLayerError, match=d):
            admin.stats(d)

        # 4. C comes back with its state: c1 stays acked, c2 (its lease returned) and c3 remain
        edit({**qa, "lease_period": 20}, qb, qc)
        reload(0, f"added queue {c!r}")
        with admin.subscribe(c, max_backlog=10) as again:
            seen = []
            for _ in range(2):
                msg = again.next(timeout=30)
                assert msg is not None
                seen.append(msg.data)
                msg.ack(wait=True, timeout=30)
            assert sorted(seen) == [b"c2", b"c3"]
            assert again.next(timeout=1.0) is None  # c1 was acked before the removal

        # A's consumer noticed nothing: the same subscription got every message, once each
        publisher.stop()
        assert publisher.error is None, publisher.error
        assert len(publisher.published) > 20
        wait_until(
            lambda: set(publisher.published) <= set(consumer.lease_left),
            timeout=60,
            message=lambda: (
                f"{len(set(publisher.published) - set(consumer.lease_left))} of"
                f" {len(publisher.published)} published messages not received"
            ),
        )
        assert consumer.error is None, consumer.error
        assert consumer.sub.id == consumer.first_id and not consumer.sub.closed
        assert consumer.duplicates == []
        consumer.sub.flush(timeout=30)
        assert consumer.sub.ack_failures == []
        print(
            f"\nreload via {how}: {len(publisher.published)} messages to {a} received and acked"
            f" on one subscription across 4 reloads"
        )
    finally:
        publisher.stop()
        consumer.stop()
        admin.close()


def test_a_subscription_over_several_queues_keeps_the_ones_left(
    coordinator_factory: Any, broker: Any, names: Callable[[str], str]
) -> None:
    """A subscription to a regex of queue names loses a removed queue and goes on with the
    others, on the same stream; the Python client's reload() returns the summary."""
    prefix = names("multi")
    x1, x2 = f"{prefix}-x1", f"{prefix}-x2"
    coordinator = {"id": names("reload")}
    q1 = {"name": x1, "underlying_topic": x1, "message_type": "bytes"}
    q2 = {"name": x2, "underlying_topic": x2, "message_type": "bytes"}
    proc = coordinator_factory([q1, q2], **coordinator)
    with QueueClient(str(proc.address)) as client:
        sub = client.subscribe(f"^{prefix}-", max_backlog=10)
        client.publish(x2, b"from-x2")
        got = sub.next(timeout=30)
        assert got is not None and got.queue == x2
        got.ack(wait=True, timeout=30)
        write_config(proc.config_path, broker.bootstrap_servers, [q1], coordinator)
        result = client.reload()
        assert result.applied and result.removed == [x2] and result.added == []
        assert result.lines()[0].endswith("added 0, removed 1, changed 0")
        client.publish(x1, b"from-x1")
        got = sub.next(timeout=30)
        assert got is not None and (got.queue, got.data) == (x1, b"from-x1")
        got.ack(wait=True, timeout=30)
        assert not sub.closed
        again = client.reload()  # the same file again: nothing to do
        assert again.applied and again.lines() == [f"reloaded {proc.config_path}: no changes"]


def test_reload_is_an_admin_call(coordinator_factory: Any, names: Callable[[str], str]) -> None:
    q = names("q")
    queues = [{"name": q, "underlying_topic": q}]
    both = coordinator_factory(queues, auth_token="user-token", admin_token="admin-token")
    server = ["--server", str(both.address)]
    r = qlayer("reload", *server, "--token", "user-token")
    assert r.returncode == 3 and "reload is an admin call" in r.stderr, r.stderr
    assert "admin token" in r.stderr
    r = qlayer("reload", *server, "--token", "wrong")
    assert r.returncode == 3 and "unknown bearer token" in r.stderr, r.stderr
    r = qlayer("reload", *server, "--token", "admin-token")
    assert r.returncode == 0 and "no changes" in r.stdout, r.stderr
    r = qlayer("stats", q, *server, "--token", "admin-token")  # the admin token is good for all
    assert r.returncode == 0, r.stderr

    only_user = coordinator_factory(queues, auth_token="user-token")
    r = qlayer("reload", "--server", str(only_user.address), "--token", "user-token")
    assert r.returncode == 3 and "admin_token" in r.stderr and "SIGHUP" in r.stderr, r.stderr
