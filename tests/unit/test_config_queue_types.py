"""The Qpid and Solace queue-type options: sort_key, last_value, ttl, dead_letter_if."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from layer.config import loads
from layer.coordinator.runtime import expires_at, sort_value
from layer.exceptions import ConfigError
from layer.expr import compile_expression

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
