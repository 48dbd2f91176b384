"""A stalled subscription (its stream holds its backlog's worth unsent) is paused at once, but
logged only once the stall has lasted ``STALL_LOG_AFTER``: a stream a round's push behind its
writer for a moment, as every stream is under load, is no client that stopped reading."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import pytest

from layer.api.service import DeliverySink
from layer.coordinator import subscriptions as subs_module
from layer.coordinator.round import RoundSignal
from layer.state.memory import MemoryStore
from tests.unit.ports import Clock, ListSink, new_runtime, queue_config, subscriptions

LOGGER = "layer.coordinator.subscriptions"


@dataclass
class HeldSink(ListSink):
    """A sink whose unsent count the test sets (a writer behind, or a client not reading)."""

    held: int = 0

    @property
    def unsent(self) -> int:
        return self.held


def stall_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and ("stalled" in r.getMessage() or "reads again" in r.getMessage())
    ]


def test_a_short_stall_pauses_without_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    q = queue_config()
    rt = new_runtime(q)
    subs = subscriptions({q.name: rt}, MemoryStore(), Clock(), RoundSignal())
    sink = HeldSink()
    sink_: DeliverySink = sink
    handle = asyncio.run(subs.subscribe(q.name, 10, sink_))
    state = rt.subscriptions[handle.id]
    for _ in range(50):  # a stream that falls a backlog behind and catches up, round after round
        sink.held = 10
        subs.apply_backlogs(rt)
        assert state.stalled  # paused at once
        sink.held = 0
        subs.apply_backlogs(rt)
        assert not state.stalled
    assert stall_lines(caplog) == []


def test_a_lasting_stall_is_logged_once_and_its_end_too(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, LOGGER)
    monkeypatch.setattr(subs_module, "STALL_LOG_AFTER", 0.05)
    q = queue_config()
    rt = new_runtime(q)
    subs = subscriptions({q.name: rt}, MemoryStore(), Clock(), RoundSignal())
    sink = HeldSink()
    sink_: DeliverySink = sink
    handle = asyncio.run(subs.subscribe(q.name, 10, sink_))
    state = rt.subscriptions[handle.id]
    sink.held = 12
    subs.apply_backlogs(rt)
    assert state.stalled and stall_lines(caplog) == []
    lasted = threading.Event()
    lasted.wait(0.06)  # past the (shortened) threshold: the stall goes on meanwhile
    for _ in range(5):
        subs.apply_backlogs(rt)
    lines = stall_lines(caplog)
    assert len(lines) == 1 and "stalled: its client does not read" in lines[0], lines
    assert f"subscription={handle.id}" in lines[0] and "12 messages unsent" in lines[0]
    sink.held = 0
    subs.apply_backlogs(rt)
    subs.apply_backlogs(rt)
    lines = stall_lines(caplog)
    assert not state.stalled
    assert len(lines) == 2 and "reads again" in lines[1], lines
