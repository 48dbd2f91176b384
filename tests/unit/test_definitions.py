"""The definitions topic's pure parts: record codec, the last-value-wins reduce, the file seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from layer.codec import encode
from layer.config import CoordinatorConfig, QueueConfig, loads, queue_from_table, queue_table
from layer.definitions import (
    Definition,
    Definitions,
    Manifest,
    Write,
    decode_record,
    file_changes,
    file_origin,
    parse_literal,
    toml_literal,
)

COORDINATOR = CoordinatorConfig(id="c1")


def validate(d: Definition, where: str) -> QueueConfig:
    return queue_from_table(d.table, f"definitions topic {where}", COORDINATOR)


def reduce(writes: list[Write]) -> tuple[Definitions, list[str]]:
    defs = Definitions(validate, "qlayer.queues.c1")
    problems = [defs.apply(w.key, w.value, offset) for offset, w in enumerate(writes)]
    return defs, [p for p in problems if p is not None]


def table(name: str, **options: object) -> dict[str, object]:
    return {"name": name, "underlying_topic": name, **options}


def test_a_definition_round_trips_through_its_record() -> None:
    d = Definition(
        "orders",
        table(
            "orders",
            lease_period="30s",
            max_deliveries=5,
            exclusive=True,
            redelivery_backoff={"initial": "1s", "multiplier": 2, "max": "1m"},
            filter="/symbol = 'IBM' AND /qty > 1.5",
        ),  # fmt: skip
        "api",
        "alice",
        1234,
    )
    key, value = d.encode()
    assert key == b"orders"
    assert decode_record(key, value) == ("orders", d)
    assert decode_record(key, None) == ("orders", None)


def test_a_manifest_round_trips() -> None:
    m = Manifest("c1", "/etc/qlayer.toml", {"a": table("a"), "b": table("b", lease_period=3)}, 9)
    key, value = m.encode()
    assert key == file_origin("c1").encode()
    assert decode_record(key, value) == (file_origin("c1"), m)


@given(
    st.recursive(
        st.text(max_size=20)
        | st.integers(-(2**63), 2**63 - 1)
        | st.booleans()
        | st.floats(allow_nan=False, allow_infinity=False),
        lambda inner: st.dictionaries(
            st.from_regex(r"[a-z_]{1,8}", fullmatch=True), inner, max_size=3
        ),  # fmt: skip
        max_leaves=6,
    )
)
def test_toml_literals_round_trip(value: object) -> None:
    assert parse_literal(toml_literal(value)) == value


def test_the_last_value_wins_and_a_tombstone_deletes() -> None:
    defs, problems = reduce(
        [
            Write.of(Definition("a", table("a"))),
            Write.of(Definition("b", table("b"))),
            Write.of(Definition("a", table("a", lease_period=5))),
            Write.delete("b"),
            Write.of(Definition("c", table("c"))),
            Write.delete("c"),
            Write.of(Definition("c", table("c", max_deliveries=2))),
        ]
    )
    assert problems == []
    assert [q.name for q in defs.defined()] == ["a", "c"]
    assert defs.queues["a"].lease_period == 5.0 and defs.queues["c"].max_deliveries == 2
    assert defs.latest["b"] is None
    assert defs.next_offset == 7


def test_a_malformed_record_is_named_and_skipped_keeping_the_last_good_one() -> None:
    bad_options = encode(
        "queue_definition",
        {"name": "a", "options": {"name": '"a"', "underlying_topic": '"a"', "lease_period": "-1"},
         "origin": "api", "changed_by": "x", "changed_at_ms": 0, "temporary": False},
    )  # fmt: skip
    defs, problems = reduce(
        [
            Write.of(Definition("a", table("a", lease_period=7))),
            Write(b"a", b"\x01garbage"),
            Write(b"a", bad_options),
            Write(b"\xff\xfe", b"x"),
            Write(
                b"b",
                encode(
                    "queue_definition",
                    {
                        "name": "other",
                        "options": {},
                        "origin": "api",
                        "changed_by": "",
                        "changed_at_ms": 0,
                        "temporary": False,
                    },
                ),
            ),  # fmt: skip
            Write.of(Definition("c", table("c"))),
        ]
    )
    assert [q.name for q in defs.defined()] == ["a", "c"]
    assert defs.queues["a"].lease_period == 7.0
    assert len(problems) == 4
    assert problems[0].startswith("definitions record qlayer.queues.c1/0/1 skipped")
    assert "option 'lease_period'" in problems[1] and "keeps its last definition" in problems[1]
    assert "not UTF-8" in problems[2] and "names queue 'other'" in problems[3]


def queues(**tables: dict[str, object]) -> list[QueueConfig]:
    return [queue_from_table(t, "file", COORDINATOR) for t in tables.values()]


def test_the_file_writes_only_what_it_changed_since_it_was_last_read() -> None:
    a, b = table("a"), table("b")
    defs, _ = reduce([])
    # first read: everything in the file is new
    first = file_changes(defs, "c1", "f.toml", queues(a=a, b=b), 1)
    assert [c.name for c in first if isinstance(c, Definition)] == ["a", "b"]
    writes = [Write.of(c) for c in first if isinstance(c, Definition)]
    writes.append(Write.of(Manifest("c1", "f.toml", {"a": a, "b": b})))
    # then an operator alters a and deletes b with the CLI
    writes.append(Write.of(Definition("a", table("a", max_deliveries=9))))
    writes.append(Write.delete("b"))
    defs, _ = reduce(writes)
    # the same file again: nothing to write, the operator's changes stand
    assert file_changes(defs, "c1", "f.toml", queues(a=a, b=b), 2) == []
    # the file edits a, adds c and drops b: the edit and the new table are written, b is
    # deleted already
    edited = file_changes(
        defs, "c1", "f.toml", queues(a=table("a", lease_period=3), c=table("c")), 3
    )
    assert [(c.name, dict(c.table)) for c in edited if isinstance(c, Definition)] == [
        ("a", table("a", lease_period=3.0)),
        ("c", table("c")),
    ]
    assert not [c for c in edited if isinstance(c, str)]
    # another coordinator's file does not touch this one's queues
    assert [
        c.name for c in file_changes(defs, "c2", "g.toml", [], 4) if isinstance(c, Definition)
    ] == []
    # a table removed from the file deletes its queue
    assert file_changes(defs, "c1", "f.toml", [], 5) == ["a"]


def test_a_queue_table_loads_back_to_the_same_queue(tmp_path: Path) -> None:
    schema = tmp_path / "s.avsc"
    schema.write_text('{"type": "record", "name": "R", "fields": [{"name": "x", "type": "int"}]}')
    config = loads(
        f"""
        [[queue]]
        name = "a"
        underlying_topic = "^a-.*"
        default_publish_target = "a-1"
        semantics = "at-most-once"
        lease_period = "30s"
        redelivery_backoff = {{ initial = "1s", multiplier = 3, max = "1m" }}
        message_type = "avro"
        avro_schema = "{schema}"
        priority = "/x"
        [[queue]]
        name = "b"
        underlying_topic = "b"
        priorities = 3
        lvq = "qpid"
        """
    )
    for q in config.queues:
        t = queue_table(q)
        assert queue_from_table(t, "again", config.coordinator) == q
        assert (
            queue_from_table(
                {k: parse_literal(toml_literal(v)) for k, v in t.items()},
                "again",
                config.coordinator,
            )
            == q
        )


@pytest.mark.parametrize(
    "cluster,topic", [(None, "qlayer.queues.c1"), ("prod", "qlayer.queues.prod")]
)
def test_the_definitions_topic_is_named_by_the_cluster(cluster: str | None, topic: str) -> None:
    assert CoordinatorConfig(id="c1", cluster=cluster).definitions_topic == topic


def test_a_temporary_queue_is_marked_and_its_end_is_noted() -> None:
    tmp = Definition("r", table("r"), "temporary:c1", "alice", 5, temporary=True)
    assert decode_record(*tmp.encode()) == ("r", tmp)
    defs, _ = reduce([Write.of(tmp), Write.of(Definition("a", table("a"))), Write.delete("a")])
    assert defs.ended_temporary == set()
    defs.apply(b"r", None, 3)
    assert defs.ended_temporary == {"r"}
