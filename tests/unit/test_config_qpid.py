"""The Qpid queue types' one-line options (``priorities``, ``lvq``) and expressions over the
Kafka record on ``bytes`` queues."""

from __future__ import annotations

from pathlib import Path

import pytest

from layer.config import Config, QueueConfig, loads
from layer.exceptions import ConfigError

QUEUE = '[[queue]]\nname = "orders"\nunderlying_topic = "orders"\n'


def queue(options: str) -> QueueConfig:
    return loads(QUEUE + options, source="config.toml", env={}).queue("orders")


def error(options: str) -> str:
    with pytest.raises(ConfigError) as info:
        loads(QUEUE + options, source="config.toml", env={})
    return str(info.value)


def test_priorities_alone_reads_the_jms_priority_header() -> None:
    q = queue("priorities = 10")
    assert q.priorities == 10
    assert q.priority == "HEADER('JMSPriority')"
    assert q.engine_settings().priority
    assert q.expressions["priority"] == "HEADER('JMSPriority')"


def test_priorities_with_a_priority_expression_keeps_it() -> None:
    q = queue('priorities = 2\npriority = "/urgency"')
    assert (q.priorities, q.priority) == (2, "/urgency")


def test_no_priorities_no_priority() -> None:
    q = queue("")
    assert q.priorities is None and q.priority is None


@pytest.mark.parametrize("value", ["1", "11", "0", '"4"', "4.5"])
def test_priorities_out_of_range_is_refused(value: str) -> None:
    message = error(f"priorities = {value}")
    assert message.startswith("config.toml: queue 'orders': option 'priorities': ")
    assert "\n" not in message


def test_priorities_on_a_bytes_queue_reads_only_the_record() -> None:
    q = queue('message_type = "bytes"\npriorities = 4')
    assert q.priority == "HEADER('JMSPriority')"


def test_lvq_qpid_conflates_on_the_qpid_lvq_key_header() -> None:
    q = queue('lvq = "qpid"')
    assert q.conflate_key == "HEADER('qpid.LVQ_key')"
    assert q.engine_settings().conflate


def test_a_custom_lvq_key_is_a_conflate_key_on_its_header() -> None:
    q = queue("conflate_key = \"HEADER('ISIN')\"")
    assert q.conflate_key == "HEADER('ISIN')"


def test_lvq_and_conflate_key_together_are_refused() -> None:
    assert error('lvq = "qpid"\nconflate_key = "/k"') == (
        "config.toml: queue 'orders': option 'lvq': sets conflate_key to "
        "HEADER('qpid.LVQ_key'): give lvq or conflate_key, not both"
    )


def test_an_unknown_lvq_kind_is_refused() -> None:
    assert error('lvq = "rabbit"') == (
        "config.toml: queue 'orders': option 'lvq': expected one of \"qpid\", got \"rabbit\""
    )


@pytest.mark.parametrize(
    "option",
    [
        "filter = \"HEADER('region') = 'emea'\"",
        'group_key = "KEY()"',
        "conflate_key = \"HEADER('qpid.LVQ_key')\"",
        "barrier = \"HEADER('kind') = 'eod'\"",
        "priority = \"COALESCE(HEADER('JMSPriority'), 4)\"",
        "filter = \"PARTITION() = 0 AND TOPIC() = 'orders' AND TIMESTAMP() > 0\"",
    ],
)
def test_a_bytes_queue_takes_expressions_over_the_record(option: str) -> None:
    config: Config = loads(
        QUEUE + 'message_type = "bytes"\n' + option, source="config.toml", env={}
    )
    assert config.queue("orders").expressions


def test_a_bytes_queue_refuses_field_paths_even_beside_record_fields() -> None:
    message = error('message_type = "bytes"\nfilter = "KEY() = \'a\' AND /qty > 1"')
    assert message.startswith(
        "config.toml: queue 'orders': option 'filter': needs message_type \"json\" or \"avro\""
        " to read field paths"
    )


def test_header_with_a_non_literal_name_is_refused_at_load() -> None:
    message = error("filter = \"HEADER(/name) = 'x'\"")
    assert "option 'filter'" in message
    assert "HEADER takes the header's name as a string literal at column 8" in message


def test_the_readmes_record_expression_example_loads() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = readme.index('```toml\n[[queue]]\nname = "jobs"')
    block = readme[start + len("```toml\n") : readme.index("```", start + 7)]
    q = loads(block, source="README.md", env={}).queue("jobs")
    assert q.group_key == "HEADER('JMSXGroupID')"
    assert set(q.expressions) == {"priority", "group_key", "filter"}


def test_priorities_with_target_queue_depth_names_priorities() -> None:
    assert error("priorities = 4\ntarget_queue_depth = 10") == (
        "config.toml: queue 'orders': option 'target_queue_depth': cannot be combined with "
        "'priorities' (as AMPS does)"
    )
