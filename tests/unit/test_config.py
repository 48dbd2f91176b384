"""The config loader: every option, defaults, precedence, and the error messages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from layer.config import (
    BrokerConfig,
    BrokerProfile,
    Config,
    CoordinatorConfig,
    MessageType,
    QueueConfig,
    StartFrom,
    load,
    loads,
)
from layer.durations import parse_duration
from layer.engine.model import EngineSettings, Fairness, Leasing, Semantics
from layer.exceptions import ConfigError, UnknownQueue

QUEUE = '[[queue]]\nname = "orders"\nunderlying_topic = "orders"\n'


def parse(text: str, **kwargs: object) -> Config:
    """loads() with a fixed source name and no environment unless one is given."""
    kwargs.setdefault("env", {})
    kwargs.setdefault("source", "config.toml")
    return loads(text, **kwargs)  # type: ignore[arg-type]


def queue(options: str = "") -> QueueConfig:
    return parse(QUEUE + options).queue("orders")


def error(text: str, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, **kwargs)
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# Defaults and every option
# ---------------------------------------------------------------------------------------------


def test_empty_file_gives_defaults_and_embedded_broker():
    config = parse("")
    assert config.source == "config.toml"
    assert config.queues == ()
    assert config.broker == BrokerConfig()
    assert config.broker.embedded
    assert config.broker.profile is BrokerProfile.AUTO
    assert config.broker.session_timeout_ms is None
    assert dict(config.broker.kafka) == {}
    coordinator = config.coordinator
    assert coordinator.id == "qlayer"
    assert coordinator.listen == "127.0.0.1:7070"
    assert coordinator.state_dir == Path.cwd() / ".qlayer/state"
    assert coordinator.commit_interval == 0.005
    assert coordinator.changelog_topic_prefix == "qlayer.changelog."
    assert coordinator.auth_token is None
    assert coordinator.topic_refresh_interval == 5.0


def test_queue_defaults():
    q = queue()
    assert q == QueueConfig(name="orders", underlying_topic="orders")
    assert q.message_type is MessageType.JSON
    assert q.semantics is Semantics.AT_LEAST_ONCE
    assert q.lease_period == 60.0
    assert q.max_per_subscription_backlog == 10_000
    assert q.fairness is Fairness.PROPORTIONAL
    assert q.priority is q.barrier is q.filter is None
    assert (q.target_queue_depth, q.max_deliveries, q.max_cancels) == (0, 0, 0)
    assert q.expiration is q.dead_letter_topic is q.default_publish_target is None
    assert q.leasing is Leasing.STRICT
    assert q.start_from is StartFrom.EARLIEST
    assert q.avro_schema is None
    assert not q.topic_is_regex
    assert q.publish_target == "orders"
    assert q.engine_settings() == EngineSettings()


def test_every_option_parsed(tmp_path: Path):
    (tmp_path / "orders.avsc").write_text('{"type": "record", "name": "O", "fields": []}')
    (tmp_path / "qlayer.toml").write_text(
        """
[broker]
bootstrap_servers = "k1:9092, k2:9092"
profile = "kafka"
session_timeout_ms = 6000

[broker.kafka]
"security.protocol" = "SASL_SSL"
sasl.mechanism = "PLAIN"          # a dotted TOML key: flattened back to librdkafka's key
"sasl.username" = "alice"
"sasl.password" = "hunter2"
"enable.ssl.certificate.verification" = false
"socket.timeout.ms" = 30000

[coordinator]
id = "prod-1"
listen = "0.0.0.0:7171"
state_dir = "state"
commit_interval = "10ms"
changelog_topic_prefix = "ql."
auth_token = "s3cret"
topic_refresh_interval = "1m"

[[queue]]
name = "orders"
underlying_topic = "^orders$|^orders-direct$"
message_type = "json"
semantics = "at-least-once"
lease_period = "2m"
max_per_subscription_backlog = 50
fairness = "fast"
priority = "/order/rank"
max_deliveries = 5
max_cancels = 3
expiration = "1d"
dead_letter_topic = "orders.dead-letters"
default_publish_target = "orders-direct"
leasing = "lenient"
start_from = "latest"

[[queue]]
name = "events"
underlying_topic = "events"
message_type = "avro"
avro_schema = "orders.avsc"

[[queue]]
name = "audit"
underlying_topic = "audit"
message_type = "bytes"
semantics = "at-most-once"
fairness = "round-robin"
target_queue_depth = 1000
"""
    )
    config = load(tmp_path / "qlayer.toml", env={})
    assert config.source == str(tmp_path / "qlayer.toml")
    assert config.broker == BrokerConfig(
        bootstrap_servers="k1:9092,k2:9092",
        profile=BrokerProfile.KAFKA,
        session_timeout_ms=6000,
        kafka={
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "hunter2",
            "enable.ssl.certificate.verification": "false",
            "socket.timeout.ms": "30000",
        },
    )
    assert config.coordinator == CoordinatorConfig(
        id="prod-1",
        listen="0.0.0.0:7171",
        state_dir=tmp_path / "state",  # relative to the config file's folder
        commit_interval=0.01,
        changelog_topic_prefix="ql.",
        auth_token="s3cret",
        topic_refresh_interval=60.0,
    )
    assert config.queue("orders") == QueueConfig(
        name="orders",
        underlying_topic="^orders$|^orders-direct$",
        message_type=MessageType.JSON,
        semantics=Semantics.AT_LEAST_ONCE,
        lease_period=120.0,
        max_per_subscription_backlog=50,
        fairness=Fairness.FAST,
        priority="/order/rank",
        max_deliveries=5,
        max_cancels=3,
        expiration=86400.0,
        dead_letter_topic="orders.dead-letters",
        default_publish_target="orders-direct",
        leasing=Leasing.LENIENT,
        start_from=StartFrom.LATEST,
    )
    assert config.queue("events") == QueueConfig(
        name="events",
        underlying_topic="events",
        message_type=MessageType.AVRO,
        avro_schema=tmp_path / "orders.avsc",
    )
    assert config.queue("audit") == QueueConfig(
        name="audit",
        underlying_topic="audit",
        message_type=MessageType.BYTES,
        semantics=Semantics.AT_MOST_ONCE,
        fairness=Fairness.ROUND_ROBIN,
        target_queue_depth=1000,
    )
    assert [q.name for q in config.queues] == ["orders", "events", "audit"]


def test_engine_settings_carry_the_queue_options():
    q = queue(
        'semantics = "at-most-once"\nlease_period = 5\nmax_per_subscription_backlog = 7\n'
        'leasing = "lenient"\nmax_deliveries = 2\nmax_cancels = 4\nexpiration = "90s"\n'
        'priority = "/p"\n'
    )
    assert q.engine_settings() == EngineSettings(
        semantics=Semantics.AT_MOST_ONCE,
        lease_period=5.0,
        max_per_subscription_backlog=7,
        fairness=Fairness.ROUND_ROBIN,
        leasing=Leasing.LENIENT,
        max_deliveries=2,
        max_cancels=4,
        expiration=90.0,
        target_queue_depth=0,
        priority=True,
    )
    assert queue("target_queue_depth = 10").engine_settings().target_queue_depth == 10


def test_fairness_defaults_follow_the_semantics():
    assert queue('semantics = "at-least-once"').fairness is Fairness.PROPORTIONAL
    assert queue('semantics = "at-most-once"').fairness is Fairness.ROUND_ROBIN
    assert queue('fairness = "round-robin"').fairness is Fairness.ROUND_ROBIN
    direct = QueueConfig(name="q", underlying_topic="t", semantics=Semantics.AT_MOST_ONCE)
    assert direct.fairness is Fairness.ROUND_ROBIN


def test_regex_topic_and_publish_target():
    text = '[[queue]]\nname = "all"\nunderlying_topic = "^orders\\\\..*"\n'
    q = parse(text).queue("all")
    assert q.topic_is_regex
    assert q.matches("orders.eu") and not q.matches("ordersX")
    with pytest.raises(ConfigError, match="queue 'all' cannot be published to"):
        _ = q.publish_target
    q = parse(text + 'default_publish_target = "orders.direct"').queue("all")
    assert q.publish_target == "orders.direct"
    assert queue('default_publish_target = "orders"').publish_target == "orders"


def test_changelog_topic_names_coordinator_and_queue():
    config = parse('[coordinator]\nid = "c1"\n' + QUEUE)
    assert config.coordinator.changelog_topic("orders") == "qlayer.changelog.c1.orders"


def test_listen_host_and_port():
    coordinator = parse('[coordinator]\nlisten = "[::1]:0"').coordinator
    assert (coordinator.listen_host, coordinator.listen_port) == ("::1", 0)


def test_unknown_queue():
    config = parse(QUEUE)
    with pytest.raises(UnknownQueue, match="queue 'nope' is not configured in config.toml"):
        config.queue("nope")


def test_config_objects_are_frozen_and_kafka_settings_read_only():
    config = parse('[broker.kafka]\n"client.id" = "x"')
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.broker.profile = BrokerProfile.KAFKA  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.broker.kafka["client.id"] = "y"  # type: ignore[index]


def test_client_settings_join_typed_and_pass_through_settings():
    broker = parse(
        '[broker]\nsession_timeout_ms = 6000\n[broker.kafka]\n"security.protocol" = "SSL"'
    ).broker
    with pytest.raises(ConfigError, match="embedded broker's address"):
        broker.client_settings()
    assert broker.client_settings("127.0.0.1:1234") == {
        "bootstrap.servers": "127.0.0.1:1234",
        "security.protocol": "SSL",
    }
    assert broker.client_settings("h:1", consumer=True)["session.timeout.ms"] == "6000"


# ---------------------------------------------------------------------------------------------
# Precedence: file < environment < CLI
# ---------------------------------------------------------------------------------------------

ENV = {
    "QLAYER_BOOTSTRAP_SERVERS": "env:9092",
    "QLAYER_BROKER_PROFILE": "tansu",
    "QLAYER_KAFKA_SECURITY_PROTOCOL": "SSL",
    "QLAYER_KAFKA_SASL_PASSWORD": "from-env",
    "PATH": "/usr/bin",
    "QLAYER_SOMETHING_ELSE": "ignored",
}


def test_environment_wins_over_the_file():
    text = (
        '[broker]\nbootstrap_servers = "file:9092"\nprofile = "kafka"\n'
        '[broker.kafka]\n"security.protocol" = "PLAINTEXT"\n"client.id" = "from-file"\n'
    )
    broker = parse(text, env=ENV).broker
    assert broker.bootstrap_servers == "env:9092"
    assert broker.profile is BrokerProfile.TANSU
    assert dict(broker.kafka) == {
        "security.protocol": "SSL",
        "client.id": "from-file",
        "sasl.password": "from-env",
    }


def test_empty_environment_values_are_ignored():
    broker = parse(
        '[broker]\nbootstrap_servers = "file:9092"',
        env={"QLAYER_BOOTSTRAP_SERVERS": "", "QLAYER_KAFKA_CLIENT_ID": ""},
    ).broker
    assert broker.bootstrap_servers == "file:9092"
    assert dict(broker.kafka) == {}


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("QLAYER_BOOTSTRAP_SERVERS", "os-env:9092")
    assert loads("").broker.bootstrap_servers == "os-env:9092"


def test_cli_overrides_win_over_file_and_environment(tmp_path: Path):
    path = tmp_path / "qlayer.toml"
    path.write_text('[coordinator]\nlisten = "127.0.0.1:1"\nstate_dir = "/file/state"\n')
    overrides = {"bootstrap": "cli:9092", "listen": "0.0.0.0:9999", "state_dir": "cli-state"}
    config = load(path, env=ENV, overrides=overrides)
    assert config.broker.bootstrap_servers == "cli:9092"
    assert config.coordinator.listen == "0.0.0.0:9999"
    # A flag's relative path is the shell's, not the config file's.
    assert config.coordinator.state_dir == Path.cwd() / "cli-state"


def test_cli_overrides_none_means_not_given_and_bootstrap_servers_is_an_alias():
    overrides = {"bootstrap_servers": "cli:9092", "listen": None, "state_dir": None}
    config = parse('[coordinator]\nlisten = "1.2.3.4:5"', overrides=overrides)
    assert config.broker.bootstrap_servers == "cli:9092"
    assert config.coordinator.listen == "1.2.3.4:5"


def test_unknown_override_is_an_error():
    assert error("", overrides={"lisen": "x"}) == (
        "unknown override 'lisen' (known: bootstrap, listen, state_dir, http)"
    )


def test_metrics_right_is_open_unless_set() -> None:
    assert parse("").coordinator.metrics_right is None
    assert parse('[coordinator]\nmetrics_right = "none"').coordinator.metrics_right is None
    assert parse('[coordinator]\nmetrics_right = "browse"').coordinator.metrics_right == "browse"
    assert error('[coordinator]\nmetrics_right = "publish"') == (
        "config.toml: [coordinator]: option 'metrics_right': "
        'expected "none", "browse" or "admin", got "publish"'
    )


def test_http_listener_is_off_unless_set_and_validated_like_listen(tmp_path: Path):
    assert parse("").coordinator.http is None
    config = parse('[coordinator]\nhttp = "127.0.0.1:7071"')
    assert config.coordinator.http == "127.0.0.1:7071"
    assert parse('[coordinator]\nhttp = "0.0.0.0:0"').coordinator.http == "0.0.0.0:0"
    assert error('[coordinator]\nhttp = "7071"') == (
        "config.toml: [coordinator]: option 'http': expected host:port (port 0-65535), got \"7071\""
    )
    assert error("[coordinator]\nhttp = 7071") == (
        "config.toml: [coordinator]: option 'http': expected a string, got 7071"
    )
    # the flag wins over the file, and a bad flag names the flag
    path = tmp_path / "qlayer.toml"
    path.write_text('[coordinator]\nhttp = "127.0.0.1:7071"\n')
    assert load(path, env={}, overrides={"http": "0.0.0.0:8080"}).coordinator.http == (
        "0.0.0.0:8080"
    )
    assert load(path, env={}, overrides={"http": None}).coordinator.http == "127.0.0.1:7071"
    assert error("", overrides={"http": "localhost:99999"}) == (
        "config.toml: [coordinator]: option 'http' (from --http): "
        'expected host:port (port 0-65535), got "localhost:99999"'
    )
    assert parse("").with_overrides(http="127.0.0.1:0").coordinator.http == "127.0.0.1:0"
    with pytest.raises(ConfigError, match=r"option 'http' \(from --http\)"):
        parse("").with_overrides(http=":80")


def test_with_overrides():
    config = parse(QUEUE)
    changed = config.with_overrides(bootstrap="b:1", listen="0.0.0.0:1", state_dir="/s")
    assert changed.broker.bootstrap_servers == "b:1"
    assert changed.coordinator.listen == "0.0.0.0:1"
    assert changed.coordinator.state_dir == Path("/s")
    assert changed.queues == config.queues
    assert config.with_overrides() == config
    with pytest.raises(ConfigError) as info:
        config.with_overrides(listen="nope")
    assert str(info.value) == (
        "config.toml: [coordinator]: option 'listen' (from --listen): "
        'expected host:port (port 0-65535), got "nope"'
    )


# ---------------------------------------------------------------------------------------------
# Errors: file, section or queue, option, and what was wrong
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            'lease_period = "abc"',
            'option \'lease_period\': expected a duration like 30 or "30s", got "abc"',
        ),
        ("lease_period = 0", "option 'lease_period': expected a duration > 0, got 0"),
        ('expiration = "-5s"', "option 'expiration': expected a duration like 30 or \"30s\""),
        (
            'semantics = "exactly-once"',
            "option 'semantics': expected one of \"at-least-once\", "
            '"at-most-once", got "exactly-once"',
        ),
        (
            'fairness = "random"',
            'option \'fairness\': expected one of "fast", "round-robin", '
            '"proportional", got "random"',
        ),
        (
            'message_type = "xml"',
            'option \'message_type\': expected one of "json", "avro", "bytes", got "xml"',
        ),
        ('leasing = "loose"', 'option \'leasing\': expected one of "strict", "lenient"'),
        ('start_from = "middle"', 'option \'start_from\': expected one of "earliest", "latest"'),
        (
            "max_per_subscription_backlog = 0",
            "option 'max_per_subscription_backlog': expected an integer >= 1, got 0",
        ),
        (
            "max_per_subscription_backlog = 1.5",
            "option 'max_per_subscription_backlog': expected an integer >= 1, got 1.5",
        ),
        ("max_deliveries = -1", "option 'max_deliveries': expected an integer >= 0, got -1"),
        ("max_cancels = true", "option 'max_cancels': expected an integer >= 0, got true"),
        (
            'target_queue_depth = "10"',
            "option 'target_queue_depth': expected an integer >= 0, got \"10\"",
        ),
        ('priority = "priority"', "option 'priority': expression \"priority\" : unknown name"),
        ('priority = "/price *"', "option 'priority': expression \"/price *\" : "),
        ('filter = "/qty >> 10"', "option 'filter': expression \"/qty >> 10\" : "),
        ('barrier = "/a = "', "option 'barrier': expression"),
        ('group_key = "UPPER("', "option 'group_key': expression"),
        ('group_mode = "shared"', "option 'group_mode': needs group_key"),
        ('group_key = "/c"\ngroup_mode = "loose"', "option 'group_mode': expected one of"),
        ('exclusive = "yes"', "option 'exclusive': expected true or false"),
        (
            "redelivery_backoff = 5",
            "option 'redelivery_backoff': expected a table like { initial = \"1s\"",
        ),
        (
            'redelivery_backoff = { initial = "10s", max = "1s" }',
            "option 'redelivery_backoff': needs 0 <= initial <= max",
        ),
        (
            "redelivery_backoff = { multiplier = 0.5 }",
            "option 'redelivery_backoff': multiplier must be a number >= 1",
        ),
        (
            'barrier = "/end"\ntarget_queue_depth = 5',
            "option 'target_queue_depth': cannot be combined with 'barrier' (as AMPS does)",
        ),
        (
            'dead_letter_topic = "dead letters"',
            "option 'dead_letter_topic': expected a Kafka topic name",
        ),
        (
            'dead_letter_topic = "orders"',
            "option 'dead_letter_topic': 'orders' is one of the "
            "queue's own topics: dead letters would come back to it",
        ),
        (
            'default_publish_target = "^x"',
            "option 'default_publish_target': expected a Kafka topic name",
        ),
        (
            'default_publish_target = "elsewhere"',
            "option 'default_publish_target': 'elsewhere' "
            "is not one of the queue's topics ('orders')",
        ),
        (
            'semantics = "at-most-once"\nfairness = "proportional"',
            "option 'fairness': at-most-once queues allow only \"round-robin\" (as AMPS does), "
            'got "proportional"',
        ),
        (
            'priority = "/p"\ntarget_queue_depth = 5',
            "option 'target_queue_depth': cannot be combined with 'priority' (as AMPS does)",
        ),
        (
            'message_type = "bytes"\npriority = "/p"',
            'option \'priority\': needs message_type "json" or "avro"',
        ),
        (
            'message_type = "avro"\nfilter = "/p > 1"',
            "option 'filter': needs avro_schema",
        ),
        ('avro_schema = "x.avsc"', "option 'avro_schema' is only for message_type \"avro\""),
        (
            'message_type = "avro"\navro_schema = "/no/such.avsc"',
            "option 'avro_schema': no such file: /no/such.avsc",
        ),
        ("lease_perod = 30", "unknown option 'lease_perod' (did you mean 'lease_period'?)"),
        ("LeasePeriod = 30", "unknown option 'LeasePeriod' (did you mean 'lease_period'?)"),
        ("MaxDeliveries = 3", "unknown option 'MaxDeliveries' (did you mean 'max_deliveries'?)"),
        ("colour = 1", "unknown option 'colour'"),
    ],
)
def test_queue_option_errors_name_file_queue_and_option(options: str, message: str):
    text = error(QUEUE + options)
    assert text.startswith(f"config.toml: queue 'orders': {message}"), text


def test_unknown_option_without_a_close_match_suggests_nothing():
    assert error(QUEUE + "colour = 1") == "config.toml: queue 'orders': unknown option 'colour'"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[[queue]]\nunderlying_topic = "t"', "config.toml: queue #1: option 'name' is required"),
        (
            QUEUE + '[[queue]]\nname = "my queue"\nunderlying_topic = "t"',
            "config.toml: queue #2: option 'name': expected 1-200 characters of "
            'A-Z a-z 0-9 . _ -, got "my queue"',
        ),
        (
            f'[[queue]]\nname = "{"q" * 201}"\nunderlying_topic = "t"',
            "config.toml: queue #1: option 'name': expected 1-200 characters",
        ),
        ('[[queue]]\nname = "q"', "config.toml: queue 'q': option 'underlying_topic' is required"),
        (
            '[[queue]]\nname = "q"\nunderlying_topic = "^orders("',
            "config.toml: queue 'q': option 'underlying_topic': invalid regular expression "
            '"^orders(": missing ), unterminated subpattern',
        ),
        (
            '[[queue]]\nname = "q"\nunderlying_topic = "a/b"',
            "config.toml: queue 'q': option 'underlying_topic': expected a Kafka topic name",
        ),
        (
            QUEUE + QUEUE,
            "config.toml: queue 'orders' (#2): duplicate queue name: "
            "queue #1 is also named 'orders'",
        ),
        (
            f'[coordinator]\nid = "{"c" * 200}"\n[[queue]]\nname = "{"q" * 40}"\n'
            'underlying_topic = "t"',
            "config.toml: queue '" + "q" * 40 + "': option 'name': its changelog topic",
        ),
        ("[queue]\nname = 'x'", "config.toml: 'queue' must be an array of tables: write [[queue]]"),
        ("[queues]\nx = 1", "config.toml: unknown table 'queues' (did you mean 'queue'?)"),
        ("debug = true", "config.toml: unknown option 'debug'"),
        ("broker = 1", "config.toml: 'broker' must be a table: write [broker]"),
    ],
)
def test_structure_errors(text: str, message: str):
    assert error(text).startswith(message), error(text)


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            '[broker]\nbootstrap = "x"',
            {},
            "config.toml: [broker]: unknown option 'bootstrap' (did you mean 'bootstrap_servers'?)",
        ),
        (
            '[broker]\nprofile = "redpanda"',
            {},
            'config.toml: [broker]: option \'profile\': expected one of "auto", "kafka", '
            '"tansu", got "redpanda"',
        ),
        (
            "",
            {"QLAYER_BROKER_PROFILE": "redpanda"},
            "config.toml: [broker]: option 'profile' (from QLAYER_BROKER_PROFILE): expected one of",
        ),
        (
            '[broker]\nprofile = "kafka"',
            {},
            "config.toml: [broker]: option 'profile': the embedded broker is Tansu: "
            "set bootstrap_servers (or QLAYER_BOOTSTRAP_SERVERS)",
        ),
        (
            '[broker]\nbootstrap_servers = "a:1,,b:2"',
            {},
            "config.toml: [broker]: option 'bootstrap_servers': expected host:port[,host:port...]",
        ),
        (
            '[broker]\nsession_timeout_ms = "6s"',
            {},
            "config.toml: [broker]: option 'session_timeout_ms': expected an integer >= 1",
        ),
        (
            '[broker.kafka]\n"bootstrap.servers" = "x:1"',
            {},
            "config.toml: [broker.kafka]: option 'bootstrap.servers': "
            "set it as broker.bootstrap_servers instead",
        ),
        (
            "",
            {"QLAYER_KAFKA_GROUP_ID": "g"},
            "config.toml: [broker.kafka]: option 'group.id' (from QLAYER_KAFKA_GROUP_ID): "
            "set it as coordinator.id instead",
        ),
        (
            '[broker.kafka]\n"ssl.ca.location" = ["a"]',
            {},
            "config.toml: [broker.kafka]: option 'ssl.ca.location': "
            "expected a string, number or boolean, got an array",
        ),
        (
            '[coordinator]\nlisten = "7070"',
            {},
            "config.toml: [coordinator]: option 'listen': expected host:port (port 0-65535), "
            'got "7070"',
        ),
        ('[coordinator]\nlisten = "h:70000"', {}, "option 'listen': expected host:port"),
        ('[coordinator]\nid = "a b"', {}, "config.toml: [coordinator]: option 'id': expected"),
        (
            '[coordinator]\ncommit_interval = "fast"',
            {},
            "config.toml: [coordinator]: option 'commit_interval': expected a duration like 30",
        ),
        (
            "[coordinator]\ntopic_refresh_interval = 0",
            {},
            "option 'topic_refresh_interval': expected a duration > 0, got 0",
        ),
        (
            '[coordinator]\nchangelog_topic_prefix = "a/b"',
            {},
            "option 'changelog_topic_prefix': expected characters of A-Z a-z 0-9 . _ -",
        ),
        (
            '[coordinator]\nauth_token = ""',
            {},
            "config.toml: [coordinator]: option 'auth_token': expected a non-empty string",
        ),
        (
            "[coordinator]\nstate_dir = 5",
            {},
            "config.toml: [coordinator]: option 'state_dir': expected a string, got 5",
        ),
        (
            '[coordinator]\nstatedir = "x"',
            {},
            "config.toml: [coordinator]: unknown option 'statedir' (did you mean 'state_dir'?)",
        ),
    ],
)
def test_broker_and_coordinator_errors(text: str, env: dict[str, str], message: str):
    assert message in error(text, env=env)


def test_cli_override_errors_name_the_flag():
    assert error("", overrides={"listen": "x"}) == (
        "config.toml: [coordinator]: option 'listen' (from --listen): "
        'expected host:port (port 0-65535), got "x"'
    )
    assert error("", overrides={"bootstrap": " "}).startswith(
        "config.toml: [broker]: option 'bootstrap_servers' (from --bootstrap): expected"
    )


def test_toml_syntax_error_names_file_line_and_column():
    assert error('[broker]\nprofile = "auto"\nbootstrap_servers "x"\n') == (
        "config.toml: line 3, column 19: invalid TOML: Expected '=' after a key in a key/value pair"
    )
    assert error("[broker]\nprofile =").startswith("config.toml: line 2, column 10: invalid TOML")


def test_kafka_key_written_twice_is_an_error():
    text = '[broker.kafka]\nsasl.username = "a"\n"sasl.username" = "b"\n'
    assert error(text) == (
        "config.toml: [broker.kafka]: option 'sasl.username' is set twice (once as a quoted key)"
    )


def test_load_errors_name_the_file(tmp_path: Path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError, match=f"^{missing}: no such config file$"):
        load(missing, env={})
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=f"^{binary}: not UTF-8 text"):
        load(binary, env={})
    bad = tmp_path / "bad.toml"
    bad.write_text(QUEUE + 'lease_period = "abc"\n')
    with pytest.raises(ConfigError) as info:
        load(bad, env={})
    assert str(info.value) == (
        f"{bad}: queue 'orders': option 'lease_period': "
        'expected a duration like 30 or "30s", got "abc"'
    )


# ---------------------------------------------------------------------------------------------
# Secrets
# ---------------------------------------------------------------------------------------------


def test_repr_masks_secrets():
    config = parse(
        '[broker]\nbootstrap_servers = "k:9092"\n[broker.kafka]\n'
        '"sasl.username" = "alice"\n"sasl.password" = "hunter2"\n'
        '"sasl.oauthbearer.client.secret" = "secret-q1"\n"ssl.key.password" = "secret-q2"\n'
        '"sasl.oauthbearer.token.endpoint.url" = "secret-q3"\n"security.protocol" = "SASL_SSL"\n'
        '[coordinator]\nauth_token = "secret-q4"\n'
    )
    text = repr(config)
    # secrets that no path in the repr (the state dir's, under the checkout) can contain
    for secret in ("hunter2", "secret-q1", "secret-q2", "secret-q3", "secret-q4"):
        assert secret not in text
    assert "'sasl.username': 'alice'" in text
    assert "'sasl.password': '***'" in text
    assert "'security.protocol': 'SASL_SSL'" in text
    assert "auth_token='***'" in text
    assert "auth_token=None" in repr(CoordinatorConfig())
    assert str(config.broker) == repr(config.broker)


def test_env_secret_is_masked_too():
    broker = parse("", env={"QLAYER_KAFKA_SASL_PASSWORD": "pw-from-env"}).broker
    assert broker.kafka["sasl.password"] == "pw-from-env"
    assert "pw-from-env" not in repr(broker)


# ---------------------------------------------------------------------------------------------
# Durations
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (30, 30.0),
        (1.5, 1.5),
        (0, 0.0),
        ("30", 30.0),
        ("500ms", 0.5),
        ("30s", 30.0),
        ("1.5s", 1.5),
        (".5s", 0.5),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        (" 10 s ", 10.0),
    ],
)
def test_durations(value: object, seconds: float):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("abc", '"abc"'),
        ("5x", '"5x"'),
        ("", '""'),
        ("1.2.3s", '"1.2.3s"'),
        ("s", '"s"'),
        ("-1s", '"-1s"'),
        (True, "true"),
        (None, "a NoneType"),
        ([1], "an array"),
    ],
)
def test_bad_durations_show_the_text(value: object, shown: str):
    with pytest.raises(ValueError) as info:
        parse_duration(value)
    assert str(info.value) == f'expected a duration like 30 or "30s", got {shown}'


def test_infinite_duration_is_rejected():
    with pytest.raises(ValueError, match="finite"):
        parse_duration(float("inf"))
    assert "finite" in error(QUEUE + "lease_period = inf")


def test_tls_options(tmp_path):
    (tmp_path / "c.pem").write_text("cert")
    (tmp_path / "k.pem").write_text("key")
    base = '[[queue]]\nname = "q"\nunderlying_topic = "t"\n'
    cfg = tmp_path / "qlayer.toml"
    cfg.write_text('[coordinator]\ntls_cert = "c.pem"\ntls_key = "k.pem"\n' + base)
    config = load(cfg, env={})
    assert config.coordinator.tls_cert == tmp_path / "c.pem"
    assert config.coordinator.tls_key == tmp_path / "k.pem"
    cfg.write_text('[coordinator]\ntls_cert = "c.pem"\n' + base)
    with pytest.raises(ConfigError, match="option 'tls_cert': needs tls_key too"):
        load(cfg, env={})
    cfg.write_text('[coordinator]\ntls_cert = "c.pem"\ntls_key = "nope.pem"\n' + base)
    with pytest.raises(ConfigError, match="option 'tls_key': no such file"):
        load(cfg, env={})
    # a cluster member's trust in the others' certificates
    (tmp_path / "ca.pem").write_text("ca")
    tls = 'tls_cert = "c.pem"\ntls_key = "k.pem"\n'
    cfg.write_text(f'[coordinator]\n{tls}tls_peer_ca = "ca.pem"\n' + base)
    assert load(cfg, env={}).coordinator.tls_peer_ca == tmp_path / "ca.pem"
    cfg.write_text('[coordinator]\ntls_peer_ca = "ca.pem"\n' + base)
    with pytest.raises(ConfigError, match="option 'tls_peer_ca': needs tls_cert and tls_key"):
        load(cfg, env={})
    cfg.write_text(f'[coordinator]\n{tls}tls_peer_ca = "nope.pem"\n' + base)
    with pytest.raises(ConfigError, match="option 'tls_peer_ca': no such file"):
        load(cfg, env={})


def test_auth_token_from_the_environment_wins_and_is_masked():
    text = '[coordinator]\nauth_token = "in-file"\n[[queue]]\nname = "q"\nunderlying_topic = "t"\n'
    config = loads(text, env={"QLAYER_AUTH_TOKEN": "from-env"})
    assert config.coordinator.auth_token == "from-env"
    assert "from-env" not in repr(config)
    assert loads(text, env={"QLAYER_AUTH_TOKEN": ""}).coordinator.auth_token == "in-file"


def test_on_unparseable_defaults_to_dead_letter_and_takes_deliver():
    from layer.config import OnUnparseable

    assert queue().on_unparseable == OnUnparseable.DEAD_LETTER
    assert queue('on_unparseable = "deliver"\n').on_unparseable == OnUnparseable.DELIVER
    text = error(QUEUE + 'on_unparseable = "drop"\n')
    assert "option 'on_unparseable'" in text and "dead-letter" in text and "deliver" in text
    text = error(QUEUE + 'message_type = "bytes"\non_unparseable = "deliver"\n')
    assert "option 'on_unparseable'" in text and "never parse" in text


def test_coordinator_id_from_the_environment_wins_over_the_file():
    # one config file for the several coordinators of a cluster (docker-compose.yml)
    text = '[coordinator]\nid = "in-file"\ncluster = "c"\n'
    assert loads(text, env={"QLAYER_COORDINATOR_ID": "c-2"}).coordinator.id == "c-2"
    assert loads(text, env={"QLAYER_COORDINATOR_ID": ""}).coordinator.id == "in-file"
    with pytest.raises(ConfigError) as info:
        loads(text, env={"QLAYER_COORDINATOR_ID": "c 2"})
    assert "option 'id' (from QLAYER_COORDINATOR_ID)" in str(info.value)
