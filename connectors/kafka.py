"""librdkafka settings and per-broker differences, in one place.

Every Kafka client qlayer creates gets its configuration from the functions here, and everything
that differs between the embedded Tansu broker and Apache Kafka is a field of
:class:`BrokerProfile`.
Code elsewhere asks the profile ("can this broker compact?"), never the broker's name.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from layer.exceptions import BrokerError, ConfigError

logger = logging.getLogger(__name__)

ProfileHint = Literal["auto", "tansu", "kafka"]


@dataclass(frozen=True, slots=True)
class BrokerProfile:
    """What a broker kind needs from its clients and what it can do.

    ``session_timeout_ms``: Tansu holds a JoinGroup for ``session.timeout.ms / 2`` before it
    answers, so a short session keeps group joins quick there; Apache Kafka refuses sessions below
    ``group.min.session.timeout.ms`` (6000 by default).
    The capability flags are pinned by ``tests/integration/test_broker_gaps.py``.
    """

    name: Literal["tansu", "kafka"]
    session_timeout_ms: int
    #: ``cleanup.policy=compact`` is applied (Tansu accepts the setting and never compacts).
    compaction: bool
    #: ListOffsets(latest) returns the high watermark (Tansu: last batch's base offset + 1).
    list_offsets_reliable: bool
    #: ListOffsets by timestamp finds the first record at or after it (Tansu answers 0).
    offsets_for_times: bool
    #: DeleteRecords works (on Tansu it kills the connection's broker task).
    delete_records: bool
    #: CreatePartitions exists (Tansu does not advertise the API).
    create_partitions: bool
    #: read_committed consumers skip records of aborted transactions. Tansu's fetch responses
    #: list no aborted transactions, so librdkafka hands them over (it logs "received abort txn
    #: ctrl msg ... but there are no known aborted transactions: ignoring"). Open transactions
    #: are still held back there (the last stable offset works).
    read_committed_hides_aborted: bool
    #: How long a fetch may wait for data (``fetch.wait.max.ms``). Kafka answers as soon as data
    #: arrives, so librdkafka's 500 ms costs nothing there. Tansu often holds a fetch until the
    #: wait expires even when data is there (measured: ~250 ms median at 500 ms, ~50 ms at
    #: 100 ms), so the wait is the floor of every publish-to-delivery latency: keep it short.
    fetch_wait_max_ms: int = 500

    @property
    def heartbeat_interval_ms(self) -> int:
        # librdkafka requires heartbeat.interval.ms < session.timeout.ms; a third is Kafka's ratio.
        return max(100, self.session_timeout_ms // 3)


def cluster_group_settings(
    profile: BrokerProfile, session_timeout_ms: int | None
) -> dict[str, int]:
    """The session settings of a cluster's group: ``session_timeout_ms`` (the profile's when
    None), with four heartbeats a session, so a member is evicted only after missing several.
    A session bounds how fast a hung member's queues move (on Tansu: 1.5 x session + ~0.8 s
    from a kill to the survivors' new assignment, its JoinGroup held half a session); a member
    whose API refuses connections is removed from the group at once (``layer.coordinator.
    evict``)."""
    ms = session_timeout_ms or profile.session_timeout_ms
    return {"session.timeout.ms": ms, "heartbeat.interval.ms": max(100, ms // 4)}


TANSU = BrokerProfile(
    name="tansu",
    session_timeout_ms=2000,
    compaction=False,
    list_offsets_reliable=False,
    offsets_for_times=False,
    delete_records=False,
    create_partitions=False,
    read_committed_hides_aborted=False,
    fetch_wait_max_ms=10,
)

KAFKA = BrokerProfile(
    name="kafka",
    session_timeout_ms=6000,
    compaction=True,
    list_offsets_reliable=True,
    offsets_for_times=True,
    delete_records=True,
    create_partitions=True,
    read_committed_hides_aborted=True,
)

PROFILES: Mapping[str, BrokerProfile] = {TANSU.name: TANSU, KAFKA.name: KAFKA}

# Tansu's default cluster id (its --cluster-id flag). Apache Kafka's cluster id is always a
# base64url-encoded 16-byte UUID (22 characters), so it can never be this string.
_TANSU_DEFAULT_CLUSTER_ID = "tansu_cluster"


def detect_profile(
    bootstrap_servers: str,
    kafka_settings: Mapping[str, str] | None = None,
    hint: ProfileHint | str = "auto",
    *,
    timeout: float = 10.0,
) -> BrokerProfile:
    """The profile of the broker at ``bootstrap_servers``; ``hint`` "tansu"/"kafka" wins.

    With ``hint="auto"`` the broker is asked, using two signals Apache Kafka never gives:

    1. It does not advertise CreatePartitions (Kafka API key 37) in its ApiVersions response.
       Apache Kafka has advertised it since 1.0 (KIP-195), as do Redpanda and other Kafka-compatible
       brokers that behave like Kafka. librdkafka answers a CreatePartitions call locally with
       ``_UNSUPPORTED_FEATURE`` when the broker did not advertise the API, so the probe (with
       ``validate_only`` on a topic that does not exist) never changes anything on any broker.
    2. Its cluster id is Tansu's default ``tansu_cluster`` (not a base64 UUID as Kafka's always is).
       This keeps the detection right should a later Tansu implement CreatePartitions.

    Anything else is taken for Apache Kafka, the safe default: its profile only assumes what
    Kafka guarantees. An unreachable broker raises :class:`BrokerError`.
    """
    if hint != "auto":
        try:
            return PROFILES[hint]
        except KeyError:
            raise ConfigError(
                f"unknown broker kind {hint!r}: expected one of auto, {', '.join(sorted(PROFILES))}"
            ) from None
    admin = AdminClient(admin_settings(client_settings(bootstrap_servers, kafka_settings or {})))
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerError(
            f"cannot reach the broker at {bootstrap_servers} to detect its kind: {exc}"
        ) from exc
    if metadata.cluster_id == _TANSU_DEFAULT_CLUSTER_ID:
        logger.debug("broker profile=tansu signal=cluster_id bootstrap=%s", bootstrap_servers)
        return TANSU
    probe = NewPartitions(f"qlayer-profile-probe-{uuid.uuid4().hex}", 2)
    future = admin.create_partitions([probe], validate_only=True, request_timeout=timeout)[
        probe.topic
    ]
    try:
        future.result(timeout=timeout + 5)
    except KafkaException as exc:
        code = exc.args[0].code() if exc.args and isinstance(exc.args[0], KafkaError) else None
        if code == KafkaError._UNSUPPORTED_FEATURE:
            logger.debug(
                "broker profile=tansu signal=no-create-partitions bootstrap=%s", bootstrap_servers
            )
            return TANSU
        if code in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN):
            raise BrokerError(
                f"cannot reach the broker at {bootstrap_servers} to detect its kind: {exc}"
            ) from exc
        # UNKNOWN_TOPIC_OR_PART, an authorization error...: the broker knows the API.
    logger.debug("broker profile=kafka bootstrap=%s", bootstrap_servers)
    return KAFKA


# -- librdkafka settings ----------------------------------------------------------------------

# Keys a user may pass through to every client: security and connection settings. Values are
# passed verbatim. Client-role settings (acks, isolation.level, ...) are qlayer's to choose.
_PASS_THROUGH_KEYS = frozenset(
    {
        "security.protocol",
        "client.id",
        "client.dns.lookup",
        "client.rack",
        "broker.address.family",
        "enable.ssl.certificate.verification",
        "connections.max.idle.ms",
        "metadata.max.age.ms",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "debug",
    }
)
_PASS_THROUGH_PREFIXES = ("sasl.", "ssl.", "ssl_", "socket.", "https.")


def client_settings(bootstrap_servers: str, kafka_settings: Mapping[str, str]) -> dict[str, Any]:
    """The base librdkafka configuration shared by producers, consumers and admin clients.

    ``kafka_settings`` are librdkafka's own dotted keys (SASL, SSL, socket and client-id
    settings), passed through verbatim. Error messages name keys, never values (they hold secrets).
    """
    if not bootstrap_servers:
        raise ConfigError("bootstrap servers are empty")
    settings: dict[str, Any] = {"bootstrap.servers": bootstrap_servers}
    for key, value in kafka_settings.items():
        if key == "bootstrap.servers":
            raise ConfigError(
                "kafka setting 'bootstrap.servers' conflicts with the configured bootstrap servers"
            )
        if key not in _PASS_THROUGH_KEYS and not key.startswith(_PASS_THROUGH_PREFIXES):
            raise ConfigError(
                f"kafka setting {key!r} is not passed through: only security (sasl.*, ssl.*,"
                " security.protocol) and connection settings (client.id, socket.*, ...) are"
            )
        settings[key] = value
    return settings


#: librdkafka security settings and their kafka-python counterparts (``kafka_python_settings``)
_KAFKA_PYTHON_KEYS = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "client.id": "client_id",
}


def kafka_python_settings(base: Mapping[str, Any]) -> dict[str, Any] | None:
    """The keyword arguments of a kafka-python client equivalent to librdkafka ``base``
    settings, for the one call librdkafka does not offer (removing another member from a
    group: ``layer.coordinator.evict``); None when a setting has no counterpart there."""
    out: dict[str, Any] = {"bootstrap_servers": str(base["bootstrap.servers"]).split(",")}
    for key, value in base.items():
        if key in ("bootstrap.servers", "logger", "error_cb") or key.startswith("socket."):
            continue
        target = _KAFKA_PYTHON_KEYS.get(key)
        if target is None:
            return None
        out[target] = value.upper() if key in ("security.protocol",) else value
    return out


def producer_settings(
    base: Mapping[str, Any],
    *,
    transactional_id: str | None = None,
    linger_ms: int = 5,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """An idempotent, acks=all producer; transactional when ``transactional_id`` is given."""
    settings = dict(base)
    settings.update(
        {
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": linger_ms,
        }
    )
    if transactional_id is not None:
        settings["transactional.id"] = transactional_id
    settings.update(extra or {})
    return settings


def consumer_settings(
    base: Mapping[str, Any],
    profile: BrokerProfile,
    *,
    group_id: str | None = None,
    read_committed: bool = True,
    auto_offset_reset: Literal["earliest", "latest", "error"] = "earliest",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A consumer that never commits on its own, with the profile's session timeout.

    librdkafka needs a ``group.id`` even for consumers that only ``assign()``; without
    ``group_id`` a unique one is made up and never joined.
    """
    settings = dict(base)
    settings.update(
        {
            "group.id": group_id if group_id is not None else f"qlayer-assign-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": auto_offset_reset,
            "isolation.level": "read_committed" if read_committed else "read_uncommitted",
            "session.timeout.ms": profile.session_timeout_ms,
            "heartbeat.interval.ms": profile.heartbeat_interval_ms,
            "fetch.wait.max.ms": profile.fetch_wait_max_ms,
        }
    )
    settings.update(extra or {})
    return settings


def admin_settings(base: Mapping[str, Any]) -> dict[str, Any]:
    """An admin client's configuration.

    librdkafka lets producer-type clients (the admin client is one) ask the broker to create a
    topic they name in a metadata request, and Tansu then creates it with 4 partitions. Admin
    calls must never create topics as a side effect, so that is switched off.
    """
    settings = dict(base)
    settings["allow.auto.create.topics"] = False
    return settings


# -- librdkafka's own logs --------------------------------------------------------------------

#: Where librdkafka's log lines and error events go (see :func:`with_client_logging`).
LIBRDKAFKA_LOGGER = "connectors.kafka.librdkafka"
_NUMBERS = re.compile(r"\d+")


class RateLimit(logging.Filter):
    """Lets one record of a kind through per ``interval`` seconds, and says how many it held back.

    A broker that is away makes every client log each failed connect, a few a second per client
    (390 lines in a 13 s outage, measured): one line per kind a minute says the same. Records
    are of a kind when their level and text match with numbers (ports, durations, client
    numbers) left out.
    """

    def __init__(self, interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        # kind -> (when one was last let through, how many held back since)
        self._kinds: dict[tuple[int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kind = (record.levelno, _NUMBERS.sub("#", message))
        now = self._clock()
        with self._lock:
            last, held = self._kinds.get(kind, (None, 0))
            if last is not None and now - last < self._interval:
                self._kinds[kind] = (last, held + 1)
                return False
            if len(self._kinds) > 1000:  # bounded: kinds seen once an hour ago are forgotten
                self._kinds.clear()
            self._kinds[kind] = (now, 0)
        if held and last is not None:
            seconds = now - last
            record.msg = f"{message} ({held} similar lines in the last {seconds:.0f} s not shown)"
            record.args = ()
        return True


def _librdkafka_logger() -> logging.Logger:
    log = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, RateLimit) for f in log.filters):
        log.addFilter(RateLimit())
    return log


def _on_error(error: KafkaError) -> None:
    # Connection errors also come as log lines; the coordinator's Kafka watch (not these
    # events) decides whether Kafka is away. Fatal ones surface in the call that fails.
    _librdkafka_logger().warning("client error: %s", error, extra={"code": error.code()})


def with_client_logging(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with librdkafka's logs and error events routed through Python logging
    (logger ``connectors.kafka.librdkafka``), rate-limited by :class:`RateLimit`, instead of
    written to stderr line by line. Clients serve their logs when polled (consume, poll, flush)."""
    out = dict(settings)
    out["logger"] = _librdkafka_logger()
    out["error_cb"] = _on_error
    return out


# -- the fetch wait ------------------------------------------------------------------------


class FetchWait:
    """When to change the reader's ``fetch.wait.max.ms`` (pure: the reader acts on it).

    Grow it ``factor``-fold (up to ``cap_ms``) when fetches have come back empty for
    ``max(patience, 4 waits)`` while a partition lags; step back one level, at most every
    ``settle`` seconds, after a fetch that leaves every partition caught up. A step back that was
    too far simply grows again.
    """

    def __init__(
        self,
        base_ms: int,
        cap_ms: int = 5_000,
        factor: int = 5,
        patience: float = 0.2,
        settle: float = 30.0,
    ) -> None:
        self.base_ms = base_ms
        self.wait_ms = base_ms
        self._cap = max(cap_ms, base_ms)
        self._factor = factor
        self._patience = patience
        self._settle = settle
        self._empty_since: float | None = None
        self._changed_at = 0.0

    def empty(self, now: float, lagging: Callable[[], bool]) -> int | None:
        """A fetch brought nothing; the new wait if it must grow (``lagging`` asked only then)."""
        if self._empty_since is None:
            self._empty_since = now
            return None
        if self.wait_ms >= self._cap:
            return None
        if now - self._empty_since < max(self._patience, 4 * self.wait_ms / 1000):
            return None
        if not lagging():
            self._empty_since = now  # idle, not stuck: look again later
            return None
        return self._set(min(self._cap, self.wait_ms * self._factor), now)

    def fetched(self, now: float, caught_up: Callable[[], bool]) -> int | None:
        """A fetch brought messages; the new wait if it should step back."""
        self._empty_since = None
        if self.wait_ms <= self.base_ms or now - self._changed_at < self._settle:
            return None
        if not caught_up():
            return None
        return self._set(max(self.base_ms, self.wait_ms // self._factor), now)

    def reset(self) -> None:
        """Fetching stopped for a while (flow control): empty fetches count from the next one."""
        self._empty_since = None

    def _set(self, wait_ms: int, now: float) -> int:
        self.wait_ms = wait_ms
        self._changed_at = now
        self._empty_since = None
        return wait_ms


# -- high watermarks --------------------------------------------------------------------------


def cached_high_watermark(consumer: Consumer, topic: str, partition: int) -> int | None:
    """The high watermark from the last fetch response for an assigned partition, or ``None``.

    The fetch response carries the right high watermark on every broker; ListOffsets(latest)
    (``query_watermark_offsets``, admin ``list_offsets``) does not on Tansu, where it returns the
    last batch's base offset + 1.
    """
    _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
    return None if high is None or high < 0 else int(high)


IsolationLevel = Literal["read_uncommitted", "read_committed"]


class Watermarks(NamedTuple):
    """A partition's offsets: ``low``, the first one still on the broker, and ``high``, the one
    after the last record a consumer of the isolation level may read (the high watermark, or
    the last stable offset under read_committed)."""

    low: int
    high: int


def read_watermarks(
    settings: Mapping[str, Any],
    partitions: Iterable[tuple[str, int]],
    *,
    isolation_level: IsolationLevel = "read_uncommitted",
    timeout: float = 10.0,
) -> dict[tuple[str, int], Watermarks]:
    """Both watermarks of each ``(topic, partition)``, the high one taken from fetch responses.

    ``settings`` are base client settings (:func:`client_settings`, or any librdkafka consumer
    settings: the ones a watermark read needs are set here). A short-lived consumer asks
    ListOffsets for the low watermark and a lower bound of the high one (exact on Kafka), fetches
    from there at most one batch per partition, and reads the high watermark the fetch response
    carried. Under ``read_committed`` that is the last stable offset, which librdkafka reports
    only in its statistics.
    """
    if isolation_level not in ("read_uncommitted", "read_committed"):
        raise ConfigError(
            f"isolation level must be read_uncommitted or read_committed, got {isolation_level!r}"
        )
    wanted = list(dict.fromkeys(partitions))
    if not wanted:
        return {}
    committed = isolation_level == "read_committed"
    stats: dict[str, Any] = {}

    def on_stats(payload: str) -> None:
        stats.update(json.loads(payload))

    extra: dict[str, Any] = {"max.partition.fetch.bytes": 1, "enable.partition.eof": False}
    if committed:
        extra.update({"statistics.interval.ms": 20, "stats_cb": on_stats})
    deadline = time.monotonic() + timeout
    consumer = Consumer(
        consumer_settings(
            settings,
            TANSU,  # no group is joined; the session timeout does not matter
            read_committed=committed,
            extra=extra,
        )
    )
    try:
        lows: dict[tuple[str, int], int] = {}
        assignment = []
        for topic, partition in wanted:
            tp = TopicPartition(topic, partition)
            try:
                low, lower_bound = consumer.get_watermark_offsets(
                    tp, timeout=max(0.1, deadline - time.monotonic())
                )
            except KafkaException as exc:
                raise BrokerError(
                    f"cannot read the watermarks of {topic}/{partition}: {exc}"
                ) from exc
            lows[(topic, partition)] = max(0, int(low))
            assignment.append(TopicPartition(topic, partition, max(0, int(lower_bound))))
        consumer.assign(assignment)
        result: dict[tuple[str, int], Watermarks] = {}
        while True:
            for topic, partition in wanted:
                if (topic, partition) in result:
                    continue
                if committed:
                    high = _stable_offset(stats, topic, partition)
                else:
                    high = cached_high_watermark(consumer, topic, partition)
                if high is not None:
                    result[(topic, partition)] = Watermarks(lows[(topic, partition)], high)
            if len(result) == len(wanted):
                return result
            if time.monotonic() > deadline:
                missing = ", ".join(f"{t}/{p}" for t, p in wanted if (t, p) not in result)
                raise BrokerError(f"no fetch response within {timeout:.1f}s for {missing}")
            for message in consumer.consume(num_messages=len(wanted), timeout=0.02):
                error = message.error()
                if error is not None and not error.retriable():
                    raise BrokerError(
                        f"cannot fetch from {message.topic()}/{message.partition()}: {error}"
                    )
    finally:
        consumer.close()


def _stable_offset(stats: Mapping[str, Any], topic: str, partition: int) -> int | None:
    """The last stable offset the latest fetch response of a partition carried, from
    librdkafka's statistics (-1 there until a fetch answered)."""
    entry = stats.get("topics", {}).get(topic, {}).get("partitions", {}).get(str(partition), {})
    stable = entry.get("ls_offset", -1)
    return int(stable) if stable >= 0 else None
