"""The Qpid and Solace queue-type options (sort_key, last_value, ttl, dead_letter_if): loading, and
how the coordinator evaluates them (sort value, expiry time, DMQ eligibility)."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import pytest

from layer.config import loads
from layer.coordinator.runtime import DISCARD_LOG_INTERVAL, QueueRuntime, expires_at, sort_value
from layer.engine.model import Bookmark, Done, DoneReason
from layer.engine.queue import QueueEngine
from layer.exceptions import ConfigError
from layer.expr import compile_expression
from layer.state.base import StoredMessage

QUEUE = '[[queue]]\nname = "orders"\nunderlying_topic = "orders"\n'


def queue(options: str):
    return loads(QUEUE + options, source="config.toml", env={}).queue("orders")


def error(options: str) -> str:
    with pytest.raises(ConfigError) as info:
        loads(QUEUE + options, source="config.toml", env={})
    return str(info.value)


def test_the_options_reach_the_config_and_the_engine_settings():
    q = queue('sort_key = "/symbol"\nttl = "/ttl_s"\ndead_letter_if = "/dmq = true"')
    assert (q.sort_key, q.ttl, q.dead_letter_if, q.last_value) == (
        "/symbol",
        "/ttl_s",
        "/dmq = true",
        False,
    )
    settings = q.engine_settings()
    assert settings.sort and settings.message_ttl and not settings.conflate
    assert q.expressions == {
        "sort_key": "/symbol",
        "ttl": "/ttl_s",
        "dead_letter_if": "/dmq = true",
    }
    lvq = queue("last_value = true").engine_settings()
    assert lvq.conflate and not lvq.sort and not lvq.message_ttl


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            'sort_key = "/s"\npriority = "/p"',
            "option 'sort_key': cannot be combined with 'priority' (as Qpid refuses)",
        ),
        (
            'sort_key = "/s"\nconflate_key = "/k"',
            "option 'sort_key': cannot be combined with 'conflate_key' (as Qpid refuses)",
        ),
        (
            'sort_key = "/s"\nlast_value = true',
            "option 'sort_key': cannot be combined with 'last_value'",
        ),
        (
            'last_value = true\nconflate_key = "/k"',
            "option 'last_value': cannot be combined with 'conflate_key'",
        ),
        (
            'sort_key = "/s"\ntarget_queue_depth = 10',
            "option 'target_queue_depth': cannot be combined with 'sort_key'",
        ),
        ('last_value = "yes"', "option 'last_value'"),
        ('sort_key = "/s +"', "option 'sort_key'"),
        ('ttl = "(/a"', "option 'ttl'"),
        ('dead_letter_if = "/a ="', "option 'dead_letter_if'"),
        ('message_type = "bytes"\nsort_key = "/s"', "option 'sort_key': needs message_type"),
    ],
)
def test_refusals_are_one_line_and_name_the_option(options: str, message: str):
    text = error(options)
    assert text.startswith(f"config.toml: queue 'orders': {message}"), text
    assert "\n" not in text


def test_the_sort_value_is_a_string_or_nothing():
    symbol = compile_expression("/symbol")
    assert sort_value(symbol, {"symbol": "IBM"}, 0.0) == "IBM"
    # Qpid: the property must be a String; anything else sorts as a missing one
    for doc in ({"symbol": 7}, {"symbol": None}, {}, None, {"symbol": True}):
        assert sort_value(symbol, doc, 0.0) is None


def test_the_ttl_is_seconds_after_the_enqueue_time():
    ttl = compile_expression("/ttl")
    assert expires_at(ttl, {"ttl": 30}, 0.0, 100.0) == 130.0
    assert expires_at(ttl, {"ttl": 0.5}, 0.0, 100.0) == 100.5
    assert expires_at(ttl, {"ttl": "12"}, 0.0, 100.0) == 112.0
    # NULL, not a number, 0 (Solace: never expires), negative, infinite, NaN: none of its own
    for value in (None, "soon", 0, -5, math.inf, math.nan, True, [1]):
        assert expires_at(ttl, {"ttl": value}, 0.0, 100.0) is None, value
    assert expires_at(compile_expression("/ms / 1000"), {"ms": 2500}, 0.0, 1.0) == 3.5


def test_the_readme_example_of_the_queue_types_loads():
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    section = readme.split("**Qpid and Solace queue types.**", 1)[1]
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    config = loads(example, source="README.md", env={})
    quotes, last, orders = config.queues
    assert quotes.engine_settings().sort and last.engine_settings().conflate
    assert orders.ttl == "/ttl_s" and orders.expiration == 3600.0
    assert orders.dead_letter_if == "/dmq_eligible = true"


def runtime(options: str) -> QueueRuntime:
    config = queue(options)
    return QueueRuntime(config, QueueEngine(config.name, config.engine_settings()), "changelog")


def stored(doc: object) -> StoredMessage:
    return StoredMessage(key=None, value=json.dumps(doc).encode())


def test_dead_letter_if_discards_counted_and_logged_at_a_limited_rate(caplog, monkeypatch):
    rt = runtime('dead_letter_if = "/dmq = true"\nmax_deliveries = 1')
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])

    def done(offset: int, reason: DoneReason) -> Done:
        return Done(Bookmark("orders", 0, offset), reason, 1, 0, 0.0)

    with caplog.at_level(logging.WARNING, logger="layer.coordinator.runtime"):
        assert rt.dead_letter_eligible(done(0, DoneReason.MAX_DELIVERIES), stored({"dmq": True}))
        assert not rt.dead_letter_eligible(done(1, DoneReason.EXPIRATION), stored({"dmq": 1}))
        assert not rt.dead_letter_eligible(done(2, DoneReason.MAX_CANCELS), stored({}))
        assert not rt.dead_letter_eligible(done(3, DoneReason.MAX_DELIVERIES), stored("x"))
        clock[0] += DISCARD_LOG_INTERVAL
        assert not rt.dead_letter_eligible(done(4, DoneReason.EXPIRATION), stored({}))
    # a consumer's expire is always dead-lettered; so is a message whose payload is gone
    assert rt.dead_letter_eligible(done(5, DoneReason.CONSUMER_EXPIRE), stored({}))
    assert rt.dead_letter_eligible(done(6, DoneReason.EXPIRATION), None)
    assert rt.counters.discarded == 4
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "discarded orders/0/1 (expiration, deliveries=1)" in lines[0]
    assert "dead_letter_if '/dmq = true' is not true" in lines[0]
    assert lines[1].endswith("(2 more discarded since the last line)")
    assert "\n" not in lines[0]


def test_without_dead_letter_if_every_limit_dead_letters():
    rt = runtime("max_deliveries = 1")
    done = Done(Bookmark("orders", 0, 0), DoneReason.MAX_DELIVERIES, 1, 0, 0.0)
    assert rt.dead_letter_eligible(done, stored({}))
    assert rt.counters.discarded == 0
