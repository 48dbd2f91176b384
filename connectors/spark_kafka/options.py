"""The options of the ``qlayer_kafka`` source, validated once; Spark's JSON offsets."""

from __future__ import annotations

import json
import logging
import math
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from layer.exceptions import ConfigError

logger = logging.getLogger(__name__)

FORMAT = "qlayer_kafka"

#: Spark's markers inside JSON offsets.
EARLIEST = -2
LATEST = -1

TP = tuple[str, int]
Offsets = dict[TP, int]

# Range readers stop at a known offset and never wait for new data, so the only fetch that waits
# is the last one; some brokers (Tansu) hold every fetch for the whole wait, so keep it short.
_FETCH_WAIT_MAX_MS = 10

# fmt: off
# Options of Spark's kafka source that tune its JVM consumer and change no result.
_IGNORED_OPTIONS = frozenset({
    "minpartitions", "maxrecordsperpartition", "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
})
_UNSUPPORTED_OPTIONS = frozenset({
    "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsetsbytimestampstrategy",
    "endingtimestamp", "endingoffsetsbytimestamp", "minoffsetspertrigger", "maxtriggerdelay",
})
_KNOWN_OPTIONS = (
    "kafka.bootstrap.servers", "subscribe", "subscribePattern", "assign", "startingOffsets",
    "endingOffsets", "maxOffsetsPerTrigger", "includeHeaders", "failOnDataLoss",
    "kafkaConsumer.pollTimeoutMs", "groupIdPrefix",
)
# fmt: on
# librdkafka keys the source sets itself (as Spark's source refuses the Java equivalents).
_RESERVED_KAFKA_KEYS = {
    "auto.offset.reset": "use startingOffsets to say where to start",
    "enable.auto.commit": "the source never commits offsets to Kafka",
    "enable.auto.offset.store": "the source never commits offsets to Kafka",
    "enable.partition.eof": "the source relies on end-of-partition events",
    "key.deserializer": "keys are always read as bytes",
    "value.deserializer": "values are always read as bytes",
}


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: ``subscribe``, ``subscribePattern`` or ``assign``."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str = ""
    partitions: tuple[TP, ...] = ()

    def resolve(self, topics: Mapping[str, Sequence[int]]) -> list[TP]:
        """The partitions to read, given the broker's topic -> partition ids (sorted)."""
        if self.kind == "assign":
            missing = [tp for tp in self.partitions if tp[1] not in topics.get(tp[0], ())]
            if missing:
                raise ConfigError(
                    f"assign names partitions that do not exist: {partition_names(missing)}"
                )
            return sorted(self.partitions)
        if self.kind == "subscribe":
            absent = [topic for topic in self.topics if topic not in topics]
            if absent:
                logger.info("subscribed topics do not exist (yet) topics=%s", absent)
            chosen = [topic for topic in self.topics if topic in topics]
        else:
            regex = re.compile(self.pattern)
            # Internal topics (__consumer_offsets, __transaction_state) are never matched, as with
            # the Java consumer's exclude.internal.topics.
            chosen = [t for t in topics if not t.startswith("__") and regex.fullmatch(t)]
        return sorted((topic, p) for topic in set(chosen) for p in topics[topic])


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``startingOffsets``/``endingOffsets``: earliest, latest or a JSON map (-2/-1 inside)."""

    kind: Literal["earliest", "latest", "specific"]
    offsets: Mapping[TP, int] = field(default_factory=dict)

    def resolve(
        self,
        option: str,
        partitions: Sequence[TP],
        earliest: Mapping[TP, int],
        latest: Mapping[TP, int],
    ) -> Offsets:
        """Concrete offsets for ``partitions``; a JSON map must name exactly those."""
        if self.kind == "earliest":
            return {tp: earliest[tp] for tp in partitions}
        if self.kind == "latest":
            return {tp: latest[tp] for tp in partitions}
        if set(self.offsets) != set(partitions):
            missing = partition_names(set(partitions) - set(self.offsets)) or "none"
            extra = partition_names(set(self.offsets) - set(partitions)) or "none"
            raise ConfigError(
                f"{option} must give an offset for every partition read (-2 for earliest, -1 for"
                f" latest): missing {missing}, not read {extra}"
            )
        markers = {EARLIEST: earliest, LATEST: latest}
        return {
            tp: markers[offset][tp] if offset in markers else offset
            for tp, offset in ((tp, self.offsets[tp]) for tp in partitions)
        }

    def uses(self, marker: int) -> list[TP]:
        return [tp for tp, offset in self.offsets.items() if offset == marker]


@dataclass(frozen=True, slots=True)
class KafkaSourceOptions:
    """The options of one ``qlayer_kafka`` read, validated once (:meth:`parse`)."""

    bootstrap_servers: str
    #: librdkafka settings from the ``kafka.*`` options, prefix stripped (bootstrap excluded).
    kafka_settings: Mapping[str, str]
    subscription: Subscription
    starting_offsets: OffsetSpec | None = None
    ending_offsets: OffsetSpec | None = None
    max_offsets_per_trigger: int | None = None
    include_headers: bool = False
    fail_on_data_loss: bool = True
    poll_timeout_ms: int = 120_000
    group_id_prefix: str = "qlayer-kafka-source"

    @classmethod
    def parse(cls, options: Mapping[str, str], source: str = FORMAT) -> KafkaSourceOptions:
        """Validate Spark's option map; ConfigError names the option and the bad value.

        ``source`` is the format name errors mention (a source built on this one passes its own).
        """
        given = {key.lower(): str(value) for key, value in options.items()}
        known = {name.lower(): name for name in _KNOWN_OPTIONS}
        for key in given:
            if key in _UNSUPPORTED_OPTIONS:
                raise ConfigError(f"option {key!r} is not supported by {source}")
            if key not in known and key not in _IGNORED_OPTIONS and not key.startswith("kafka."):
                raise ConfigError(
                    f"unknown option {key!r} for {source}: expected kafka.* settings or one of"
                    f" {', '.join(_KNOWN_OPTIONS[1:])}"
                )
        bootstrap = given.get("kafka.bootstrap.servers", "").strip()
        if not bootstrap:
            raise ConfigError(f"option 'kafka.bootstrap.servers' is required by {source}")
        settings: dict[str, str] = {}
        for key, value in given.items():
            if not key.startswith("kafka.") or key == "kafka.bootstrap.servers":
                continue
            name = key[len("kafka.") :]
            if name in _RESERVED_KAFKA_KEYS:
                raise ConfigError(
                    f"option 'kafka.{name}' is not supported: {_RESERVED_KAFKA_KEYS[name]}"
                )
            settings[name] = value
        isolation = settings.get("isolation.level", "read_uncommitted")
        if isolation not in ("read_committed", "read_uncommitted"):
            raise ConfigError(
                f"option 'kafka.isolation.level' must be read_committed or read_uncommitted,"
                f" got {isolation!r}"
            )
        max_offsets = given.get("maxoffsetspertrigger")
        return cls(
            bootstrap_servers=bootstrap,
            kafka_settings=settings,
            subscription=_parse_subscription(given),
            starting_offsets=_parse_offset_spec("startingOffsets", given.get("startingoffsets")),
            ending_offsets=_parse_offset_spec("endingOffsets", given.get("endingoffsets")),
            max_offsets_per_trigger=(
                None if max_offsets is None else _positive_int("maxOffsetsPerTrigger", max_offsets)
            ),
            include_headers=boolean_option("includeHeaders", given.get("includeheaders", "false")),
            fail_on_data_loss=boolean_option("failOnDataLoss", given.get("failondataloss", "true")),
            poll_timeout_ms=_positive_int(
                "kafkaConsumer.pollTimeoutMs", given.get("kafkaconsumer.polltimeoutms", "120000")
            ),
            group_id_prefix=given.get("groupidprefix", "qlayer-kafka-source"),
        )

    @property
    def read_committed(self) -> bool:
        return self.kafka_settings.get("isolation.level") == "read_committed"

    def client_settings(self) -> dict[str, Any]:
        """The bootstrap address and the ``kafka.*`` settings, for driver-side clients."""
        return {**self.kafka_settings, "bootstrap.servers": self.bootstrap_servers}

    def consumer_config(self, **overrides: Any) -> dict[str, Any]:
        """A consumer that never joins a group, never commits, and sees partition ends."""
        config: dict[str, Any] = {
            "group.id": f"{self.group_id_prefix}-{uuid.uuid4().hex}",
            "isolation.level": "read_uncommitted",  # Spark's default
            "fetch.wait.max.ms": _FETCH_WAIT_MAX_MS,
        }
        config.update(self.kafka_settings)
        config.update(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "error" if self.fail_on_data_loss else "earliest",
            }
        )
        config.update(overrides)
        return config


def _parse_subscription(given: Mapping[str, str]) -> Subscription:
    chosen = [name for name in ("subscribe", "subscribepattern", "assign") if name in given]
    if len(chosen) != 1:
        raise ConfigError(
            "exactly one of the options 'subscribe', 'subscribePattern' or 'assign' is needed,"
            f" got {len(chosen)}" + (f" ({', '.join(chosen)})" if chosen else "")
        )
    value = given[chosen[0]]
    if chosen[0] == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise ConfigError(f"option 'subscribe' names no topic: {value!r}")
        return Subscription("subscribe", topics=topics)
    if chosen[0] == "subscribepattern":
        if not value.strip():
            raise ConfigError("option 'subscribePattern' is empty")
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(
                f"option 'subscribePattern' is not a valid regex {value!r}: {exc}"
            ) from exc
        return Subscription("subscribePattern", pattern=value)
    example = '{"topicA":[0,1],"topicB":[0]}'
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not all(
        isinstance(ps, list)
        and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in ps)
        for ps in parsed.values()
    ):
        raise ConfigError(f"option 'assign' must be JSON like {example}, got {value!r}")
    partitions = tuple(sorted({(str(t), p) for t, ps in parsed.items() for p in ps}))
    if not partitions:
        raise ConfigError(f"option 'assign' names no partition: {value!r}")
    return Subscription("assign", partitions=partitions)


def _parse_offset_spec(option: str, value: str | None) -> OffsetSpec | None:
    if value is None:
        return None
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec("earliest" if text.lower() == "earliest" else "latest")
    example = '{"topicA":{"0":23,"1":-2}}'
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    offsets: dict[TP, int] = {}
    if isinstance(parsed, dict):
        for topic, by_partition in parsed.items():
            if not isinstance(by_partition, dict):
                parsed = None
                break
            for partition, offset in by_partition.items():
                if (
                    not str(partition).isdigit()
                    or isinstance(offset, bool)
                    or not isinstance(offset, int)
                    or offset < EARLIEST
                ):
                    raise ConfigError(
                        f"option {option!r}: bad offset {offset!r} for partition {partition!r}"
                        f" of topic {topic!r} (offsets are >= 0, -2 for earliest, -1 for latest)"
                        f" in {value!r}"
                    )
                offsets[(str(topic), int(partition))] = offset
    if not isinstance(parsed, dict) or not offsets:
        raise ConfigError(
            f"option {option!r} must be 'earliest', 'latest' or JSON like {example}, got {value!r}"
        )
    return OffsetSpec("specific", offsets)


def _positive_int(option: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        number = 0
    if number <= 0:
        raise ConfigError(f"option {option!r} must be a positive integer, got {value!r}")
    return number


def boolean_option(option: str, value: str) -> bool:
    if value.strip().lower() not in ("true", "false"):
        raise ConfigError(f"option {option!r} must be true or false, got {value!r}")
    return value.strip().lower() == "true"


def partition_names(partitions: Iterator[TP] | Sequence[TP] | set[TP]) -> str:
    return ", ".join(f"{t}/{p}" for t, p in sorted(partitions))


# -- offsets as Spark stores them ------------------------------------------------------------


def offsets_to_json(offsets: Mapping[TP, int]) -> dict[str, dict[str, int]]:
    """``{(t, p): o}`` -> Spark's ``{"t": {"p": o}}``, in a fixed order (Spark compares text)."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def offsets_from_json(offsets: Mapping[str, Any]) -> Offsets:
    """Spark's ``{"t": {"p": o}}`` -> ``{(t, p): o}``."""
    return {
        (topic, int(partition)): int(offset)
        for topic, by_partition in offsets.items()
        for partition, offset in by_partition.items()
    }


def rate_limit(limit: int, start: Mapping[TP, int], until: Mapping[TP, int]) -> Offsets:
    """Cap the offsets read between ``start`` and ``until`` at about ``limit``, as Spark does.

    Each partition with a lag gets ``limit * lag / total lag`` offsets (rounded down, or up to 1
    when below 1, so small partitions are never starved: the sum may pass ``limit`` by at most the
    number of partitions). Partitions missing from ``start`` must be given from their earliest.
    """
    sizes = {tp: end - start[tp] for tp, end in until.items() if end - start[tp] > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(until)
    limited = dict(until)
    for tp, size in sizes.items():
        share = limit * size / total
        taken = math.ceil(share) if share < 1 else math.floor(share)
        limited[tp] = min(until[tp], start[tp] + taken)
    return limited
