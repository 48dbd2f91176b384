"""Loading qlayer's TOML configuration into the objects of ``layer.config.model``.

Precedence, lowest first: defaults, the file, the environment, then the CLI's overrides. Every
error is a ``ConfigError`` naming the file, the section or queue, the option and, for values
that did not come from the file, the variable or flag they came from.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, cast

from layer.config.model import (
    _E,
    _NAME_RE,
    _NAME_RULE,
    _OVERRIDE_ALIASES,
    _OVERRIDE_FLAGS,
    _OWNED_KAFKA_KEYS,
    _T,
    _TOPIC_RE,
    ENV_ADMIN_TOKEN,
    ENV_AUTH_TOKEN,
    ENV_BOOTSTRAP,
    ENV_COORDINATOR_ID,
    ENV_KAFKA_PREFIX,
    ENV_PROFILE,
    MAX_SHARDS,
    MAX_TOPIC_LENGTH,
    BrokerConfig,
    BrokerProfile,
    Config,
    CoordinatorConfig,
    Distribution,
    MessageType,
    OnUnparseable,
    QueueConfig,
    StartFrom,
    shard_view_topic,
    shared_view_topic,
)
from layer.documents import load_avro_schema
from layer.durations import format_value, parse_duration
from layer.engine.model import Fairness, GroupMode, Leasing, Semantics
from layer.engine.priorities import JMS_PRIORITY_HEADER, MAX_LEVELS, MIN_LEVELS
from layer.exceptions import ConfigError, ExpressionError, SerializationError
from layer.expr import compile_expression

# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load(
    path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Read and validate a config file. ``env`` defaults to ``os.environ``; ``overrides`` are the
    CLI's flags, which win over file and environment: ``bootstrap`` (or ``bootstrap_servers``),
    ``listen``, ``state_dir`` (relative to the current directory), ``http``; None values are
    ignored."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such config file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text ({exc.reason})") from exc
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the config file: {exc.strerror}") from exc
    return _build(text, source, path.resolve().parent, env, overrides)


def loads(
    text: str,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> Config:
    """Like ``load`` for text; relative paths in it are taken from the current directory."""
    return _build(text, source, Path.cwd(), env, overrides)


def _build(
    text: str,
    source: str,
    base_dir: Path,
    env: Mapping[str, str] | None,
    overrides: Mapping[str, object] | None,
) -> Config:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _toml_error(source, text, exc) from None
    env = os.environ if env is None else env
    overrides = {
        _OVERRIDE_ALIASES.get(key, key): value
        for key, value in (overrides or {}).items()
        if value is not None
    }
    for key in overrides:
        if key not in _OVERRIDE_FLAGS:
            raise ConfigError(f"unknown override {key!r} (known: {', '.join(_OVERRIDE_FLAGS)})")

    top = _Section(source, "", data, {})
    for key, value in data.items():
        if key not in ("broker", "coordinator", "queue"):
            kind = "table" if isinstance(value, dict | list) else "option"
            raise top.error(None, f"unknown {kind} {key!r}{_suggest(key, _TOP_LEVEL)}")
    broker = _broker(top.table("broker", "[broker]"), env, overrides)
    coordinator = _coordinator(top.table("coordinator", "[coordinator]"), base_dir, overrides, env)

    queues_raw = data.get("queue", [])
    if not isinstance(queues_raw, list) or not all(isinstance(q, dict) for q in queues_raw):
        raise top.error(None, "'queue' must be an array of tables: write [[queue]] for each queue")
    queues: list[QueueConfig] = []
    first_index: dict[str, int] = {}
    for index, raw in enumerate(queues_raw, start=1):
        queue = _queue(raw, index, source, base_dir, coordinator)
        if queue.name in first_index:
            label = f"queue {queue.name!r} (#{index})"
            raise ConfigError(
                f"{source}: {label}: duplicate queue name: queue #{first_index[queue.name]} "
                f"is also named {queue.name!r}"
            )
        first_index[queue.name] = index
        if coordinator.cluster is not None:
            shared = shared_view_topic(queue, queues)
            if shared is not None:
                raise ConfigError(f"{source}: queue {queue.name!r}: option 'view_topic': {shared}")
        queues.append(queue)
    return Config(
        source=source,
        broker=broker,
        coordinator=coordinator,
        queues=tuple(queues),
        overrides=tuple(sorted((key, str(value)) for key, value in overrides.items())),
    )


def reread(config: Config, env: Mapping[str, str] | None = None) -> Config:
    """Read the file ``config`` was loaded from again, with the same CLI overrides (a reload);
    ``ConfigError`` as ``load``, or when ``config`` did not come from a file."""
    if config.source == "<string>":
        raise ConfigError("the configuration was not loaded from a file: nothing to read again")
    return load(config.source, env, dict(config.overrides))


_TOP_LEVEL = ("broker", "coordinator", "queue")


def _toml_error(source: str, document: str, exc: tomllib.TOMLDecodeError) -> ConfigError:
    # The one place that reads tomllib's message: Python < 3.14 has the position only in it.
    text = str(exc)
    line, column = getattr(exc, "lineno", None), getattr(exc, "colno", None)
    if (match := re.search(r"\s*\(at line (\d+), column (\d+)\)$", text)) is not None:
        line, column, text = int(match[1]), int(match[2]), text[: match.start()]
    elif (match := re.search(r"\s*\(at end of document\)$", text)) is not None:
        lines = document.split("\n")
        line, column, text = len(lines), len(lines[-1]) + 1, text[: match.start()]
    where = f"line {line}, column {column}: " if line is not None else ""
    return ConfigError(f"{source}: {where}invalid TOML: {text}")


class _Section:
    """One table of the file being validated: its values, where overridden ones came from, and
    the errors that name file, section and option."""

    def __init__(
        self, source: str, label: str, values: dict[str, Any], origins: dict[str, str]
    ) -> None:
        self.source, self.label, self.values, self.origins = source, label, values, origins

    def error(self, option: str | None, problem: str) -> ConfigError:
        parts = [self.source] + ([self.label] if self.label else [])
        if option is not None:
            origin = self.origins.get(option)
            parts.append(f"option {option!r}" + (f" (from {origin})" if origin else ""))
        # "option 'x' is required" reads as a sentence; other problems follow a colon.
        separator = " " if problem.startswith("is ") else ": "
        return ConfigError(": ".join(parts) + separator + problem)

    def table(self, key: str, label: str) -> _Section:
        value = self.values.get(key, {})
        if not isinstance(value, dict):
            raise self.error(None, f"{key!r} must be a table: write {label}")
        return _Section(self.source, label, dict(value), {})

    def check_keys(self, known: tuple[str, ...], pending: tuple[str, ...] = ()) -> None:
        for key in self.values:
            if key in pending:
                raise self.error(key, "is not supported yet")
            if key not in known:
                raise self.error(None, f"unknown option {key!r}{_suggest(key, known + pending)}")

    def convert(self, option: str, value: object, convert: Callable[[object], _T]) -> _T:
        try:
            return convert(value)
        except ValueError as exc:
            raise self.error(option, str(exc)) from None

    def get(self, option: str, default: _T, convert: Callable[[object], _T]) -> _T:
        if option not in self.values:
            return default
        return self.convert(option, self.values[option], convert)


def _suggest(key: str, known: tuple[str, ...]) -> str:
    # AMPS users write LeasePeriod: map CamelCase before guessing at typos.
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).lower().replace("-", "_")
    guesses = [snake] if snake in known else difflib.get_close_matches(key, known, n=1)
    return f" (did you mean {guesses[0]!r}?)" if guesses else ""


# Converters: value as read -> typed value, or ValueError saying what was expected.


def _metrics_right(value: object) -> str | None:
    if value in ("none", "browse", "admin"):
        return None if value == "none" else str(value)
    raise ValueError(f'expected "none", "browse" or "admin", got {format_value(value)}')


def _string(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {format_value(value)}")
    if not value.strip():
        raise ValueError("expected a non-empty string")
    return value


def _name(value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ValueError(f"expected {_NAME_RULE}, got {format_value(value)}")
    return value


def _topic(value: object) -> str:
    if not isinstance(value, str) or not _TOPIC_RE.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"expected a Kafka topic name (1-249 characters of A-Z a-z 0-9 . _ -), "
            f"got {format_value(value)}"
        )
    return value


def _topic_or_regex(value: object) -> str:
    if isinstance(value, str) and value.startswith("^"):
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"invalid regular expression {format_value(value)}: {exc}") from None
        return value
    return _topic(value)


def _choice(enum: type[_E]) -> Callable[[object], _E]:
    def convert(value: object) -> _E:
        for member in enum:
            if value == member.value:
                return member
        choices = ", ".join(format_value(member.value) for member in enum)
        raise ValueError(f"expected one of {choices}, got {format_value(value)}")

    return convert


def _integer(minimum: int, maximum: int | None = None) -> Callable[[object], int]:
    def convert(value: object) -> int:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and value >= minimum
            and (maximum is None or value <= maximum)
        ):
            return value
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise ValueError(f"expected an integer {bound}, got {format_value(value)}")

    return convert


def _duration(*, allow_zero: bool) -> Callable[[object], float]:
    def convert(value: object) -> float:
        seconds = parse_duration(value)
        if seconds < 0 or (seconds == 0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise ValueError(f"expected a duration {bound}, got {format_value(value)}")
        return seconds

    return convert


def _path(base_dir: Path) -> Callable[[object], Path]:
    def convert(value: object) -> Path:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        path = Path(_string(value)).expanduser()
        return path if path.is_absolute() else base_dir / path

    return convert


def _bootstrap(value: object) -> str:
    servers = [server.strip() for server in _string(value).split(",")]
    if not all(servers):
        raise ValueError(f"expected host:port[,host:port...], got {format_value(value)}")
    return ",".join(servers)


def _listen(value: object) -> str:
    host, colon, port = _string(value).rpartition(":")
    if not colon or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"expected host:port (port 0-65535), got {format_value(value)}")
    return cast(str, value)


def _prefix(value: object) -> str:
    if not isinstance(value, str) or (value and not _TOPIC_RE.fullmatch(value)):
        raise ValueError(f"expected characters of A-Z a-z 0-9 . _ -, got {format_value(value)}")
    return value


def _expression(value: object) -> str:
    text = _string(value)
    try:
        compile_expression(text)
    except ExpressionError as exc:
        raise ValueError(str(exc)) from None
    return text


def _boolean(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {format_value(value)}")
    return value


def _backoff(value: object) -> tuple[float, float, float]:
    """``{ initial = "1s", multiplier = 2, max = "1m" }``: the delay after the n-th lease timeout
    is ``min(max, initial * multiplier ** (n - 1))``."""
    if not isinstance(value, dict):
        raise ValueError(
            'expected a table like { initial = "1s", multiplier = 2, max = "1m" }, '
            f"got {format_value(value)}"
        )
    unknown = set(value) - {"initial", "multiplier", "max"}
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(unknown)}: expected initial, multiplier, max")
    initial = parse_duration(value.get("initial", 1.0))
    multiplier = value.get("multiplier", 2.0)
    if isinstance(multiplier, bool) or not isinstance(multiplier, int | float) or multiplier < 1:
        raise ValueError(f"multiplier must be a number >= 1, got {format_value(multiplier)}")
    cap = parse_duration(value.get("max", 60.0))
    if initial < 0 or cap < initial:
        raise ValueError(f"needs 0 <= initial <= max, got initial={initial}s max={cap}s")
    return (initial, float(multiplier), cap)


def _kafka_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"expected a string, number or boolean, got {format_value(value)}")


def _flatten(section: _Section, values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML reads ``sasl.username = "x"`` as nested tables; librdkafka wants the dotted key."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        nested = _flatten(section, value, f"{prefix}{key}.") if isinstance(value, dict) else {}
        for full_key, item in nested.items() or [(f"{prefix}{key}", value)]:
            if full_key in flat:
                raise section.error(full_key, "is set twice (once as a quoted key)")
            flat[full_key] = item
    return flat


# Sections.

_BROKER_KEYS = ("bootstrap_servers", "profile", "session_timeout_ms", "kafka")
_COORDINATOR_KEYS = (
    "id",
    "listen",
    "state_dir",
    "commit_interval",
    "changelog_topic_prefix",
    "auth_token",
    "admin_token",
    "topic_refresh_interval",
    "tls_cert",
    "tls_key",
    "tls_client_ca",
    "tls_peer_ca",
    "tokens_file",
    "http",
    "metrics_right",
    "snapshot_every",
    "snapshot_interval",
    "cluster",
    "temporary_queue_grace",
    "standby_replicas",
)


def _broker(
    section: _Section, env: Mapping[str, str], overrides: Mapping[str, object]
) -> BrokerConfig:
    section.check_keys(_BROKER_KEYS)
    kafka_section = section.table("kafka", "[broker.kafka]")
    kafka_section.values = _flatten(kafka_section, kafka_section.values)
    for name, value in env.items():
        if name.startswith(ENV_KAFKA_PREFIX) and name != ENV_KAFKA_PREFIX and value != "":
            key = name[len(ENV_KAFKA_PREFIX) :].lower().replace("_", ".")
            kafka_section.values[key] = value
            kafka_section.origins[key] = name
    for option, variable in (("bootstrap_servers", ENV_BOOTSTRAP), ("profile", ENV_PROFILE)):
        if env.get(variable, "") != "":
            section.values[option], section.origins[option] = env[variable], variable
    if "bootstrap" in overrides:
        section.values["bootstrap_servers"] = overrides["bootstrap"]
        section.origins["bootstrap_servers"] = _OVERRIDE_FLAGS["bootstrap"]

    kafka: dict[str, str] = {}
    for key, value in kafka_section.values.items():
        if key in _OWNED_KAFKA_KEYS:
            raise kafka_section.error(key, f"set it as {_OWNED_KAFKA_KEYS[key]} instead")
        kafka[key] = kafka_section.convert(key, value, _kafka_value)

    bootstrap = section.get("bootstrap_servers", None, _bootstrap)
    profile = section.get("profile", BrokerProfile.AUTO, _choice(BrokerProfile))
    if bootstrap is None and profile == BrokerProfile.KAFKA:
        raise section.error(
            "profile", f"the embedded broker is Tansu: set bootstrap_servers (or {ENV_BOOTSTRAP})"
        )
    return BrokerConfig(
        bootstrap_servers=bootstrap,
        profile=profile,
        session_timeout_ms=section.get("session_timeout_ms", None, _integer(1)),
        kafka=kafka,
    )


def _coordinator(
    section: _Section, base_dir: Path, overrides: Mapping[str, object], env: Mapping[str, str]
) -> CoordinatorConfig:
    section.check_keys(_COORDINATOR_KEYS)
    # tokens: kept out of the file; id: one file for the several coordinators of a cluster
    for option, variable in (
        ("auth_token", ENV_AUTH_TOKEN),
        ("admin_token", ENV_ADMIN_TOKEN),
        ("id", ENV_COORDINATOR_ID),
    ):
        if env.get(variable, "") != "":
            section.values[option], section.origins[option] = env[variable], variable
    default = CoordinatorConfig()
    state_dir_base = base_dir
    for option in ("listen", "state_dir", "http"):
        if option in overrides:
            section.values[option] = overrides[option]
            section.origins[option] = _OVERRIDE_FLAGS[option]
    if "state_dir" in overrides:
        state_dir_base = Path.cwd()  # a flag's relative path means the shell's directory
    config = CoordinatorConfig(
        id=section.get("id", default.id, _name),
        listen=section.get("listen", default.listen, _listen),
        state_dir=section.get("state_dir", base_dir / default.state_dir, _path(state_dir_base)),
        commit_interval=section.get(
            "commit_interval", default.commit_interval, _duration(allow_zero=True)
        ),
        changelog_topic_prefix=section.get(
            "changelog_topic_prefix", default.changelog_topic_prefix, _prefix
        ),
        auth_token=section.get("auth_token", None, _string),
        admin_token=section.get("admin_token", None, _string),
        topic_refresh_interval=section.get(
            "topic_refresh_interval", default.topic_refresh_interval, _duration(allow_zero=False)
        ),
        tls_cert=section.get("tls_cert", None, _path(base_dir)),
        tls_key=section.get("tls_key", None, _path(base_dir)),
        tls_client_ca=section.get("tls_client_ca", None, _path(base_dir)),
        tls_peer_ca=section.get("tls_peer_ca", None, _path(base_dir)),
        tokens_file=section.get("tokens_file", None, _path(base_dir)),
        http=section.get("http", None, _listen),
        metrics_right=section.get("metrics_right", None, _metrics_right),
        snapshot_every=section.get("snapshot_every", default.snapshot_every, _integer(0)),
        snapshot_interval=section.get(
            "snapshot_interval", default.snapshot_interval, _duration(allow_zero=True)
        ),
        cluster=section.get("cluster", None, _name),
        temporary_queue_grace=section.get(
            "temporary_queue_grace", default.temporary_queue_grace, _duration(allow_zero=False)
        ),
        # at most 12 members share a cluster's queues (its control partitions): 11 others
        standby_replicas=section.get("standby_replicas", default.standby_replicas, _integer(0, 11)),
    )
    if config.admin_token is not None and config.admin_token == config.auth_token:
        raise section.error(
            "admin_token", "must differ from auth_token (every client would be an admin)"
        )
    for option, other in (("tls_cert", "tls_key"), ("tls_key", "tls_cert")):
        path = getattr(config, option)
        if (path is None) != (getattr(config, other) is None):
            raise section.error(option if path is not None else other, f"needs {other} too")
        if path is not None and not path.is_file():
            raise section.error(option, f"no such file: {path}")
    if config.tls_client_ca is not None:
        if config.tls_cert is None:
            raise section.error("tls_client_ca", "needs tls_cert and tls_key (mutual TLS is TLS)")
        if not config.tls_client_ca.is_file():
            raise section.error("tls_client_ca", f"no such file: {config.tls_client_ca}")
    if config.tls_peer_ca is not None:
        if config.tls_cert is None:
            raise section.error(
                "tls_peer_ca", "needs tls_cert and tls_key (the members' API is TLS)"
            )
        if not config.tls_peer_ca.is_file():
            raise section.error("tls_peer_ca", f"no such file: {config.tls_peer_ca}")
    if config.tokens_file is not None:
        from layer.api.tokens import read_tokens_file

        if not config.tokens_file.is_file():
            raise section.error("tokens_file", f"no such file: {config.tokens_file}")
        read_tokens_file(config.tokens_file)  # fail at load, naming the file and what is wrong
    return config


_QUEUE_KEYS = (
    "name",
    "underlying_topic",
    "message_type",
    "semantics",
    "lease_period",
    "max_per_subscription_backlog",
    "fairness",
    "priority",
    "target_queue_depth",
    "max_deliveries",
    "max_cancels",
    "expiration",
    "dead_letter_topic",
    "default_publish_target",
    "leasing",
    "start_from",
    "avro_schema",
    "barrier",
    "filter",
    "group_key",
    "group_mode",
    "conflate_key",
    "exclusive",
    "redelivery_backoff",
    "view_topic",
    "view_snapshot_interval",
    # Qpid's queue types in one line (layer.engine.priorities; the LVQ's key header)
    "priorities",
    "lvq",
    # the Qpid and Solace queue types
    "sort_key",
    "last_value",
    "ttl",
    "dead_letter_if",
    "on_unparseable",
    # issue 12: a queue spread over a cluster's members by underlying partition
    "distribution",
    "partitions",
)
_QUEUE_PENDING: tuple[str, ...] = ()  # AMPS options whose implementation comes later


def _queue(
    raw: dict[str, Any], index: int, source: str, base_dir: Path, coordinator: CoordinatorConfig
) -> QueueConfig:
    name = raw.get("name")
    named = isinstance(name, str) and _NAME_RE.fullmatch(name) is not None
    section = _Section(source, f"queue {name!r}" if named else f"queue #{index}", raw, {})
    if "name" not in raw:
        raise section.error("name", "is required")
    name = section.get("name", "", _name)
    section.check_keys(_QUEUE_KEYS, _QUEUE_PENDING)
    if "underlying_topic" not in raw:
        raise section.error("underlying_topic", "is required")

    semantics = section.get("semantics", Semantics.AT_LEAST_ONCE, _choice(Semantics))
    at_most_once = semantics == Semantics.AT_MOST_ONCE
    fairness = section.get(
        "fairness",
        Fairness.ROUND_ROBIN if at_most_once else Fairness.PROPORTIONAL,
        _choice(Fairness),
    )
    if at_most_once and fairness != Fairness.ROUND_ROBIN:
        raise section.error(
            "fairness",
            f'at-most-once queues allow only "round-robin" (as AMPS does), '
            f"got {format_value(fairness.value)}",
        )
    queue = QueueConfig(
        name=name,
        underlying_topic=section.get("underlying_topic", "", _topic_or_regex),
        message_type=section.get("message_type", MessageType.JSON, _choice(MessageType)),
        semantics=semantics,
        lease_period=section.get("lease_period", 60.0, _duration(allow_zero=False)),
        max_per_subscription_backlog=section.get(
            "max_per_subscription_backlog", 10_000, _integer(1)
        ),
        fairness=fairness,
        priority=section.get("priority", None, _expression),
        priorities=section.get("priorities", None, _integer(MIN_LEVELS, MAX_LEVELS)),
        barrier=section.get("barrier", None, _expression),
        filter=section.get("filter", None, _expression),
        group_key=section.get("group_key", None, _expression),
        group_mode=section.get("group_mode", GroupMode.STICKY, _choice(GroupMode)),
        conflate_key=_conflate_key(section),
        exclusive=section.get("exclusive", False, _boolean),
        redelivery_backoff=section.get("redelivery_backoff", None, _backoff),
        target_queue_depth=section.get("target_queue_depth", 0, _integer(0)),
        max_deliveries=section.get("max_deliveries", 0, _integer(0)),
        max_cancels=section.get("max_cancels", 0, _integer(0)),
        expiration=section.get("expiration", None, _duration(allow_zero=False)),
        dead_letter_topic=section.get("dead_letter_topic", None, _topic),
        default_publish_target=section.get("default_publish_target", None, _topic),
        view_topic=section.get("view_topic", None, _topic),
        view_snapshot_interval=section.get(
            "view_snapshot_interval", 60.0, _duration(allow_zero=False)
        ),
        leasing=section.get("leasing", Leasing.STRICT, _choice(Leasing)),
        start_from=section.get("start_from", StartFrom.EARLIEST, _choice(StartFrom)),
        avro_schema=section.get("avro_schema", None, _path(base_dir)),
        sort_key=section.get("sort_key", None, _expression),
        last_value=section.get("last_value", False, _boolean),
        ttl=section.get("ttl", None, _expression),
        dead_letter_if=section.get("dead_letter_if", None, _expression),
        on_unparseable=section.get(
            "on_unparseable", OnUnparseable.DEAD_LETTER, _choice(OnUnparseable)
        ),
        distribution=section.get("distribution", Distribution.QUEUE, _choice(Distribution)),
        partitions=section.get("partitions", None, _integer(1, MAX_SHARDS)),
    )
    if queue.priorities is not None and queue.priority is None:
        # Qpid: the JMS priority header, JMS's default 4 when absent (layer.engine.priorities)
        queue = replace(queue, priority=_JMS_PRIORITY)
    _check_queue(queue, section, coordinator)
    return queue


_JMS_PRIORITY = f"HEADER('{JMS_PRIORITY_HEADER}')"
_QPID_LVQ_KEY = "HEADER('qpid.LVQ_key')"  # the Qpid broker's default LVQ key property
_LVQ_KINDS = {"qpid": _QPID_LVQ_KEY}


def _conflate_key(section: _Section) -> str | None:
    """``conflate_key``, or the key of the ``lvq`` kind (``lvq = "qpid"``: the qpid.LVQ_key
    header, as a Qpid LVQ conflates by default); not both."""
    conflate_key = section.get("conflate_key", None, _expression)
    lvq = section.get("lvq", None, _lvq)
    if lvq is None:
        return conflate_key
    if conflate_key is not None:
        raise section.error(
            "lvq", f"sets conflate_key to {_LVQ_KINDS[lvq]}: give lvq or conflate_key, not both"
        )
    return _LVQ_KINDS[lvq]


def _lvq(value: object) -> str:
    if value not in _LVQ_KINDS:
        choices = ", ".join(format_value(kind) for kind in _LVQ_KINDS)
        raise ValueError(f"expected one of {choices}, got {format_value(value)}")
    return cast(str, value)


def _check_queue_type(queue: QueueConfig, section: _Section) -> None:
    """One delivery order, one kind of last-value queue (as Qpid refuses mixed queue types)."""
    if queue.sort_key is not None:
        for option in ("priority", "conflate_key"):
            if getattr(queue, option) is not None:
                raise section.error(
                    "sort_key", f"cannot be combined with {option!r} (as Qpid refuses)"
                )
        if queue.last_value:
            raise section.error("sort_key", "cannot be combined with 'last_value'")
        if queue.target_queue_depth:
            raise section.error(
                "target_queue_depth",
                "cannot be combined with 'sort_key': messages not read yet could not be sorted "
                "(as with 'priority')",
            )
    if queue.last_value and queue.conflate_key is not None:
        raise section.error(
            "last_value",
            "cannot be combined with 'conflate_key': last_value keeps the newest message "
            "whatever its key, conflate_key the newest of each key",
        )


# What cannot hold per underlying partition, and why (a partitioned queue refuses it).
_NOT_PER_PARTITION = {
    "group_key": (
        "a message group would be held by one consumer per partition, not one in all: key the"
        " topic by the group instead (Kafka's partitioner keeps a key on one partition)"
    ),
    "conflate_key": "each partition would keep its own newest message of a key",
    "last_value": "each partition would keep its own newest message",
    "default_publish_target": "a publish goes to the underlying topic, partitioned by its key",
}


# the longest suffix of a view topic's generation (layer.viewgen: ".g" and up to 10 digits)
_GENERATION_ROOM = ".g" + "9" * 10


def _check_partitioned(queue: QueueConfig, section: _Section) -> None:
    """``distribution`` and ``partitions`` (layer.shards): a partitioned queue is one shard
    per partition of one named topic; options that cannot hold per partition are refused."""
    if not queue.partitioned:
        if queue.partitions is not None:
            raise section.error("partitions", 'needs distribution = "partitioned"')
        return
    if queue.partitions is None:
        raise section.error(
            "distribution",
            '"partitioned" needs partitions = the underlying topic\'s partition count',
        )
    if queue.topic_is_regex:
        raise section.error(
            "distribution",
            f'"partitioned" needs underlying_topic to name one topic, got the regex'
            f" {queue.underlying_topic!r}",
        )
    for option, reason in _NOT_PER_PARTITION.items():
        if getattr(queue, option) not in (None, False):
            raise section.error(
                option, f'cannot be combined with distribution "partitioned": {reason}'
            )
    if queue.view_topic is not None:
        # each shard writes a view topic of its own, with generations after it (layer.viewgen)
        longest = shard_view_topic(queue.view_topic, queue.partitions - 1) + _GENERATION_ROOM
        if len(longest) > MAX_TOPIC_LENGTH:
            raise section.error(
                "view_topic",
                f"its shards' view topics ({longest!r} at the longest, with a generation) would"
                f" be longer than Kafka's {MAX_TOPIC_LENGTH} characters: shorten it",
            )


def _check_queue(queue: QueueConfig, section: _Section, coordinator: CoordinatorConfig) -> None:
    """The rules that relate options to each other."""
    for option in ("priority", "barrier"):
        if queue.target_queue_depth and getattr(queue, option) is not None:
            given = "priorities" if option == "priority" and queue.priorities else option
            raise section.error(
                "target_queue_depth", f"cannot be combined with {given!r} (as AMPS does)"
            )
    for option, text in queue.expressions.items():
        if queue.message_type == MessageType.BYTES:
            # the Kafka record's fields (KEY(), HEADER(...)) are there whatever the payload
            if compile_expression(text).uses_document:
                raise section.error(
                    option,
                    'needs message_type "json" or "avro" to read field paths: a "bytes" queue'
                    " has no fields (KEY(), HEADER('name'), TIMESTAMP(), TOPIC() and"
                    " PARTITION() read the Kafka record)",
                )
            continue
        if queue.message_type == MessageType.AVRO and queue.avro_schema is None:
            raise section.error(option, 'needs avro_schema to read the fields of "avro" messages')
    _check_queue_type(queue, section)
    _check_partitioned(queue, section)
    if "on_unparseable" in section.values and queue.message_type == MessageType.BYTES:
        raise section.error(
            "on_unparseable", 'needs message_type "json" or "avro": "bytes" payloads never parse'
        )
    if queue.group_mode != GroupMode.STICKY and queue.group_key is None:
        raise section.error("group_mode", "needs group_key")
    if queue.avro_schema is not None:
        if queue.message_type != MessageType.AVRO:
            raise section.error("avro_schema", 'is only for message_type "avro"')
        if not queue.avro_schema.is_file():
            raise section.error("avro_schema", f"no such file: {queue.avro_schema}")
        try:
            load_avro_schema(queue.avro_schema)
        except (ValueError, SerializationError) as exc:
            raise section.error("avro_schema", str(exc)) from None
    target = queue.default_publish_target
    if target is not None and not queue.matches(target):
        raise section.error(
            "default_publish_target",
            f"{target!r} is not one of the queue's topics ({queue.underlying_topic!r}): "
            "what is published would never reach the queue",
        )
    dead = queue.dead_letter_topic
    if dead is not None and queue.matches(dead):
        raise section.error(
            "dead_letter_topic",
            f"{dead!r} is one of the queue's own topics: dead letters would come back to it",
        )
    changelog = coordinator.changelog_topic(queue.name)
    view = queue.view_topic
    if view is not None and (queue.matches(view) or view in (dead, changelog)):
        raise section.error(
            "view_topic",
            f"{view!r} is already the queue's own topic, dead-letter topic or changelog: "
            "the view needs a topic of its own",
        )
    if len(changelog) > MAX_TOPIC_LENGTH:
        raise section.error(
            "name",
            f"its changelog topic {changelog!r} would be longer than Kafka's "
            f"{MAX_TOPIC_LENGTH} characters: shorten the name or the coordinator's id",
        )


# ---------------------------------------------------------------------------------------------
# One queue's options as a table: the queue definitions topic (layer.definitions) and the CLI
# ---------------------------------------------------------------------------------------------


def queue_from_table(
    table: Mapping[str, Any],
    source: str,
    coordinator: CoordinatorConfig,
    base_dir: Path | None = None,
) -> QueueConfig:
    """Validate one ``[[queue]]`` table (as ``tomllib`` reads it) exactly as ``load`` does, with
    the same one-line ``ConfigError``s; ``source`` names where it came from in them. Relative
    paths are taken from ``base_dir`` (default: the current directory)."""
    return _queue(dict(table), 1, source, base_dir or Path.cwd(), coordinator)


def queue_table(queue: QueueConfig) -> dict[str, Any]:
    """The ``[[queue]]`` table that loads back to ``queue``: its name, underlying topic and
    every option that differs from its default, as TOML values (the inverse of
    ``queue_from_table``, up to how an option was spelled: ``lvq`` comes back as
    ``conflate_key``, a relative ``avro_schema`` as an absolute path)."""
    defaults = QueueConfig(name=queue.name, underlying_topic=queue.underlying_topic)
    # fairness's default is the semantics' own
    fairness = replace(defaults, semantics=queue.semantics, fairness=None).fairness  # type: ignore[arg-type]
    table: dict[str, Any] = {"name": queue.name, "underlying_topic": queue.underlying_topic}
    for f in fields(queue):
        value = getattr(queue, f.name)
        default = fairness if f.name == "fairness" else getattr(defaults, f.name)
        if f.name in table or f.name == "shard" or value == default:
            continue
        table[f.name] = _toml_of(f.name, value)
    return table


def _toml_of(option: str, value: object) -> object:
    if option == "redelivery_backoff":
        initial, multiplier, cap = cast(tuple[float, float, float], value)
        return {"initial": initial, "multiplier": multiplier, "max": cap}
    if isinstance(value, StrEnum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value
