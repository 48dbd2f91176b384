"""Reloading the config: the pure plan (layer.coordinator.reload), the engine taking live
settings (QueueEngine.reconfigure), the summary, and reading the file again with the CLI's
overrides. No I/O beyond temporary config files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from layer.api.frames import RELOAD_CODEC, RELOAD_REPLY_CODEC, Reload, ReloadReply
from layer.api.service import ReloadChange, ReloadRefusal, ReloadResult
from layer.config import Config, load, loads, reread
from layer.coordinator.reload import FIXED_OPTIONS, LIVE_OPTIONS, plan
from layer.engine.model import (
    AckOp,
    Arrival,
    Bookmark,
    DoneReason,
    EngineSettings,
    Fairness,
    Leasing,
    Semantics,
    TopicPartition,
)
from layer.engine.queue import QueueEngine
from layer.exceptions import ConfigError

BASE = """
[coordinator]
id = "c1"

[[queue]]
name = "a"
underlying_topic = "a"

[[queue]]
name = "c"
underlying_topic = "c"
"""


def config(text: str = BASE, extra_a: str = "", extra_c: str = "", tail: str = "") -> Config:
    """BASE with options added to queue a and c, and more TOML after it."""
    text = text.replace('underlying_topic = "a"\n', f'underlying_topic = "a"\n{extra_a}\n')
    text = text.replace('underlying_topic = "c"\n', f'underlying_topic = "c"\n{extra_c}\n')
    return loads(text + tail, source="qlayer.toml", env={})


# ---------------------------------------------------------------------------------------------
# the plan
# ---------------------------------------------------------------------------------------------


def test_unchanged_file_plans_nothing():
    p = plan(config(), config())
    assert p.empty and p.applicable
    assert p.result(applied=True).lines() == ["reloaded qlayer.toml: no changes"]


def test_added_and_removed_queues():
    new = loads(
        BASE.replace('name = "c"\nunderlying_topic = "c"', 'name = "b"\nunderlying_topic = "b"'),
        source="qlayer.toml",
        env={},
    )
    p = plan(config(), new)
    assert [q.name for q in p.added] == ["b"]
    assert p.added[0].underlying_topic == "b"
    assert p.removed == ("c",)
    assert p.changes == () and p.refused == () and p.applicable
    lines = p.result(applied=True).lines()
    assert lines[0] == "reloaded qlayer.toml: added 1, removed 1, changed 0"
    assert "  added queue 'b'" in lines
    assert "  removed queue 'c' (subscriptions ended; its state is kept)" in lines


LIVE_CASES = [
    ("lease_period", "", 'lease_period = "5s"', "60.0", "5.0"),
    ("max_per_subscription_backlog", "", "max_per_subscription_backlog = 3", "10000", "3"),
    ("fairness", "", 'fairness = "fast"', '"proportional"', '"fast"'),
    ("leasing", "", 'leasing = "lenient"', '"strict"', '"lenient"'),
    ("max_deliveries", "", "max_deliveries = 3", "0", "3"),
    ("max_cancels", "max_cancels = 5", "max_cancels = 2", "5", "2"),
    ("expiration", "", 'expiration = "1h"', "(unset)", "3600.0"),
    ("target_queue_depth", "", "target_queue_depth = 100", "0", "100"),
    (
        "redelivery_backoff",
        "",
        'redelivery_backoff = { initial = "1s", multiplier = 2, max = "1m" }',
        "(unset)",
        "[1.0, 2.0, 60.0]",
    ),
    (
        "dead_letter_topic",
        'dead_letter_topic = "dl1"',
        'dead_letter_topic = "dl2"',
        '"dl1"',
        '"dl2"',
    ),
    ("on_unparseable", "", 'on_unparseable = "deliver"', '"dead-letter"', '"deliver"'),
]


@pytest.mark.parametrize(("option", "before", "after", "old", "new"), LIVE_CASES)
def test_each_live_option_is_a_change(option, before, after, old, new):
    p = plan(config(extra_a=before), config(extra_a=after))
    assert p.applicable and not p.added and not p.removed
    assert p.changes == (ReloadChange("a", option, old, new),)
    assert [q.name for q in p.changed] == ["a"]
    assert getattr(p.changed[0], option) == getattr(config(extra_a=after).queue("a"), option)
    assert p.result(applied=True).lines()[1] == f"  changed queue 'a': {option} {old} -> {new}"


def test_every_live_option_is_tested_and_none_is_also_fixed():
    assert {case[0] for case in LIVE_CASES} == set(LIVE_OPTIONS)
    assert not set(LIVE_OPTIONS) & set(FIXED_OPTIONS)


def _schema(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.avsc"
    fields = [{"name": "x", "type": "long"}]
    path.write_text(json.dumps({"type": "record", "name": name, "fields": fields}))
    return str(path)


def fixed_cases(tmp_path: Path) -> list[tuple[str, str, str]]:
    s1, s2 = _schema(tmp_path, "One"), _schema(tmp_path, "Two")
    return [
        ("underlying_topic", "", ""),  # special-cased below: the topic line itself changes
        ("semantics", "", 'semantics = "at-most-once"\nfairness = "round-robin"'),
        ("message_type", "", 'message_type = "bytes"'),
        (
            "avro_schema",
            f'message_type = "avro"\navro_schema = "{s1}"',
            f'message_type = "avro"\navro_schema = "{s2}"',
        ),
        ("priority", "", 'priority = "/p"'),
        ("priorities", "priorities = 10", "priorities = 4"),
        ("barrier", "", "barrier = \"/kind = 'eod'\""),
        ("filter", 'filter = "/qty > 1"', 'filter = "/qty > 2"'),
        ("group_key", "", 'group_key = "/g"'),
        ("group_mode", 'group_key = "/g"', 'group_key = "/g"\ngroup_mode = "shared"'),
        ("conflate_key", "", 'conflate_key = "/k"'),
        ("exclusive", "", "exclusive = true"),
        ("default_publish_target", 'underlying_topic = "^a.*"', ""),  # special-cased below
        ("view_topic", "", 'view_topic = "a-view"'),
        ("start_from", "", 'start_from = "latest"'),
        ("sort_key", "", 'sort_key = "/s"'),
        ("last_value", "", "last_value = true"),
        ("ttl", "", 'ttl = "/ttl"'),
        ("dead_letter_if", "", 'dead_letter_if = "/keep"'),
        ("distribution", "", 'distribution = "partitioned"\npartitions = 2'),
        (
            "partitions",
            'distribution = "partitioned"\npartitions = 2',
            'distribution = "partitioned"\npartitions = 3',
        ),
    ]


def test_each_fixed_option_is_refused_with_its_reason(tmp_path):
    cases = fixed_cases(tmp_path)
    assert {case[0] for case in cases} == set(FIXED_OPTIONS)
    for option, before, after in cases:
        if option == "underlying_topic":
            old = config()
            new = loads(
                BASE.replace('underlying_topic = "a"', 'underlying_topic = "a2"'),
                source="qlayer.toml",
                env={},
            )
        elif option == "default_publish_target":
            regex = BASE.replace('underlying_topic = "a"', 'underlying_topic = "^a.*"')
            old = loads(regex, source="qlayer.toml", env={})
            new = loads(
                regex.replace('"^a.*"', '"^a.*"\ndefault_publish_target = "a1"'),
                source="qlayer.toml",
                env={},
            )
        else:
            old, new = config(extra_a=before), config(extra_a=after)
        p = plan(old, new)
        assert not p.applicable, option
        refused = [r for r in p.refused if r.option == option]
        assert len(refused) == 1, (option, p.refused)
        assert refused[0].where == "queue 'a'"
        assert refused[0].reason == FIXED_OPTIONS[option]
        # a queue with a refused option is not among the changed ones, even with live changes
        assert "a" not in [q.name for q in p.changed]


def test_a_refusal_is_reported_with_what_would_have_been_applied():
    p = plan(
        config(),
        config(extra_a='semantics = "at-most-once"\nfairness = "round-robin"', tail=""),
    )
    result = p.result(applied=False)
    assert not result.applied
    lines = result.lines()
    assert lines[0].startswith("reload of qlayer.toml refused, nothing changed: 1 option ")
    assert any("option 'semantics'" in line and "changelog" in line for line in lines)
    # fairness is live, but its queue has a refusal: the whole reload is refused
    assert result.changed == [ReloadChange("a", "fairness", '"proportional"', '"round-robin"')]


@pytest.mark.parametrize(
    ("section", "before", "after", "option"),
    [
        ("[coordinator]", 'id = "c1"', 'id = "c2"', "id"),
        ("[coordinator]", 'id = "c1"', 'id = "c1"\nlisten = "127.0.0.1:9999"', "listen"),
        ("[coordinator]", 'id = "c1"', 'id = "c1"\ncommit_interval = "20ms"', "commit_interval"),
        ("[coordinator]", 'id = "c1"', 'id = "c1"\nauth_token = "s3cret"', "auth_token"),
        ("[coordinator]", 'id = "c1"', 'id = "c1"\nadmin_token = "adm1n"', "admin_token"),
    ],
)
def test_coordinator_section_changes_are_refused(section, before, after, option):
    new = loads(BASE.replace(before, after), source="qlayer.toml", env={})
    p = plan(config(), new)
    assert [(r.where, r.option) for r in p.refused] == [(section, option)]
    assert "coordinator process itself" in p.refused[0].reason
    assert "s3cret" not in str(p.refused[0]) and "adm1n" not in str(p.refused[0])


def test_broker_section_changes_are_refused():
    tail_old = '\n[broker]\nbootstrap_servers = "k1:9092"\n'
    tail_new = '\n[broker]\nbootstrap_servers = "k2:9092"\n[broker.kafka]\n"sasl.password" = "pw"\n'
    p = plan(config(tail=tail_old), config(tail=tail_new))
    assert sorted(r.option for r in p.refused) == ["bootstrap_servers", "kafka"]
    assert all(r.where == "[broker]" for r in p.refused)
    assert "pw" not in " ".join(str(r) for r in p.refused)


# ---------------------------------------------------------------------------------------------
# reading the file again
# ---------------------------------------------------------------------------------------------


def test_reread_applies_the_same_overrides(tmp_path):
    path = tmp_path / "qlayer.toml"
    path.write_text(BASE)
    first = load(path, env={}, overrides={"listen": "127.0.0.1:0", "state_dir": str(tmp_path)})
    assert first.coordinator.listen == "127.0.0.1:0"
    path.write_text(BASE + '\n[[queue]]\nname = "b"\nunderlying_topic = "b"\n')
    again = reread(first, env={})
    assert again.coordinator == first.coordinator  # the flags still win over the file
    p = plan(first, again)
    assert p.applicable and [q.name for q in p.added] == ["b"]


def test_reread_of_a_bad_file_names_file_queue_and_option(tmp_path):
    path = tmp_path / "qlayer.toml"
    path.write_text(BASE)
    first = load(path, env={})
    path.write_text(
        BASE.replace('underlying_topic = "c"', 'underlying_topic = "c"\nlease_period = -1')
    )
    with pytest.raises(ConfigError) as info:
        reread(first, env={})
    assert str(path) in str(info.value)
    assert "queue 'c'" in str(info.value) and "lease_period" in str(info.value)
    path.write_text("[[queue]\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        reread(first, env={})


def test_reread_needs_a_file():
    with pytest.raises(ConfigError, match="not loaded from a file"):
        reread(loads(BASE, env={}))


def test_admin_token_from_file_or_environment_and_masked():
    cfg = loads(BASE.replace('id = "c1"', 'id = "c1"\nadmin_token = "xyzzy"'), env={})
    assert cfg.coordinator.admin_token == "xyzzy"
    assert "xyzzy" not in repr(cfg.coordinator)
    cfg = loads(BASE, env={"QLAYER_ADMIN_TOKEN": "from-env"})
    assert cfg.coordinator.admin_token == "from-env"
    with pytest.raises(ConfigError, match="admin_token.*must differ from auth_token"):
        loads(BASE.replace('id = "c1"', 'id = "c1"\nauth_token = "t"\nadmin_token = "t"'), env={})


# ---------------------------------------------------------------------------------------------
# the engine takes live settings
# ---------------------------------------------------------------------------------------------

TP = TopicPartition("t", 0)


def engine(**settings: object) -> QueueEngine:
    e = QueueEngine("q", EngineSettings(**settings))  # type: ignore[arg-type]
    e.start_partition(TP, 0)
    return e


def arrive(e: QueueEngine, offsets: range, now: float, ts: float | None = None) -> None:
    e.add(
        [Arrival(Bookmark("t", 0, o), now if ts is None else ts, None, 0, 0) for o in offsets], now
    )


def test_new_lease_period_applies_to_new_leases_only():
    e = engine(lease_period=60.0)
    arrive(e, range(2), 0.0)
    e.subscribe("s", 1, 0.0)
    e.dispatch(0.0)
    first = e.drain().deliveries[0]
    e.reconfigure(EngineSettings(lease_period=5.0))
    assert e.ack("s", [first.bookmark], AckOp.ACK, 1.0)[0].error is None
    e.dispatch(1.0)
    second = e.drain().deliveries[0]
    assert first.deadline == 60.0 and second.deadline == 6.0


def test_new_max_deliveries_and_expiration_apply():
    e = engine(lease_period=1.0)
    arrive(e, range(1), 0.0)
    e.subscribe("s", 1, 0.0)
    e.dispatch(0.0)
    e.drain()
    e.reconfigure(EngineSettings(lease_period=1.0, max_deliveries=1))
    e.tick(2.0)  # the lease times out: 1 delivery reaches the new limit
    done = [c for c in e.drain().changes if getattr(c, "reason", None) is DoneReason.MAX_DELIVERIES]
    assert len(done) == 1
    arrive(e, range(1, 2), 10.0)
    e.reconfigure(EngineSettings(lease_period=1.0, expiration=5.0))
    e.tick(16.0)
    expired = [c for c in e.drain().changes if getattr(c, "reason", None) is DoneReason.EXPIRATION]
    assert [c.bookmark.offset for c in expired] == [1]


def test_lower_backlog_cap_lowers_open_subscriptions():
    e = engine(max_per_subscription_backlog=10)
    arrive(e, range(10), 0.0)
    e.subscribe("s", 10, 0.0)
    e.reconfigure(EngineSettings(max_per_subscription_backlog=2))
    e.dispatch(0.0)
    assert len(e.drain().deliveries) == 2
    assert e.subscribe("s2", 10, 0.0) == 2


def test_fairness_switch_keeps_every_subscription():
    e = engine(fairness=Fairness.PROPORTIONAL)
    e.subscribe("s1", 5, 0.0)
    e.subscribe("s2", 5, 0.0)
    e.reconfigure(EngineSettings(fairness=Fairness.FAST))
    arrive(e, range(6), 0.0)
    e.dispatch(0.0)
    by_sub = [d.subscription for d in e.drain().deliveries]
    assert by_sub == ["s1"] * 5 + ["s2"]  # fast: the first with room takes all it can


def test_leasing_switch_applies_to_the_next_ack():
    e = engine(leasing=Leasing.STRICT)
    arrive(e, range(1), 0.0)
    e.subscribe("s1", 1, 0.0)
    e.subscribe("s2", 1, 0.0)
    e.dispatch(0.0)
    d = e.drain().deliveries[0]
    other = "s2" if d.subscription == "s1" else "s1"
    assert e.ack(other, [d.bookmark], AckOp.ACK, 0.0)[0].error is not None
    e.reconfigure(EngineSettings(leasing=Leasing.LENIENT))
    assert e.ack(other, [d.bookmark], AckOp.ACK, 0.0)[0].error is None


def test_reconfigure_refuses_what_shapes_the_state():
    e = engine()
    with pytest.raises(ValueError, match="semantics, priority"):
        e.reconfigure(
            EngineSettings(
                semantics=Semantics.AT_MOST_ONCE, fairness=Fairness.ROUND_ROBIN, priority=True
            )
        )
    with pytest.raises(ValueError, match="lease_period must be > 0"):
        e.reconfigure(EngineSettings(lease_period=0))


# ---------------------------------------------------------------------------------------------
# the wire
# ---------------------------------------------------------------------------------------------


def test_reload_frames_round_trip():
    result = ReloadResult(
        "qlayer.toml",
        False,
        ["b"],
        ["c"],
        [ReloadChange("a", "lease_period", "60.0", "5.0")],
        [ReloadRefusal("queue 'a'", "semantics", '"at-least-once"', '"at-most-once"', "why")],
    )
    assert RELOAD_REPLY_CODEC.decode(RELOAD_REPLY_CODEC.encode(ReloadReply(result))).result == (
        result
    )
    assert RELOAD_CODEC.decode(RELOAD_CODEC.encode(Reload())) == Reload()
