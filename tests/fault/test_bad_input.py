"""Bad input at volume against a real coordinator process.

Each test runs a well-behaved consumer (a thread: it acks what parses as JSON and expires what
does not) while something feeds the coordinator bad input: malformed JSON messages, messages over
the size limits, deeply nested JSON, malformed and truncated API frames (hypothesis), streams that
are opened and never read, and acks of unknown bookmarks. Each checks that the coordinator keeps
serving the good consumer, that nothing is lost (every good message acked, every bad one on the
dead-letter topic with its reason) and that the coordinator's resident memory stays bounded.

``QLAYER_SOAK=1`` (``make soak``) multiplies the volumes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import psutil
import pytest
from confluent_kafka import Producer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from layer.api.frames import (
    ACK_WHERE_CODEC,
    BROWSE_CODEC,
    CLIENT_FRAME_CODEC,
    LIST_QUEUES_CODEC,
    PUBLISH_CODEC,
    SERVER_FRAME_CODEC,
    STATS_CODEC,
    Ack,
    AckResult,
    AckWhere,
    Browse,
    Close,
    Error,
    ListQueues,
    Messages,
    Publish,
    Replace,
    Stats,
    Subscribe,
    Subscribed,
)
from layer.api.proto.qlayer.v1 import queue_pb2 as pb
from layer.client import QueueClient
from layer.codec import decode
from layer.engine.model import AckOp, Bookmark
from layer.exceptions import QLayerError
from tests.harness import CoordinatorProcess
from tests.helpers import wait_until

pytestmark = pytest.mark.fault

SOAK = os.environ.get("QLAYER_SOAK") == "1"
SCALE = 10 if SOAK else 1
MiB = 1 << 20
SERVICE = "/qlayer.v1.QueueService/"
# The coordinator's Kafka producers keep librdkafka's default message.max.bytes: qlayer's config
# does not pass that setting through, so it is the size limit of what the coordinator produces.
PRODUCER_LIMIT = 1_000_000
API_LIMIT = 64 * MiB  # grpc.max_receive_message_length of the API server


# --- helpers ----------------------------------------------------------------------------------


class GoodConsumer:
    """A well-behaved consumer in a thread: acks what parses as JSON, expires what does not, and
    subscribes again whenever its stream breaks. A message counts as acked (or expired) once the
    coordinator confirmed it: an ack that arrives after the lease ran out is refused, and the
    message comes back to be handled again."""

    def __init__(self, coordinator: CoordinatorProcess, queue_name: str, backlog: int = 100):
        self.coordinator = coordinator
        self.queue = queue_name
        self.backlog = backlog
        self.acked: set[str] = set()
        self.expired: set[str] = set()
        self.refused = 0  # acks and expires the coordinator refused
        self.deliveries = 0
        self.reconnects = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="good-consumer", daemon=True)

    def __enter__(self) -> GoodConsumer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)

    def handled(self) -> set[str]:
        with self.lock:
            return self.acked | self.expired

    def _run(self) -> None:
        while not self.stop.is_set():
            address = self.coordinator.address if self.coordinator.running else None
            if address is None:
                self.stop.wait(0.1)
                continue
            try:
                with (
                    QueueClient(address, timeout=10) as client,
                    client.subscribe(self.queue, max_backlog=self.backlog) as sub,
                ):
                    self._consume(sub)
            except (QLayerError, TimeoutError):
                self.reconnects += 1
                self.stop.wait(0.2)

    def _consume(self, sub: Any) -> None:
        sent: dict[str, bool] = {}  # bookmark -> good (acked) or not (expired), unconfirmed
        seen = 0  # sub.ack_failures already accounted for
        while not self.stop.is_set():
            msg = sub.next(timeout=0.1)
            if msg is None or len(sent) >= self.backlog:
                seen = self._confirm(sub, sent, seen)
            if msg is None:
                continue
            try:
                json.loads(msg.data)
                good = True
            except (ValueError, RecursionError):
                good = False
            if good:
                msg.ack()
            else:
                msg.expire()
            sent[msg.bookmark] = good
            with self.lock:
                self.deliveries += 1
        self._confirm(sub, sent, seen)

    def _confirm(self, sub: Any, sent: dict[str, bool], seen: int) -> int:
        """Wait for the answers to what was sent; record what the coordinator accepted.
        Returns how many of ``sub.ack_failures`` are accounted for."""
        if not sent:
            return seen
        sub.flush(timeout=10)
        failures = sub.ack_failures[seen:]
        refused = {f.bookmark for f in failures}
        with self.lock:
            for bookmark, good in sent.items():
                if bookmark not in refused:
                    (self.acked if good else self.expired).add(bookmark)
            self.refused += len(refused)
        sent.clear()
        return seen + len(failures)


def publish(bootstrap: str, topic: str, values: list[bytes | None], **settings: Any) -> list[str]:
    """Publish with a plain producer; returns the bookmarks, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **settings})
    found: dict[int, str] = {}

    def report(i: int) -> Callable[[Any, Any], None]:
        def delivered(err: Any, msg: Any) -> None:
            assert err is None, f"publish failed: {err}"
            found[i] = f"{msg.topic()}/{msg.partition()}/{msg.offset()}"

        return delivered

    for i, value in enumerate(values):
        producer.produce(topic, value=value, key=str(i).encode(), on_delivery=report(i))
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0
    producer.close()
    return [found[i] for i in range(len(values))]


def rss(coordinator: CoordinatorProcess) -> int:
    assert coordinator.proc is not None
    return int(psutil.Process(coordinator.proc.pid).memory_info().rss)


def serving(
    coordinator: CoordinatorProcess,
    done: Callable[[], Any],
    timeout: float,
    what: str,
    detail: Callable[[], str] = lambda: "",
) -> Any:
    """Wait for ``done()``; fail at once, with the log's tail, if the coordinator exits."""

    def exited() -> AssertionError:
        return AssertionError(
            f"the coordinator exited while waiting for {what}; log tail:\n"
            + coordinator.log_tail(25)
        )

    def check() -> Any:
        if not coordinator.running:
            raise exited()
        try:
            return done()
        except QLayerError:  # refused: it may be on its way out (checked on the next turn)
            return False

    return wait_until(
        check, timeout, interval=0.1, message=lambda: f"{what} within {timeout}s {detail()}"
    )


def queue_options(name: str, topic: str, dlq: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "underlying_topic": topic, "dead_letter_topic": dlq, **more}


def dead_letters(consume_all: Callable[..., list[Any]], topic: str) -> dict[str, dict[str, Any]]:
    letters = [decode("dead_letter", m.value()) for m in consume_all(topic, timeout=60)]
    return {letter["bookmark"]: letter for letter in letters}


def assert_nothing_lost(
    coordinator: CoordinatorProcess,
    consumer: GoodConsumer,
    queue_name: str,
    good: set[str],
    bad: set[str],
    letters: dict[str, dict[str, Any]],
    unparseable: set[str] = frozenset(),  # type: ignore[assignment]
) -> None:
    """Every good message acked, every bad one dead-lettered (the unparseable ones on arrival,
    never delivered: on_unparseable = "dead-letter"; the others expired by the consumer), the
    queue empty."""
    assert good <= consumer.acked, f"{len(good - consumer.acked)} good messages never acked"
    expired = bad - unparseable
    assert expired <= consumer.expired, (
        f"{len(expired - consumer.expired)} bad messages never expired"
    )
    delivered = unparseable & consumer.handled()
    assert not delivered, f"{len(delivered)} unparseable messages were delivered"
    assert set(letters) == bad, (
        f"dead letters: {len(set(letters) - bad)} unexpected, {len(bad - set(letters))} missing"
    )
    wrong = [
        b
        for b, letter in letters.items()
        if letter["reason"] != ("unparseable" if b in unparseable else "consumer_expire")
    ]
    assert not wrong, f"dead letters with the wrong reason: {[letters[b] for b in wrong[:3]]}"
    with QueueClient(coordinator.address or "", timeout=10) as client:
        s = client.stats(queue_name)[0]
    assert (s.available, s.leased, s.inactive) == (0, 0, 0), s


# --- malformed messages -----------------------------------------------------------------------

MALFORMED: list[bytes | None] = [
    b'{"i": 1, "qty": ',  # truncated
    b"{not json}",
    b"\xff\xfe\x00\x01 binary",  # not UTF-8
    b"",
    None,  # a null value (a tombstone): no payload at all
    b'{"a": tru}',
    b"[1, 2",
    b'"unterminated',
    b'{"a": 1}{"b": 2}',  # trailing data
    b"NaNx",
    b"\x00" * 64,
    b'{"a": 1e5' + b"9" * 4000,  # a long number, cut short
    b'{"\xc3\x28": 1}',  # invalid UTF-8 in a key
]


def test_one_percent_malformed_json_is_dead_lettered_and_the_rest_acked(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    topic, dlq, q = names("malformed"), names("malformed.dlq"), names("q")
    c = coordinator_factory([queue_options(q, topic, dlq, lease_period="30s")])
    rounds, per_round = 4, 5_000 * SCALE
    rng = random.Random(5)
    good: set[str] = set()
    bad: set[str] = set()
    null_values: set[str] = set()
    memory = [rss(c)]
    with GoodConsumer(c, q, backlog=200) as consumer:
        for r in range(rounds):
            values: list[bytes | None] = []
            kinds: list[bool] = []
            for i in range(per_round):
                if i % 100 == 50:  # 1%
                    value = MALFORMED[(r * per_round + i) // 100 % len(MALFORMED)]
                    kinds.append(False)
                else:
                    value = json.dumps({"i": i, "pad": "x" * rng.randrange(300)}).encode()
                    kinds.append(True)
                values.append(value)
            bookmarks = publish(broker.bootstrap_servers, topic, values)
            for b, ok, value in zip(bookmarks, kinds, values, strict=True):
                (good if ok else bad).add(b)
                if value is None:
                    null_values.add(b)
            # the unparseable ones are dead-lettered on arrival; a null value is not JSON
            # either, but has no payload to parse: the consumer expires it
            serving(
                c, lambda: consumer.handled() >= good | null_values, 120, f"round {r} handled"
            )  # fmt: skip
            memory.append(rss(c))
        sent = good | bad
    letters = dead_letters(consume_all, dlq)
    assert_nothing_lost(c, consumer, q, good, bad, letters, bad - null_values)
    # the parse error travels with the dead letter
    undetailed = [b for b in bad - null_values if "unparseable" not in (letters[b]["detail"] or "")]
    assert not undetailed, f"dead letters without the parse error: {undetailed[:5]}"
    with QueueClient(c.address or "", timeout=10) as client:
        s = client.stats(q)[0]
    assert s.acked_total == len(good) and s.dead_lettered_total == len(bad)
    assert s.extra["unparseable_total"] == len(bad - null_values)
    growth = memory[-1] - memory[1]
    print(
        f"\nmalformed json: {len(sent):,} messages, {len(bad):,} malformed"
        f" ({len(MALFORMED)} kinds), all {len(good):,} good ones acked, {len(letters):,} dead"
        f" letters; coordinator RSS {memory[0] / MiB:.0f} MiB at start,"
        f" {memory[1] / MiB:.0f} after round 1, {memory[-1] / MiB:.0f} after round {rounds}"
    )
    assert growth < 48 * MiB, f"RSS grew {growth / MiB:.0f} MiB over rounds 2..{rounds}"


def test_deeply_nested_json_is_dead_lettered_and_does_not_stop_the_coordinator(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    """A JSON document nested deeper than the parser's recursion limit (this one is valid JSON,
    2 KB) is as unparseable as any other: it is dead-lettered on arrival, never delivered."""
    topic, dlq, q = names("nested"), names("nested.dlq"), names("q")
    c = coordinator_factory([queue_options(q, topic, dlq, lease_period="30s")])
    nested = b"[" * 1000 + b"]" * 1000
    values = [b'{"i": 0}', nested, b'{"i": 2}']
    with GoodConsumer(c, q) as consumer:
        bookmarks = publish(broker.bootstrap_servers, topic, values)
        good = {bookmarks[0], bookmarks[2]}
        serving(c, lambda: consumer.handled() >= good, 30, "both good messages handled")
    letters = dead_letters(consume_all, dlq)
    assert_nothing_lost(c, consumer, q, good, {bookmarks[1]}, letters, {bookmarks[1]})
    assert "nested too deep" in (letters[bookmarks[1]]["detail"] or "")


# --- sizes ------------------------------------------------------------------------------------


def test_messages_over_the_size_limits_are_refused_or_carried_whole(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    """Over the coordinator's producer limit, a publish through the API is refused; over the
    API's frame limit, any request is refused; a message over 1 MB that a producer with a
    higher limit wrote to the topic is delivered whole. The good consumer is served throughout."""
    topic, dlq, q = names("sizes"), names("sizes.dlq"), names("q")
    c = coordinator_factory([queue_options(q, topic, dlq, lease_period="30s")])
    before = rss(c)
    refused: Counter[str] = Counter()
    with GoodConsumer(c, q) as consumer, QueueClient(c.address or "", timeout=30) as client:
        first = publish(broker.bootstrap_servers, topic, [b'{"i": 0}'])
        for size in (PRODUCER_LIMIT + 1, 2 * PRODUCER_LIMIT, 16 * PRODUCER_LIMIT):
            with pytest.raises(QLayerError, match="(?i)too large"):
                client.publish(q, b'"' + b"x" * size + b'"')
            refused["publish over the producer limit"] += 1
        # a frame over the API limit, from a client that allows itself to send one
        options = [("grpc.max_send_message_length", 2 * API_LIMIT)]
        with grpc.insecure_channel(c.address or "", options=options) as channel:
            call = channel.unary_unary(SERVICE + "Publish")
            frame = PUBLISH_CODEC.encode(Publish(q, b"x" * (API_LIMIT + 1)))
            with pytest.raises(grpc.RpcError) as info:
                call(frame, timeout=60)
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, info.value
            refused["request over the API limit"] += 1
            del frame
        # big messages written straight to the topic are delivered whole, and acked
        pad = "y" * (3 * PRODUCER_LIMIT // 2)
        big = [json.dumps({"i": i, "pad": pad}).encode() for i in range(3)]
        bookmarks = first + publish(
            broker.bootstrap_servers, topic, big, **{"message.max.bytes": 8 * PRODUCER_LIMIT}
        )
        serving(c, lambda: consumer.handled() >= set(bookmarks), 60, "every message handled")
        stats = client.stats(q)[0]
        assert stats.extra["ingested_total"] == len(bookmarks), stats  # the refused never entered
    assert_nothing_lost(c, consumer, q, set(bookmarks), set(), dead_letters(consume_all, dlq))
    after = rss(c)
    print(
        f"\nsizes: refused {dict(refused)}; {len(big)} messages of"
        f" {len(big[0]) / 1e6:.1f} MB delivered and acked; coordinator RSS"
        f" {before / MiB:.0f} -> {after / MiB:.0f} MiB"
    )


def test_a_message_near_the_size_limit_can_be_dead_lettered(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    """A message that fits a default Kafka producer (message.max.bytes 1,000,000) is
    dead-lettered (it does not parse: on arrival): its dead letter (the payload wrapped in an
    envelope) is a little bigger than the message. The coordinator must keep running, and the
    message must leave the queue with a dead letter (its payload cut, if it must be)."""
    topic, dlq, q = names("near-limit"), names("near-limit.dlq"), names("q")
    c = coordinator_factory([queue_options(q, topic, dlq, lease_period="30s")])
    near = b"\x00" * (PRODUCER_LIMIT - 200)  # not JSON: dead-lettered on arrival
    with GoodConsumer(c, q) as consumer:
        bookmarks = publish(broker.bootstrap_servers, topic, [b'{"i": 0}', near, b'{"i": 2}'])
        good = {bookmarks[0], bookmarks[2]}
        serving(c, lambda: consumer.handled() >= good, 30, "both good ones handled")
        with QueueClient(c.address or "", timeout=10) as client:
            serving(c, lambda: client.stats(q)[0].leased == 0, 30, "the acks durable")
    letters = dead_letters(consume_all, dlq)
    assert_nothing_lost(c, consumer, q, good, {bookmarks[1]}, letters, {bookmarks[1]})


# --- API frames -------------------------------------------------------------------------------


HELD = "\x00held-"  # in a RawAck, topic HELD + k: the k-th message the stream was given
EXTREMES = [0.0, 0.5, 30.0, 1e306, 1.7e308, math.inf, -math.inf, math.nan, -1e-300]
HOWS = ["valid", "valid", "valid", "truncated", "flipped", "random"]


@dataclasses.dataclass(frozen=True)
class RawAck:
    """An Ack as any client may send it: any op number (unknown ones too) and any runs (end
    before start, negative, absurdly long, odd counts). An entry whose topic is HELD + k names
    the k-th message the stream holds when it is sent."""

    request_id: int
    op: int
    offsets: tuple[tuple[str, int, tuple[int, ...]], ...]
    seconds: float

    def encode(self, held: list[str]) -> bytes:
        entries = []
        for topic, partition, runs in self.offsets:
            if topic.startswith(HELD):
                k = int(topic[len(HELD) :])
                if held:
                    topic, p, o = held[k % len(held)].rsplit("/", 2)
                    partition, runs = int(p), (int(o), int(o))
                else:
                    topic, runs = topic[:1] + "t", (k, k)
            entries.append(pb.OffsetRuns(topic=topic, partition=partition, runs=runs))
        ack = pb.Ack(request_id=self.request_id, op=self.op, offsets=entries, seconds=self.seconds)
        return pb.ClientFrame(ack=ack).SerializeToString()


OPS = [pb.ACK_OP_ACK, pb.ACK_OP_CANCEL, pb.ACK_OP_EXPIRE, pb.ACK_OP_EXTEND]
BAD_OPS = [pb.ACK_OP_UNSPECIFIED, 5, 99, -1, 2**31 - 1]  # unspecified, or unknown to the server


@dataclasses.dataclass(frozen=True)
class Frame:
    """A frame to send: ``frame`` encoded, then kept (valid), cut short (truncated), with one
    byte changed (flipped) or replaced by random bytes; ``at`` is where, as a fraction."""

    frame: Any
    how: str
    at: float
    byte: int
    noise: bytes

    def render(self, codec: Any, held: list[str]) -> bytes:
        frame = self.frame
        data = frame.encode(held) if isinstance(frame, RawAck) else codec.encode(frame)
        cut = int(self.at * len(data))
        if self.how == "truncated":
            return data[:cut]
        if self.how == "flipped" and data:
            return data[:cut] + bytes([self.byte]) + data[cut + 1 :]
        if self.how == "random":
            return self.noise
        return data


@dataclasses.dataclass(frozen=True)
class Call:
    """One API call of the fuzz: a subscription stream of client frames, or a unary request."""

    method: str
    frames: tuple[Frame, ...]


def _frame(frames: st.SearchStrategy[Any], hows: list[str] = HOWS) -> st.SearchStrategy[Frame]:
    return st.builds(
        Frame, frames, st.sampled_from(hows), st.floats(0, 1, exclude_max=True),
        st.integers(0, 255), st.binary(max_size=300),
    )  # fmt: skip


def calls(fuzz_queue: str, fuzz_topic: str) -> st.SearchStrategy[list[Call]]:
    text = st.text(max_size=40)
    queue_names = st.sampled_from([fuzz_queue, "no-such-queue", ""]) | text
    int64 = st.integers(-(2**63), 2**63 - 1)
    # one partition's entry of an Ack: a held message, a run (end before start, negative,
    # past the end, absurdly long), any count of any numbers, any topic
    entry = st.one_of(
        st.integers(0, 50).map(lambda k: (f"{HELD}{k}", 0, ())),
        st.integers(0, 50).map(lambda k: (f"{HELD}{k}", 0, ())),
        st.builds(
            lambda p, first, n: (fuzz_topic, p, (first, first + n)),
            st.integers(-2, 3), st.integers(-1, 2**62), st.integers(-3, 5),
        ),
        st.builds(lambda first: (fuzz_topic, 0, (first, 2**63 - 1)), st.integers(-1, 60)),
        st.builds(lambda runs: (fuzz_topic, 0, tuple(runs)), st.lists(int64, max_size=5)),
        st.builds(
            lambda t, runs: (t, 0, tuple(runs)), text, st.lists(st.integers(0, 60), max_size=4)
        ),
    )  # fmt: skip
    # filters: random text, and token soup that gets further into the parser
    tokens = st.sampled_from(
        ["/a", "/b/c", "/items[0]", "=", "<>", "AND", "OR", "NOT", "(", ")", "LIKE", "'x'",
         "'['", "IN", ",", "BETWEEN", "IS", "NULL", "1", "1e308", "-", "*", "/", "%", "UPPER(",
         "ROUND(", "COALESCE(", "NOW()", "TRUE", '"q"', "LENGTH("]
    )  # fmt: skip
    filters = st.none() | text | st.lists(tokens, max_size=12).map(" ".join)
    int32 = st.integers(-(2**31), 2**31 - 1)
    seconds = st.floats() | st.sampled_from(EXTREMES)
    ops = st.sampled_from(OPS) | st.sampled_from(OPS) | st.sampled_from(BAD_OPS)
    ack = st.builds(RawAck, st.integers(0, 2**63 - 1), ops,
                    st.lists(entry, min_size=1, max_size=8).map(tuple), seconds)  # fmt: skip
    others = {
        "subscribe": st.builds(Subscribe, queue_names, int32, text, filters),
        "replace": st.builds(Replace, st.integers(0, 2**63 - 1), queue_names, int32, filters),
        "close": st.just(Close()),
    }
    client_frames = st.sampled_from(["ack", "ack", "ack", *others]).flatmap(
        lambda kind: ack if kind == "ack" else others[kind]
    )
    headers = st.lists(st.tuples(text, st.none() | st.binary(max_size=20)), max_size=3)
    unary = {
        "Publish": st.builds(Publish, queue_names, st.binary(max_size=200),
                             st.none() | st.binary(max_size=20), headers),
        "Stats": st.builds(Stats, st.none() | queue_names),
        "ListQueues": st.just(ListQueues()),
        "Browse": st.builds(Browse, queue_names, filters, st.none() | int32),
        "AckWhere": st.builds(AckWhere, queue_names, text | tokens, st.booleans()),
    }  # fmt: skip
    no_filter = st.one_of(st.none(), st.none(), st.none(), filters)
    backlogs = st.integers(1, 50)
    first = st.builds(Subscribe, st.just(fuzz_queue), backlogs, st.just("fuzz"), no_filter)
    stream = st.builds(
        lambda head, rest: Call("Subscribe", (head, *rest)),
        _frame(first, ["valid"] * 5 + HOWS[3:]),
        st.lists(_frame(client_frames), max_size=6),
    )
    one = st.sampled_from(["Subscribe"] * 5 + list(unary)).flatmap(
        lambda m: stream if m == "Subscribe" else _frame(unary[m]).map(lambda f: Call(m, (f,)))
    )
    return st.lists(one, min_size=1, max_size=4)


def seeded_calls(fuzz_queue: str) -> list[Call]:
    """Where the fuzz starts: every op on a held message with each extreme number of
    seconds, and extreme backlogs."""

    def valid(frame: Any) -> Frame:
        return Frame(frame, "valid", 0.0, 0, b"")

    out = []
    for op in OPS:
        frames = [RawAck(i, op, ((f"{HELD}{i}", 0, ()),), s) for i, s in enumerate(EXTREMES)]
        out.append(Call("Subscribe", tuple(map(valid, [Subscribe(fuzz_queue, 50), *frames]))))
    for backlog in (0, -1, 2**31 - 1):
        out.append(Call("Subscribe", (valid(Subscribe(fuzz_queue, backlog)),)))
    return out


UNARY_CODECS = {
    "Publish": PUBLISH_CODEC,
    "Stats": STATS_CODEC,
    "ListQueues": LIST_QUEUES_CODEC,
    "Browse": BROWSE_CODEC,
    "AckWhere": ACK_WHERE_CODEC,
}


def run_call(channel: grpc.Channel, call: Call) -> str:
    """Make the call; returns its status code name. On a stream, the frames after the first go
    once the first messages came (or 0.3 s passed), so acks can name messages it holds."""
    if call.method != "Subscribe":
        try:
            codec = UNARY_CODECS[call.method]
            channel.unary_unary(SERVICE + call.method)(call.frames[0].render(codec, []), timeout=10)
        except grpc.RpcError as exc:
            return exc.code().name
        return "OK"
    requests: queue.Queue[bytes | None] = queue.Queue()
    requests.put(call.frames[0].render(CLIENT_FRAME_CODEC, []))
    held: list[str] = []
    sent = threading.Lock()

    def send_rest() -> None:
        if sent.acquire(blocking=False):
            for f in call.frames[1:]:
                requests.put(f.render(CLIENT_FRAME_CODEC, held))
            requests.put(None)

    timer = threading.Timer(0.3, send_rest)
    timer.start()
    stream = channel.stream_stream(SERVICE + "Subscribe")(iter(requests.get, None), timeout=10)
    try:
        for data in stream:
            frame = SERVER_FRAME_CODEC.decode(data)  # whatever comes back must be well formed
            if isinstance(frame, Messages):
                held.extend(str(m.bookmark) for m in frame.messages)
                send_rest()
    except grpc.RpcError as exc:
        return exc.code().name
    finally:
        timer.cancel()
        send_rest()
    return "OK holding" if held else "OK"


def log_size(coordinator: CoordinatorProcess) -> int:
    return coordinator.log_path.stat().st_size


def survived(coordinator: CoordinatorProcess, log_from: int) -> bool:
    """Did the coordinator get through two more rounds without failing? (After a crash, it is
    left stopped.)"""

    def rounds() -> float | None:
        with QueueClient(coordinator.address or "", timeout=5) as client:
            return client.stats()[0].extra["rounds_total"]

    try:
        start = rounds()
        wait_until(lambda: (rounds() or 0) >= (start or 0) + 2, 10, interval=0.02)
    except (QLayerError, AssertionError):
        pass
    with open(coordinator.log_path, "rb") as log:
        log.seek(log_from)
        failed = b"coordinator failed" in log.read()
    if failed or not coordinator.running:
        wait_until(lambda: not coordinator.running, 20, message="the failed coordinator to exit")
        return False
    return True


def failure(coordinator: CoordinatorProcess, log_from: int) -> str:
    """The line that says why the coordinator failed (its log, from ``log_from``)."""
    with open(coordinator.log_path, "rb") as log:
        log.seek(log_from)
        lines = log.read().decode(errors="replace").splitlines()
    marker = "coordinator failed: "
    failed = [line.split(marker, 1)[1] for line in lines if marker in line]
    raised = [line for line in lines if re.match(r"[A-Za-z_.]+(Error|Exception): ", line)]
    return (failed or raised or ["(no error in the log)"])[-1]


def test_malformed_and_truncated_api_frames_do_not_disturb_the_others(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    """Hypothesis makes API calls out of random, truncated, corrupted and well-formed but
    extreme frames (huge counts, NaN and infinite seconds, odd filters) against a queue of
    their own, while the good consumer works on another. After every example the coordinator
    must still run; at the end every good message is acked and memory has not grown."""
    topic, dlq, q = names("frames"), names("frames.dlq"), names("q")
    fuzz_topic, fuzz_q = names("fuzz"), names("fuzz-q")
    c = coordinator_factory(
        [
            queue_options(q, topic, dlq, lease_period="30s"),
            {"name": fuzz_q, "underlying_topic": fuzz_topic, "lease_period": "2s"},
        ]
    )
    publish(broker.bootstrap_servers, fuzz_topic, [b'{"a": 1, "b": {"c": "x"}}'] * 50 + [b"{"])
    statuses: Counter[str] = Counter()
    mangled: Counter[str] = Counter()
    crashes: list[str] = []
    causes: Counter[str] = Counter()
    good: set[str] = set()
    examples = [0]
    memory = [rss(c)]
    with GoodConsumer(c, q) as consumer:

        @settings(
            max_examples=300 * SCALE,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(calls(fuzz_q, fuzz_topic))
        @example(seeded_calls(fuzz_q))
        def fuzz(batch: list[Call]) -> None:
            examples[0] += 1
            seen = log_size(c)
            answers: Counter[str] = Counter()
            with grpc.insecure_channel(c.address or "") as channel:
                for call in batch:
                    answers[f"{call.method} {run_call(channel, call)}"] += 1
                    mangled.update(f.how for f in call.frames)
            if survived(c, seen):
                statuses.update(answers)
            else:  # record it, start again, go on: find every crasher
                why = failure(c, seen)
                causes[why] += 1
                crashes.append(f"{why}\n  after {repr(batch)[:1500]}")
                c.start()
            if examples[0] % 25 == 0:
                publish(broker.bootstrap_servers, fuzz_topic, [b'{"a": 1}'] * 30)
                good.update(publish(broker.bootstrap_servers, topic, [b'{"ok": true}'] * 20))
                memory.append(rss(c))

        fuzz()
        good.update(publish(broker.bootstrap_servers, topic, [b'{"ok": true}'] * 20))
        serving(c, lambda: consumer.handled() >= good, 60, "every good message handled")
    memory.append(rss(c))
    frames = sum(mangled.values())
    print(
        f"\napi frames: {examples[0]} examples, {frames:,} frames ({dict(mangled)});"
        f" answers {dict(sorted(statuses.items()))}; coordinator RSS"
        f" {memory[0] / MiB:.0f} -> {max(memory) / MiB:.0f} (max) -> {memory[-1] / MiB:.0f} MiB;"
        f" {len(good)} good messages acked meanwhile"
    )
    # the others were served, and nothing of theirs was lost, even across the crashes
    assert_nothing_lost(c, consumer, q, good, set(), dead_letters(consume_all, dlq))
    assert memory[-1] - memory[1] < 64 * MiB
    unexpected = {k: n for k, n in statuses.items() if k.split()[1] in ("UNKNOWN", "INTERNAL")}
    assert not unexpected, f"calls that failed inside the server: {unexpected}"
    assert not crashes, (
        f"{len(crashes)} examples stopped the coordinator ({dict(causes)}):\n"
        + "\n\n".join(crashes[:3])
    )


def test_a_cancel_with_an_infinite_delay_does_not_stop_the_coordinator(
    broker: Any, coordinator_factory: Any, names: Any
) -> None:
    """The client library refuses a non-finite cancel delay, but the frame carries any double:
    a raw client's cancel of a leased message with delay inf (or >= ~1.8e305 s, which overflows
    the changelog's milliseconds) must be refused, or clamped, not fatal."""
    topic, q = names("inf"), names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "lease_period": "30s"}])
    publish(broker.bootstrap_servers, topic, [b'{"i": 0}', b'{"i": 1}'])
    for delay in (math.inf, 1e306):
        answer = cancel_on_a_raw_stream(c.address or "", q, delay)
        assert isinstance(answer, AckResult), (delay, answer)
        failed = [f for f in answer.failures if str(f.error) == "ack_failed"]
        assert not failed, f"cancel delay={delay}: {failed}; log tail:\n{c.log_tail(12)}"
        with QueueClient(c.address or "", timeout=10) as client:
            client.stats(q)  # still serving


def test_bad_ack_frames_are_refused_by_name_and_the_stream_goes_on(
    broker: Any, coordinator_factory: Any, names: Any
) -> None:
    """Protobuf-level garbage on an open subscription stream: truncated frames, a varint where
    a message goes, bad UTF-8, unknown and unspecified ops, runs that end before they start,
    absurdly long, negative or odd. Each is answered by an Error frame (malformed_frame) that
    names what was wrong, in order, and nothing is applied; the same stream then acks its
    message. A first frame naming an unknown queue ends its call with NOT_FOUND unknown_queue."""
    topic, q = names("bad-acks"), names("q")
    c = coordinator_factory([{"name": q, "underlying_topic": topic, "lease_period": "30s"}])
    publish(broker.bootstrap_servers, topic, [b'{"i": 0}'])

    def ack(op: int, *runs: tuple[int, ...], partition: int = 0, topic: str = topic) -> bytes:
        offsets = [pb.OffsetRuns(topic=topic, partition=partition, runs=r) for r in runs]
        return pb.ClientFrame(ack=pb.Ack(request_id=5, op=op, offsets=offsets)).SerializeToString()

    bad = [
        (b"\x12\x06\x08\x05\x10", "Wire format was corrupt"),  # an Ack cut short
        (b"\x10\x05", "without a body"),  # a varint where the Ack message goes
        (b"\x12\x05\x1a\x03\x0a\x01\xff", "bad UTF-8"),  # its topic is not UTF-8
        (ack(99, (0, 0)), "Ack op 99 is not one of"),
        (ack(pb.ACK_OP_UNSPECIFIED, (0, 0)), "Ack op 0 is not one of"),
        (ack(pb.ACK_OP_ACK, (5, 4)), "run 5..4 ends before it starts"),
        (ack(pb.ACK_OP_ACK, (0, 2**62)), "more than 100,000 offsets"),
        (ack(pb.ACK_OP_ACK, (0, 2**63 - 1), (0, 2**63 - 1)), "more than 100,000 offsets"),
        (ack(pb.ACK_OP_ACK, (-3, 1)), "negative offset -3"),
        (ack(pb.ACK_OP_ACK, (1, 2, 3)), "3 runs values"),
        (ack(pb.ACK_OP_ACK, (0, 0), partition=-1), "negative partition"),
        (ack(pb.ACK_OP_ACK, (0, 0), topic=""), "empty topic"),
    ]
    with grpc.insecure_channel(c.address or "") as channel:
        subscribe = channel.stream_stream(SERVICE + "Subscribe")
        with pytest.raises(grpc.RpcError) as info:
            list(subscribe(iter([CLIENT_FRAME_CODEC.encode(Subscribe("no-such-queue", 1))])))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND, info.value
        assert ("qlayer-error-code", "unknown_queue") in (info.value.trailing_metadata() or ())

        requests: queue.Queue[bytes | None] = queue.Queue()
        requests.put(CLIENT_FRAME_CODEC.encode(Subscribe(q, 1)))
        stream = subscribe(iter(requests.get, None), timeout=60)
        try:
            frames = (SERVER_FRAME_CODEC.decode(f) for f in stream)
            assert isinstance(next(frames), Subscribed)
            delivered = next(frames)
            assert isinstance(delivered, Messages) and len(delivered.messages) == 1
            for data, _ in bad:
                requests.put(data)
            answers = [next(frames) for _ in bad]
            for (data, reason), answer in zip(bad, answers, strict=True):
                assert isinstance(answer, Error), (data, answer)
                assert answer.code == "malformed_frame" and reason in answer.message, (
                    data,
                    answer,
                )
                assert answer.request_id is None
            # nothing was applied, and the stream still serves: its message is still leased
            # to it, and acking it now works
            assert stats_of(c, q).leased == 1
            held = delivered.messages[0].bookmark
            requests.put(CLIENT_FRAME_CODEC.encode(Ack.of(6, AckOp.ACK, [held])))
            answer = next(frames)
            assert isinstance(answer, AckResult) and (answer.request_id, answer.failures) == (6, [])
        finally:
            requests.put(None)
            stream.cancel()
    s = stats_of(c, q)
    assert (s.available, s.leased, s.acked_total) == (0, 0, 1), s


def cancel_on_a_raw_stream(address: str, q: str, delay: float) -> object:
    """Subscribe, take one message, cancel it with ``delay``: the answer (None if the stream
    ended first)."""
    with grpc.insecure_channel(address) as channel:
        requests: queue.Queue[bytes | None] = queue.Queue()
        requests.put(CLIENT_FRAME_CODEC.encode(Subscribe(q, 1)))
        subscribe = channel.stream_stream(SERVICE + "Subscribe")
        stream = subscribe(iter(requests.get, None), timeout=30)
        try:
            for frame in (SERVER_FRAME_CODEC.decode(f) for f in stream):
                if isinstance(frame, Messages):
                    cancel = Ack.of(1, AckOp.CANCEL, [frame.messages[0].bookmark], delay)
                    requests.put(CLIENT_FRAME_CODEC.encode(cancel))
                elif isinstance(frame, AckResult):
                    return frame
        except grpc.RpcError:
            return None
        finally:
            requests.put(None)
            stream.cancel()
    return None


# --- misbehaving clients ----------------------------------------------------------------------


def ack_in_one_frame(address: str, q: str, bookmarks: list[Bookmark]) -> Counter[str]:
    """Ack all ``bookmarks`` in one Ack frame on a raw stream; the refusals, by error."""
    options = [("grpc.max_receive_message_length", API_LIMIT)]
    with grpc.insecure_channel(address, options=options) as channel:
        requests: queue.Queue[bytes | None] = queue.Queue()
        requests.put(CLIENT_FRAME_CODEC.encode(Subscribe(q, 1)))
        requests.put(CLIENT_FRAME_CODEC.encode(Ack.of(7, AckOp.ACK, bookmarks, 0.0)))
        subscribe = channel.stream_stream(SERVICE + "Subscribe")
        stream = subscribe(iter(requests.get, None), timeout=120)
        try:
            for frame in (SERVER_FRAME_CODEC.decode(f) for f in stream):
                if isinstance(frame, AckResult) and frame.request_id == 7:
                    return Counter(str(f.error) for f in frame.failures)
        finally:
            requests.put(None)
            stream.cancel()
    raise AssertionError("no answer to the ack")


def parsed_or_none(text: str) -> Bookmark | None:
    try:
        return Bookmark.parse(text)
    except ValueError:
        return None


def never_reading_streams(address: str, q: str, n: int, backlog: int) -> Iterator[Any]:
    """Open ``n`` subscription streams that are never read (their requests never end)."""
    for _ in range(n):
        channel = grpc.insecure_channel(address)
        requests: queue.Queue[bytes | None] = queue.Queue()
        requests.put(CLIENT_FRAME_CODEC.encode(Subscribe(q, backlog, "never-reads")))
        call = channel.stream_stream(SERVICE + "Subscribe")(iter(requests.get, None))
        yield channel, requests, call


def test_clients_that_open_streams_and_never_read(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    """Ten clients subscribe with a backlog of 1,000 each and never read a frame. Such a stream
    takes what its client's HTTP/2 window holds (grpc grows it to ~4 MiB) and then its backlog's
    worth more, and stalls: it takes nothing new, and whatever it was leased comes back when the
    lease runs out (1 s). Then a good consumer must get every message, and the coordinator must
    not keep what it cannot send in memory.

    The streams are filled before the good consumer starts: how long that takes depends on the
    window (ten of them hold ~50,000 deliveries of these 1 KB messages, handed out one lease
    period at a time), not on how the coordinator serves a reader, which the rounds measure."""
    topic, dlq, q = names("unread"), names("unread.dlq"), names("q")
    c = coordinator_factory(
        [queue_options(q, topic, dlq, lease_period="1s", max_per_subscription_backlog=1000)]
    )
    streams = list(never_reading_streams(c.address or "", q, 10, 1000))
    rounds, per_round = 3, 3_000 * SCALE
    good: set[str] = set()
    memory = [rss(c)]
    took: list[float] = []  # seconds: filling the streams, then each round
    try:
        started = time.monotonic()
        # enough that every stream can take its whole backlog in each lease period
        good.update(publish(broker.bootstrap_servers, topic, padded(len(streams) * 1000)))
        stats = serving(
            c, lambda: stalled(c, q, len(streams)), 180, "every never-reading stream stalled",
            lambda: f"(stats {stats_of(c, q)})",
        )  # fmt: skip
        memory.append(rss(c))
        took.append(time.monotonic() - started)
        with GoodConsumer(c, q, backlog=200) as consumer:
            for r in range(rounds):
                started = time.monotonic()
                if r:
                    good.update(publish(broker.bootstrap_servers, topic, padded(per_round)))
                serving(
                    c, lambda: consumer.handled() >= good, 30, f"round {r}: all acked",
                    lambda: f"({len(good - consumer.handled())} of {len(good):,} never reached"
                    f" the good consumer; stats {stats_of(c, q)})",
                )  # fmt: skip
                memory.append(rss(c))
                took.append(time.monotonic() - started)
            # a stream that does not read stays stalled (so it took nothing meanwhile)
            still = stalled(c, q, len(streams))
        print(
            f"\nnever-reading streams: {len(streams)} streams x backlog 1000 stalled after"
            f" {stats.delivered_total:,} deliveries in {took[0]:.1f}s; {len(good):,} messages all"
            f" acked by the good consumer, rounds of {', '.join(f'{t:.1f}' for t in took[1:])}s;"
            f" coordinator RSS (MiB) at start, stalled, per round:"
            f" {[round(m / MiB) for m in memory]}"
        )
        assert still, stats_of(c, q)
        assert_nothing_lost(c, consumer, q, good, set(), dead_letters(consume_all, dlq))
        assert memory[-1] - memory[2] < 48 * MiB, [round(m / MiB) for m in memory]
    finally:
        for channel, requests, call in streams:
            call.cancel()
            requests.put(None)
            channel.close()


def padded(n: int) -> list[bytes | None]:
    """``n`` JSON messages of ~1 KB."""
    return [json.dumps({"i": i, "pad": "z" * 999}).encode() for i in range(n)]


def stats_of(coordinator: CoordinatorProcess, queue_name: str) -> Any:
    with QueueClient(coordinator.address or "", timeout=10) as client:
        return client.stats(queue_name)[0]


def stalled(coordinator: CoordinatorProcess, queue_name: str, n: int) -> Any:
    """The queue's stats once ``n`` of its subscriptions are stalled, else None."""
    s = stats_of(coordinator, queue_name)
    return s if s.extra["stalled_subscriptions"] == n else None


def test_a_client_that_acks_100k_unknown_bookmarks(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any
) -> None:
    """A client acks 100,000 bookmarks that name no message of the queue (other topics, other
    partitions, offsets past the end, malformed text), in batches and in one 100,000-bookmark
    frame: each is refused, nothing changes, the good consumer keeps acking every message."""
    topic, dlq, q = names("unknown"), names("unknown.dlq"), names("q")
    c = coordinator_factory([queue_options(q, topic, dlq, lease_period="30s")])
    n = 100_000 * SCALE
    rng = random.Random(7)
    forms = [
        lambda i: f"{topic}/0/{10**12 + i}",  # past the end of the partition
        lambda i: f"{topic}/{1 + i % 5}/{i}",  # a partition the topic does not have
        lambda i: f"other-topic-{i % 97}/0/{i}",
        lambda i: f"not a bookmark {i}",
        lambda i: f"{topic}/0/-{i + 1}",
        lambda i: "/" * (i % 7),
    ]
    bookmarks = [forms[i % len(forms)](i) for i in range(n)]
    rng.shuffle(bookmarks)
    good: set[str] = set()
    memory = [rss(c)]
    with GoodConsumer(c, q) as consumer, QueueClient(c.address or "", timeout=120) as client:
        good.update(publish(broker.bootstrap_servers, topic, [b'{"i": 0}'] * 1000))
        with client.subscribe(q, max_backlog=1) as sub:
            for chunk in range(0, n, 10_000):
                for b in bookmarks[chunk : chunk + 10_000]:
                    sub.ack(b)
                sub.flush(timeout=120)
                good.update(publish(broker.bootstrap_servers, topic, [b'{"i": 1}'] * 100))
            batched = Counter(str(f.error) for f in sub.ack_failures)
        memory.append(rss(c))
        # and (up to 100,000 of) them again in one frame, from a raw stream: the wire carries
        # offsets, so the malformed ones cannot be in it (the runs tests refuse those)
        parsed = [b for b in map(parsed_or_none, bookmarks[:100_000]) if b is not None]
        one_frame = ack_in_one_frame(c.address or "", q, parsed)
        memory.append(rss(c))
        serving(c, lambda: consumer.handled() >= good, 60, "every good message acked")
        memory.append(rss(c))
    assert sum(batched.values()) == n, batched
    assert set(batched) <= {"unknown_bookmark", "malformed_bookmark"}, batched
    assert sum(one_frame.values()) == len(set(parsed)) > 0.45 * min(n, 100_000), one_frame
    assert set(one_frame) == {"unknown_bookmark"}, one_frame
    assert_nothing_lost(c, consumer, q, good, set(), dead_letters(consume_all, dlq))
    print(
        f"\nunknown bookmarks: {n + sum(one_frame.values()):,} acks refused ({dict(batched)} in"
        f" batches, then {sum(one_frame.values()):,} in one frame); {len(good):,} good messages"
        f" acked meanwhile; coordinator RSS"
        f" (MiB) {[round(m / MiB) for m in memory]}"
    )
    assert memory[-1] - memory[0] < 64 * MiB


# --- volume -----------------------------------------------------------------------------------


def test_a_partition_of_many_small_batches_is_read(
    broker: Any, coordinator_factory: Any, names: Any, consume_all: Any, topic_factory: Any
) -> None:
    """A producer that sends one message at a time (linger 0) writes one record batch per
    message. 40,000 of them in one partition must still be read into the queue and delivered.
    (On the embedded broker a fetch that may wait only a few milliseconds finds nothing in a
    partition this long: whoever reads it must let the fetch wait longer.)"""
    topic, dlq, q = topic_factory(1, prefix="batches"), names("batches.dlq"), names("q")
    n = 40_000
    values: list[bytes | None] = [json.dumps({"i": i}).encode() for i in range(n)]
    bookmarks = publish(
        broker.bootstrap_servers, topic, values, **{"linger.ms": 0, "batch.num.messages": 1}
    )
    c = coordinator_factory([queue_options(q, topic, dlq, lease_period="30s")])
    with GoodConsumer(c, q, backlog=500) as consumer:
        serving(
            c, lambda: consumer.handled() >= set(bookmarks), 60, f"all {n:,} messages acked",
            lambda: f"({len(consumer.handled()):,} of {n:,} acked)",
        )  # fmt: skip
    assert_nothing_lost(c, consumer, q, set(bookmarks), set(), dead_letters(consume_all, dlq))
