"""Fixtures that run real coordinator processes (see tests/harness.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import CoordinatorProcess, write_config


@pytest.fixture
def coordinator_factory(
    broker: Any, tmp_path: Path, topic_factory: Callable[..., str]
) -> Iterator[Callable[..., CoordinatorProcess]]:
    """Start ``qlayer coordinator`` processes over the session broker; all stopped at teardown.

    It takes ``topic_factory`` so that its teardown comes first: the coordinators stop before
    the test's topics are deleted (on Tansu, librdkafka crashes a process whose consumer reads
    a topic that is deleted, README "Limits").

    ``coordinator_factory(queues=[{...}], broker={...}, **coordinator_options)`` returns a
    started process; queue tables are the TOML ``[[queue]]`` options, ``broker`` more keys of
    its ``[broker]`` table.
    """
    started: list[CoordinatorProcess] = []
    kafka = broker  # ``broker=`` below is the config's [broker] table

    def make(
        queues: list[dict[str, Any]],
        start: bool = True,
        broker: dict[str, Any] | None = None,
        **coordinator: Any,
    ) -> CoordinatorProcess:
        n = len(started)
        home = tmp_path / f"coordinator-{n}"
        home.mkdir()
        coordinator.setdefault("id", f"test-{uuid.uuid4().hex[:8]}")
        cfg = write_config(
            home / "qlayer.toml", kafka.bootstrap_servers, queues, coordinator, broker
        )
        proc = CoordinatorProcess(cfg, home / "state", home / "coordinator.log")
        started.append(proc)
        if start:
            proc.start()
        return proc

    yield make
    for proc in started:
        proc.stop()


@pytest.fixture
def names() -> Callable[[str], str]:
    """Unique topic / queue names per test."""
    suffix = uuid.uuid4().hex[:8]
    return lambda base: f"{base}-{suffix}"
