"""The queue core end to end: plain Kafka producers in, a coordinator process, QueueClient out."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from layer.api.frames import CLIENT_FRAME_CODEC, SERVER_FRAME_CODEC, Subscribe
from layer.api.proto.qlayer.v1 import queue_pb2 as pb
from layer.client import QueueClient
from layer.codec import decode
from layer.exceptions import LeaseError, NotLeaseHolder, UnknownBookmark, UnknownQueue
from tests.harness import ROOT
from tests.helpers import wait_until

pytestmark = pytest.mark.integration


def produce(bootstrap: str, topic: str, docs: list[Any], raw: bool = False, **kw: Any) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2})
    for i, doc in enumerate(docs):
        value = doc if raw else json.dumps(doc).encode()
        p.produce(topic, value=value, key=str(i).encode(), **kw)
    assert p.flush(10) == 0


def read_topic(bootstrap: str, topic: str, expect: int, timeout: float = 15) -> list[Any]:
    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "t",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        out.extend(m for m in c.consume(100, 0.1) if m.error() is None)
    # and nothing more arrives
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        out.extend(m for m in c.consume(100, 0.1) if m.error() is None)
    c.close()
    return out


def dead_letters(bootstrap: str, topic: str, expect: int) -> list[dict[str, Any]]:
    return [decode("dead_letter", m.value()) for m in read_topic(bootstrap, topic, expect)]


def take(sub: Any, n: int, timeout: float = 10) -> list[Any]:
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"got {len(got)} of {n} messages"
        msg = sub.next(timeout=left)
        if msg is not None:
            got.append(msg)
    return got


def queue(name: str, topic: str, **options: Any) -> dict[str, Any]:
    return {"name": name, "underlying_topic": topic, **options}


def test_publish_consume_ack(broker, coordinator_factory, names) -> None:
    topic, q = names("orders"), names("q")
    c = coordinator_factory([queue(q, topic)])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(20)])
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=5) as sub:
        msgs = []
        for _ in range(4):
            batch = take(sub, 5)
            assert sub.next(timeout=0.2) is None  # the backlog is full until we ack
            assert all(m.lease_deadline and m.lease_deadline > time.time() for m in batch)
            for m in batch:
                m.ack()
            msgs.extend(batch)
        sub.flush(timeout=10)
        assert [m.json()["i"] for m in msgs] == list(range(20))  # oldest first
        assert all(m.deliveries == 1 for m in msgs)
        assert sub.next(timeout=0.5) is None
        s = client.stats(q)[0]
        assert (s.acked_total, s.available, s.leased) == (20, 0, 0)


def _raw_messages(address: str, q: str, common: bool, want: int) -> list[Any]:
    """The MessageColumns a real coordinator writes to a raw Subscribe stream (message_columns
    set, common_columns as given) until ``want`` messages came."""
    subscribe = CLIENT_FRAME_CODEC.encode(
        Subscribe(q, want, "raw", None, batch_frames=False, message_columns=True,
                  common_columns=common)
    )  # fmt: skip
    frames: list[Any] = []
    done = threading.Event()

    def requests() -> Iterator[bytes]:
        yield subscribe
        done.wait(30)  # the stream stays open (a half-close would end it) until we are done

    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream("/qlayer.v1.QueueService/Subscribe")(requests(), timeout=30)
        count = 0
        for data in call:
            frame = pb.ServerFrame.FromString(data)
            if frame.WhichOneof("body") == "messages":
                frames.append(frame.messages.columns)
                count += len(frame.messages.columns.offset)
                if count >= want:
                    break
        done.set()
        call.cancel()
    return frames


def test_a_client_that_reads_common_columns_gets_alike_columns_once(
    broker, coordinator_factory, names
) -> None:
    """On the wire from a real coordinator: a round's batch goes to a client that set
    common_columns with its topic, queue, flags, counts and deadline once, and in full to one
    that did not; both decode to the same messages."""
    topic, q = names("orders"), names("q")
    c = coordinator_factory([queue(q, topic, lease_period="1s")])
    p = Producer({"bootstrap.servers": broker.bootstrap_servers, "linger.ms": 2})
    for i in range(6):
        p.produce(topic, json.dumps({"i": i}).encode())  # no key: a plain batch
    assert p.flush(10) == 0
    compact = _raw_messages(c.address, q, True, 6)
    full = _raw_messages(c.address, q, False, 6)  # the leases ran out: delivered again
    assert sum(len(cols.offset) for cols in compact) == 6
    for cols in compact:
        assert not cols.topic and not cols.queue and not cols.flags and not cols.key
        assert (cols.common_topic, cols.common_queue, cols.common_deliveries) == (topic, q, 1)
        assert cols.HasField("common_lease_deadline_ms") and cols.common_lease_deadline_ms > 0
    for cols in full:
        assert list(cols.topic) == [topic] * len(cols.offset) and list(cols.queue)
        assert not cols.HasField("common_topic") and not cols.HasField("common_flags")
        assert set(cols.deliveries) == {2}
    decoded = [
        SERVER_FRAME_CODEC.decode(
            pb.ServerFrame(messages=pb.Messages(columns=cols)).SerializeToString()
        ).messages  # type: ignore[union-attr]
        for cols in compact + full
    ]
    seen = [
        (m.bookmark.offset, json.loads(m.value)["i"], m.deliveries) for ms in decoded for m in ms
    ]
    for n in (1, 2):  # each message once as sent in common columns, once in full
        assert sorted((offset, i) for offset, i, d in seen if d == n) == [(i, i) for i in range(6)]


def test_an_idle_queue_over_a_transactional_topic_keeps_its_fetch_wait(
    broker, coordinator_factory, names
) -> None:
    """A topic written in transactions ends with a commit marker, which is never delivered: the
    reader must not take it for a lag and lengthen its fetch wait (on Tansu the next delivery
    would wait that long)."""
    topic, q = names("tx"), names("q")
    c = coordinator_factory([queue(q, topic)])
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap_servers, "transactional.id": f"tx-{topic}"}
    )
    producer.init_transactions(10)

    def publish(doc: dict[str, Any]) -> None:
        producer.begin_transaction()
        producer.produce(topic, json.dumps(doc).encode())
        producer.commit_transaction(10)

    with QueueClient(c.address) as client, client.subscribe(q) as sub:
        publish({"i": 0})
        (msg,) = take(sub, 1)
        msg.ack(wait=True)
        base = client.stats(q)[0].extra["fetch_wait_ms"]
        # The idle time under test: a reader that took the marker for a lag would have
        # lengthened its wait by now (to 50 ms after 0.2 s, 250 after 0.4, 1,250 after 1.4).
        time.sleep(2.5)
        assert client.stats(q)[0].extra["fetch_wait_ms"] == base
        publish({"i": 1})
        assert [m.json()["i"] for m in take(sub, 1)] == [1]


def test_lease_timeout_redelivers_with_count(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, lease_period="1s")])
    produce(broker.bootstrap_servers, topic, [{"i": 0}])
    with QueueClient(c.address) as client, client.subscribe(q) as sub:
        first = take(sub, 1)[0]
        started = time.monotonic()
        again = take(sub, 1, timeout=5)[0]
        assert again.bookmark == first.bookmark
        assert again.deliveries == 2
        assert time.monotonic() - started >= 0.8
        again.ack(wait=True)


def test_extend_moves_the_deadline(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, lease_period="1s")])
    produce(broker.bootstrap_servers, topic, [{"i": 0}])
    with QueueClient(c.address) as client, client.subscribe(q) as sub:
        msg = take(sub, 1)[0]
        msg.extend(4)
        sub.flush(timeout=5)
        assert sub.next(timeout=2.0) is None  # past the original 1 s lease: still ours
        msg.ack(wait=True)


def test_cancel_and_max_cancels_dead_letters(broker, coordinator_factory, names) -> None:
    topic, q, dlq = names("t"), names("q"), names("dlq")
    c = coordinator_factory([queue(q, topic, max_cancels=3, dead_letter_topic=dlq)])
    produce(broker.bootstrap_servers, topic, [{"i": 0}])
    with QueueClient(c.address) as client, client.subscribe(q) as sub:
        for expected_cancels in range(3):
            msg = take(sub, 1)[0]
            assert msg.cancels == expected_cancels
            msg.cancel()
            sub.flush(timeout=5)
        assert sub.next(timeout=0.5) is None  # the 3rd cancel expired it
    (letter,) = dead_letters(broker.bootstrap_servers, dlq, 1)
    assert letter["reason"] == "max_cancels" and letter["cancels"] == 3
    assert json.loads(letter["payload"]) == {"i": 0}
    assert letter["bookmark"] == f"{topic}/0/0" and letter["queue"] == q


def test_max_deliveries_dead_letters(broker, coordinator_factory, names) -> None:
    topic, q, dlq = names("t"), names("q"), names("dlq")
    c = coordinator_factory(
        [queue(q, topic, lease_period="0.5s", max_deliveries=2, dead_letter_topic=dlq)]
    )
    produce(broker.bootstrap_servers, topic, [{"i": 0}])
    with QueueClient(c.address) as client, client.subscribe(q) as sub:
        assert [m.deliveries for m in take(sub, 2, timeout=5)] == [1, 2]
        assert sub.next(timeout=1.5) is None  # not delivered after its 2nd unsuccessful delivery
    (letter,) = dead_letters(broker.bootstrap_servers, dlq, 1)
    assert letter["reason"] == "max_deliveries" and letter["deliveries"] == 2


def test_expire_sends_envelope_with_key_headers(broker, coordinator_factory, names) -> None:
    topic, q, dlq = names("t"), names("q"), names("dlq")
    c = coordinator_factory([queue(q, topic, dead_letter_topic=dlq)])
    p = Producer({"bootstrap.servers": broker.bootstrap_servers})
    p.produce(topic, key=b"k1", value=b'{"bad": true}', headers=[("h", b"v"), ("n", None)])
    p.flush(10)
    with QueueClient(c.address) as client, client.subscribe(q) as sub:
        msg = take(sub, 1)[0]
        assert msg.key == b"k1"
        assert ("h", b"v") in msg.headers
        msg.expire()
        sub.flush(timeout=5)
    (letter,) = dead_letters(broker.bootstrap_servers, dlq, 1)
    assert letter["reason"] == "consumer_expire"
    assert letter["key"] == b"k1" and letter["payload"] == b'{"bad": true}'
    assert {"key": "h", "value": b"v"} in letter["headers"]
    assert {"key": "n", "value": None} in letter["headers"]
    assert letter["deliveries"] == 1


def test_expiration_of_waiting_messages(broker, coordinator_factory, names) -> None:
    topic, q, dlq = names("t"), names("q"), names("dlq")
    c = coordinator_factory([queue(q, topic, expiration="1s", dead_letter_topic=dlq)])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(3)])
    letters = dead_letters(
        broker.bootstrap_servers,
        dlq,
        3,
    )
    assert sorted(json.loads(x["payload"])["i"] for x in letters) == [0, 1, 2]
    assert {x["reason"] for x in letters} == {"expiration"}
    with QueueClient(c.address) as client:
        s = client.stats(q)[0]
        assert s.available == 0 and s.dead_lettered_total == 3


def test_disconnect_returns_leases_at_once(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, lease_period="60s")])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(5)])
    with QueueClient(c.address) as client:
        a = client.subscribe(q, max_backlog=5)
        held = {m.bookmark for m in take(a, 5)}
        with client.subscribe(q, max_backlog=5) as b:
            assert b.next(timeout=0.3) is None
            started = time.monotonic()
            a.close()
            got = take(b, 5, timeout=5)
            assert {m.bookmark for m in got} == held
            assert all(m.deliveries == 2 for m in got)
            assert time.monotonic() - started < 3  # far below the 60 s lease


def test_killed_consumer_process_leases_return(
    broker, coordinator_factory, names, tmp_path
) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, lease_period="60s")])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(10)])
    script = tmp_path / "holder.py"
    script.write_text(
        "import sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from layer.client import QueueClient\n"
        f"with QueueClient({c.address!r}) as c, c.subscribe({q!r}, max_backlog=10) as s:\n"
        "    n = 0\n"
        "    while n < 10:\n"
        "        n += s.next(timeout=10) is not None\n"
        "    print('holding', flush=True)\n"
        "    time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"holding"
        with QueueClient(c.address) as client, client.subscribe(q, max_backlog=10) as sub:
            assert sub.next(timeout=0.3) is None
            killed = time.monotonic()
            holder.kill()
            got = take(sub, 10, timeout=15)
            assert len({m.bookmark for m in got}) == 10
            assert time.monotonic() - killed < 10  # the lease period is 60 s
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


def test_strict_and_lenient_leasing(broker, coordinator_factory, names) -> None:
    topic, strict, lenient = names("t"), names("strict"), names("lenient")
    c = coordinator_factory([queue(strict, topic), queue(lenient, topic, leasing="lenient")])
    produce(broker.bootstrap_servers, topic, [{"i": 0}])
    with QueueClient(c.address) as client:
        for q, allowed in ((strict, False), (lenient, True)):
            with client.subscribe(q) as a, client.subscribe(q) as b:
                msg = take(a, 1)[0]
                assert b.next(timeout=0.3) is None
                # b acks a's lease by bookmark through its own stream
                if allowed:
                    b.ack(msg.bookmark, wait=True)
                else:
                    with pytest.raises(NotLeaseHolder):
                        b.ack(msg.bookmark, wait=True)
                    msg.ack(wait=True)


def test_unknown_queue_and_bookmarks(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic)])
    produce(broker.bootstrap_servers, topic, [{"i": 0}, {"i": 1}])
    with QueueClient(c.address) as client:
        with pytest.raises(UnknownQueue, match="nope"), client.subscribe("nope") as sub:
            sub.next(timeout=5)
        with client.subscribe(q) as sub:
            msg = take(sub, 1)[0]
            with pytest.raises(UnknownBookmark):
                sub.ack(f"{topic}/0/999999", wait=True)
            with pytest.raises(UnknownBookmark):
                sub.ack("other-topic/0/0", wait=True)
            with pytest.raises(LeaseError, match="malformed"):
                sub.ack("not-a-bookmark", wait=True)
            msg.ack(wait=True)  # the stream still serves
            assert take(sub, 1)[0].json() == {"i": 1}


def test_unparseable_json_is_delivered_lowest_and_dead_letters_on_expire(
    broker, coordinator_factory, names
) -> None:
    """on_unparseable = "deliver": the message is queued, lowest, with its parse error."""
    topic, q, dlq = names("t"), names("q"), names("dlq")
    c = coordinator_factory(
        [queue(q, topic, priority="/p", dead_letter_topic=dlq, on_unparseable="deliver")]
    )
    produce(
        broker.bootstrap_servers,
        topic,
        [b"{not json", b'{"p": 5}', b'{"p": "high"}', b'{"p": 9}'],
        raw=True,
    )
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 4, 10, message="4 messages queued")
        with client.subscribe(q, max_backlog=10) as sub:
            msgs = take(sub, 4)
            assert [m.data for m in msgs[:2]] == [b'{"p": 9}', b'{"p": 5}']
            # non-numeric and unparseable are lowest, oldest first among them
            assert [m.data for m in msgs[2:]] == [b"{not json", b'{"p": "high"}']
            assert msgs[2].parse_error.startswith("unparseable json: ")
            assert [m.parse_error for m in (msgs[0], msgs[1], msgs[3])] == [None] * 3
            msgs[2].expire()
            for m in (msgs[0], msgs[1], msgs[3]):
                m.ack()
            sub.flush(timeout=5)
    (letter,) = dead_letters(broker.bootstrap_servers, dlq, 1)
    assert letter["payload"] == b"{not json" and "unparseable" in (letter["detail"] or "")


def test_target_queue_depth_and_remembered_acks(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, target_queue_depth=3)])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(8)])
    with QueueClient(c.address) as client:
        wait_until(lambda: client.stats(q)[0].available == 3, 10, message="3 active messages")
        time.sleep(0.3)
        s = client.stats(q)[0]
        assert s.available == 3 and s.leased == 0
        with client.subscribe(q, max_backlog=10) as sub:
            first = take(sub, 3)
            assert [m.json()["i"] for m in first] == [0, 1, 2]
            assert sub.next(timeout=0.3) is None  # the rest are inactive
            # ack message 5 before it is active: remembered, it is never delivered
            sub.ack(f"{topic}/0/5", wait=True)
            for m in first:
                m.ack()
            sub.flush(timeout=5)
            rest = take(sub, 3)
            for m in rest:
                m.ack()
            sub.flush(timeout=5)
            later = [m.json()["i"] for m in take(sub, 1)]
            assert sorted(m.json()["i"] for m in rest) + later == [3, 4, 6, 7]


def test_queues_share_a_topic_independently(broker, coordinator_factory, names) -> None:
    topic, q1, q2 = names("t"), names("a"), names("b")
    c = coordinator_factory([queue(q1, topic), queue(q2, topic, semantics="at-most-once")])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(5)])
    with QueueClient(c.address) as client:
        for q in (q1, q2):
            with client.subscribe(q, max_backlog=5) as sub:
                msgs = take(sub, 5)
                assert sorted(m.json()["i"] for m in msgs) == list(range(5))
                for m in msgs:
                    m.ack()
                sub.flush(timeout=5)


def test_regex_topics_picked_up_later(broker, coordinator_factory, names) -> None:
    prefix, q = names("ev"), names("q")
    c = coordinator_factory([queue(q, f"^{prefix}-.*")], topic_refresh_interval=0.5)
    produce(broker.bootstrap_servers, f"{prefix}-one", [{"t": 1}])
    produce(broker.bootstrap_servers, f"{prefix}-two", [{"t": 2}])
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=5) as sub:
        msgs = take(sub, 2, timeout=20)
        assert sorted(m.topic for m in msgs) == sorted([f"{prefix}-one", f"{prefix}-two"])


def test_at_most_once_never_redelivers(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, semantics="at-most-once", lease_period="0.5s")])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(3)])
    with QueueClient(c.address) as client:
        with client.subscribe(q, max_backlog=3) as a:
            assert len(take(a, 3)) == 3
        with client.subscribe(q, max_backlog=3) as b:
            assert b.next(timeout=1.5) is None
        s = client.stats(q)[0]
        assert s.available == 0 and s.leased == 0 and s.delivered_total == 3


def test_publish_through_the_api(broker, coordinator_factory, names) -> None:
    topic, target, q1, q2 = names("t"), names("target"), names("a"), names("b")
    c = coordinator_factory(
        [
            queue(q1, topic),
            queue(q2, f"^{target}$", default_publish_target=target, message_type="bytes"),
        ]
    )
    with QueueClient(c.address) as client:
        bm = client.publish(q1, {"x": 1}, key=b"k", headers=[("h", b"1")])
        assert bm.startswith(f"{topic}/0/")
        bm2 = client.publish(q2, b"raw")
        assert bm2.startswith(f"{target}/0/")
        with client.subscribe(q1) as sub:
            msg = take(sub, 1)[0]
            assert msg.json() == {"x": 1} and msg.key == b"k" and ("h", b"1") in msg.headers
            msg.ack(wait=True)
        with pytest.raises(UnknownQueue):
            client.publish("nope", b"x")


def test_state_survives_restart(broker, coordinator_factory, names) -> None:
    topic, q = names("t"), names("q")
    c = coordinator_factory([queue(q, topic, lease_period="60s")])
    produce(broker.bootstrap_servers, topic, [{"i": i} for i in range(6)])
    with QueueClient(c.address) as client, client.subscribe(q, max_backlog=4) as sub:
        msgs = take(sub, 4)
        for m in msgs[:2]:
            m.ack()
        sub.flush(timeout=5)
    c.kill()
    for wipe in (False, True):
        if wipe:
            c.kill()
            c.wipe_state()
        c.start()
        with QueueClient(c.address) as client, client.subscribe(q, max_backlog=10) as sub:
            got = take(sub, 4)
            by_i = {m.json()["i"]: m.deliveries for m in got}
            # the two acked never return; the two leased return with their count; 4 and 5 are new
            assert set(by_i) == {2, 3, 4, 5}
            assert by_i[2] >= 2 and by_i[3] >= 2 and by_i[4] >= 1
            assert sub.next(timeout=0.3) is None
        c.stop()


def test_bad_config_exits_2_naming_the_option(tmp_path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[[queue]]\nname = "orders"\nunderlying_topic = "o"\nlease_period = "soon"\n')
    r = subprocess.run(
        [sys.executable, "-m", "layer.cli", "coordinator", "--config", str(cfg)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    err = r.stderr.strip().splitlines()
    assert (
        len(err) == 1 and "bad.toml" in err[0] and "orders" in err[0] and "lease_period" in err[0]
    )
