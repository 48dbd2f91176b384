"""qlayer's configuration objects: frozen, typed, validated once by ``layer.config.loader``."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar, cast

from layer.engine.model import EngineSettings, Fairness, GroupMode, Leasing, Semantics
from layer.exceptions import ConfigError, UnknownQueue
from layer.viewgen import generation_of

MAX_TOPIC_LENGTH = 249  # Kafka's limit on a topic name
MAX_SHARDS = 1024  # partitions of a partitioned queue: one engine (and changelog) each
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_NAME_RULE = "1-200 characters of A-Z a-z 0-9 . _ -"
_SECRET_HINTS = ("password", "secret", "key", "token")
_MASK = "***"
ENV_BOOTSTRAP = "QLAYER_BOOTSTRAP_SERVERS"
ENV_PROFILE = "QLAYER_BROKER_PROFILE"
ENV_AUTH_TOKEN = "QLAYER_AUTH_TOKEN"
ENV_ADMIN_TOKEN = "QLAYER_ADMIN_TOKEN"
ENV_COORDINATOR_ID = "QLAYER_COORDINATOR_ID"
ENV_KAFKA_PREFIX = "QLAYER_KAFKA_"
# librdkafka keys that have a typed home here: two spellings of one setting would disagree.
_OWNED_KAFKA_KEYS = {
    "bootstrap.servers": "broker.bootstrap_servers",
    "session.timeout.ms": "broker.session_timeout_ms",
    "group.id": "coordinator.id",
    "transactional.id": "coordinator.id",
}
_OVERRIDE_FLAGS = {
    "bootstrap": "--bootstrap",
    "listen": "--listen",
    "state_dir": "--state-dir",
    "http": "--http",
}
_OVERRIDE_ALIASES = {"bootstrap_servers": "bootstrap"}

_T = TypeVar("_T")
_E = TypeVar("_E", bound=StrEnum)


class BrokerProfile(StrEnum):
    """Which broker's feature set to expect; ``auto`` finds out on connect."""

    AUTO = "auto"
    KAFKA = "kafka"
    TANSU = "tansu"


class MessageType(StrEnum):
    JSON = "json"
    AVRO = "avro"
    BYTES = "bytes"


class OnUnparseable(StrEnum):
    """What a typed queue (json, avro) does with a message whose payload does not parse."""

    DEAD_LETTER = "dead-letter"  # done at once, reason "unparseable", the error as its detail
    DELIVER = "deliver"  # queued like any other; the consumer sees its parse_error


class Distribution(StrEnum):
    """How a cluster assigns a queue to its members (``layer.shards``)."""

    QUEUE = "queue"  # the whole queue on one member: every semantic exact
    PARTITIONED = "partitioned"  # one shard per underlying partition, spread over the members


#: what joins a partitioned queue's name and a shard's number: ``orders#3``. Not a character of
#: queue names, so a shard's name never collides with a queue's.
SHARD_MARK = "#"


def shard_name(queue: str, shard: int) -> str:
    """The name of shard ``shard`` of the partitioned queue ``queue``."""
    return f"{queue}{SHARD_MARK}{shard}"


def shard_view_topic(view_topic: str, shard: int) -> str:
    """The view topic shard ``shard`` of a partitioned queue writes (the queue's
    ``view_topic`` + ``.shard-3``): each shard has its own generations (``layer.viewgen``), so
    the members serving the shards never write, snapshot or delete one another's, and a shard
    that moves takes its view with it. A reader of the queue merges the shards' topics."""
    return f"{view_topic}.shard-{shard}"


def parse_shard(name: str) -> tuple[str, int] | None:
    """``(queue, shard)`` of a shard's name, None for any other name."""
    queue, mark, number = name.rpartition(SHARD_MARK)
    if not mark or not queue or not number.isdigit():
        return None
    return queue, int(number)


def queue_of(name: str) -> str:
    """The queue a name belongs to: a shard's partitioned queue, or the name itself."""
    parsed = parse_shard(name)
    return name if parsed is None else parsed[0]


class StartFrom(StrEnum):
    """Where a queue starts reading a partition it has never seen."""

    EARLIEST = "earliest"
    LATEST = "latest"


def _masked(key: str, value: str) -> str:
    return _MASK if any(hint in key.lower() for hint in _SECRET_HINTS) else value


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    bootstrap_servers: str | None = None  # None = start the embedded broker
    profile: BrokerProfile = BrokerProfile.AUTO
    session_timeout_ms: int | None = None  # None = librdkafka's default
    # librdkafka settings passed through verbatim, e.g. {"security.protocol": "SASL_SSL"}.
    kafka: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kafka", MappingProxyType(dict(self.kafka)))

    def __repr__(self) -> str:
        kafka = {key: _masked(key, value) for key, value in self.kafka.items()}
        return (
            f"BrokerConfig(bootstrap_servers={self.bootstrap_servers!r}, "
            f"profile={str(self.profile)!r}, session_timeout_ms={self.session_timeout_ms!r}, "
            f"kafka={kafka!r})"
        )

    @property
    def embedded(self) -> bool:
        return self.bootstrap_servers is None

    def client_settings(
        self, bootstrap_servers: str | None = None, *, consumer: bool = False
    ) -> dict[str, str]:
        """librdkafka settings for a client: the pass-through ones plus the typed ones.

        ``bootstrap_servers`` is the embedded broker's address when the config has none.
        ``consumer`` adds consumer-only settings (librdkafka warns when a producer gets them).
        """
        servers = bootstrap_servers or self.bootstrap_servers
        if servers is None:
            raise ConfigError("no bootstrap servers: the embedded broker's address is needed")
        settings = dict(self.kafka)
        settings["bootstrap.servers"] = servers
        if consumer and self.session_timeout_ms is not None:
            settings["session.timeout.ms"] = str(self.session_timeout_ms)
        return settings


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    id: str = "qlayer"  # names the transactional id and the changelog topics
    listen: str = "127.0.0.1:7070"  # host:port of the API; port 0 = any free port
    state_dir: Path = Path(".qlayer/state")  # load() makes it absolute
    commit_interval: float = 0.005  # seconds: the group commit window
    changelog_topic_prefix: str = "qlayer.changelog."
    auth_token: str | None = None
    # Required by admin calls (Reload) when set; with auth_token set and no admin_token, admin
    # calls are refused through the API (SIGHUP still reloads).
    admin_token: str | None = None
    topic_refresh_interval: float = 5.0  # seconds between looks for new topics matching a regex
    tls_cert: Path | None = None  # PEM certificate (chain) of the API; with tls_key, serve TLS
    tls_key: Path | None = None  # PEM private key of the API
    # PEM CA certificate(s): clients must present a certificate signed by one (mutual TLS);
    # its subject names the principal in the tokens file
    tls_client_ca: Path | None = None
    # PEM CA certificate(s) that verify the other members' API certificates when this member
    # forwards a call to one or probes it (a cluster over TLS); None: tls_client_ca when set
    # (one CA for a cluster's members), else the system's roots (``peer_root_cert``)
    tls_peer_ca: Path | None = None
    # TOML file of principals (token hashes, certificate subjects) and their per-queue grants
    # (layer.api.tokens); read again on SIGHUP and `qlayer reload`
    tokens_file: Path | None = None
    # host:port of the HTTP listener (/healthz, /readyz, /metrics, the console); None = none
    http: str | None = None
    # the right a scraper of /metrics needs ("browse", "admin"); None = open (the default)
    metrics_right: str | None = None
    # a queue's partitions are snapshotted in its changelog after this many changelog records
    # (or as many as the last snapshot had runs, if more), 0 = not by count ...
    snapshot_every: int = 1000
    # ... and after this many seconds with any record since the last snapshot, 0 = not by time
    snapshot_interval: float = 30.0
    # the cluster this coordinator belongs to; None: a cluster of its own, named by ``id``.
    # Names the queue definitions topic (``definitions_topic``) its members share.
    cluster: str | None = None
    # a temporary queue is deleted with its state once no subscription has been open on it
    # for this long (its client went away and did not come back)
    temporary_queue_grace: float = 60.0
    # in a cluster: how many other members keep a warm copy of each queue's state (tailing its
    # changelog, ``layer.coordinator.standby``), so a takeover reads only the tail; 0 = none
    standby_replicas: int = 1

    def __repr__(self) -> str:
        token = None if self.auth_token is None else _MASK
        admin = None if self.admin_token is None else _MASK
        return (
            f"CoordinatorConfig(id={self.id!r}, listen={self.listen!r}, "
            f"state_dir={self.state_dir!r}, commit_interval={self.commit_interval!r}, "
            f"changelog_topic_prefix={self.changelog_topic_prefix!r}, auth_token={token!r}, "
            f"admin_token={admin!r}, "
            f"topic_refresh_interval={self.topic_refresh_interval!r}, "
            f"tls_cert={self.tls_cert!r}, tls_key={self.tls_key!r}, "
            f"tls_client_ca={self.tls_client_ca!r}, tls_peer_ca={self.tls_peer_ca!r}, "
            f"tokens_file={self.tokens_file!r}, "
            f"http={self.http!r}, "
            f"snapshot_every={self.snapshot_every!r}, "
            f"snapshot_interval={self.snapshot_interval!r}, cluster={self.cluster!r}, "
            f"standby_replicas={self.standby_replicas!r})"
        )

    @property
    def listen_host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]")

    @property
    def listen_port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    def changelog_topic(self, queue_name: str) -> str:
        # a cluster's members share each queue's changelog: whichever owns the queue writes it.
        # A shard's (``q#3``) is ``....q.shard-3``: "#" is not a character of topic names.
        parsed = parse_shard(queue_name)
        if parsed is not None:
            queue_name = f"{parsed[0]}.shard-{parsed[1]}"
        return f"{self.changelog_topic_prefix}{self.cluster or self.id}.{queue_name}"

    @property
    def definitions_topic(self) -> str:
        """The compacted topic of the cluster's queue definitions (``layer.definitions``)."""
        return f"qlayer.queues.{self.cluster or self.id}"


@dataclass(frozen=True, slots=True)
class QueueConfig:
    name: str
    underlying_topic: str  # a topic name, or a regex when it starts with "^" (Kafka's convention)
    message_type: MessageType = MessageType.JSON
    semantics: Semantics = Semantics.AT_LEAST_ONCE
    lease_period: float = 60.0
    max_per_subscription_backlog: int = 10_000
    # Left out, it is AMPS's default for the semantics (set in __post_init__, hence the cast).
    fairness: Fairness = cast(Fairness, None)
    # AMPS expressions (layer.expr), validated at load; the coordinator compiles them.
    priority: str | None = None  # e.g. "/price * /qty": highest first, NULL lowest
    # Qpid priority queue: this many levels (2-10) over JMS priorities 0-9 (absent: 4), from
    # ``priority`` (the loader's default: HEADER('JMSPriority')); layer.engine.priorities
    priorities: int | None = None
    barrier: str | None = None  # matching messages are barriers
    filter: str | None = None  # only matching messages of the underlying topics enter the queue
    group_key: str | None = None  # message groups: one consumer per group at a time
    group_mode: GroupMode = GroupMode.STICKY
    conflate_key: str | None = None  # last-value queue: a newer message replaces an older one
    exclusive: bool = False  # one active consumer; the others stand by
    # (initial, multiplier, max) seconds of delay before a timed-out message is redelivered
    redelivery_backoff: tuple[float, float, float] | None = None
    target_queue_depth: int = 0  # 0 = unlimited
    max_deliveries: int = 0  # 0 = unlimited
    max_cancels: int = 0  # 0 = unlimited
    expiration: float | None = None  # seconds in the queue; None = never
    dead_letter_topic: str | None = None
    default_publish_target: str | None = None
    # Spark views: publish every change of the live contents here (layer.coordinator.view)
    view_topic: str | None = None
    # at most this often a new generation of the view topic begins (layer.viewgen)
    view_snapshot_interval: float = 60.0
    leasing: Leasing = Leasing.STRICT
    start_from: StartFrom = StartFrom.EARLIEST
    avro_schema: Path | None = None  # only for message_type avro
    # -- the Qpid and Solace queue types (issue 15) --
    sort_key: str | None = None  # Qpid sorted queue: ascending by this string value, NULL last
    last_value: bool = False  # Solace last value queue: only the newest message is kept
    ttl: str | None = None  # seconds a message may stay (its own TTL); ``expiration`` caps it
    # Solace DMQ eligibility: a message that expires or reaches max_deliveries / max_cancels is
    # dead-lettered when this is true, discarded (counted, logged) otherwise
    dead_letter_if: str | None = None
    # issue 15: what a json/avro queue does with a payload that does not parse
    on_unparseable: OnUnparseable = OnUnparseable.DEAD_LETTER
    # issue 12: "partitioned" spreads the queue's shards (one per underlying partition, of
    # ``partitions``) over a cluster's members (``layer.shards``)
    distribution: Distribution = Distribution.QUEUE
    partitions: int | None = None  # the underlying topic's partition count (partitioned only)
    # a shard's own config only (never in a table): the underlying partition it reads
    shard: int | None = None

    def __post_init__(self) -> None:
        if self.fairness is None:
            at_most_once = self.semantics == Semantics.AT_MOST_ONCE
            default = Fairness.ROUND_ROBIN if at_most_once else Fairness.PROPORTIONAL
            object.__setattr__(self, "fairness", default)

    @property
    def partitioned(self) -> bool:
        return self.distribution == Distribution.PARTITIONED

    @property
    def topic_is_regex(self) -> bool:
        return self.underlying_topic.startswith("^")

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is one of this queue's underlying topics."""
        if self.topic_is_regex:
            return re.search(self.underlying_topic, topic) is not None
        return topic == self.underlying_topic

    @property
    def publish_target(self) -> str:
        """The topic a publish through this queue writes to.

        A queue over a regex has no single topic: without ``default_publish_target`` it can be
        consumed but not published to, and asking for its target raises ``ConfigError``.
        """
        if self.default_publish_target is not None:
            return self.default_publish_target
        if self.topic_is_regex:
            raise ConfigError(
                f"queue {self.name!r} cannot be published to: its underlying_topic "
                f"{self.underlying_topic!r} is a regex and it has no default_publish_target"
            )
        return self.underlying_topic

    def engine_settings(self) -> EngineSettings:
        return EngineSettings(
            semantics=self.semantics,
            lease_period=self.lease_period,
            max_per_subscription_backlog=self.max_per_subscription_backlog,
            fairness=self.fairness,
            leasing=self.leasing,
            max_deliveries=self.max_deliveries,
            max_cancels=self.max_cancels,
            expiration=self.expiration,
            target_queue_depth=self.target_queue_depth,
            priority=self.priority is not None,
            groups=self.group_mode if self.group_key is not None else None,
            exclusive=self.exclusive,
            conflate=self.conflate_key is not None or self.last_value,
            sort=self.sort_key is not None,
            message_ttl=self.ttl is not None,
            redelivery_backoff=self.redelivery_backoff,
            track_view=self.view_topic is not None,
        )

    @property
    def expressions(self) -> dict[str, str]:
        """The queue's expression options that are set: option name -> text."""
        named = {
            "priority": self.priority,
            "barrier": self.barrier,
            "filter": self.filter,
            "group_key": self.group_key,
            "conflate_key": self.conflate_key,
            "sort_key": self.sort_key,
            "ttl": self.ttl,
            "dead_letter_if": self.dead_letter_if,
        }
        return {option: text for option, text in named.items() if text is not None}


@dataclass(frozen=True, slots=True)
class Config:
    source: str  # the file's path, or "<string>"
    broker: BrokerConfig = field(default_factory=BrokerConfig)
    coordinator: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    queues: tuple[QueueConfig, ...] = ()
    # The CLI's flags it was loaded with, so a reload reads the file again the same way
    # (``layer.config.reread``); provenance, not content: left out of comparisons.
    overrides: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def queue(self, name: str) -> QueueConfig:
        for queue in self.queues:
            if queue.name == name:
                return queue
        known = ", ".join(repr(q.name) for q in self.queues) or "none"
        raise UnknownQueue(f"queue {name!r} is not configured in {self.source} (queues: {known})")

    def with_overrides(
        self,
        *,
        bootstrap: str | None = None,
        listen: str | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        http: str | None = None,
    ) -> Config:
        """This config with the CLI's flags applied (None leaves a setting as it is)."""
        # the loader's converters validate overrides exactly as they validate the file
        from layer.config.loader import _bootstrap, _listen, _path, _Section

        given = {"bootstrap": bootstrap, "listen": listen, "state_dir": state_dir, "http": http}
        overrides = {key: value for key, value in given.items() if value is not None}
        broker = _Section(self.source, "[broker]", {}, {"bootstrap_servers": "--bootstrap"})
        flags = {key: _OVERRIDE_FLAGS[key] for key in ("listen", "state_dir", "http")}
        coordinator = _Section(self.source, "[coordinator]", {}, flags)
        config = self
        if "bootstrap" in overrides:
            value = broker.convert("bootstrap_servers", overrides["bootstrap"], _bootstrap)
            config = replace(config, broker=replace(config.broker, bootstrap_servers=value))
        changes: dict[str, Any] = {}
        if "listen" in overrides:
            changes["listen"] = coordinator.convert("listen", overrides["listen"], _listen)
        if "http" in overrides:
            changes["http"] = coordinator.convert("http", overrides["http"], _listen)
        if "state_dir" in overrides:
            changes["state_dir"] = coordinator.convert(
                "state_dir", overrides["state_dir"], _path(Path.cwd())
            )
        recorded = dict(config.overrides)
        recorded.update((key, str(value)) for key, value in overrides.items())
        return replace(
            config,
            coordinator=replace(config.coordinator, **changes),
            overrides=tuple(sorted(recorded.items())),
        )


def view_topics(queue: QueueConfig) -> list[str]:
    """The view topics a queue as defined writes: its own, or each shard's for a partitioned
    queue (none without ``view_topic``)."""
    if queue.view_topic is None:
        return []
    if not queue.partitioned or queue.partitions is None:
        return [queue.view_topic]
    return [shard_view_topic(queue.view_topic, i) for i in range(queue.partitions)]


def shared_view_topic(queue: QueueConfig, others: Iterable[QueueConfig]) -> str | None:
    """Why ``queue`` cannot have its view topic in a cluster, or None: it (or one of its
    generations, ``layer.viewgen``) is one of another queue's. The generations of a view topic
    are kept by the coordinator that writes it, snapshotting the queues *it* serves and deleting
    the generations before the two last; two queues on two members would each drop the other
    from the views (a single coordinator keeps one series for every queue naming the topic, so
    sharing works there)."""
    mine = view_topics(queue)
    for other in others:
        if other.name == queue.name:
            continue
        for a in mine:
            for b in view_topics(other):
                if a == b:
                    clash = f"{a!r} is also the view topic of queue {other.name!r}"
                elif generation_of(b, a) is not None:
                    clash = (
                        f"{a!r} is a generation of {b!r}, the view topic of queue {other.name!r}"
                    )
                elif generation_of(a, b) is not None:
                    clash = (
                        f"{b!r}, the view topic of queue {other.name!r}, is a generation of {a!r}"
                    )
                else:
                    continue
                return (
                    f"{clash}: in a cluster each queue needs a view topic of its own (the"
                    " members serving the two would each roll its generations and delete the"
                    " other's)"
                )
    return None
